-- needs: docker, local
-- Budgets count every process of the box, on Docker: a CPU burner in the
-- background, and one detached from any command (its exec long returned),
-- use up a seconds budget and are stopped; a background writer that never
-- ends uses up an output_bytes budget as its bytes arrive and is stopped.
-- Each later command is refused with budget_exceeded.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

-- Processes of a box whose command line matches pattern, seen from a
-- docker exec of the test's own (the box refuses commands past its budget).
local function running(box, pattern)
  local out = H.sh("docker exec " .. box.id .. [[ sh -c 'for p in /proc/[0-9]*; do c=$(tr "\0" " " < $p/cmdline 2>/dev/null); ]] ..
    [[read -r s < $p/stat 2>/dev/null; case "$s" in *") Z"*) continue;; esac; echo "$c"; done']])
  local n = 0
  for line in out:gmatch("[^\n]+") do
    if line:find(pattern) and not line:find("/proc/", 1, true) then n = n + 1 end
  end
  return n
end

-- Waits (generously) until pred() holds: true, or false after limit seconds.
local function eventually(pred, limit)
  local t0 = sbx.now()
  while sbx.now() - t0 < limit do
    if pred() then return true end
    sbx.sleep(0.5)
  end
  return pred()
end

-- 1. A background CPU burner under a 3 s seconds budget.
local box = H.box { image = H.busybox, transport = "agent", policy = { budget = { seconds = 3 } } }
local name = assert(box:spawn("while :; do :; done # burner-bg"))
local view = box:wait(name, 60)
tap.ok(view ~= nil, "the background burner is stopped within the budget's watch (not left to run)")
tap.is(view and view.status, "killed", "its status is killed")
tap.like(view and view.error, "seconds budget is used up", "saying which budget")
local r, err, code = box:exec("echo more")
tap.is(code, "budget_exceeded", "the next command is refused: budget_exceeded (" .. tostring(err) .. ")")
tap.ok(eventually(function() return running(box, "burner%-bg") == 0 end, 30), "no burner runs on in the box")
box:close()

-- 2. A burner detached from its command: the exec transport's command
-- returns at once and nothing of sbx's tracks the burner, but the box's CPU
-- time counts.
box = H.box { image = H.busybox, transport = "exec", policy = { budget = { seconds = 3 } } }
r = assert(box:exec("setsid sh -c 'while :; do :; done # burner-detached' </dev/null >/dev/null 2>&1 & echo left"))
tap.is(r.stdout, "left\n", "the command that left a detached burner returned")
tap.ok(eventually(function() return running(box, "burner%-detached") == 0 end, 60),
  "the detached burner is stopped once the box's CPU time passes the budget")
r, err, code = box:exec("echo more")
tap.is(code, "budget_exceeded", "and the next command is refused: budget_exceeded (" .. tostring(err) .. ")")
tap.ok((box.usage.cpu_seconds or 0) >= 3, "box.usage.cpu_seconds shows the box's CPU time (" .. tostring(box.usage.cpu_seconds) .. ")")
box:close()

-- 3. A background writer that never ends, against 1000 bytes of output.
box = H.box { image = H.busybox, transport = "agent", policy = { budget = { output_bytes = 1000 } } }
name = assert(box:spawn("head -c 5000000 /dev/zero | tr '\\0' x; exec sleep 1005"))
view = box:wait(name, 60)
tap.ok(view ~= nil, "the writer is stopped (it never ends by itself)")
tap.is(view and view.status, "killed", "its status is killed")
tap.like(view and view.error, "output bytes budget is used up", "saying which budget")
r, err, code = box:exec("echo more")
tap.is(code, "budget_exceeded", "the next command is refused: budget_exceeded (" .. tostring(err) .. ")")
tap.ok(eventually(function() return running(box, "sleep 1005") == 0 end, 30), "the writer is gone from the box")
box:close()

-- Without budgets nothing watches and nothing is stopped.
box = H.box { image = H.busybox, transport = "agent" }
name = assert(box:spawn("sleep 2; echo done"))
view = box:wait(name, 60)
tap.is(view and view.status, "exited", "no budget: a background process runs to its end")
box:close()

-- The local backend (as root: cgroups): the box's cpuacct group counts
-- its CPU time.
local L = require "local_helper"
if L.role == "root" and os.getenv("SBX_SKIP_LOCAL") == nil then
  local lbox, lerr = L.box { policy = { budget = { seconds = 3 } } }
  if not lbox then
    tap.skip("local: a box's CPU time", tostring(lerr))
  else
    name = assert(lbox:spawn("while :; do :; done"))
    view = lbox:wait(name, 60)
    tap.is(view and view.status, "killed", "local: a background burner is stopped at its seconds budget")
    tap.ok((lbox.usage.cpu_seconds or 0) > 0, "local: box.usage.cpu_seconds is the box's cgroup CPU time (" ..
      tostring(lbox.usage.cpu_seconds) .. ")")
    r, err, code = lbox:exec("echo more")
    tap.is(code, "budget_exceeded", "local: the next command is refused")
    lbox:close()
  end
end

tap.done()

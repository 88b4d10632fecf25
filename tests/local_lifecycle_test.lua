-- needs: docker, local, root
-- The local backend's lifecycle, as root and as the unprivileged users:
-- kill -9 of sbx leaves no process, `sbx reap --backend local` removes
-- what it left on disk, close() and the collector leave nothing, lifetimes,
-- a lost agent is a lost box, restart, refusals, many boxes at once.
local sbx = require "sbx"
local tap = require "tap"
local L = require "local_helper"

local root = L.role == "root"
local S = sbx.core.sandbox
local image = os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12"
local rootfs = L.my_rootfs(image)
local bin = os.getenv("SBX_BIN") or "build/sbx"

local function gone(path) return sbx.core.path_type(path) == nil end

-- Waits until f() is true, at most seconds: f's last value.
local function eventually(seconds, f)
  local deadline = sbx.now() + seconds
  while true do
    local v = f()
    if v or sbx.now() > deadline then return v end
    sbx.sleep(0.05)
  end
end

-- close(): nothing of the box is left.
do
  local box = assert(L.box {})
  local h = box.handle
  tap.ok(sbx.core.path_type(h.dir .. "/owner") == "file", "a running box has its owner record")
  assert(box:spawn("sleep 876501"))
  local t0 = sbx.now()
  box:close()
  tap.ok(sbx.now() - t0 < 2, string.format("close() takes %.1f ms", (sbx.now() - t0) * 1000))
  tap.ok(gone(h.dir), "its directory is gone")
  for _, d in ipairs(h.cgroups or {}) do tap.ok(gone(d), "its cgroup is gone: " .. d) end
  tap.is(#L.host_procs("sleep 876501"), 0, "and its processes")
  local ok, err = pcall(box.exec, box, "true")
  tap.ok(not ok and tostring(err):find("closed box"), "a closed box refuses commands")
end

-- A collected box is removed too.
do
  local dir, pid
  do
    local box = assert(L.box {})
    dir, pid = box.handle.dir, box.handle.pid
    assert(box:exec("true"))
  end
  collectgarbage()
  collectgarbage()
  tap.ok(eventually(3, function() return gone(dir) end), "a dropped box is removed by the collector")
  tap.is(#L.host_procs("bwrap.*" .. dir), 0, "its bubblewrap (pid " .. pid .. ") is gone")
end

-- kill -9 of sbx: the boxes die with it; the reaper removes what is left.
do
  local script = os.tmpname() .. ".lua"
  local f = assert(io.open(script, "w"))
  f:write([[
local L = require "local_helper"
local a = assert(L.box {})
local b = assert(L.box {})
assert(a:spawn("sleep 876503"))
assert(b:spawn("setsid sh -c 'sleep 876504 & sleep 876505' & sleep 876506"))
require("sbx").sleep(0.3)
print("READY " .. a.handle.dir .. " " .. b.handle.dir .. " " .. table.concat(a.handle.cgroups or {}, ",") .. " " ..
  table.concat(b.handle.cgroups or {}, ","))
io.stdout:flush()
require("sbx").sleep(120)
]])
  f:close()
  local out = os.tmpname()
  local pid = tonumber((L.sh(string.format("%s run %s > %s 2>&1 & echo $!", L.q(bin), L.q(script), L.q(out)))))
  local line = eventually(30, function()
    local o = io.open(out)
    local text = o and o:read("a") or ""
    if o then o:close() end
    return text:match("READY [^\n]+")
  end)
  tap.ok(line, "a child sbx made two boxes (" .. tostring(line) .. ")")
  local d1, d2, c1, c2 = tostring(line):match("READY (%S+) (%S+) ?(%S*) ?(%S*)")
  tap.ok(#L.host_procs("sleep 87650[3-6]") >= 4, "their processes run")
  L.sh("kill -9 " .. pid)
  local left = eventually(5, function() return #L.host_procs("sleep 87650[3-6]") == 0 and #L.host_procs("bwrap.*" .. (d1 or "x")) == 0 end)
  tap.ok(left, "kill -9 of sbx: no process of its boxes is left (" ..
    table.concat(L.host_procs("sleep 87650[3-6]"), "; ") .. ")")
  tap.ok(d1 and sbx.core.path_type(d1 .. "/owner") == "file", "what the host keeps of them is still there")
  local r = L.sh(L.q(bin) .. " reap --backend local --dry-run")
  tap.like(r, "would remove " .. tostring(d1):match("[^/]+$") .. " %(owner process " .. pid .. " is gone%)",
    "sbx reap --dry-run names the dead owner's boxes")
  tap.ok(sbx.core.path_type(d1 .. "/owner") == "file", "and removes nothing")
  r = L.sh(L.q(bin) .. " reap --backend local")
  tap.like(r, "removed " .. tostring(d2):match("[^/]+$"), "sbx reap --backend local removes them: " .. r:gsub("\n", " | "))
  tap.ok(gone(d1) and gone(d2), "their directories are gone")
  local cgs = {}
  for c in ((c1 or "") .. "," .. (c2 or "")):gmatch("[^,]+") do cgs[#cgs + 1] = c end
  if root then
    tap.ok(#cgs >= 2, "the boxes had cgroups (" .. #cgs .. ")")
    local all = true
    for _, c in ipairs(cgs) do if not gone(c) then all = false end end
    tap.ok(all, "and they are gone")
  else
    tap.skip("cgroups reaped", "no cgroups for an unprivileged user on this host")
    tap.skip("cgroups reaped", "no cgroups for an unprivileged user on this host")
  end
  os.remove(script)
  os.remove(out)
end

-- Unpacking leftovers in the image cache: a dead process's go, a live
-- one's stay.
do
  local cache = assert(require("sbx.images.cache").open(sbx.policy.images))
  local dead = tonumber((L.sh("sh -c 'echo $$'"):match("%d+")))
  local gone_dir = string.format("%s/tmp/%d-reaptest", cache.dir, dead)
  local live_dir = string.format("%s/tmp/%d-reaptest", cache.dir, sbx.core.pid())
  L.sh(string.format("mkdir -p %s/root %s && echo x > %s/root/f", L.q(gone_dir), L.q(live_dir), L.q(gone_dir)))
  local r = L.sh(L.q(bin) .. " reap --backend local --dry-run")
  tap.like(r, "would remove image cache tmp/" .. dead .. "%-reaptest", "sbx reap --dry-run lists a dead process's unpacking leftover")
  tap.ok(gone_dir and sbx.core.path_type(gone_dir) == "dir", "and leaves it")
  r = L.sh(L.q(bin) .. " reap --backend local")
  tap.like(r, "removed image cache tmp/" .. dead .. "%-reaptest %(an unpacking left by a process that is gone%)",
    "sbx reap --backend local removes it")
  tap.ok(not sbx.core.path_type(gone_dir), "it is gone")
  tap.is(sbx.core.path_type(live_dir), "dir", "a live process's unpacking stays")
  L.sh("rm -rf " .. L.q(live_dir))
end

-- The reaper leaves a live owner's boxes alone.
do
  local box = assert(L.box {})
  local r = L.sh(L.q(bin) .. " reap --backend local")
  tap.like(r, "kept %(owner alive%)", "sbx reap keeps a live owner's box")
  tap.is(assert(box:exec("echo ok")).stdout, "ok\n", "which still works")
  box:close()
end

-- A lost agent is a lost box; the lifetime ends a box.
do
  local box = assert(L.box {})
  local running = sbx.spawn(function() return box:exec("sleep 30", { timeout = 60 }) end)
  sbx.sleep(0.3)
  sbx.core.proc.signal(box.handle.pid, "KILL")      -- bubblewrap, from the host
  local r, err, code = sbx.wait(running)
  tap.ok(r == nil and code == "agent_lost", "a command in flight fails with agent_lost (" .. tostring(err) .. ")")
  r, err, code = box:exec("echo hi")
  tap.is(code, "box_gone", "the next command: box_gone (" .. tostring(err) .. ")")
  box:close()
  local short = assert(L.box { lifetime = 1 })
  sbx.sleep(1.6)
  r, err, code = short:exec("echo hi")
  tap.is(code, "box_gone", "past its lifetime the box is gone (" .. tostring(err) .. ")")
  tap.like(tostring(err), "lifetime", "and the message says why")
  tap.ok(gone(short.handle.dir), "and removed")
  short:close()
end

-- restart: the box again from its image.
do
  local box = assert(L.box {})
  assert(box:exec("echo before > /work/f"))
  local ok, err = box.impl.restart(box.handle, sbx.now() + 10)
  tap.ok(ok, "restart (" .. tostring(err) .. ")")
  local r = assert(box:exec("cat /work/f 2>/dev/null || echo fresh"))
  tap.is(r.stdout, "fresh\n", "commands run again, in a box fresh from its image")
  box:close()
end

-- Refusals.
do
  local b, err, code = sbx.box { backend = "local", image = "sbx-no-such-image:1",
    policy = { box = { pull = "never" } } }
  tap.ok(b == nil and code == "image_unavailable" and tostring(err):find("sbx-no-such-image:1", 1, true),
    "an image no source has: image_unavailable, naming it (" .. tostring(err) .. ")")
  b, err, code = sbx.box { backend = "local", image = "rootfs:/nonexistent/dir" }
  tap.ok(b == nil and code == "image_unavailable", "a missing rootfs: " .. tostring(err))
  b, err, code = sbx.box { backend = "local", image = "rootfs:" .. rootfs, transport = "exec" }
  tap.ok(b == nil and code == "unsupported", "transport = \"exec\": " .. tostring(err))
  b, err, code = sbx.box { backend = "local", image = "x", layers = { rootfs, "/proc" } }
  tap.ok(b == nil and code == "launch_failed" and tostring(err):find("sbx%-launch: cannot mount"),
    "a layer the overlay refuses: the launcher's own words (" .. tostring(err) .. ")")
  b, err, code = sbx.box { backend = "local", image = "rootfs:" .. rootfs, ulimits = { nofile = 1e12 // 1 } }
  tap.ok(b == nil and code == "unsupported", "a ulimit above sbx's own hard limit: " .. tostring(err))
  b = assert(sbx.box { backend = "local", image = "rootfs:" .. rootfs, transport = "auto" })
  tap.is(b.transport, "agent", "transport = \"auto\" is the agent")
  b:close()
  if not root then
    -- State that another user owns is refused: sbx executes programs from it.
    b, err, code = sbx.box { backend = "local", image = "rootfs:" .. rootfs,
      policy = { ["local"] = { state_dir = "/var/tmp/sbx-foreign-state/x" } } }
    tap.ok(b == nil and code == "state_dir", "a state directory another user owns is refused: " .. tostring(err))
  else
    L.sh("mkdir -p /var/tmp/sbx-foreign-state/x && chmod 1777 /var/tmp/sbx-foreign-state /var/tmp/sbx-foreign-state/x")
    tap.skip("foreign state directory", "root owns every directory")
  end
end

-- Many boxes at once, and nothing left after.
do
  local tasks, dir = {}, nil
  for i = 1, 12 do
    tasks[i] = sbx.spawn(function()
      local b = assert(L.box {})
      dir = b.handle.dir:match("^(.*)/[^/]+$")
      local r = assert(b:exec("echo " .. i))
      b:close()
      return r.stdout
    end)
  end
  local outs = sbx.gather(tasks)
  local ok = true
  for i = 1, 12 do if outs[i] ~= i .. "\n" then ok = false end end
  tap.ok(ok, "12 boxes made at once each run their own command")
  -- What stays is the spare launcher (policy.local.spares) waiting for the
  -- next box: a record without a pid. Only this process's records count
  -- (other sbx processes may share the state directory).
  local me = "owner.pid " .. sbx.core.pid() .. "\n"
  local function mine()
    local n, left = 0, 0
    for _, id in ipairs(S.list(dir) or {}) do
      local rec = io.open(dir .. "/" .. id .. "/owner")
      local text = rec and rec:read("a") or ""
      if rec then rec:close() end
      if text:find(me, 1, true) then
        n = n + 1
        if not text:find("\npid \n", 1, true) then left = left + 1 end
      end
    end
    return n, left
  end
  tap.ok(eventually(3, function() return select(2, mine()) == 0 end), "and the state directory holds no box after")
  tap.ok(mine() <= sbx.policy["local"].spares, "only the spare launcher waits there")
end

-- A spare launcher removes what it made when its sbx ends, even by kill -9.
do
  local script = os.tmpname() .. ".lua"
  local f = assert(io.open(script, "w"))
  f:write([[
local L = require "local_helper"
local b = assert(L.box {})
b:close()
require("sbx").sleep(0.5)
print("READY") io.stdout:flush()
require("sbx").sleep(120)
]])
  f:close()
  local function spares_of(pid)
    local found = {}
    for _, p in ipairs(L.host_procs("sbx%-launch%-%x+ " .. pid .. " ")) do found[#found + 1] = p end
    return found
  end
  local out = os.tmpname()
  local pid = tonumber((L.sh(string.format("%s run %s > %s 2>&1 & echo $!", L.q(bin), L.q(script), L.q(out)))))
  -- After READY the child's box is closed: the launcher left is its spare.
  eventually(30, function()
    local o = io.open(out)
    local text = o and o:read("a") or ""
    if o then o:close() end
    return text:find("READY", 1, true) and #spares_of(pid) > 0
  end)
  local spare = spares_of(pid)[1] or ""
  local sdir = spare:match("%-%-dir (%S+)")
  local scg = spare:match("%-%-cgroup (%S+)")
  tap.ok(sdir and sbx.core.path_type(sdir), "a child sbx keeps a spare launcher (" .. tostring(sdir) .. ")")
  L.sh("kill -9 " .. pid)
  tap.ok(eventually(5, function() return sdir and gone(sdir) and #spares_of(pid) == 0 end),
    "kill -9 of sbx: the spare is gone, and so is its directory")
  if scg then tap.ok(gone(scg), "and its cgroup") else tap.skip("spare cgroup", "no cgroups here") end
  os.remove(script)
  os.remove(out)
end

L.relay_users(tap, "tests/local_lifecycle_test.lua", image)
tap.done()

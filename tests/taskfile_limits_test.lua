-- needs: docker
-- A stranger's Lua task file against sbx eval's time limits and its
-- environment: a run function that loops forever (also inside xpcall's
-- handler, where hooks are off, or in a pattern that backtracks for hours,
-- in C) is stopped at its task's timeout and its
-- box removed; a chunk that loops is stopped at harness.load_timeout;
-- SIGTERM and SIGINT end sbx while the file's code spins, closing its
-- boxes (exit 128 + N; `sbx reap --dry-run` names none of them); getmetatable("") gives the file a stand-in, not
-- the string table sbx runs on; a task file cannot reach the host through
-- its box options. Bounds here only prove "does not hang" (generous: a
-- loaded machine); nothing asserts a speed.
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"
local json = sbx.json

local dir = H.tmpdir()
local write = H.write
local read = H.slurp
-- A unique task id per run: boxes are found by their sbx.task label.
local tag = string.format("lim%d%d", sbx.core.pid(), math.random(1e6))
local function boxes_of(id)
  local out = H.sh("docker ps -aq --filter label=sbx.task=" .. id)
  local n = 0
  for _ in out:gmatch("%S+") do n = n + 1 end
  return n
end
-- sbx under `timeout -s KILL`: a hang is a failure, not a stuck test.
local HANG = 300
local function eval(args)
  return H.sh(string.format("timeout -s KILL %d %s %s", HANG, H.sbx_bin, args))
end

-- Loops in phase functions ----------------------------------------------------

local spin_id, xp_id, pat_id = tag .. "-spin", tag .. "-xp", tag .. "-pat"
write(dir .. "/spin.lua", string.format([[
local function spin() while true do end end
return {
  { id = %q, box = { image = %q }, timeout = 2,
    run = function(box) box:exec("true") while true do pcall(spin) end end,
    check = "true", outputs = { "/tmp/none" } },
  { id = %q, box = { image = %q }, timeout = 2,
    run = function(box) while true do xpcall(spin, spin) end end,
    check = "true", outputs = { "/tmp/none" } },
  { id = %q, box = { image = %q }, timeout = 2,
    run = function(box) return (box:exec("echo aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").stdout):find(".-.-.-.-.-.-.-.-.-.-b") end,
    check = "true", outputs = { "/tmp/none" } },
}]], spin_id, H.busybox, xp_id, H.busybox, pat_id, H.busybox))
local out, code = eval(string.format("eval %s/spin.lua --out %s/spin.out --concurrency 3", dir, dir))
tap.ok(code ~= 137, "sbx eval of a task whose run never returns ends (not killed)", out)
local by = {}
for line in (read(dir .. "/spin.out") or ""):gmatch("[^\n]+") do
  local r = json.decode(line)
  by[r.id] = r
end
for _, id in ipairs { spin_id, xp_id, pat_id } do
  local r = by[id]
  local run = r and r.phases and r.phases.run
  tap.ok(run and run.timed_out == true, id .. ": its run phase timed out at the task's timeout", r and json.encode(r))
  tap.isnt(r and r.status, "passed", id .. ": and the task did not pass")
  tap.is(boxes_of(id), 0, id .. ": its box is gone")
end

-- A chunk that loops while the file loads.
write(dir .. "/load.lua", "while true do end\n")
write(dir .. "/short.lua", "return { harness = { load_timeout = 1 } }\n")
out, code = eval(string.format("--policy %s/short.lua eval %s/load.lua", dir, dir))
tap.is(code, 2, "a task file whose chunk never returns does not load", out)
tap.like(out, "did not load within", "the error says it ran out of time")

-- Signals while a task file's code spins ------------------------------------

-- Starts sbx eval in the background; returns pid, rcfile, log.
local function start(name, args)
  local pidfile, rcfile, log = dir .. "/" .. name .. ".pid", dir .. "/" .. name .. ".rc", dir .. "/" .. name .. ".log"
  os.execute(string.format("( sh -c 'echo $$ > %s; exec timeout -s KILL %d %s %s' > %s 2>&1; echo $? > %s ) &",
    pidfile, HANG, H.sbx_bin, args, log, rcfile))
  local pid
  local limit = sbx.now() + 60
  while not pid and sbx.now() < limit do
    pid = (read(pidfile) or ""):match("%d+")
    if not pid then sbx.sleep(0.1) end
  end
  return pid, rcfile, log
end
local function wait_rc(rcfile, seconds)
  local limit = sbx.now() + seconds
  while not read(rcfile) and sbx.now() < limit do sbx.sleep(0.1) end
  return tonumber((read(rcfile) or ""):match("%d+"))
end
-- The pid of sbx under `timeout` (the child of the pid started).
local function sbx_pid(pid)
  local limit = sbx.now() + 60
  while sbx.now() < limit do
    local c = H.sh("pgrep -P " .. pid):match("%d+")
    if c then return c end
    sbx.sleep(0.1)
  end
end

for _, sig in ipairs { { "TERM", 143 }, { "INT", 130 } } do
  local id = tag .. "-sig" .. sig[1]:lower()
  write(dir .. "/" .. id .. ".lua", string.format([[
return {
  { id = %q, box = { image = %q }, timeout = 3600,
    run = function(box)
      box:exec("echo spinning > /tmp/started")
      while true do xpcall(function() while true do end end, function() while true do end end) end
    end,
    check = "true", outputs = { "/tmp/none" } },
}]], id, H.busybox))
  local pid, rcfile, log = start(id, string.format("eval %s/%s.lua --out %s/%s.out", dir, id, dir, id))
  local child = pid and sbx_pid(pid)
  -- Wait until its run function spins: it wrote /tmp/started in its box.
  local limit, started, cid = sbx.now() + 120, false, nil
  while not started and sbx.now() < limit do
    cid = H.sh("docker ps -q --filter label=sbx.task=" .. id):match("%x+")
    started = cid and H.sh("docker exec " .. cid .. " cat /tmp/started"):find("spinning") ~= nil
    if not started then sbx.sleep(0.2) end
  end
  local name = cid and H.sh("docker inspect -f '{{.Name}}' " .. cid):match("[%w%-_]+")
  tap.ok(started, "SIG" .. sig[1] .. ": the task's run function is spinning in its box", read(log))
  os.execute(string.format("kill -%s %s", sig[1], tostring(child)))
  local rc = wait_rc(rcfile, 120)
  tap.is(rc, sig[2], string.format("SIG%s ends sbx while the task's code spins (exit %d)", sig[1], sig[2]), read(log))
  tap.is(boxes_of(id), 0, "SIG" .. sig[1] .. ": and its box is removed", read(log))
  local reap = H.sh(H.sbx_bin .. " reap --dry-run")
  tap.ok(name and not reap:find(name, 1, true), "SIG" .. sig[1] .. ": sbx reap has nothing of it (" .. tostring(name) .. ")", reap)
end

-- SIGTERM while the chunk itself spins (nothing to close: it still ends).
write(dir .. "/long.lua", "return { harness = { load_timeout = 3600 } }\n")
do
  local pid, rcfile, log = start("loadspin", string.format("--policy %s/long.lua eval %s/load.lua", dir, dir))
  local child = pid and sbx_pid(pid)
  sbx.sleep(1)
  os.execute("kill -TERM " .. tostring(child))
  tap.is(wait_rc(rcfile, 120), 143, "SIGTERM ends sbx while a task file's chunk spins", read(log))
end

-- The string metatable ------------------------------------------------------

local meta_id = tag .. "-meta"
write(dir .. "/meta.lua", string.format([[
local smt = getmetatable("")
smt.__index.format = function() return "pwned" end
smt.__index.rep = nil
smt.__index = { upper = function() return "pwned" end }
smt.__metatable = "mine"
return {
  { id = %q, box = { image = %q },
    run = function(box)
      local s = getmetatable("")
      s.__index = nil
      return box:exec("echo inside").stdout .. string.format("%%s", "x")
    end,
    check = "true", outputs = { "/tmp/none" } },
}]], meta_id, H.busybox))
out, code = eval(string.format("eval %s/meta.lua --out %s/meta.out", dir, dir))
tap.is(code, 0, "a task file that rewrites getmetatable('') still runs", out)
local r = json.decode((read(dir .. "/meta.out") or "{}"):match("[^\n]*"))
tap.is(r.phases and r.phases.run and r.phases.run.value, "inside\npwned",
  "its own string.format is its to change (its environment's)")
tap.is(r.status, "passed", "and sbx's strings are untouched: it reports the task")
tap.like(out, "passed%s+1", "and prints its summary")

-- Task options that reach the host ------------------------------------------

local host = {
  { box = { image = "host" }, want = "image:host" },
  { box = { image = "rootfs:/etc" }, want = "image:rootfs" },
  { box = { image = "oci:/var/lib" }, want = "image:path" },
  { box = { image = "docker-archive:/etc/shadow" }, want = "image:path" },
  { box = { network = "host" }, want = "network:host" },
  { box = { layers = { "/etc" } }, want = "layers" },
}
local lines = {}
for i, t in ipairs(host) do
  lines[i] = json.encode { id = tag .. "-host" .. i, box = t.box, run = "cat /etc/shadow" }
end
write(dir .. "/host.jsonl", table.concat(lines, "\n") .. "\n")
for _, be in ipairs { "docker", "local" } do
  out, code = eval(string.format("eval %s/host.jsonl --backend %s --out %s/host-%s.out", dir, be, dir, be))
  tap.is(code, 1, be .. ": a task file that reaches for the host makes eval exit 1", out)
  local got = {}
  for line in (read(dir .. "/host-" .. be .. ".out") or ""):gmatch("[^\n]+") do
    local x = json.decode(line)
    got[x.id] = x
  end
  for i, t in ipairs(host) do
    local x = got[tag .. "-host" .. i]
    tap.ok(x and x.status == "error" and tostring(x.error):find(t.want, 1, true)
      and tostring(x.error):find("task_host_access", 1, true),
      string.format("%s: %s is an error naming %s and the knob", be, json.encode(t.box), t.want), x and x.error)
    tap.ok(not (x and x.phases and x.phases.run), "and nothing ran")
  end
end

os.execute("rm -rf " .. dir)
tap.done()

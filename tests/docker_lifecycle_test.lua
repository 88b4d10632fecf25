-- needs: docker
-- Box lifecycle against the real daemon: what the container looks like,
-- destroy paths (close, <close>, gc, exit, signals), the reaper after
-- kill -9, and clear errors for a missing daemon or image.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local box = H.box { memory = 256 * 1024 * 1024, cpus = 0.5, pids = 100, env = { BOXVAR = "1" }, labels = { team = "evals" } }
local info = H.container(box.id)
local labels = info.Config.Labels
tap.is(labels["sbx.owner.pid"], tostring(sbx.core.pid()), "label: owner pid")
tap.ok(tonumber(labels["sbx.owner.start"]) ~= nil, "label: owner start time")
tap.ok(labels["sbx.owner.host"] ~= nil and labels["sbx.owner.host"] ~= "", "label: owner host")
tap.ok(tonumber(labels["sbx.created"]) ~= nil, "label: creation time")
tap.is(labels["sbx.version"], sbx.version, "label: sbx version")
tap.ok(tonumber(labels["sbx.deadline"]) > tonumber(labels["sbx.created"]), "label: deadline after creation")
tap.is(labels.team, "evals", "user labels kept")
local hc = info.HostConfig
tap.is(hc.Init, true, "an init process is PID 1")
tap.is(hc.Memory, 256 * 1024 * 1024, "memory limit")
tap.is(hc.MemorySwap, 256 * 1024 * 1024, "no swap beyond it")
tap.is(hc.NanoCpus, 500000000, "CPU quota")
tap.is(hc.PidsLimit, 100, "pids limit")
tap.is(hc.NetworkMode, "none", "network none by default")
tap.like(table.concat(hc.SecurityOpt or {}, ","), "no%-new%-privileges", "no-new-privileges")
tap.like(table.concat(hc.CapDrop or {}, ","), "NET_RAW", "dangerous capabilities dropped")
tap.is(info.Config.WorkingDir, "/work", "working dir from policy")
tap.like(table.concat(info.Config.Env, ","), "BOXVAR=1", "box env")
local r = assert(box:exec("cat /proc/1/cmdline | tr '\\0' ' '; grep NoNewPrivs /proc/self/status"))
tap.like(r.stdout, "^/%S+%-init %-%- sleep 86400", "PID 1 is init, its child sleeps for the lifetime cap")
tap.like(r.stdout, "NoNewPrivs:%s+1", "no-new-privileges seen inside")

local id = box.id
tap.ok(box:close(), "close succeeds")
tap.is(H.container(id), nil, "the container is gone after close")
tap.ok(box:close(), "close is idempotent")
tap.checkerr("closed box", function() box:spawn("true") end)

do
  local b <close> = H.box { image = H.busybox }
  id = b.id
end
tap.is(H.container(id), nil, "<close> removes the box at scope end")

local function make_and_drop()
  local b = H.box { image = H.busybox }
  return b.id
end
id = make_and_drop()
collectgarbage(); collectgarbage()
for _ = 1, 50 do
  if not H.container(id) then break end
  sbx.sleep(0.1)
end
tap.is(H.container(id), nil, "a garbage-collected box is removed")

-- Errors a user can act on.
local b, err, code = sbx.box { image = H.busybox, docker_host = "unix:///tmp/sbx-no-daemon.sock" }
tap.is(b, nil, "no box without a daemon")
tap.is(code, "daemon_unavailable", "code daemon_unavailable")
tap.like(err, "no Docker daemon answered; tried: unix:///tmp/sbx%-no%-daemon%.sock", "message names what was tried")
b, err, code = sbx.box { image = H.busybox, docker_host = "tcp://127.0.0.1:1" }
tap.is(code, "daemon_unavailable", "a refused TCP daemon too (" .. tostring(err) .. ")")
b, err, code = sbx.box { image = "sbx-no-such-image:1" }
tap.is(code, "image_unavailable", "a missing image that cannot be pulled")
tap.like(err, "image 'sbx%-no%-such%-image:1' is not available locally and could not be pulled", "says which image and why")
b, err, code = sbx.box { image = "sbx-no-such-image:1", pull = "never" }
tap.like(err, 'pull = "never"', "pull=never does not try the registry")
tap.checkerr("unknown backend", function() sbx.box { backend = "nope" } end)

-- A host that exits, or gets a signal, removes its boxes.
local function child(script, action)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(script)
  f:close()
  local idfile = os.tmpname()
  local pid = H.sh(string.format("SBX_IDFILE=%s %s run %s >/dev/null 2>&1 & echo $!", idfile, H.sbx_bin, path)):match("%d+")
  local cid
  for _ = 1, 100 do
    local fh = io.open(idfile)
    cid = fh and fh:read("l")
    if fh then fh:close() end
    if cid and #cid > 10 then break end
    sbx.sleep(0.1)
  end
  return pid, cid
end

local holder = [[
local sbx = require "sbx"
local b = assert(sbx.box { image = "]] .. H.busybox .. [[" })
local f = io.open(os.getenv("SBX_IDFILE"), "w"); f:write(b.id, "\n"); f:close()
sbx.sleep(120)
]]

for _, sig in ipairs { "TERM", "INT" } do
  local pid, cid = child(holder)
  tap.ok(cid and H.container(cid) ~= nil, "child host made a box (SIG" .. sig .. " case)")
  H.sh("kill -" .. sig .. " " .. pid)
  for _ = 1, 100 do
    if H.sh("kill -0 " .. pid .. " 2>/dev/null; echo $?"):match("1") then break end
    sbx.sleep(0.1)
  end
  tap.is(cid and H.container(cid), nil, "SIG" .. sig .. " to the host removes its box")
end

-- A signal while boxes are still being created leaves nothing behind.
do
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write([[
local sbx = require "sbx"
for i = 1, 5 do sbx.spawn(function() sbx.box { image = "]] .. H.busybox .. [[" }; sbx.sleep(60) end) end
sbx.sleep(60)
]])
  f:close()
  for _, delay in ipairs { 0.05, 0.15, 0.3 } do
    local cpid = H.sh(string.format("%s run %s >/dev/null 2>&1 & echo $!", H.sbx_bin, path)):match("%d+")
    sbx.sleep(delay)
    H.sh("kill -INT " .. cpid)
    for _ = 1, 100 do
      if H.sh("kill -0 " .. cpid .. " 2>/dev/null; echo $?"):match("1") then break end
      sbx.sleep(0.1)
    end
    local list = H.containers { "sbx.owner.pid=" .. cpid }
    tap.is(#list, 0, string.format("SIGINT %.2f s into creating 5 boxes leaves none", delay))
  end
end

local normal = [[
local sbx = require "sbx"
local b = assert(sbx.box { image = "]] .. H.busybox .. [[" })
local f = io.open(os.getenv("SBX_IDFILE"), "w"); f:write(b.id, "\n"); f:close()
error("the script fails")
]]
local exiting = [[
local sbx = require "sbx"
local b = assert(sbx.box { image = "]] .. H.busybox .. [[" })
local f = io.open(os.getenv("SBX_IDFILE"), "w"); f:write(b.id, "\n"); f:close()
os.exit(3)
]]
local _, ecid = child(exiting)
for _ = 1, 50 do
  if not H.container(ecid) then break end
  sbx.sleep(0.1)
end
tap.is(ecid and H.container(ecid), nil, "os.exit in a script still removes its box")

local _, cid = child(normal)
for _ = 1, 50 do
  if not H.container(cid) then break end
  sbx.sleep(0.1)
end
tap.is(cid and H.container(cid), nil, "a script that raises still removes its box")

local pid
pid, cid = child(holder)
tap.ok(cid and H.container(cid) ~= nil, "child host made a box (kill -9 case)")
H.sh("kill -9 " .. pid)
sbx.sleep(0.2)
tap.ok(H.container(cid) ~= nil, "after kill -9 the box is still there")
local out = H.sh(H.sbx_bin .. " reap --dry-run")
tap.like(out, "would remove sbx%-%x+ %(owner process " .. pid .. " is gone%)", "sbx reap --dry-run names the orphan")
tap.ok(H.container(cid) ~= nil, "and leaves it in place")
out = H.sh(H.sbx_bin .. " reap")
tap.like(out, "removed sbx%-%x+ %(owner process " .. pid .. " is gone%)", "sbx reap names what it removed")
tap.is(H.container(cid), nil, "and the box is gone")
local live = H.box { image = H.busybox }
out = H.sh(H.sbx_bin .. " reap")
tap.ok(H.container(live.id) ~= nil, "reap keeps boxes whose owner is alive")
tap.like(out, "kept", "and says so")
live:close()

tap.done()

-- needs: docker, local, root
-- The local backend where users run it: sbx inside containers the test
-- starts (tests/local_container_image.sh builds the image from the built
-- tree and the locally built sbx-debian:12; no registry, no daemon inside),
-- as root and as a user made by `useradd -m`:
--   * seccomp and AppArmor unconfined (/proc masked, Docker's default):
--     the README's first command works; the box's /proc is copies and the
--     agent still kills a command's whole tree (setsid included) through
--     the container's /proc; the plain user's newuidmap fails there and the
--     box falls back to one id, which box.limits.ids says;
--   * policy.local.proc = "mount" there: refused, one line naming
--     --security-opt systempaths=unconfined and the policy switch;
--   * also systempaths=unconfined: a proc of the box's own;
--   * Docker's default seccomp profile: one line, no Lua traceback;
--   * sbx as PID 1 (no --init): no zombie after many boxes.
local tap = require "tap"
local H = require "helper"

local build = (H.sbx_bin:match("^(.*)/sbx$")) or "build"

-- The containers are Docker's, whatever daemon the suite tests: what is
-- under test is sbx inside them (make test-podman points DOCKER_HOST at
-- Podman, whose service the docker CLI cannot attach to: "unable to
-- upgrade to tcp, received 409").
local DOCKER = "env -u DOCKER_HOST docker"
local tag = "sbx-local-container-test:latest"

-- What the test image is built from: a daemon to build and run it, the
-- locally built sbx-debian:12 and its `docker save` archive (both made by
-- scripts/build-images.sh). Without them this file says so and skips.
local ARCHIVE = "/var/lib/sbx/images/sbx-debian:12.tar"
local missing
if select(2, H.sh("timeout 20 " .. DOCKER .. " version --format '{{.Server.Version}}'")) ~= 0 then
  missing = "no Docker daemon answers (docker version)"
elseif select(2, H.sh(DOCKER .. " image inspect sbx-debian:12 >/dev/null")) ~= 0 then
  missing = "the daemon has no sbx-debian:12 image (scripts/build-images.sh builds it)"
elseif require("sbx").core.path_type(ARCHIVE) ~= "file" then
  missing = ARCHIVE .. " is missing (scripts/build-images.sh writes it)"
end
if missing then
  tap.skip("sbx in containers the test starts", missing)
  tap.done()
  return
end

local out, code = H.sh("tests/local_container_image.sh " .. build .. " " .. tag)
tap.is(code, 0, "the test image was built from this tree: " .. out:sub(1, 300))

local UNCONFINED = "--security-opt seccomp=unconfined --security-opt apparmor=unconfined"

local function script(text)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  H.sh("chmod 644 " .. path)
  return path
end

-- Runs sbx in a container: sbx ARGS with opts (docker run options); a
-- script file is mounted at /t.lua. Output (stdout and stderr) and status.
local function run(opts, user, args, file)
  local mount = file and ("-v " .. file .. ":/t.lua:ro ") or ""
  return H.sh(string.format("timeout 300 %s run --rm --network none %s -u %s %s%s sbx %s", DOCKER,
    opts, user, mount, tag, args))
end

local probe = script([[
local sbx = require "sbx"
local b = assert(sbx.box { image = "sbx-debian:12" })
print("backend=" .. b.backend_name)
print("proc=" .. b.limits.proc.note)
print("ids=" .. b.limits.ids.note)
-- A command that leaves a setsid'd child behind and times out.
local r = assert(b:exec("sleep 171 & setsid sleep 172 & echo started; sleep 30", { timeout = 1 }))
print("timed_out=" .. tostring(r.timed_out))
-- The container's /proc, seen by sbx: are the box's sleeps gone?
local function left()
  local n = 0
  local p = io.popen("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
  for w in p:read("a"):gmatch("sleep 17[12]") do n = n + 1 end
  p:close()
  return n
end
local t = sbx.core.now()
while left() > 0 and sbx.core.now() - t < 10 do sbx.sleep(0.1) end
print("left=" .. left())
print("box_proc=" .. b:exec("ls /proc | tr '\\n' ' '; test -e /proc/self && echo self").stdout)
b:close()
]])

for _, user in ipairs { "root", "plain" } do
  out, code = run(UNCONFINED, user, "run lua/examples/hello.lua")
  tap.is(code, 0, user .. ", /proc masked: the README's first command exits 0\n" .. out)
  tap.like(out, "exit 0 in %d+ ms:\nLinux", user .. ": it ran a command in a box")
  tap.like(out, "Exit code: 3", user .. ": and the example ran to its end")

  out = run(UNCONFINED, user, "run /t.lua", probe)
  tap.like(out, "backend=local", user .. ": the box is local\n" .. out)
  tap.like(out, "proc=copies", user .. ": box.limits.proc says the box's /proc is copies")
  tap.like(out, "box_proc=[^\n]*cpuinfo[^\n]*meminfo", user .. ": the box's /proc holds the copies")
  tap.ok(not out:find("box_proc=[^\n]*self"), user .. ": and no /proc/self")
  tap.like(out, "timed_out=true", user .. ": the command timed out")
  tap.like(out, "left=0", user .. ": its tree (a setsid'd child too) was killed through the container's /proc")
  if user == "root" then
    tap.like(out, "ids=65536 ids", "root: the box maps 65536 ids")
  else
    tap.like(out, "ids=a single id[^\n]*newuidmap failed here", "plain: newuidmap failed, the box has one id, and box.limits.ids says why")
  end
end

-- The weaker /proc refused by policy: one line with the fix.
local strict = script([[
local sbx = require "sbx"
sbx.use_policy { ["local"] = { proc = "mount" } }
assert(sbx.box { image = "sbx-debian:12" })
]])
out, code = run(UNCONFINED, "root", "run /t.lua", strict)
tap.is(code, 1, "proc = \"mount\" in a masked container: the box is refused (exit 1)")
tap.like(out, "systempaths=unconfined", "the message names --security-opt systempaths=unconfined\n" .. out)
tap.like(out, "proc = \"copy\"", "and the policy switch")
tap.ok(not out:find("traceback"), "without a Lua traceback")

-- Unmasked: a proc of the box's own.
out = run(UNCONFINED .. " --security-opt systempaths=unconfined", "root", "run /t.lua", probe)
tap.like(out, "proc=a proc of the box's own", "systempaths=unconfined: the box mounts its own /proc\n" .. out)
tap.like(out, "box_proc=[^\n]*self", "with /proc/self")
tap.like(out, "left=0", "and the tree is killed there too")

-- Docker's default seccomp profile: no user namespaces.
for _, user in ipairs { "root", "plain" } do
  out, code = run("", user, "run lua/examples/hello.lua")
  tap.is(code, 1, user .. ", default seccomp: sbx exits 1")
  local lines = select(2, out:gsub("\n", "\n"))
  tap.is(lines, 1, user .. ": with one line\n" .. out)
  tap.like(out, "needs user namespaces", user .. ": which says user namespaces are refused")
  tap.like(out, "seccomp=unconfined", user .. ": and names the options")
end

-- sbx as PID 1: every finished box's agent is reaped.
local many = script([[
local sbx = require "sbx"
assert(sbx.core.pid() ~= 1, "sbx runs under its own init")
for i = 1, 20 do
  local b = assert(sbx.box { image = "sbx-debian:12" })
  assert(b:exec("true").exit_code == 0)
  b:close()
end
local function zombies()
  local n = 0
  local p = io.popen("cat /proc/[0-9]*/stat 2>/dev/null")
  for st in p:read("a"):gmatch("%) (%a) ") do if st == "Z" then n = n + 1 end end
  p:close()
  return n
end
local t = sbx.core.now()
while zombies() > 0 and sbx.core.now() - t < 10 do sbx.sleep(0.1) end
print("zombies=" .. zombies())
]])
out, code = run(UNCONFINED, "root", "run /t.lua", many)
tap.is(code, 0, "as PID 1: 20 boxes ran\n" .. out)
tap.like(out, "zombies=0\n", "and no zombie is left")
out, code = H.sh("timeout 60 " .. DOCKER .. " run --rm --network none " .. tag .. " sh -c 'sbx run /nonexistent.lua; echo rc=$?'")
tap.like(out, "rc=1", "sbx's status comes through its init")

for _, f in ipairs { probe, strict, many } do os.remove(f) end
tap.done()

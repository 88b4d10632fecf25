-- A Docker box's whole life beside `docker run --rm`, on this machine, in
-- one run (scripts/bench-docker-run.sh): create + one exec of /bin/true +
-- destroy on the agent transport (the agent bound read-only from the host,
-- and uploaded per box as for a remote daemon) and on the exec transport,
-- and the docker CLI's `docker run --rm` with the same command, bare and
-- with the settings sbx gives a box. Taken in turns, so that a busy
-- machine weighs on all of them alike. Prints a markdown table of medians
-- and p90s.
--   sbx run scripts/bench/docker_run.lua [N]
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local n = tonumber(arg[1]) or 20

local function sorted(list) local t = { table.unpack(list) } table.sort(t) return t end
local function median(list) local t = sorted(list) return t[math.max(1, math.ceil(#t / 2))] end
local function pct(list, q) local t = sorted(list) return t[math.max(1, math.ceil(#t * q))] end
local function ms(s) return string.format("%.0f ms", s * 1000) end
local function mp(list) return ms(median(list)) .. " (p90 " .. ms(pct(list, 0.9)) .. ")" end
local function load() return (io.open("/proc/loadavg"):read("l") or ""):match("^(%S+ %S+ %S+)") end

local function find(name)
  for dir in (os.getenv("PATH") .. ":/usr/sbin:/sbin"):gmatch("[^:]+") do
    if sbx.core.path_type(dir .. "/" .. name) == "file" then return dir .. "/" .. name end
  end
end
local docker = assert(find("docker"), "the docker CLI is not installed")

-- A program run to its end (core.proc.spawn): seconds.
local function run(argv)
  local t0 = sbx.now()
  local p, s = assert(sbx.core.proc.spawn { argv = argv, stdout = false, stderr = true,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } } })
  local info = assert(p:wait(120))
  s:wait(5)
  if info.status ~= 0 then error(table.concat(argv, " ") .. " failed: " .. s:captured("stderr")) end
  return sbx.now() - t0
end

-- The settings sbx's default policy gives a box (scripts/bench.sh's CLI_OPTS).
local BOX_OPTS = { "--init", "--network", "none", "--memory", "1g", "--memory-swap", "1g", "--cpus", "1",
  "--pids-limit", "512", "--cap-drop", "NET_RAW", "--cap-drop", "MKNOD", "--cap-drop", "AUDIT_WRITE",
  "--cap-drop", "SETFCAP", "--cap-drop", "SYS_CHROOT", "--security-opt", "no-new-privileges",
  "--label", "sbx-bench=" .. C.run_id }

local function docker_run(opts)
  local argv = { docker, "run", "--rm" }
  for _, o in ipairs(opts) do argv[#argv + 1] = o end
  argv[#argv + 1] = C.image
  argv[#argv + 1] = "/bin/true"
  return run(argv)
end

-- One box's life: create, one exec of /bin/true, destroy. -> seconds,
-- the transport it ran on, whether its agent was bound.
local function life(transport, bind)
  sbx.use_policy { docker = { agent_bind = bind } }
  local t0 = sbx.now()
  local b = C.box { backend = "docker", transport = transport }
  C.exec_ok(b, { "/bin/true" })
  local got, bound = b.transport, b.handle and b.handle.agent_bound ~= nil
  b:close()
  return sbx.now() - t0, got, bound
end

local load0 = load()
-- Warm up: the image's facts, the host's agent file, the daemon's caches.
life("agent", true); life("agent", false); life("exec", true)
docker_run { "--network", "none" }

local kinds = {
  { key = "bound", label = "sbx, agent transport, agent bound from the host: create + exec + destroy",
    f = function() return life("agent", true) end, want = { "agent", true } },
  { key = "upload", label = "sbx, agent transport, agent uploaded per box (a remote daemon's way)",
    f = function() return life("agent", false) end, want = { "agent", false } },
  { key = "exec", label = "sbx, exec transport: create + exec + destroy",
    f = function() return life("exec", true) end, want = { "exec" } },
  { key = "run", label = "`docker run --rm --network none IMAGE /bin/true`",
    f = function() return docker_run { "--network", "none" } end },
  { key = "run_box", label = "`docker run --rm` with sbx's box settings (init, limits, caps)",
    f = function() return docker_run(BOX_OPTS) end },
}
local t = {}
for _, k in ipairs(kinds) do t[k.key] = {} end
for i = 1, n do
  for _, k in ipairs(kinds) do
    local s, tr, bound = k.f()
    if k.want and (tr ~= k.want[1] or (k.want[2] ~= nil and bound ~= k.want[2])) then
      error(string.format("%s: ran on %s (bound %s)", k.key, tostring(tr), tostring(bound)))
    end
    t[k.key][i] = s
  end
end
sbx.use_policy { docker = { agent_bind = true } }

print(string.format("load average %s at the start, %s at the end; n=%d each, in turns", load0, load(), n))
print("| measure | median (p90) | / `docker run --rm` |")
print("|---|---|---|")
local base = median(t.run)
for _, k in ipairs(kinds) do
  print(string.format("| %s | %s | %.2fx |", k.label, mp(t[k.key]), median(t[k.key]) / base))
end

-- 1 GiB (or BYTES) through one command, beside its peers, in one run, the
-- kinds taken in turns: the Docker backend (agent and exec transports)
-- beside `docker exec` through the CLI, and the local backend beside the
-- floor (the same program writing into one and into two host pipes: the
-- local box's output crosses two, the command's and the agent's channel).
-- Every row is the same program, `head -c BYTES /dev/zero`, from IMAGE
-- (busybox's head writes 4 KiB at a time and is itself the limit at about
-- 0.1 GB/s: use an image with GNU coreutils). Prints a markdown table of
-- medians with sbx's own CPU seconds per run.
--   sbx run scripts/bench/output_peers.lua IMAGE BYTES RUNS
local sbx = require "sbx"
local image = arg[1] or "sbx-debian:12"
local bytes = math.tointeger(tonumber(arg[2])) or 1073741824
local runs = math.tointeger(tonumber(arg[3])) or 5
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")

local function cpu()
  local f = assert(io.open("/proc/self/stat"))
  local s = f:read("a")
  f:close()
  local fields = {}
  for x in s:match("%) (.*)"):gmatch("%S+") do fields[#fields + 1] = x end
  return (tonumber(fields[12]) + tonumber(fields[13])) / 100   -- USER_HZ: 100 on Linux
end

-- A shell pipeline on the host, to its end: seconds.
local function host(cmd)
  local t0 = sbx.now()
  local p = assert(sbx.core.proc.spawn { argv = { "sh", "-c", cmd }, stdout = false, stderr = false })
  local info = assert(p:wait(600))
  assert(info.status == 0, cmd .. " failed")
  return sbx.now() - t0
end

local cmd = "head -c " .. bytes .. " /dev/zero"
local kinds, samples, cpus = {}, {}, {}
local function kind(name, fn) kinds[#kinds + 1] = { name = name, fn = fn }; samples[name], cpus[name] = {}, {} end

local docker_ok = require("sbx.backends.docker").connect() ~= nil
local boxes = {}
if docker_ok then
  boxes.agent = C.box { backend = "docker", image = image, transport = "agent" }
  boxes.exec = C.box { backend = "docker", image = image, transport = "exec" }
  kind("sbx, Docker backend, agent transport", function() return boxes.agent:exec(cmd, { timeout = 600 }) end)
  kind("sbx, Docker backend, exec transport", function() return boxes.exec:exec(cmd, { timeout = 600 }) end)
  local id = boxes.exec.id
  kind("the docker CLI: `docker exec BOX head -c N /dev/zero`, piped to `cat`", function()
    return host("docker exec " .. id .. " " .. cmd .. " | cat > /dev/null")
  end)
end
boxes["local"] = C.box { backend = "local", image = image }
kind("sbx, local backend (agent)", function() return boxes["local"]:exec(cmd, { timeout = 600 }) end)
kind("the floor: `head -c N /dev/zero`, piped to `cat`, on the host", function() return host(cmd .. " | cat > /dev/null") end)
kind("the floor, two pipes: the same through two `cat`s", function()
  return host(cmd .. " | cat | cat > /dev/null")
end)

for _, b in pairs(boxes) do b:exec("true") end
for _ = 1, runs do
  for _, k in ipairs(kinds) do
    local t0, c0 = sbx.now(), cpu()
    local r = k.fn()
    local dt, dc = sbx.now() - t0, cpu() - c0
    if type(r) == "table" then
      assert(r.stdout_bytes == bytes, k.name .. ": " .. tostring(r.stdout_bytes) .. " bytes, not " .. bytes)
      cpus[k.name][#cpus[k.name] + 1] = dc
    end
    samples[k.name][#samples[k.name] + 1] = dt
    C.full_gc()
  end
end
for _, b in pairs(boxes) do b:close() end

local function median(t)
  local s = { table.unpack(t) }
  table.sort(s)
  return s[math.max(1, math.ceil(#s / 2))]
end
print(string.format("# %d bytes through one command, %s, %d runs each in turns, load %s", bytes, image, runs,
  (io.open("/proc/loadavg"):read("l") or ""):match("^(%S+ %S+ %S+)")))
print("| what | median time | rate | sbx's CPU |")
print("|---|---|---|---|")
for _, k in ipairs(kinds) do
  local t = median(samples[k.name])
  print(string.format("| %s | %.2f s | %.2f GB/s | %s |", k.name, t, bytes / t / 1e9,
    #cpus[k.name] > 0 and string.format("%.2f s", median(cpus[k.name])) or "-"))
end

-- What backend = "auto" chooses between, per box, on this machine: create +
-- one exec + destroy on the local backend and on Docker (agent transport),
-- one box after another, and N tasks (create, one `python3 -c` or `sh -c`
-- command, destroy) at concurrency C, as a grading harness runs them
-- (scripts/bench-auto.sh). Prints a markdown table of medians and p90s.
--   sbx run scripts/bench/auto.lua IMAGE [SEQ_N] [TASKS] [CONCURRENCY]
local sbx = require "sbx"
local image = arg[1] or "sbx-debian:12"
local n = tonumber(arg[2]) or 20
local tasks = tonumber(arg[3]) or 64
local conc = tonumber(arg[4]) or 8

local function sorted(list) local t = { table.unpack(list) } table.sort(t) return t end
local function pct(list, q) local t = sorted(list) return t[math.max(1, math.ceil(#t * q))] end
local function ms(s) return string.format("%.1f ms", s * 1000) end
local function mp(list) return ms(pct(list, 0.5)) .. " (p90 " .. ms(pct(list, 0.9)) .. ")" end
local function load() return (io.open("/proc/loadavg"):read("l") or ""):match("^(%S+ %S+ %S+)") end

local function one(backend, cmd)
  local t0 = sbx.now()
  local b = assert(sbx.box { backend = backend, image = image })
  local r = assert(b:exec(cmd))
  assert(r.exit_code == 0, r.stderr)
  b:close()
  return sbx.now() - t0
end

local picked = require("sbx.box").backend_name("auto", { image = image })
print(string.format("# image %s, load %s; backend = \"auto\" picks %s here", image, load(), picked))
print("| measure | local | docker |")
print("|---|---|---|")
local seq = { ["local"] = {}, docker = {} }
one("local", "true") one("docker", "true")       -- warm: image cache, daemon
for _ = 1, n do
  for _, be in ipairs { "local", "docker" } do table.insert(seq[be], one(be, "true")) end
end
print(string.format("| create + one exec of `true` + destroy, one box after another (n=%d) | %s | %s |", n,
  mp(seq["local"]), mp(seq.docker)))

local cmd = "command -v python3 >/dev/null && python3 -c 'print(sum(range(10)))' || echo 45"
local walls, per = {}, {}
for _, be in ipairs { "local", "docker" } do
  per[be] = {}
  local next_i, t0 = 0, sbx.now()
  local workers = {}
  for w = 1, conc do
    workers[w] = sbx.spawn(function()
      while next_i < tasks do
        next_i = next_i + 1
        table.insert(per[be], one(be, cmd))
      end
    end)
  end
  for _, w in ipairs(workers) do w:join() end
  walls[be] = sbx.now() - t0
end
print(string.format("| %d tasks at concurrency %d: wall | %.2f s | %.2f s |", tasks, conc, walls["local"], walls.docker))
print(string.format("| the same, per task | %s | %s |", mp(per["local"]), mp(per.docker)))
print(string.format("# load after: %s", load()))

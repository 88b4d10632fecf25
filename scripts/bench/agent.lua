-- The agent transport beside the exec transport, the docker CLI and the
-- physical floor, on this machine, in one run (scripts/bench-agent.sh).
-- Prints a markdown table of medians and the notes behind it.
--   sbx run scripts/bench/agent.lua [N]
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local n = tonumber(arg[1]) or 200

local function median(list)
  table.sort(list)
  return list[math.max(1, math.ceil(#list / 2))]
end
local function pct(list, q)
  table.sort(list)
  return list[math.max(1, math.ceil(#list * q))]
end
local function ms(s) return string.format("%.2f ms", s * 1000) end
local rows = {}
local function row(...) rows[#rows + 1] = "| " .. table.concat({ ... }, " | ") .. " |" end

local function sh(cmd)
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  return out
end

-- Sequential exec of /bin/true.
local function seq_true(box, count)
  local times = {}
  for _ = 1, 5 do C.exec_ok(box, { "/bin/true" }) end
  for i = 1, count do
    local t0 = sbx.now()
    C.exec_ok(box, { "/bin/true" })
    times[i] = sbx.now() - t0
  end
  return times
end

local agent = C.box { transport = "agent" }
local exec = C.box { transport = "exec" }
assert(agent.transport == "agent", "the agent did not start: " .. tostring(agent.transport_reason))

local ta = seq_true(agent, n)
local te = seq_true(exec, math.min(n, 40))
local cli = {}
for i = 1, 30 do
  local t0 = sbx.now()
  sh("docker exec " .. exec.id .. " /bin/true")
  cli[i] = sbx.now() - t0
end
-- The floor: fork+exec of /bin/true inside the box, 1000 times in a loop.
local f0 = sbx.now()
C.exec_ok(agent, "i=0; while [ $i -lt 1000 ]; do /bin/true; i=$((i+1)); done")
local floor = (sbx.now() - f0) / 1000     -- seconds per fork+exec (one command's overhead spread over 1000)
local ma, me, mc = median(ta), median(te), median(cli)
row("exec `/bin/true`, sequential, agent (median, p90)", ms(ma) .. ", " .. ms(pct(ta, 0.9)), "n=" .. n)
row("the same, exec transport", ms(me), "n=" .. #te)
row("the same, `docker exec` through the CLI", ms(mc), "n=30")
row("ratio CLI / agent", string.format("%.1fx", mc / ma), "")
row("floor: fork+exec of `/bin/true` in the box", ms(floor), "1000 in a shell loop")

-- Timeout kill: deadline to result, nothing left running.
local kt = {}
for i = 1, 10 do
  local r = assert(agent:exec("sleep 100 & sleep 101; echo never", { timeout = 0.3 }))
  kt[i] = r.duration - 0.3
end
local left = agent:exec("ps | grep -c 'sleep 10[01]' || true").stdout
row("timeout kill, deadline to result (agent)", ms(median(kt)) .. " (max " .. ms(pct(kt, 1)) .. ")",
  "left running afterwards: " .. tonumber(left))

-- 16 boxes x 200 execs from coroutines.
local boxes = {}
for i = 1, 16 do boxes[i] = C.box { transport = "agent" } end
local t0 = sbx.now()
local tasks = {}
for i = 1, 16 do
  tasks[i] = sbx.spawn(function()
    for _ = 1, 200 do C.exec_ok(boxes[i], { "/bin/true" }) end
  end)
end
sbx.gather(tasks)
local rate = 16 * 200 / (sbx.now() - t0)
row("16 boxes x 200 execs from coroutines, agent", string.format("%.0f execs/s", rate), "")

-- Host memory per idle box, agent and exec: RSS and Lua heap growth over
-- IDLE boxes (hundreds, as a harness holds them; a few boxes mostly
-- measure the allocator's slack).
local IDLE = tonumber(os.getenv("BENCH_IDLE")) or 200
for _, tr in ipairs { "agent", "exec" } do
  C.full_gc()
  local rss0, lua0 = C.status_kb("VmRSS"), collectgarbage("count")
  local idle = {}
  for i = 1, IDLE do idle[i] = C.box { transport = tr } end
  C.full_gc()
  row("host memory per idle box, " .. tr, string.format("%.1f KB", (C.status_kb("VmRSS") - rss0) / IDLE),
    string.format("%d boxes; Lua heap %.1f KB of it", IDLE, (collectgarbage("count") - lua0) / IDLE))
  for _, b in ipairs(idle) do b:close() end
end
for _, b in ipairs(boxes) do b:close() end

-- 1 GiB through one command, both transports.
for _, pair in ipairs { { "agent", agent }, { "exec", exec } } do
  C.full_gc()
  local _, hwm0 = C.status_kb("VmRSS"), C.status_kb("VmHWM")
  local s0 = sbx.now()
  local r = assert(pair[2]:exec("head -c 1073741824 /dev/zero"))
  local dt = sbx.now() - s0
  assert(r.stdout_bytes == 1073741824)
  row("1 GiB through one command, " .. pair[1], string.format("%.2f s", dt),
    string.format("peak RSS +%d KB", C.status_kb("VmHWM") - hwm0))
end

agent:close()
exec:close()
print("| measure | value | note |")
print("|---|---|---|")
print(table.concat(rows, "\n"))

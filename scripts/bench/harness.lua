-- The eval harness's own cost: N tasks at concurrency C through
-- sbx.harness.run, beside the same boxes and commands driven by hand
-- (sbx.spawn + a semaphore), on the same daemon. Prints one line of
-- key=value numbers for scripts/bench-harness.sh.
--   sbx run scripts/bench/harness.lua N C IMAGE MODE    (MODE: harness | bare)
local sbx = require "sbx"
local n, c, image, mode = tonumber(arg[1]) or 200, tonumber(arg[2]) or 16, arg[3] or "sbx-busybox:latest", arg[4] or "harness"

local function median(t)
  table.sort(t)
  return t[math.max(1, math.ceil(#t / 2))] or 0
end

local t0 = sbx.now()
local per_task = {}
if mode == "harness" then
  local tasks = {}
  for i = 1, n do tasks[i] = { id = "t" .. i, run = "echo " .. i, check = "true", outputs = { "/tmp/none" } } end
  local out = os.tmpname()
  os.remove(out)
  local summary = sbx.harness.run { tasks = tasks, concurrency = c, box = { image = image }, out = out, progress = "none" }
  for line in io.lines(out) do
    local r = sbx.json.decode(line)
    if r and r.duration then per_task[#per_task + 1] = r.duration end
  end
  os.remove(out)
  assert(summary.passed == n, "not every task passed")
else
  local sem = sbx.semaphore(c)
  local ts = {}
  for i = 1, n do
    ts[i] = sbx.spawn(function()
      sem:with(function()
        local s = sbx.now()
        local b = assert(sbx.box { image = image })
        assert(b:exec("echo " .. i).exit_code == 0)
        assert(b:exec("true").exit_code == 0)
        b:close()
        per_task[#per_task + 1] = sbx.now() - s
      end)
    end)
  end
  sbx.gather(ts)
end
local wall = sbx.now() - t0
local f = io.open("/proc/self/status")
local hwm = f:read("a"):match("VmHWM:%s+(%d+)")
f:close()
print(string.format("mode=%s tasks=%d concurrency=%d wall=%.2f per_task_median=%.3f peak_rss_kb=%s", mode, n, c, wall, median(per_task), hwm))

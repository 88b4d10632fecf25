-- Warm pools: how long pool:take() takes from a warm pool, and `sbx eval`
-- of one-command tasks with a pool beside the same run without one. Prints
-- one line of key=value numbers for scripts/bench-pool.sh.
--   sbx run scripts/bench/pool.lua take N SIZE IMAGE    N takes, each from a pool of SIZE ready boxes
--   sbx run scripts/bench/pool.lua eval N C POOL IMAGE  N tasks at concurrency C (POOL 0: no pool)
local sbx = require "sbx"
local mode = arg[1]

local function sorted(t)
  table.sort(t)
  return t
end

local function pct(t, q)
  return t[math.max(1, math.min(#t, math.ceil(q * #t)))] or 0
end

local function peak_rss_kb()
  local f = io.open("/proc/self/status")
  local kb = f:read("a"):match("VmHWM:%s+(%d+)")
  f:close()
  return kb
end

-- Every box is named sbx-bench-* and labelled for the shell's clean-up.
local function box_opts(image)
  return { image = image, name_prefix = "sbx-bench-", labels = { ["sbx-bench"] = os.getenv("BENCH_RUN_ID") or "manual" } }
end

if mode == "take" then
  local n, size, image = tonumber(arg[2]) or 50, tonumber(arg[3]) or 8, arg[4] or "sbx-busybox:latest"
  local pool = assert(sbx.pool { size = size, box = box_opts(image) })
  local lat, closing = {}, {}
  for i = 1, n do
    -- Each take finds the pool warm: all SIZE boxes ready.
    while pool:stats().ready < size do sbx.sleep(0.005) end
    local t0 = sbx.now()
    local b = assert(pool:take())
    lat[i] = sbx.now() - t0
    closing[#closing + 1] = sbx.spawn(b.close, b)
  end
  sbx.gather(closing)
  pool:close()
  -- For contrast: a box made when it is needed (sbx.box), one at a time.
  local fresh = {}
  for i = 1, 10 do
    local t0 = sbx.now()
    local b = assert(sbx.box(box_opts(image)))
    fresh[i] = sbx.now() - t0
    b:close()
  end
  sorted(lat)
  sorted(fresh)
  print(string.format("mode=take takes=%d size=%d median_ms=%.4f p90_ms=%.4f max_ms=%.4f fresh_box_median_ms=%.1f", n, size,
    1000 * pct(lat, 0.5), 1000 * pct(lat, 0.9), 1000 * lat[#lat], 1000 * pct(fresh, 0.5)))
elseif mode == "eval" then
  local n, c, size, image = tonumber(arg[2]) or 100, tonumber(arg[3]) or 16, tonumber(arg[4]) or 16, arg[5] or "sbx-busybox:latest"
  local tasks = {}
  for i = 1, n do tasks[i] = { id = "t" .. i, run = "echo " .. i } end
  local out = os.tmpname()
  os.remove(out)
  local t0 = sbx.now()
  local s = sbx.harness.run { tasks = tasks, concurrency = c, pool = size, box = box_opts(image), out = out, progress = "none" }
  local wall = sbx.now() - t0
  local per = {}
  for line in io.lines(out) do
    local r = sbx.json.decode(line)
    if r and r.duration then per[#per + 1] = r.duration end
  end
  os.remove(out)
  assert(s.passed == n, "not every task passed")
  sorted(per)
  print(string.format("mode=eval tasks=%d concurrency=%d pool=%d wall=%.2f tasks_per_s=%.2f per_task_median=%.3f per_task_p90=%.3f taken=%d peak_rss_kb=%s",
    n, c, size, wall, n / wall, pct(per, 0.5), pct(per, 0.9), s.pool and s.pool.taken or 0, peak_rss_kb()))
else
  io.stderr:write("usage: sbx run scripts/bench/pool.lua take N SIZE IMAGE | eval N C POOL IMAGE\n")
  os.exit(2)
end

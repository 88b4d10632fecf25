-- The local backend beside plain bubblewrap, `docker run --rm` and the
-- Docker backend (agent transport), on this machine, in one run
-- (scripts/bench-local.sh). Prints a markdown table of medians and p90s.
--   sbx run scripts/bench/local.lua ROOTFS [N]
-- ROOTFS: the image's root filesystem (the bench's shell script exports it
-- from BENCH_IMAGE); N: samples of the sequential measures.
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local rootfs = assert(arg[1], "usage: sbx run scripts/bench/local.lua ROOTFS [N]")
local n = tonumber(arg[2]) or 50
local image = "rootfs:" .. rootfs

local function sorted(list) local t = { table.unpack(list) } table.sort(t) return t end
local function median(list) local t = sorted(list) return t[math.max(1, math.ceil(#t / 2))] end
local function pct(list, q) local t = sorted(list) return t[math.max(1, math.ceil(#t * q))] end
local function ms(s) return string.format("%.1f ms", s * 1000) end
local function mp(list) return ms(median(list)) .. " (p90 " .. ms(pct(list, 0.9)) .. ")" end
local rows = {}
local function row(...) rows[#rows + 1] = "| " .. table.concat({ ... }, " | ") .. " |" end
local function load() return (io.open("/proc/loadavg"):read("l") or ""):match("^(%S+ %S+ %S+)") end

local function lbox(extra)
  local o = { backend = "local", image = image }
  for k, v in pairs(extra or {}) do o[k] = v end
  local b, err, code = sbx.box(o)
  if not b then error(string.format("sbx.box failed: %s (%s)", tostring(err), tostring(code)), 2) end
  return b
end

-- A program run to its end without a shell (core.proc.spawn): seconds.
local function run(argv)
  local t0 = sbx.now()
  local p, s = assert(sbx.core.proc.spawn { argv = argv, stdout = false, stderr = true,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } } })
  local info = assert(p:wait(60))
  s:wait(5)
  if info.status ~= 0 then error(table.concat(argv, " ") .. " failed: " .. s:captured("stderr")) end
  return sbx.now() - t0
end

local function find(name)
  for dir in (os.getenv("PATH") .. ":/usr/sbin:/sbin"):gmatch("[^:]+") do
    if sbx.core.path_type(dir .. "/" .. name) == "file" then return dir .. "/" .. name end
  end
end

local load0 = load()

-- Warm up: the programs installed, the seccomp filter built, a spare started.
for _ = 1, 3 do lbox():close() end

-- Create + destroy, with one exec between, and plain bubblewrap, taken in
-- turns so that a busy machine weighs on all of them alike.
local bwrap = find("bwrap")
local cd, ce, ex, bw, bwfull = {}, {}, {}, {}, {}
for i = 1, n do
  local t0 = sbx.now()
  local b = lbox()
  b:close()
  cd[i] = sbx.now() - t0
  t0 = sbx.now()
  b = lbox()
  local t1 = sbx.now()
  C.exec_ok(b, { "/bin/true" })
  ex[i] = sbx.now() - t1
  b:close()
  ce[i] = sbx.now() - t0
  bw[i] = run { bwrap, "--unshare-all", "--ro-bind", rootfs, "/", "/bin/true" }
  bwfull[i] = run { bwrap, "--unshare-all", "--die-with-parent", "--as-pid-1", "--new-session", "--ro-bind", rootfs, "/",
    "--proc", "/proc", "--dev", "/dev", "--cap-drop", "ALL", "--", "/bin/true" }
end
row("local: create + destroy", mp(cd), "n=" .. n)
row("local: create + one exec + destroy", mp(ce), "exec of `/bin/true` alone: " .. ms(median(ex)))
row("`bwrap --unshare-all --ro-bind ROOTFS / /bin/true`", mp(bw), "n=" .. n .. ", in turns with the above")
row("the same with --proc, --dev, --as-pid-1, --cap-drop ALL", mp(bwfull), "n=" .. n)

-- docker run --rm, and the Docker backend's create + destroy.
local docker = find("docker")
if docker and os.getenv("BENCH_DOCKER") ~= "0" then
  local dr, db = {}, {}
  local dn = math.min(n, tonumber(os.getenv("BENCH_DOCKER_N")) or 10)
  for i = 1, dn do dr[i] = run { docker, "run", "--rm", "--network", "none", C.image, "/bin/true" } end
  for i = 1, dn do
    local t0 = sbx.now()
    local b = C.box { transport = "agent" }
    b:close()
    db[i] = sbx.now() - t0
  end
  row("`docker run --rm --network none IMAGE /bin/true`", mp(dr), "n=" .. dn)
  row("Docker backend (agent transport): create + destroy", mp(db), "n=" .. dn)
end

-- 16 boxes x 200 execs from coroutines.
local function throughput(make, label)
  local boxes = {}
  for i = 1, 16 do boxes[i] = make() end
  for i = 1, 16 do C.exec_ok(boxes[i], { "/bin/true" }) end
  local t0 = sbx.now()
  local tasks = {}
  for i = 1, 16 do
    tasks[i] = sbx.spawn(function() for _ = 1, 200 do C.exec_ok(boxes[i], { "/bin/true" }) end end)
  end
  sbx.gather(tasks)
  local rate = 16 * 200 / (sbx.now() - t0)
  for _, b in ipairs(boxes) do b:close() end
  row("16 boxes x 200 execs from coroutines, " .. label, string.format("%.0f execs/s", rate), "")
end
throughput(lbox, "local")
if docker and os.getenv("BENCH_DOCKER") ~= "0" then
  throughput(function() return C.box { transport = "agent" } end, "Docker backend (agent)")
end

-- 200 boxes alive at once: sbx's RSS (a fresh measure in this process
-- includes what the runs above left in its heap; bench-local.sh also runs
-- this part alone).
C.full_gc()
local alive = {}
local t0 = sbx.now()
for i = 1, 200 do alive[i] = lbox() end
local made = sbx.now() - t0
for i = 1, 200 do C.exec_ok(alive[i], { "/bin/true" }) end
C.full_gc()
row("200 local boxes alive in one sbx", string.format("RSS %.1f MB", C.status_kb("VmRSS") / 1024),
  string.format("made in %.1f s; Lua heap %.1f MB", made, collectgarbage("count") / 1024))
t0 = sbx.now()
for i = 1, 200 do alive[i]:close() end
row("closing them", ms(sbx.now() - t0), "")

print(string.format("load average %s at the start, %s at the end", load0, load()))
print("| measure | value | note |")
print("|---|---|---|")
print(table.concat(rows, "\n"))

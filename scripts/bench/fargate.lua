-- Fargate boxes over the local AWS stand-in (scripts/bench-fargate.sh starts
-- it and passes its URL): time from sbx.box{} to the first command's result,
-- per-command latency on one box, and BOXES boxes driven at once from this
-- one process (create, one command each, close).
-- usage: sbx run fargate.lua URL [N] [COMMANDS] [BOXES]
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local url = assert(arg[1], "usage: fargate.lua URL [N] [COMMANDS] [BOXES]")
local n, commands, boxes = tonumber(arg[2]) or 5, tonumber(arg[3]) or 50, tonumber(arg[4]) or 100

sbx.use_policy {
  fargate = {
    endpoint_url = url, credentials = { access_key = "AKIDSTANDIN", secret_key = "standin-secret" },
    region = "us-east-1", subnets = { "subnet-0bench" }, poll_interval = tonumber(os.getenv("BENCH_POLL") or "0.1"),
    start_timeout = 300,
  },
}

local function fbox()
  local b, err, code = sbx.box { backend = "fargate", image = C.image }
  if not b then error(string.format("sbx.box failed: %s (%s)", tostring(err), tostring(code)), 2) end
  return b
end

-- Warm-up: cluster, roles and the task definition are made once.
fbox():close()

for _ = 1, n do
  local t0 = sbx.now()
  local b = fbox()
  local t1 = sbx.now()
  C.exec_ok(b, "true")
  local t2 = sbx.now()
  C.emit("fargate_create", t1 - t0)
  C.emit("fargate_create_to_first_command", t2 - t0)
  local t3 = sbx.now()
  b:close()
  C.emit("fargate_close", sbx.now() - t3)
end

local b = fbox()
for _ = 1, commands do
  local t0 = sbx.now()
  C.exec_ok(b, "true")
  C.emit("fargate_exec_true", sbx.now() - t0)
end
local payload = string.rep("x", 1024 * 1024)
for _ = 1, 3 do
  local t0 = sbx.now()
  C.exec_ok(b, "head -c 10485760 /dev/zero")
  C.emit("fargate_exec_10MB_output", sbx.now() - t0)
  t0 = sbx.now()
  assert(b:write_file("/tmp/one-mb", payload))
  C.emit("fargate_write_1MB", sbx.now() - t0)
end
b:close()

-- BOXES at once from one process.
local function cpu_seconds()
  local f = io.open("/proc/self/stat")
  local s = f:read("a")
  f:close()
  local rest = s:match("^.*%)%s+(.*)$")
  local i, ut, st = 0, 0, 0
  for field in rest:gmatch("%S+") do
    i = i + 1
    if i == 12 then ut = tonumber(field) elseif i == 13 then st = tonumber(field) break end
  end
  return (ut + st) / 100
end
local cpu0, t0 = cpu_seconds(), sbx.now()
local tasks, failures = {}, 0
local first_done = {}
for i = 1, boxes do
  tasks[i] = sbx.spawn(function()
    local ok, err = pcall(function()
      local bx = fbox()
      C.exec_ok(bx, "echo " .. i)
      first_done[#first_done + 1] = sbx.now() - t0
      C.exec_ok(bx, "sleep 1; echo again")
      bx:close()
    end)
    if not ok then failures = failures + 1; C.note("box %d: %s", i, tostring(err)) end
  end)
end
for _, t in ipairs(tasks) do t:join() end
C.emit("fargate_concurrent_boxes", boxes)
C.emit("fargate_concurrent_failures", failures)
C.emit("fargate_concurrent_wall", sbx.now() - t0)
table.sort(first_done)
C.emit("fargate_concurrent_all_first_commands", first_done[#first_done] or -1)
C.emit("fargate_concurrent_sbx_cpu", cpu_seconds() - cpu0)
C.emit("fargate_concurrent_sbx_hwm_kb", C.status_kb("VmHWM"))

-- Kubernetes boxes over the local stand-in (scripts/bench-kubernetes.sh
-- starts it and passes its kubeconfig): create, create to the first
-- command's result, exec `true` on a ready box (exec and agent
-- transports), and BOXES boxes driven at once from this one process
-- (create, 2 commands each, close) with sbx's own CPU time.
-- usage: sbx run kubernetes.lua KUBECONFIG [N] [COMMANDS] [BOXES]
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local kubeconfig = assert(arg[1], "usage: kubernetes.lua KUBECONFIG [N] [COMMANDS] [BOXES]")
local n, commands, boxes = tonumber(arg[2]) or 5, tonumber(arg[3]) or 200, tonumber(arg[4]) or 100

sbx.use_policy { kubernetes = { kubeconfig = kubeconfig } }

local function kbox(transport)
  local b, err, code = sbx.box { backend = "kubernetes", image = C.image, transport = transport or "exec" }
  if not b then error(string.format("sbx.box failed: %s (%s)", tostring(err), tostring(code)), 2) end
  return b
end

kbox():close()   -- warm-up: the client, the TLS contexts

for _ = 1, n do
  local t0 = sbx.now()
  local b = kbox()
  local t1 = sbx.now()
  C.exec_ok(b, "true")
  C.emit("k8s_create", t1 - t0)
  C.emit("k8s_create_to_first_command", sbx.now() - t0)
  local t2 = sbx.now()
  b:close()
  C.emit("k8s_close", sbx.now() - t2)
end

for _, transport in ipairs { "exec", "agent" } do
  local b = kbox(transport)
  assert(b.transport == transport, "transport " .. tostring(b.transport))
  C.exec_ok(b, "true")
  for _ = 1, (transport == "exec" and math.min(commands, 50) or commands) do
    local t0 = sbx.now()
    C.exec_ok(b, { "/bin/true" })
    C.emit("k8s_" .. transport .. "_exec_true_ms", (sbx.now() - t0) * 1000)
  end
  b:close()
end

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

for _, transport in ipairs { "exec", "agent" } do
  local cpu0, t0 = cpu_seconds(), sbx.now()
  local tasks, failures = {}, 0
  for i = 1, boxes do
    tasks[i] = sbx.spawn(function()
      local ok, err = pcall(function()
        local bx = kbox(transport)
        assert(C.exec_ok(bx, "echo " .. i).stdout == i .. "\n")
        C.exec_ok(bx, "echo again")
        bx:close()
      end)
      if not ok then failures = failures + 1; C.note("box %d: %s", i, tostring(err)) end
    end)
  end
  for _, t in ipairs(tasks) do t:join() end
  C.emit("k8s_" .. transport .. "_100_boxes_failures", failures)
  C.emit("k8s_" .. transport .. "_100_boxes_wall_s", sbx.now() - t0)
  C.emit("k8s_" .. transport .. "_100_boxes_sbx_cpu_s", cpu_seconds() - cpu0)
end
C.emit("k8s_sbx_hwm_kb", C.status_kb("VmHWM"))

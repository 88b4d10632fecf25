-- Sequential exec latency of `true` in one box: as an argv (what `docker
-- exec C true` does) and as a shell string (the policy's shell wrapper).
-- usage: sbx run exec.lua N
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local n = tonumber(arg[1]) or 10

local b <close> = C.box()
for _ = 1, 3 do C.exec_ok(b, { "true" }) end
C.full_gc()
local rss0 = C.status_kb("VmRSS")
for _ = 1, n do
  local t0 = sbx.now()
  C.exec_ok(b, { "true" })
  C.emit("exec_argv", sbx.now() - t0)
end
for _ = 1, n do
  local t0 = sbx.now()
  C.exec_ok(b, "true")
  C.emit("exec_string", sbx.now() - t0)
end
C.full_gc()
C.emit("exec_rss_growth_kb", C.status_kb("VmRSS") - rss0)

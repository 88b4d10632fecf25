-- One big output: `head -c BYTES /dev/zero` in a box, RUNS times; checks the
-- byte count and that the host kept only the bounded capture. Prints the
-- exec time per run and the peak resident set (VmHWM) of this process.
-- usage: sbx run output.lua BYTES RUNS   (BYTES = 0 runs `true`: a baseline)
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local bytes = tonumber(arg[1]) or 52428800
local runs = tonumber(arg[2]) or 1

local b <close> = C.box()
local cmd = bytes > 0 and { "sh", "-c", "head -c " .. bytes .. " /dev/zero" } or { "true" }
for _ = 1, runs do
  local t0 = sbx.now()
  local r = C.exec_ok(b, cmd, { timeout = 600 })
  local dt = sbx.now() - t0
  if r.stdout_bytes ~= bytes then
    error(string.format("expected %d bytes of stdout, the result counts %d", bytes, r.stdout_bytes))
  end
  C.emit("out_time", dt)
  C.emit("out_kept_bytes", #r.stdout + #r.output)
  r = nil
  C.full_gc()
end
C.emit("out_hwm_kb", C.status_kb("VmHWM"))
C.emit("out_rss_kb", C.status_kb("VmRSS"))

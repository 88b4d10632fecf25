-- Shared helpers for the scripts/bench.sh Lua parts. Each bench script
-- prints machine-readable lines "key value" on stdout (bench.sh takes the
-- median per key); diagnostics go to stderr.
local sbx = require "sbx"

local C = {}

C.image = os.getenv("BENCH_IMAGE") or "sbx-busybox:latest"
C.run_id = os.getenv("BENCH_RUN_ID") or "manual"

-- Every box the bench makes is named sbx-bench-* and labelled, so the
-- shell's trap can remove it even if this process is killed.
function C.box_opts(extra)
  local o = { image = C.image, name_prefix = "sbx-bench-", labels = { ["sbx-bench"] = C.run_id } }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

function C.box(extra)
  local b, err, code = sbx.box(C.box_opts(extra))
  if not b then error(string.format("sbx.box failed: %s (%s)", tostring(err), tostring(code)), 2) end
  return b
end

-- A field of /proc/self/status in KB (VmRSS, VmHWM, ...).
function C.status_kb(field)
  for line in io.lines("/proc/self/status") do
    local v = line:match("^" .. field .. ":%s*(%d+)")
    if v then return tonumber(v) end
  end
end

function C.emit(key, value)
  io.write(key, " ", string.format("%.6f", value), "\n")
  io.stdout:flush()
end

function C.note(fmt, ...)
  io.stderr:write("  [lua] ", string.format(fmt, ...), "\n")
end

-- Runs argv in box, raises unless it exits 0; returns the result.
function C.exec_ok(b, cmd, opts)
  local r, err, code = b:exec(cmd, opts)
  if not r then error(string.format("exec failed: %s (%s)", tostring(err), tostring(code)), 2) end
  if r.exit_code ~= 0 then
    error(string.format("exec exited %s (timed_out=%s): %s", tostring(r.exit_code), tostring(r.timed_out), r.stderr), 2)
  end
  return r
end

function C.full_gc()
  collectgarbage("collect")
  collectgarbage("collect")
end

return C

-- The start check, for exec transports without sbx-agent (the Kubernetes
-- exec subresource, ECS Exec): there a command runs as the last step of a
-- shell script, and a shell that cannot change to the directory or find the
-- program exits 125, 126 or 127, which the command itself could also have
-- chosen. So the script checks each step first and says on stdout, before
-- anything of the command, either
--   __SBX_<id>_G__                  every step passed; the exec follows
--   __SBX_<id>_F<stage>:<reason>__  a step failed (stage cwd or exec); exit 125
-- and the filter below cuts that marker out of the output. A command that
-- failed a step is nil, message, "exec_failed" on every transport, as with
-- Docker's exec and the agent; one that started keeps its own exit status.
-- What the check cannot see: a program that passes it but whose exec still
-- fails (a missing interpreter, a wrong architecture) exits 126 or 127, as
-- under any shell.
local M = {}

local shq = require("sbx.util").shell_quote

-- Shell lines (none holds a line end of its own outside quotes, so a
-- caller may join them with newlines or "; "): change to req.cwd (when
-- given), then the caller's setup lines (the environment), then check that
-- req.argv[1] can be run, then print the start marker. The caller's exec
-- line follows. Every name the lines set starts with sbx_; the checks'
-- stderr goes nowhere.
function M.lines(req, id, setup)
  local function fail(stage, why)
    return string.format("{ printf '__SBX_%s_F%s:%%s__\\n' '%s'; exit 125; }", id, stage, why)
  end
  local lines = {}
  if req.cwd then
    local d = shq(req.cwd)
    lines[#lines + 1] = "cd -- " .. d .. " 2>/dev/null || if [ ! -e " .. d .. " ]; then " ..
      fail("cwd", "No such file or directory") .. "; elif [ ! -d " .. d .. " ]; then " ..
      fail("cwd", "Not a directory") .. "; else " .. fail("cwd", "Permission denied") .. "; fi"
  end
  for _, l in ipairs(setup or {}) do lines[#lines + 1] = l end
  -- The program: a path is looked at itself; a name is looked up in PATH
  -- as exec would, with the command's own environment in place.
  lines[#lines + 1] = "sbx_p=" .. shq(req.argv[1]) .. "; sbx_f=; case $sbx_p in */*) sbx_f=$sbx_p ;; *) sbx_i=$IFS; IFS=:; " ..
    "for sbx_d in ${PATH:-/usr/local/bin:/usr/bin:/bin}; do [ -f \"${sbx_d:-.}/$sbx_p\" ] && " ..
    "[ -x \"${sbx_d:-.}/$sbx_p\" ] && { sbx_f=${sbx_d:-.}/$sbx_p; break; }; done; IFS=$sbx_i ;; esac"
  lines[#lines + 1] = "if [ -z \"$sbx_f\" ] || [ ! -e \"$sbx_f\" ]; then " .. fail("exec", "No such file or directory") ..
    "; elif [ -d \"$sbx_f\" ]; then " .. fail("exec", "Is a directory") ..
    "; elif [ ! -f \"$sbx_f\" ] || [ ! -x \"$sbx_f\" ]; then " .. fail("exec", "Permission denied") .. "; fi"
  lines[#lines + 1] = "unset sbx_p sbx_f sbx_i sbx_d; printf '__SBX_%s_G__' " .. id
  return lines
end

-- A filter for the command's stdout: filter.feed(bytes) passes on the
-- bytes without the marker; filter.failed is { stage, reason } once a
-- failure marker came (nothing after it is passed on). The marker comes
-- before anything of the command (its id is random, so the command cannot
-- know it); a cooked PTY's echo of stdin may come first, so it is looked
-- for anywhere, holding back only bytes that may begin it.
function M.filter(id, emit)
  local ok_marker = "__SBX_" .. id .. "_G__"
  local fail_prefix = "__SBX_" .. id .. "_F"
  local fail_pat = fail_prefix:gsub("%p", "%%%0") .. "(%a+):([^\n]-)__\n"
  local fl, buf, state = {}, "", "pre"
  local function out(x) if x ~= "" then emit(x) end end
  -- Length of the longest suffix of buf that may begin a marker.
  local function partial()
    for k = math.min(#buf, math.max(#ok_marker, #fail_prefix)), 1, -1 do
      local suf = buf:sub(#buf - k + 1)
      if ok_marker:sub(1, k) == suf or fail_prefix:sub(1, k) == suf then return k end
    end
    return 0
  end
  function fl.feed(bytes)
    if state == "body" then return out(bytes) end
    if state == "failed" then return end
    buf = buf .. bytes
    local i, j = buf:find(ok_marker, 1, true)
    local fi, _, stage, reason = buf:find(fail_pat)
    if fi and (not i or fi < i) then
      out(buf:sub(1, fi - 1))
      state, buf = "failed", ""
      fl.failed = { stage = stage, reason = reason }
      return
    end
    if i then
      out(buf:sub(1, i - 1))
      state = "body"
      local rest = buf:sub(j + 1)
      buf = ""
      return out(rest)
    end
    -- A failure line begun and not ended (it is short): hold it.
    local at = buf:find(fail_prefix, 1, true)
    if at and #buf - at < 300 then
      out(buf:sub(1, at - 1))
      buf = buf:sub(at)
      return
    end
    local keep = partial()
    out(buf:sub(1, #buf - keep))
    buf = buf:sub(#buf - keep + 1)
  end
  -- The stream ended: what is held back was the command's after all.
  function fl.flush()
    if state == "pre" then out(buf) end
    buf = ""
  end
  return fl
end

-- The exec_failed message for a failure the filter saw.
function M.message(failed, req, pol)
  return pol.format_exec_failed({ stage = failed.stage, reason = failed.reason, program = req.argv and req.argv[1],
    cwd = req.cwd, user = req.user }, pol)
end

return M

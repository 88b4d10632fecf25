-- The start check, for exec transports without sbx-agent (the Kubernetes
-- exec subresource, ECS Exec): there a command runs as the last step of a
-- shell script, and a shell that cannot change to the directory or find the
-- program exits 125, 126 or 127, which the command itself could also have
-- chosen. So the script checks each step first and says on stdout, before
-- anything of the command, either
--   __SBX_<id>_S__                  every step passed; the exec follows
--   __SBX_<id>_F<stage>:<reason>__  a step failed (stage cwd or exec); exit 125
-- and the filter below cuts that marker out of the output. A command that
-- failed a step is nil, message, "exec_failed" on every transport, as with
-- Docker's exec and the agent; one that started keeps its own exit status.
-- What the check cannot see: a program that passes it but whose exec still
-- fails (a missing interpreter, a wrong architecture) exits 126 or 127, as
-- under any shell.
local M = {}

local function shq(v) return "'" .. tostring(v):gsub("'", "'\\''") .. "'" end

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
  lines[#lines + 1] = "unset sbx_p sbx_f sbx_i sbx_d; printf '__SBX_%s_S__' " .. id
  return lines
end

-- A filter for the command's stdout: filter.feed(bytes) passes on what
-- follows the start marker; filter.failed is { stage, reason } once a failure
-- marker came. Only the very start of stdout can hold a marker (nothing of
-- the command runs before it); anything else there is passed on as it is.
function M.filter(id, emit)
  local ok_marker = "__SBX_" .. id .. "_S__"
  local fail_prefix = "__SBX_" .. id .. "_F"
  local fl, buf, state = {}, "", "pre"
  function fl.feed(bytes)
    if state == "body" then return emit(bytes) end
    if state == "failed" then return end
    buf = buf .. bytes
    if buf:sub(1, #ok_marker) == ok_marker then
      state = "body"
      local rest = buf:sub(#ok_marker + 1)
      buf = ""
      if rest ~= "" then emit(rest) end
      return
    end
    local stage, reason = buf:match("^" .. fail_prefix:gsub("%p", "%%%0") .. "(%a+):(.-)__\n")
    if stage then
      state, buf = "failed", ""
      fl.failed = { stage = stage, reason = reason }
      return
    end
    -- Still possibly a marker: wait for more (the failure line is short).
    local n = math.min(#buf, #ok_marker)
    if buf:sub(1, n) == ok_marker:sub(1, n) and #buf < #ok_marker then return end
    n = math.min(#buf, #fail_prefix)
    if buf:sub(1, n) == fail_prefix:sub(1, n) and #buf < #fail_prefix + 200 and not buf:find("\n", 1, true) then return end
    state = "body"
    local all = buf
    buf = ""
    emit(all)
  end
  -- The stream ended: what is held back was the command's after all.
  function fl.flush()
    if state == "pre" and buf ~= "" then emit(buf) end
    buf, state = "", state == "pre" and "body" or state
  end
  return fl
end

-- The exec_failed message for a failure the filter saw.
function M.message(failed, req, pol)
  return pol.format_exec_failed({ stage = failed.stage, reason = failed.reason, program = req.argv and req.argv[1],
    cwd = req.cwd, user = req.user }, pol)
end

return M

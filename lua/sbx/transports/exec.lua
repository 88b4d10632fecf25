-- The exec transport: every command is one command of the backend (a
-- Docker exec, an ECS Exec session), started, waited for and killed through
-- the backend's per-command functions. It needs nothing in the box but a
-- shell for the kill, which is why it is the fallback where sbx-agent cannot
-- be placed. The transport contract is written in transports/init.lua.
local M = { name = "exec" }

function M.open(box)
  return { box = box }
end

-- A backend whose API is JSON (Docker's exec create, ECS ExecuteCommand)
-- says so with text_argv = "<why>": an argv, environment, cwd or user that
-- is not UTF-8 cannot reach its box unchanged, so it is refused, never
-- sent repaired.
local function not_text(req)
  local valid = require("sbx.core").text.valid
  for i, a in ipairs(req.argv or {}) do
    if not valid(a) then return "argument " .. i end
  end
  for _, kv in ipairs(req.env or {}) do
    if not valid(kv) then return "env " .. (kv:match("^[^=]*") or "?") end
  end
  if req.cwd and not valid(req.cwd) then return "cwd" end
  if req.user and not valid(tostring(req.user)) then return "user" end
end

function M.start(t, req)
  local why = t.box.impl.text_argv
  local which = why and not_text(req)
  if which then
    return nil, string.format("%s is not UTF-8 text, which the exec transport cannot carry (%s); " ..
      "the agent transport takes any bytes but NUL", which, why), "unsupported"
  end
  return t.box.impl.start(t.box.handle, req)
end

function M.finish(t, job, deadline)
  return t.box.impl.finish(t.box.handle, job, deadline)
end

-- The kill: kill_request run as another command of the backend
-- (sbx.job.kill_by_exec), unless the backend has a kill of its own.
function M.kill(t, job, signal, deadline)
  local impl = t.box.impl
  if impl.kill then return impl.kill(t.box.handle, job, signal, deadline) end
  return require("sbx.job").kill_by_exec(impl, t.box.handle, job, signal, deadline)
end

function M.close() end

return M

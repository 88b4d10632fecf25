-- The exec transport: every command is one command of the backend (a
-- Docker exec, an ECS Exec session), started, waited for and killed through
-- the backend's per-command functions. It needs nothing in the box but a
-- shell for the kill, which is why it is the fallback where sbx-agent cannot
-- be placed. The transport contract is written in transports/init.lua.
local M = { name = "exec" }

function M.open(box)
  return { box = box }
end

function M.start(t, req)
  return t.box.backend.start(t.box.handle, req)
end

function M.finish(t, job, deadline)
  return t.box.backend.finish(t.box.handle, job, deadline)
end

function M.kill(t, job, signal, deadline)
  return t.box.backend.kill(t.box.handle, job, signal, deadline)
end

function M.close() end

return M

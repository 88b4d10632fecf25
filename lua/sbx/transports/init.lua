-- Transports run a box's commands; backends own its lifecycle. box.lua
-- talks to a transport only, through this contract (every function may
-- yield; failures return nil, message, code):
--
--   open(box, pol) -> state | nil, reason, code
--       ready to run commands (the agent transport places sbx-agent and
--       starts it; the exec transport needs nothing)
--   start(state, req) -> job | nil, message, code
--       req: argv, env (list of NAME=value), cwd, user, stdin (bytes or
--       nil: closed), marker, capture, chunks, chunk_limit, deadline.
--       job.stream has the sbx.stream methods (wait, take, captured, read,
--       info, close); it ends when the command's output has ended and its
--       exit status is known.
--   finish(state, job, deadline) -> exit_code | nil, message, code
--       after job.stream ended; a command ended by signal N is 128 + N
--   kill(state, job, signal, deadline) -> true | nil, message, code
--       signal ("KILL", "TERM", ...) to the job's whole process tree
--   read_file(state, path, max, deadline) -> bytes | nil, message, code   (optional)
--   write_file(state, path, data, opts, deadline) -> true | nil, message, code   (optional)
--   close(state)
--
-- A backend that can carry the agent provides agent_channel(handle, opts),
-- and agent_attach(handle, opts) where a dropped channel can be opened again
-- (see transports/agent.lua). Which transport a box uses is the box option
-- or policy.box.transport: "auto" (the agent where it can be placed, else
-- exec, and box.transport_reason says why), "agent" or "exec". A backend
-- without per-command functions (no start: the local backend, whose boxes
-- are the agent's) has no exec transport: "exec" asked for (a box option,
-- or a policy that changed the built-in default) is "unsupported" there,
-- the built-in default "exec" means the agent, and "auto" is the agent or
-- nothing.
local M = {}

M.exec = require "sbx.transports.exec"
M.agent = require "sbx.transports.agent"

-- choose(box, pol, opts) -> transport module, state, reason | nil, message,
-- code. opts: what sbx.box{} was given.
function M.choose(box, pol, opts)
  local want = box.spec.transport or pol.box.transport or "auto"
  local has_exec = box.impl.start ~= nil
  if want == "exec" and not has_exec and (opts == nil or opts.transport == nil)
    and pol.box.transport == require("sbx.policy").box.transport then
    want = "agent"
  end
  if want == "exec" and not has_exec then
    return nil, string.format("the %s backend runs commands through sbx-agent only (transport = \"exec\")",
      tostring(box.backend_name)), "unsupported"
  end
  if want == "exec" then return M.exec, M.exec.open(box), "transport = \"exec\"" end
  local st, reason, code = M.agent.open(box, pol)
  if st then return M.agent, st, nil end
  if want == "agent" or not has_exec then
    return nil, "sbx-agent could not be started: " .. tostring(reason), code or "agent_unavailable"
  end
  return M.exec, M.exec.open(box), reason
end

return M

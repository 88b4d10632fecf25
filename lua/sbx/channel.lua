-- sbx.channel: the agent's channel over a sink (core.stream.sink), for a
-- backend whose bytes from the box arrive through Lua (an ECS Exec session,
-- a Kubernetes exec stream) rather than a socket sbx owns. The channel
-- contract is in transports/agent.lua (write, wait, take, info, captured,
-- close); this is its one implementation over a sink, so Fargate and
-- Kubernetes differ only in how bytes go out and what closing ends. A leaf.
local M = {}

-- over_sink(sink, { write = fn(bytes) -> queued | nil, message;
--   close = fn(); ended = message }) -> channel. write is refused with
-- ended once the sink has ended; close ends the sink first (a pump that
-- still pushes sees the end), then calls o.close.
function M.over_sink(sink, o)
  local ch = {}
  function ch.write(_, bytes)
    if sink:info().eof then return nil, o.ended or "the channel ended" end
    return o.write(bytes)
  end
  function ch.wait(_, timeout) return sink:wait(timeout) end
  function ch.take(_, raw) return sink:take(raw) end
  function ch.info() return sink:info() end
  function ch.captured(_, name) return sink:captured(name) end
  function ch.close()
    if not sink:info().eof then sink:finish() end
    o.close()
  end
  return ch
end

return M

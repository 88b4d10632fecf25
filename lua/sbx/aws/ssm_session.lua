-- The client side of one SSM data channel (the websocket ECS ExecuteCommand
-- returns), as docs/aws-protocol.md section 1 sets it out:
-- the opening text frame, binary ClientMessages checked by the C codec,
-- acknowledgements, in-order delivery with a buffer for early frames, re-acks
-- for duplicates, resend of our own unacknowledged input (TCP-style RTO),
-- the SessionType handshake (KMS declined), terminal size, pings and
-- channel_closed. Every number comes from policy (policy.fargate.ssm).
--
--   local s, err, code = ssm_session.open{ url=, token=, pol=, on_output=fn(bytes, payload_type), room=fn(timeout) }
-- room(timeout) -> true when the reader of the output has room for more,
-- waiting up to timeout seconds for it (false: still none).
--   s:send(bytes) -> true | nil, msg, code     -- stdin bytes, sequenced, resent until acked
--   s:wait([timeout]) -> result | nil          -- { reason, code?, message?, output?, exit_code? }
--   s:close()                                  -- idempotent
-- result.reason: "closed" (channel_closed from the service), "disconnected"
-- (the socket went away first), "error" (protocol, KMS, resend limit), "cancelled".
local M = {}

local core = require "sbx.core"
local json, codec = core.json, core.ssm

local Session = {}
Session.__index = Session

local PAYLOAD = {
  output = 1, stderr_legacy = 2, size = 3, parameter = 4, handshake_request = 5,
  handshake_response = 6, handshake_complete = 7, enc_challenge_request = 8,
  enc_challenge_response = 9, flag = 10, stderr = 11, exit_code = 12,
}
M.PAYLOAD = PAYLOAD

local function uuid()
  local b = { assert(core.random.bytes(16)):byte(1, 16) }
  b[7] = (b[7] & 0x0f) | 0x40
  b[9] = (b[9] & 0x3f) | 0x80
  local h = string.format(string.rep("%02x", 16), table.unpack(b))
  return h:sub(1, 8) .. "-" .. h:sub(9, 12) .. "-" .. h:sub(13, 16) .. "-" .. h:sub(17, 20) .. "-" .. h:sub(21)
end
M.uuid = uuid

local function ordered(t, order)
  return setmetatable(t, { __jsonorder = order })
end

-- Key order as Go's encoder writes these structs (the reference client).
local ACK_ORDER = { "AcknowledgedMessageType", "AcknowledgedMessageId", "AcknowledgedMessageSequenceNumber", "IsSequentialMessage" }
local OPEN_ORDER = { "MessageSchemaVersion", "RequestId", "TokenValue", "ClientId", "ClientVersion" }

local client_id                     -- one per process, as the plugin does per run

-- Opens the websocket, sends the opening frame and the terminal size, and
-- starts the reader and the resend timer. Returns at once after the open.
function M.open(opts)
  local pol = opts.pol
  local ws, err, code = core.ws.connect {
    url = opts.url, timeout = pol.connect_timeout, max_message = pol.max_message, max_queue = pol.max_queue,
    ca_file = pol.ca_file, insecure = pol.insecure,
  }
  if not ws then return nil, "cannot open the SSM data channel: " .. tostring(err), code end
  client_id = client_id or uuid()
  local self = setmetatable({
    ws = ws, pol = pol, on_output = opts.on_output, room = opts.room,
    out_seq = 0,                    -- next sequence number of our input_stream_data
    unacked = {},                   -- our sent, unacknowledged messages, oldest first
    expected = 0,                   -- next agent sequence number to deliver
    ahead = {}, ahead_n = 0,        -- early agent messages by sequence number
    rtt = pol.initial_rtt, rttvar = 0, rto = pol.initial_rto,
    handshaking = false,            -- between HandshakeRequest and HandshakeComplete
    gate = core.event(),            -- set while input may be sent
    publish = core.event(),         -- clear between pause_publication and start_publication
    last_input = core.now(),        -- when our last input_stream_data went (the service's idle timer)
    window = core.event(),          -- set while the unacked window has room
    kick = core.event(),            -- wakes the resend timer
    done = core.event(),
    result = nil,
  }, Session)
  self.gate:set()
  self.window:set()
  self.publish:set()
  local ok, serr = ws:send(json.encode(ordered({
    MessageSchemaVersion = "1.0", RequestId = uuid(), TokenValue = opts.token,
    ClientId = client_id, ClientVersion = pol.client_version,
  }, OPEN_ORDER)), "text")
  if not ok then
    ws:close()
    return nil, "cannot open the SSM data channel: " .. tostring(serr), "disconnected"
  end
  self.reader = core.spawn(function() self:read_loop() end)
  self.timer = core.spawn(function() self:resend_loop() end)
  if pol.terminal then
    self:queue(PAYLOAD.size, json.encode(ordered({ cols = pol.terminal.cols, rows = pol.terminal.rows }, { "cols", "rows" })))
  end
  return self
end

function Session:finish(reason, code, message, extra)
  if self.result then return end
  self.result = { reason = reason, code = code, message = message }
  for k, v in pairs(extra or {}) do self.result[k] = v end
  -- Wake everyone who waits on this session.
  self.gate:set()
  self.window:set()
  self.publish:set()
  self.kick:set()
  self.done:set()
  self.ws:close(1000)
end

function Session:send_frame(frame)
  return self.ws:send(frame, "binary")
end

-- A sequenced input_stream_data message, kept until acknowledged.
function Session:queue(payload_type, payload)
  local frame = codec.encode {
    message_type = "input_stream_data", sequence_number = self.out_seq, flags = 0,
    message_id = uuid(), payload_type = payload_type, payload = payload,
  }
  local m = { seq = self.out_seq, frame = frame, sent = core.now(), attempts = 0, first = core.now() }
  self.out_seq = self.out_seq + 1
  self.unacked[#self.unacked + 1] = m
  if #self.unacked >= self.pol.window then self.window:clear() end
  self.last_input = core.now()
  -- Paused (pause_publication): kept, and sent when start_publication
  -- comes.
  if self.paused then m.unsent = true else self:send_frame(frame) end
  self.kick:set()
end

function Session:ack(m)
  local payload = json.encode(ordered({
    AcknowledgedMessageType = m.message_type, AcknowledgedMessageId = m.message_id,
    AcknowledgedMessageSequenceNumber = m.sequence_number, IsSequentialMessage = true,
  }, ACK_ORDER))
  self:send_frame(codec.encode {
    message_type = "acknowledge", sequence_number = 0, flags = 3, message_id = uuid(), payload = payload,
  })
end

-- RTT estimate as TCP does it (the reference's constants come from policy).
function Session:sample_rtt(sample)
  local pol = self.pol
  self.rttvar = (1 - pol.rtt_beta) * self.rttvar + pol.rtt_beta * math.abs(self.rtt - sample)
  self.rtt = (1 - pol.rtt_alpha) * self.rtt + pol.rtt_alpha * sample
  self.rto = math.min(pol.max_rto, self.rtt + math.max(pol.min_rto_var, 4 * self.rttvar))
end

function Session:on_ack(m)
  local ok, content = pcall(json.decode, m.payload)
  local seq = ok and type(content) == "table" and tonumber(content.AcknowledgedMessageSequenceNumber)
  if not seq then return end
  for i, u in ipairs(self.unacked) do
    if u.seq == seq then
      table.remove(self.unacked, i)
      self:sample_rtt(core.now() - u.sent)
      if #self.unacked < self.pol.window then self.window:set() end
      return
    end
  end
end

function Session:handshake(m)
  local ok, req = pcall(json.decode, m.payload)
  if not ok or type(req) ~= "table" then
    return self:finish("error", "protocol", "the SSM agent sent a handshake request sbx cannot read")
  end
  self.handshaking = true
  self.gate:clear()
  local processed, declined = {}, nil
  for _, a in ipairs(req.RequestedClientActions or {}) do
    local r = ordered({ ActionType = a.ActionType, ActionStatus = 1, ActionResult = json.null, Error = "" },
      { "ActionType", "ActionStatus", "ActionResult", "Error" })
    if a.ActionType == "SessionType" then
      local t = type(a.ActionParameters) == "table" and a.ActionParameters.SessionType
      if t ~= "InteractiveCommands" and t ~= "NonInteractiveCommands" and t ~= "Standard_Stream" then
        r.ActionStatus, r.Error = 3, "unsupported session type " .. tostring(t)
        declined = declined or r.Error
      end
    elseif a.ActionType == "KMSEncryption" then
      r.ActionStatus, r.Error = 2, self.pol.kms_message
      declined = declined or self.pol.kms_message
    else
      r.ActionStatus, r.Error = 3, "unsupported action " .. tostring(a.ActionType)
      declined = declined or r.Error
    end
    processed[#processed + 1] = r
  end
  self:queue(PAYLOAD.handshake_response, json.encode(ordered({
    ClientVersion = self.pol.client_version, ProcessedClientActions = json.array(processed),
    Errors = declined and json.array { declined } or json.null,
  }, { "ClientVersion", "ProcessedClientActions", "Errors" })))
  if declined then
    -- The agent cancels the session on a declined action; say why here.
    self.declined = declined
  end
end

-- Delivers one in-order agent message.
function Session:deliver(m)
  local pt = m.payload_type
  if pt == PAYLOAD.output or pt == PAYLOAD.stderr then
    if not self.output_seen then
      -- The agent acks no input before its PTY is up; output says it is up
      -- now, so what it turned away goes again at once, not an RTO later.
      self.output_seen = true
      local now = core.now()
      for _, u in ipairs(self.paused and {} or self.unacked) do
        u.attempts = u.attempts + 1
        u.sent = now
        self:send_frame(u.frame)
      end
    end
    if self.on_output then self.on_output(m.payload, pt) end
  elseif pt == PAYLOAD.exit_code then
    self.exit_code = tonumber(m.payload:match("EXIT_CODE:%s*(%-?%d+)"))
  elseif pt == PAYLOAD.handshake_complete then
    self.handshaking = false
    if not self.declined then self.gate:set() end
  elseif pt == PAYLOAD.enc_challenge_request then
    self:finish("error", "kms_unsupported", self.pol.kms_message)
  end
end

local ACK_FIRST = { [PAYLOAD.handshake_request] = true, [PAYLOAD.handshake_complete] = true,
  [PAYLOAD.enc_challenge_request] = true }

function Session:on_output_message(m)
  local seq = m.sequence_number
  if seq == self.expected then
    if m.payload_type == PAYLOAD.handshake_request then
      self:ack(m)
      self:handshake(m)
    elseif ACK_FIRST[m.payload_type] then
      self:ack(m)
      self:deliver(m)
    else
      self:deliver(m)
      self:ack(m)
    end
    self.expected = seq + 1
    while self.ahead[self.expected] and not self.result do
      local nxt = self.ahead[self.expected]
      self.ahead[self.expected] = nil
      self.ahead_n = self.ahead_n - 1
      if nxt.payload_type == PAYLOAD.handshake_request then self:handshake(nxt) else self:deliver(nxt) end
      self.expected = self.expected + 1
    end
  elseif seq > self.expected then
    -- Early: keep it (acked now) if there is room, else let the agent resend.
    if not self.ahead[seq] and self.ahead_n < self.pol.reorder_capacity then
      self.ahead[seq] = m
      self.ahead_n = self.ahead_n + 1
      self:ack(m)
    elseif self.ahead[seq] then
      self:ack(m)
    end
  else
    -- A duplicate of something delivered: re-ack so the agent stops resending.
    self:ack(m)
  end
end

function Session:read_loop()
  local ok, err = pcall(function()
    while not self.result do
      -- Back-pressure: while the reader of our output is behind, stop
      -- reading (and so stop acking); the agent holds and resends.
      -- (room(1) waits up to a second for it, so a session that ended
      -- meanwhile is noticed)
      while self.room and not self.result and not self.room(1) do end
      local data, kind = self.ws:recv()
      if not data then
        if not self.result then
          self:finish("disconnected", "disconnected",
            "the SSM data channel closed before the session ended (" .. tostring(kind) .. ")")
        end
        return
      end
      local m, derr = codec.decode(data)
      if not m then
        return self:finish("error", "protocol", "the SSM agent sent a frame sbx cannot read: " .. tostring(derr))
      end
      local t = m.message_type
      if t == "output_stream_data" then
        self:on_output_message(m)
      elseif t == "acknowledge" then
        self:on_ack(m)
      elseif t == "channel_closed" then
        local okj, c = pcall(json.decode, m.payload)
        local out = okj and type(c) == "table" and c.Output or nil
        if self.declined then
          return self:finish("error", "kms_unsupported", self.declined .. (out and out ~= "" and (" (" .. out .. ")") or ""))
        end
        return self:finish("closed", nil, nil, { output = out, exit_code = self.exit_code })
      elseif t == "pause_publication" then
        -- The service's back-pressure: no input (new or resent) until
        -- start_publication (docs/aws-protocol.md 1.9).
        self.paused = true
        self.publish:clear()
      elseif t == "start_publication" then
        self.paused = false
        self.publish:set()
        -- What waited goes at once, oldest first (what was sent before
        -- the pause is resent by the timer, as ever).
        local now = core.now()
        for _, u in ipairs(self.unacked) do
          if u.unsent then
            u.unsent, u.sent = nil, now
            self:send_frame(u.frame)
          end
        end
        self.kick:set()
      end
      -- agent_session_state and others are for the service; ignore them.
    end
  end)
  if not ok and not self.result then
    self:finish("cancelled", "cancelled", tostring(err))
  end
end

-- Every resend_interval, the oldest unacked message is sent again once the
-- RTO has passed since its last send; too many attempts end the session.
-- Idle sessions sleep until there is something to resend or a ping is due.
function Session:resend_loop()
  local pol = self.pol
  local last_ping = core.now()
  pcall(function()
    while not self.result do
      if #self.unacked == 0 then
        self.kick:clear()
        local idle = pol.keepalive_interval and (self.last_input + pol.keepalive_interval - core.now())
        self.kick:wait(math.max(0, math.min(pol.ping_interval, idle or math.huge)))
      else
        core.sleep(pol.resend_interval)
      end
      if self.result then return end
      local now = core.now()
      local u = self.unacked[1]
      if u and not self.paused and now - u.sent > self.rto then
        u.attempts = u.attempts + 1
        if u.attempts > pol.max_resends then
          return self:finish("error", "timeout", string.format(
            "the SSM agent did not acknowledge input %d after %d resends", u.seq, pol.max_resends))
        end
        u.sent = now
        self:send_frame(u.frame)
      end
      -- The service ends a session without input for 20 minutes (ECS
      -- Exec's idle timeout); a size message (the same size: no SIGWINCH)
      -- is input that changes nothing in the box.
      if pol.keepalive_interval and not self.paused and self.gate:is_set() and pol.terminal
        and now - self.last_input >= pol.keepalive_interval then
        self:queue(PAYLOAD.size, json.encode(ordered({ cols = pol.terminal.cols, rows = pol.terminal.rows }, { "cols", "rows" })))
      end
      if now - last_ping >= pol.ping_interval then
        last_ping = now
        self.ws:ping(pol.ping_payload)
      end
    end
  end)
end

-- Sends stdin bytes in policy-sized chunks; waits for the handshake to
-- complete and for room in the unacked window.
function Session:send(bytes)
  local chunk = self.pol.input_chunk
  local i = 1
  while i <= #bytes do
    while not self.result and (not self.gate:is_set() or not self.window:is_set() or self.paused) do
      if not self.gate:is_set() then self.gate:wait()
      elseif self.paused then self.publish:wait()
      else self.window:wait() end
    end
    if self.result then return nil, self.result.message or "the session ended", self.result.code or "closed" end
    self:queue(PAYLOAD.output, bytes:sub(i, i + chunk - 1))
    i = i + chunk
  end
  return true
end

-- A session that lives as long as its box (the agent's channel): core.drain
-- (the end of `sbx run`) does not wait for its reader and resend timer, as
-- task:unref; the box is closed after the drain, and the session with it.
function Session:unref()
  self.reader:unref()
  self.timer:unref()
  return self
end

function Session:wait(timeout)
  if not self.done:wait(timeout) then return nil end
  return self.result
end

function Session:close()
  self:finish("cancelled", "cancelled", "closed by sbx")
  return true
end

return M

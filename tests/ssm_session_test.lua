-- needs: python3
-- The SSM data-channel client (sbx.aws.ssm_session) against a scripted
-- agent (tests/ws_server.py /script): the rules of docs/aws-protocol.md 1.5-1.8
-- checked frame by frame, independent of the stand-in's own choices.
local tap = require "tap"
local sbx = require "sbx"
local core, json, ssm = sbx.core, sbx.json, sbx.ssm
local S = require "sbx.aws.ssm_session"

local function start_server()
  local portfile = os.tmpname()
  local p = io.popen(string.format("python3 tests/ws_server.py %d > %s 2>&1 & echo $!", core.pid(), portfile))
  local pid = tonumber(p:read("l"))
  p:close()
  for _ = 1, 200 do
    local f = io.open(portfile)
    local text = f and f:read("a")
    if f then f:close() end
    local port = text and tonumber(text:match("^(%d+)\n"))
    if port then os.remove(portfile) return port, pid end
    sbx.sleep(0.05)
  end
  error("the websocket server did not start")
end
local port, server_pid = start_server()

local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
local function unhex(h) return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end)) end

local function out(seq, payload, ptype, id)
  return ssm.encode { message_type = "output_stream_data", sequence_number = seq, flags = seq == 0 and 1 or 0,
    message_id = id or S.uuid(), payload_type = ptype or 1, payload = payload }
end
local function control(mtype, payload)
  return ssm.encode { message_type = mtype, sequence_number = 0, flags = 3, message_id = S.uuid(), payload = payload or "" }
end
local function closed(output)
  return control("channel_closed", json.encode { MessageType = "channel_closed", Output = output or "", SchemaVersion = 1 })
end

-- Runs a script; returns the session result, the output, and every message
-- the client sent (decoded; [1] is the opening text frame).
local function run(steps, opts)
  opts = opts or {}
  local file = os.tmpname()
  local f = assert(io.open(file, "w"))
  local list = {}
  for i, st in ipairs(steps) do
    if type(st) == "string" then list[i] = { send = hex(st) } else list[i] = st end
  end
  f:write(json.encode(json.array(list)))
  f:close()
  local pol = {}
  for k, v in pairs(sbx.policy.fargate.ssm) do pol[k] = v end
  for k, v in pairs(opts.pol or {}) do pol[k] = v end
  local chunks = {}
  local s = assert(S.open { url = string.format("ws://127.0.0.1:%d/script?file=%s", port, file), token = "tok",
    pol = pol, on_output = function(b) chunks[#chunks + 1] = b end })
  if opts.input and opts.after_handshake_request then
    -- Sent while the handshake is under way: it must wait for its end.
    core.spawn(function()
      while not s.handshaking and not s.result do sbx.sleep(0.01) end
      s:send(opts.input)
    end)
  elseif opts.input then
    s:send(opts.input)
  end
  local r = s:wait(opts.timeout or 10)
  if not r then s:close() end
  sbx.sleep(0.1)
  local sent = {}
  for line in io.lines(file .. ".got") do
    local raw = unhex(line)
    sent[#sent + 1] = ssm.decode(raw) or { text = raw }
  end
  os.remove(file)
  os.remove(file .. ".got")
  return r, table.concat(chunks), sent, s
end

local function acks_of(sent)
  local l = {}
  for _, m in ipairs(sent) do
    if m.message_type == "acknowledge" then l[#l + 1] = json.decode(m.payload).AcknowledgedMessageSequenceNumber end
  end
  return table.concat(l, ",")
end

local function inputs(sent, ptype)
  local l = {}
  for _, m in ipairs(sent) do
    if m.message_type == "input_stream_data" and (ptype == nil or m.payload_type == ptype) then l[#l + 1] = m end
  end
  return l
end

-- 1. Opening frame, size, in-order delivery, early frames, duplicates.
local r, text, sent = run {
  { expect = 2 },                                   -- the opening frame and the size message
  out(0, "a"), out(2, "c"), out(1, "b"), out(1, "b"), out(3, "d"),
  { expect = 8 },                                   -- the size again (see 7) and five acks
  closed("bye"),
  { sleep = 0.2 },
}
local open = json.decode(sent[1].text)
tap.is(open.TokenValue, "tok", "the opening frame carries the token")
tap.ok(open.MessageSchemaVersion == "1.0" and #open.RequestId == 36 and #open.ClientId == 36 and open.ClientVersion,
  "and the other four keys of the reference client")
local size = inputs(sent, 3)[1]
tap.ok(size and size.sequence_number == 0, "the terminal size is our input message 0")
tap.is(size and size.payload, '{"cols":300,"rows":100}', "with the policy's size")
tap.is(text, "abcd", "output is delivered in sequence order")
tap.is(acks_of(sent), "0,2,1,1,3", "every message is acked: early ones at once, duplicates again")
tap.is(r and r.reason, "closed", "channel_closed ends the session")
tap.is(r and r.output, "bye", "with its Output")
local ack
for _, m in ipairs(sent) do if not ack and m.message_type == "acknowledge" then ack = m end end
tap.ok(ack.message_type == "acknowledge" and ack.sequence_number == 0 and ack.flags == 3 and ack.payload_type == 0,
  "acks: sequence 0, flags 3, payload type 0")
tap.like(ack.payload, '^{"AcknowledgedMessageType":"output_stream_data","AcknowledgedMessageId":"%x+%-',
  "ack JSON keys in the reference client's order")

-- 2. Handshake: ack first, answer SessionType with status 1, hold input until complete.
local hs = json.encode { AgentVersion = "3.3.0.0", RequestedClientActions = json.array { {
  ActionType = "SessionType", ActionParameters = { SessionType = "InteractiveCommands" } } } }
r, text, sent = run({
  { expect = 2 },
  out(0, hs, 5),
  { expect = 4 },                                   -- its ack and our HandshakeResponse
  { sleep = 0.3 },
  out(1, json.encode { HandshakeTimeToComplete = 1000000, CustomerMessage = "" }, 7),
  { expect = 6 },                                   -- the ack of 7 and the held input
  out(2, "x"),
  { expect = 7 },
  closed(),
}, { input = "hello", after_handshake_request = true })
tap.is(sent[3].message_type, "acknowledge", "a HandshakeRequest is acked before it is answered")
local resp = inputs(sent, 6)[1]
local rj = resp and json.decode(resp.payload)
tap.ok(rj and rj.ProcessedClientActions[1].ActionType == "SessionType" and rj.ProcessedClientActions[1].ActionStatus == 1,
  "HandshakeResponse: SessionType with ActionStatus 1")
local stdin = inputs(sent, 1)[1]
local stdin_pos
for i, m in ipairs(sent) do if m == stdin then stdin_pos = i end end
local complete_ack
for i, m in ipairs(sent) do
  if m.message_type == "acknowledge" and json.decode(m.payload).AcknowledgedMessageSequenceNumber == 1 then complete_ack = i end
end
tap.ok(stdin and stdin.payload == "hello" and complete_ack and stdin_pos > complete_ack,
  "input waits for HandshakeComplete (it follows the ack of message 1)", tostring(stdin_pos) .. " " .. tostring(complete_ack))
tap.is(r and r.reason, "closed", "and the session ends normally")

-- 3. KMS is declined with a clear error.
local kms = json.encode { AgentVersion = "3.3.0.0", RequestedClientActions = json.array {
  { ActionType = "SessionType", ActionParameters = { SessionType = "InteractiveCommands" } },
  { ActionType = "KMSEncryption", ActionParameters = { KMSKeyId = "arn:aws:kms:x", Challenge = "c" } } } }
r, text, sent = run { { expect = 2 }, out(0, kms, 5), { expect = 4 }, closed("Handshake failed") }
resp = inputs(sent, 6)[1]
rj = resp and json.decode(resp.payload)
tap.ok(rj and rj.ProcessedClientActions[2].ActionStatus == 2, "KMSEncryption is answered with Failed")
tap.is(r and r.code, "kms_unsupported", "and the session fails with kms_unsupported")

-- 4. Our input is resent until acked; the ack stops it.
r, text, sent = run({
  { expect = 2 },                                   -- open + size (seq 0), not acked
  { expect = 4 },                                   -- stdin (seq 1) and a resend
  control("acknowledge", json.encode { AcknowledgedMessageType = "input_stream_data", AcknowledgedMessageId = "x",
    AcknowledgedMessageSequenceNumber = 0, IsSequentialMessage = true }),
  control("acknowledge", json.encode { AcknowledgedMessageType = "input_stream_data", AcknowledgedMessageId = "x",
    AcknowledgedMessageSequenceNumber = 1, IsSequentialMessage = true }),
  { sleep = 1.5 },
  closed(),
}, { input = "in" })
local seqs = {}
for _, m in ipairs(inputs(sent)) do seqs[#seqs + 1] = m.sequence_number end
local resent = #seqs > 2
tap.ok(resent, "unacked input is resent (sent " .. #seqs .. " times for 2 messages)")
tap.ok(#seqs <= 6, "and acks stop the resends (" .. #seqs .. " sends in 1.5 s, RTO 200 ms)")
local same_bytes = true
for _, m in ipairs(inputs(sent)) do if m.sequence_number == 1 and m.payload ~= "in" then same_bytes = false end end
tap.ok(same_bytes, "a resend carries the same payload")

-- 5. Exit code payload and a frame with a bad digest.
r = run { { expect = 2 }, out(0, "EXIT_CODE: 7", 12), closed() }
tap.is(r and r.exit_code, 7, "an ExitCode payload (12) is read when an agent sends one")
local bad = out(0, "abc")
bad = bad:sub(1, 80) .. string.rep("\0", 32) .. bad:sub(113)
r = run { { expect = 2 }, bad, { sleep = 1 } }
tap.is(r and r.code, "protocol", "a frame whose digest does not match fails the session")

-- 6. A dropped socket before channel_closed is 'disconnected'.
r = run { { expect = 2 }, out(0, "partial"), { expect = 3 }, { drop = true } }
tap.is(r and r.reason, "disconnected", "a socket that drops first is reported as disconnected")

-- 7. The agent acks no input before its PTY is up (the size message sent at
-- open, usually); its first output says it is up, so unacked input goes
-- again at once, not an RTO later (here 5 s). Fargate waits for this: its
-- secret line is sent after the first output and queues behind the size.
local t0 = sbx.now()
r, text, sent = run({
  { expect = 2 },                                   -- open + size (seq 0), not acked
  out(0, "ready"),
  { expect = 4 },                                   -- the ack of 0 and the size again
  closed(),
}, { pol = { initial_rto = 5, max_rto = 5 } })
local sizes = inputs(sent, 3)
tap.is(#sizes, 2, "input turned away before the first output is sent again")
tap.ok(sbx.now() - t0 < 2, "at the first output, not after the RTO", string.format("%.2f s", sbx.now() - t0))
tap.is(sizes[2] and sizes[2].sequence_number, 0, "as the same message")

os.execute("kill " .. server_pid .. " 2>/dev/null")
tap.done()

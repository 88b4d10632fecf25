-- The agent transport: one long-lived channel per box to sbx-agent (see
-- src/agent_proto.h for the protocol and agent/sbx_agent.c for the program),
-- which forks every command itself. A command costs a frame each way
-- instead of a daemon round trip.
--
-- The backend places the agent and opens the channel:
--   backend.agent_channel(handle, { key =, deadline =, pol = }) -> channel,
--     mac | nil, reason, code
-- where channel has write(bytes) -> queued | nil, message, code,
-- wait(timeout) -> "data" | "eof" | "timeout", take(true) -> raw bytes, info() ->
-- { eof, error, error_code } and close(); mac says frames must be
-- authenticated (the channel is a PTY that other processes could write to).
-- extra (optional): default_user, the user commands run as when they name
-- none; env, a list of NAME=value every command gets unless its own env
-- sets the name (the box's environment); retry(), for a channel that ends
-- before the agent's hello: true when the backend will place the agent
-- another way on the next agent_channel (open asks once more). A backend may also provide
-- oom_check(handle, job): asked after a command ended with SIGKILL's
-- status, it sets job.oom_killed (and job.memory_limit) when the box's OOM
-- killer did it.
--
-- and, where a dropped channel can be opened again,
--   backend.agent_attach(handle, { name =, deadline =, pol = }) -> channel |
--     nil, reason, code
-- which runs a freshly placed agent binary as "sbx-agent attach <name>" (a
-- relay to the running agent's socket) on a new channel of the same kind.
--
-- A channel that drops (the connection to the daemon, an ECS Exec session,
-- a ping that goes unanswered) is opened again: the host and the agent
-- prove the per-box key to each other and each sends again what the other
-- has not acknowledged, so running commands, background processes and
-- sessions go on and no byte is lost or doubled (src/agent_proto.h,
-- "Re-attach"). Every byte from the box is untrusted: a malformed or
-- unauthenticated frame, a frame for no job, an agent that cannot be
-- reached again within policy.agent.reattach_timeout, all end the channel;
-- the box's pending commands fail with "agent_lost" and the next command
-- places a fresh agent (never the copy left in the box).
local core = require "sbx.core"
local util = require "sbx.util"
local A = core.agent

local M = { name = "agent" }

local T = {
  HELLO = 0x01, SPAWN = 0x10, STDIN = 0x11, STDIN_EOF = 0x12, SIGNAL = 0x13, CREDIT = 0x14,
  FORGET = 0x15, READ_FILE = 0x20, WRITE_FILE = 0x21, PING = 0x30, ACK = 0x31,
  STARTED = 0x90, OUT = 0x91, EOF = 0x92, EXIT = 0x93, DONE = 0x94, KILLED = 0x95,
  ERROR = 0xA3, PONG = 0xB1, AGENT_ACK = 0xB2,
}
local F = { ARGV = 1, ENV = 2, CWD = 3, USER = 4, FLAGS = 5, PATH = 6, MAX = 7, MODE = 8,
  CODE = 9, MESSAGE = 10, VERSION = 11, PID = 12, ARCH = 13, WINDOW = 14, GRACE = 15, ACK = 16, STAGE = 17 }
local STDIN_PIPE, SOCK_OUTPUT, MKDIRS = 1, 8, 1
-- Linux's numbers (the same on x86_64 and aarch64).
local SIGNALS = { HUP = 1, INT = 2, QUIT = 3, KILL = 9, USR1 = 10, USR2 = 12, TERM = 15, CONT = 18, STOP = 19 }
M.T, M.F = T, F

local function field(tag, v) return string.pack(">Bs4", tag, v) end
local function u32(tag, n) return string.pack(">BI4I4", tag, 4, n) end

-- Fields of a payload: { [tag] = value or list of values for repeated tags }.
local function fields(payload)
  local out, pos = {}, 1
  while pos <= #payload do
    if #payload - pos + 1 < 5 then return nil end
    local tag, len = string.unpack(">BI4", payload, pos)
    if pos + 5 + len - 1 > #payload then return nil end
    local v = payload:sub(pos + 5, pos + 4 + len)
    if out[tag] == nil then out[tag] = v
    elseif type(out[tag]) == "table" then out[tag][#out[tag] + 1] = v
    else out[tag] = { out[tag], v } end
    pos = pos + 5 + len
  end
  return out
end
M.fields = fields

local random_bytes = core.random.bytes

-- Frames out ------------------------------------------------------------------------

-- With a grace (the channel may come back) every frame is kept until the
-- agent acknowledges it: kept[i] ends at byte kept_end[i] of everything
-- sent. While the channel is being opened again (st.ch is nil) frames are
-- only kept; they go out after the handshake.
local function send(st, ftype, id, payload)
  if st.dead then return nil, st.dead, "agent_lost" end
  local frame = A.encode(ftype, id, payload or "", st.mac and st.key or nil, st.seq_out)
  st.seq_out = st.seq_out + 1
  if st.grace > 0 then
    st.tx_pos = st.tx_pos + #frame
    local n = st.kept_tail + 1
    st.kept[n], st.kept_end[n], st.kept_tail = frame, st.tx_pos, n
    if not st.ch then return 0 end
  end
  local q, err = st.ch:write(frame)
  if not q then
    if st.grace > 0 and not st.closed then
      -- The reader sees the channel end and opens it again.
      st.drop_reason = st.drop_reason or ("a write to the channel failed: " .. tostring(err))
      pcall(st.ch.close, st.ch)
      return 0
    end
    M.lost(st, "the channel to the agent closed: " .. tostring(err))
    return nil, st.dead, "agent_lost"
  end
  return q
end

-- The agent has every frame that ends at or before pos.
local function acked(st, pos)
  local i = st.kept_head
  while i <= st.kept_tail and st.kept_end[i] <= pos do
    st.kept[i], st.kept_end[i] = nil, nil
    i = i + 1
  end
  st.kept_head = i
end

local function send_ack(st)
  local pos = st.dec:position()
  if pos > st.rx_acked then
    st.rx_acked = pos
    send(st, T.ACK, 0, string.pack(">I8", pos))
  end
end

-- Jobs ------------------------------------------------------------------------------

-- What box.lua reads: the job's sink, whose take() also gives back the
-- credit held while a slow on_output reader let the chunk queue grow.
local JobStream = {}
JobStream.__index = JobStream
for _, m in ipairs { "wait", "captured", "read", "info" } do
  JobStream[m] = function(self, ...) return self.sink[m](self.sink, ...) end
end

function JobStream:take(raw)
  local out, err = self.sink:take(raw)
  local job = self.job
  for s = 1, 2 do
    if job.owed[s] > 0 and not job.st.dead and job.st.jobs[job.id] then
      send(job.st, T.CREDIT, job.id, string.pack(">BI4", s, job.owed[s]))
      job.owed[s] = 0
    end
  end
  return out, err
end

-- Frees the capture's memory for good (an evicted background log).
function JobStream:release() return self.sink:release() end

function JobStream:close(code, message)
  local job = self.job
  if not self.sink:info().eof then self.sink:close(code, message) end
  -- Nothing more is read for it; the agent still reaps its tree.
  if job.st.jobs[job.id] and not job.done then send(job.st, T.FORGET, job.id) end
  job.st.jobs[job.id] = nil
end

local function complete(job)
  if job.completed then return end
  if job.error then
    job.completed = true
    job.sink:finish(job.error_code, job.error)
  elseif job.status ~= nil and job.eof[1] and job.eof[2] then
    job.completed = true
    job.sink:finish()
  end
end

local dispatch = {}

dispatch[T.STARTED] = function(_, job, p)
  if #p >= 4 then job.pid = string.unpack(">I4", p) end
end

-- Credit goes back in batches (a quarter of the window), not per frame.
local function give_credit(st, job, s, n)
  local c = (job.credit or 0) + n
  if c >= st.window // 4 then
    send(st, T.CREDIT, job.id, string.pack(">BI4", s, c))
    c = 0
  end
  job.credit = c
  job.credit_stream = s
end

-- The decoder hands OUT frames over as (bytes, stream), or, having pushed
-- them into job.sink itself (drain passes it st.jobs), as (their count,
-- stream, what the push returned).
dispatch[T.OUT] = function(st, job, bytes, s, pushed)
  if s ~= 1 and s ~= 2 then return M.lost(st, "output for an unknown stream") end
  local q, n
  if math.type(bytes) == "integer" then
    q, n = pushed, bytes
  else
    q, n = job.sink:push(s == 1 and "stdout" or "stderr", bytes), #bytes
  end
  if job.on_bytes then job.on_bytes(job) end
  if q and q > job.chunk_limit then
    job.owed[s] = job.owed[s] + n       -- given back at take()
  elseif job.credit_stream and job.credit_stream ~= s and job.credit > 0 then
    send(st, T.CREDIT, job.id, string.pack(">BI4", job.credit_stream, job.credit))
    job.credit = 0
    give_credit(st, job, s, n)
  else
    give_credit(st, job, s, n)
  end
end

dispatch[T.EOF] = function(st, job, p)
  local s = p:byte(1)
  if s ~= 1 and s ~= 2 then return M.lost(st, "end of an unknown stream") end
  job.eof[s] = true
  complete(job)
end

dispatch[T.EXIT] = function(_, job, p)
  if #p < 4 then return end
  local v = string.unpack(">i4", p)
  if v < 0 then job.status, job.signal = 128 - v, -v else job.status = v end
  complete(job)
end

dispatch[T.DONE] = function(st, job)
  job.done = true
  if job.status == nil and not job.error then
    job.error, job.error_code = "the command's process vanished without an exit status", "no_exit_code"
  end
  job.eof[1], job.eof[2] = true, true
  complete(job)
  -- The agent has sent all there is: the transport lets go of the job (its
  -- reader keeps the sink as long as it reads it). Kept, every command a
  -- box ever ran would hold its captured output until the box closed.
  st.jobs[job.id] = nil
end

dispatch[T.KILLED] = function(_, job, p)
  job.killed = #p >= 4 and string.unpack(">I4", p) or 0
  if job.kill_event then job.kill_event:set() end
end

dispatch[T.CREDIT] = function(_, job, p)
  if #p < 4 then return end
  job.stdin_unacked = math.max(0, job.stdin_unacked - string.unpack(">I4", p))
  if job.stdin_event then job.stdin_event:set() end
end

dispatch[T.ERROR] = function(st, job, p)
  local f = fields(p) or {}
  job.error = tostring(f[F.MESSAGE] or "the agent refused the command")
  job.error_code = tostring(f[F.CODE] or "agent_error")
  if job.error_code == "exec_failed" and job.req then
    -- The command never started (its directory, user or exec failed): the
    -- agent sends nothing more for it; the message is the policy's.
    local req, box = job.req, st.boxref and st.boxref[1]
    local pol = box and box:policy() or st.pol
    job.error = pol.format_exec_failed({ stage = tostring(f[F.STAGE] or "exec"), reason = job.error,
      program = req.argv and req.argv[1], cwd = req.cwd, user = req.user or st.default_user }, pol)
    st.jobs[job.id] = nil
    if job.stdin_event then job.stdin_event:set() end
  end
  complete(job)
end

-- M.lost(st, why [, code]): the channel is gone; every pending command
-- fails with code ("agent_lost" unless the backend said why: a box frozen
-- for its disk ends the channel with "disk_exceeded").
function M.lost(st, why, code)
  if st.dead then return end
  st.dead = why
  code = code or "agent_lost"
  local prefix = code == "agent_lost" and "the box's agent was lost: " or ""
  if st.ch then pcall(st.ch.close, st.ch) end
  st.kept, st.kept_end = {}, {}
  for _, job in pairs(st.jobs) do
    if not job.completed then
      job.completed = true
      job.sink:finish(code, prefix .. why)
    end
    if job.kill_event then job.kill_event:set() end
    if job.stdin_event then job.stdin_event:set() end
  end
  if st.hello_event then st.hello_event:set() end
end

local function on_frame(st, ftype, id, payload, stream, pushed)
  st.last_rx = core.now()
  if id == 0 then
    if ftype == T.HELLO then
      local f = fields(payload)
      if not f then return M.lost(st, "a malformed HELLO") end
      st.agent_version = f[F.VERSION] and string.unpack(">I4", f[F.VERSION])
      st.agent_pid = f[F.PID] and string.unpack(">I4", f[F.PID])
      st.arch = f[F.ARCH]
      st.hello = true
      if st.hello_event then st.hello_event:set() end
    elseif ftype == T.PONG then
      st.ping_sent = nil
      if st.pong_event then st.pong_event:set() end
    elseif ftype == T.AGENT_ACK and #payload == 8 then
      st.acks_seen = true
      acked(st, (string.unpack(">I8", payload)))
    elseif ftype == T.ERROR then
      local f = fields(payload) or {}
      M.lost(st, string.format("the agent said: %s (%s)", tostring(f[F.MESSAGE]), tostring(f[F.CODE])))
    else
      M.lost(st, string.format("an unexpected frame 0x%02x from the agent", ftype))
    end
    return
  end
  local job = st.jobs[id]
  if not job then
    -- A frame for a job the host forgot (it raced the FORGET): harmless.
    if id < st.next_id then return end
    return M.lost(st, "a frame for a job that was never started")
  end
  local h = dispatch[ftype]
  if not h then return M.lost(st, string.format("an unknown frame 0x%02x from the agent", ftype)) end
  h(st, job, payload, stream, pushed)
end

-- Frames the decoder holds, to their handlers.
local function drain(st)
  local dec = st.dec
  while not st.dead do
    local ftype, id, payload, stream, pushed = dec:next(st.jobs)
    if ftype == nil then break end
    if ftype == false then M.lost(st, payload) break end
    on_frame(st, ftype, id, payload, stream, pushed)
  end
  if st.grace > 0 and not st.dead and dec:position() - st.rx_acked >= st.ack_bytes then send_ack(st) end
end

local function random_bytes_or_fail(n)
  local b = random_bytes(n)
  if not b then error("no random bytes", 0) end
  return b
end

-- Reads exactly n more bytes of the handshake (buf holds what came early).
local function handshake_read(ch, buf, n, deadline)
  while #buf[1] < n do
    local ev = ch:wait(math.max(0.001, deadline - core.now()))
    local b = ch:take(true)
    if b and #b > 0 then buf[1] = buf[1] .. b end
    if #buf[1] >= n then break end
    if ev == "eof" then return nil, "eof" end
    if ev == "timeout" then return nil, "timeout" end
  end
  return true
end

-- The attach handshake on a fresh relay (src/agent_proto.h, "Re-attach"):
-- each side proves the key, says what it has, and the host sends again every
-- kept frame the agent lacks.
local hex, unhex = util.hex, util.unhex

local function handshake(st, ch, deadline)
  local buf = { "" }
  local ok, why = handshake_read(ch, buf, 36, deadline)
  local nonce_a = ok and buf[1]:sub(1, 4) == "SBXA" and unhex(buf[1]:sub(5, 36))
  if not nonce_a then
    -- The relay says why on stderr (a PTY mixes it into the channel).
    local said = ((ch.captured and ch:captured("stderr") or "") .. buf[1]):sub(1, 300)
    said = said:gsub("[^%g ]+", " "):gsub("^%s+", ""):gsub("%s+$", "")
    if why == "timeout" and said == "" then
      return nil, "the agent did not answer on its attach socket", "agent_unresponsive"
    end
    return nil, "the agent is gone" .. (said ~= "" and (" (" .. said .. ")") or ""), "agent_gone"
  end
  local nonce_h = random_bytes_or_fail(16)
  buf[1] = buf[1]:sub(37)
  local rx = st.dec:resume()
  ch:write(hex(nonce_h .. A.attach_proof(st.key, "host", nonce_a, nonce_h) .. string.pack(">I8", rx)))
  ok = handshake_read(ch, buf, 80, deadline)
  local answer = ok and unhex(buf[1]:sub(1, 80))
  if not answer then return nil, "the agent refused the attach", "agent_gone" end
  if answer:sub(1, 32) ~= A.attach_proof(st.key, "agent", nonce_a, nonce_h) then
    return nil, "the process on the agent's attach socket could not prove the box's key", "bad_proof"
  end
  local agent_rx = string.unpack(">I8", answer, 33)
  acked(st, agent_rx)
  local i = st.kept_head
  if i <= st.kept_tail and st.kept_end[i] - #st.kept[i] ~= agent_rx then
    return nil, "the agent's position does not match what the host kept", "bad_proof"
  end
  if i > st.kept_tail and agent_rx ~= st.tx_pos then
    return nil, "the agent's position does not match what the host sent", "bad_proof"
  end
  for j = i, st.kept_tail do ch:write(st.kept[j]) end
  st.rx_acked = rx
  return true, buf[1]:sub(81)
end

-- Opens the channel again after a drop; true, or nil and why.
local function reattach(st, why, gen)
  local box = st.boxref[1]
  if not box then return nil, why end
  local pol = st.pol.agent
  local deadline = core.now() + pol.reattach_timeout
  local name = A.attach_name(st.key)
  local last, delay = why, 0.05
  st.ch = nil
  while not st.dead and not st.closed and st.gen == gen do
    local ch, err, code = box.impl.agent_attach(box.handle, { name = name, deadline = deadline, pol = st.pol })
    if ch then
      local ok, rest, hcode = handshake(st, ch, math.min(deadline, core.now() + pol.attach_timeout))
      if st.gen ~= gen then pcall(ch.close, ch) return nil, "replaced" end
      if ok then
        if st.dead or st.closed then pcall(ch.close, ch) return nil, st.dead or "the box was closed" end
        st.ch = ch
        st.reattached = (st.reattached or 0) + 1
        st.last_rx, st.ping_sent = core.now(), nil
        if #rest > 0 then st.dec:feed(rest) drain(st) end
        return true
      end
      pcall(ch.close, ch)
      -- The relay reached the socket (or found none): trying again cannot help.
      return nil, string.format("the channel dropped (%s) and the agent could not be reached again: %s", why, rest),
        hcode == "bad_proof" and "agent_lost" or nil
    else
      last = err
      -- A daemon that refuses (its socket gone, nothing listening; asked
      -- once more, backend.ping) is not a dropped connection: the commands
      -- fail now, saying so.
      if code == "daemon_unavailable" and box.impl.ping then
        local up, _, pcode = box.impl.ping(box.handle)
        if not up and pcode == "daemon_unavailable" then
          return nil, string.format("the channel dropped (%s): %s", why, err), code
        end
      end
      if code == "box_gone" or code == "unsupported" or code == "disk_exceeded" then
        return nil, string.format("the channel dropped (%s): %s", why, err), code
      end
    end
    if core.now() + delay >= deadline then break end
    core.sleep(delay)
    delay = math.min(delay * 2, 1)
  end
  return nil, string.format("the channel dropped (%s) and the agent could not be reached again within %g s: %s",
    why, pol.reattach_timeout, tostring(last))
end

local function can_reattach(st)
  local box = st.boxref[1]
  return st.grace > 0 and st.attachable and not st.closed and box ~= nil and box.impl.agent_attach ~= nil
end

-- The channel reader: one task per box.
local function reader(st, gen)
  while not st.dead and st.gen == gen do
    local ch = st.ch
    local ev = ch:wait()
    if ev == "data" or ev == "eof" then
      -- A core.stream hands its bytes to the decoder without a Lua string
      -- (a backend's wrapper of one is read through its take).
      if type(ch) == "userdata" then
        if st.dec:feed_from(ch) > 0 then drain(st) end
      else
        local bytes = ch:take(true)
        if bytes and #bytes > 0 then
          st.dec:feed(bytes)
          drain(st)
        end
      end
    end
    if ev == "eof" and not st.dead and st.gen == gen then
      local info = ch:info()
      -- A code the backend set (disk_exceeded, box_gone) is the box's, not the agent's.
      local code = info.error_code ~= "closed" and info.error_code or nil
      local why = st.drop_reason or info.error or "the agent ended the channel"
      st.drop_reason = nil
      if code == "disk_exceeded" or code == "box_gone" or not can_reattach(st) or not st.hello_done then
        M.lost(st, why, code)
      else
        local ok, err, ecode = reattach(st, why, gen)
        if st.gen ~= gen then return end
        if not ok then M.lost(st, err, ecode) end
      end
    end
  end
end

-- Keep-alives: idle channels are cut by ECS Exec and load balancers, and a
-- silent agent must not leave commands waiting forever. One task for every
-- channel of the process (a task per box would cost every idle box a
-- coroutine): each pass pings the channels idle for ping_interval and
-- declares lost those whose ping went unanswered for ping_timeout.
local channels = setmetatable({}, { __mode = "k" })   -- st -> true
local pinger_task

local function pinger()
  while next(channels) do
    local now, nearest = core.now(), math.huge
    for st in pairs(channels) do
      if st.dead or st.closed then
        channels[st] = nil
      elseif not st.ch then
        nearest = math.min(nearest, 1)   -- being opened again
      else
        local pol = st.pol.agent
        if st.ping_sent then
          if now - st.ping_sent >= pol.ping_timeout then
            local why = string.format("the agent did not answer a ping within %g s", pol.ping_timeout)
            if can_reattach(st) then
              -- A half-open connection looks like this too: try the way back.
              st.drop_reason, st.ping_sent = why, nil
              pcall(st.ch.close, st.ch)
            else
              M.lost(st, why)
              channels[st] = nil
            end
          else
            nearest = math.min(nearest, st.ping_sent + pol.ping_timeout - now)
          end
        elseif now - st.last_rx >= pol.ping_interval then
          st.ping_sent = now
          if st.grace > 0 then send_ack(st) end
          send(st, T.PING, 0, "")
          nearest = math.min(nearest, pol.ping_timeout)
        else
          nearest = math.min(nearest, st.last_rx + pol.ping_interval - now)
        end
      end
    end
    if next(channels) then core.sleep(math.max(0.01, math.min(nearest, 1))) end
  end
  pinger_task = nil
end

local function watch(st)
  channels[st] = true
  if not pinger_task then
    pinger_task = core.spawn(pinger)
    pinger_task:unref()
  end
end

-- Opening -------------------------------------------------------------------------------

-- Each opening of a channel has its own generation: a reader or re-attach
-- of an earlier one (the state table is reused, see alive) stops at once.
local generation = 0

-- open(box, pol [, into [, deadline]]) -> state | nil, reason, code. into:
-- the state table of a lost agent, filled anew (jobs hold it); deadline: the
-- command's that waits for it (placing is bounded by it too).
function M.open(box, pol, into, by)
  local backend = box.impl
  if not backend.agent_channel then
    return nil, string.format("the %s backend cannot carry sbx-agent", box.backend_name), "unsupported"
  end
  local key = random_bytes(A.KEY)
  if not key then return nil, "no random bytes for the agent's key", "no_random" end
  local deadline = math.min(core.now() + pol.agent.start_timeout, by or math.huge)
  local ch, mac_or_err, extra = backend.agent_channel(box.handle, { key = key, deadline = deadline, pol = pol })
  if not ch then return nil, mac_or_err, extra end
  extra = type(extra) == "table" and extra or {}
  local st = {
    -- Weak: the channel's tasks must not keep a dropped box from its
    -- collector (whose __gc removes it).
    boxref = setmetatable({ box }, { __mode = "v" }),
    ch = ch, key = key, mac = mac_or_err == true, seq_out = 0,
    dec = A.decoder(mac_or_err == true and key or nil), jobs = {}, next_id = 1,
    window = pol.agent.window, hello_event = core.event(),
    default_user = extra.default_user, pol = pol,
    -- A channel that can be opened again: frames kept until acknowledged.
    grace = (backend.agent_attach and pol.agent.reattach_grace > 0) and pol.agent.reattach_grace or 0,
    ack_bytes = pol.agent.ack_bytes, kept = {}, kept_end = {}, kept_head = 1, kept_tail = 0,
    tx_pos = 0, rx_acked = 0,
    env = extra.env,
  }
  if into then
    for k in pairs(into) do into[k] = nil end
    for k, v in pairs(st) do into[k] = v end
    st = into
  end
  generation = generation + 1
  st.gen = generation
  -- The mode byte and the key go before any frame; lower case asks the
  -- agent to run beside the channel's process (which the backend may kill
  -- when the channel ends).
  local mode = st.mac and "M" or "P"
  if extra.relay then mode = mode:lower() end
  local ok, err = ch:write(mode .. key)
  if not ok then
    M.lost(st, "cannot write to the agent: " .. tostring(err))
    return nil, st.dead, "agent_unavailable"
  end
  st.reader = core.spawn(reader, st, st.gen)
  st.reader:unref()
  if not st.hello_event:wait(math.max(0.001, deadline - core.now())) or not st.hello then
    local why = st.dead or "the agent did not say hello in time"
    local said = ch.captured and ch:captured("stderr") or ""
    if said ~= "" then why = why .. " (" .. said:gsub("%s+$", "") .. ")" end
    local ended = st.dead ~= nil
    M.lost(st, why)
    -- The channel ended before a hello (the agent never ran): a backend
    -- with another way to place it says so (extra.retry), once.
    if ended and extra.retry and extra.retry() then return M.open(box, pol, into, by) end
    return nil, why, "agent_unavailable"
  end
  st.hello_event = nil
  if st.agent_version ~= A.VERSION then
    M.lost(st, "the agent speaks protocol " .. tostring(st.agent_version))
    return nil, st.dead, "agent_unavailable"
  end
  local hello = u32(F.VERSION, A.VERSION) .. u32(F.WINDOW, st.window)
  if st.grace > 0 then
    hello = hello .. u32(F.GRACE, math.ceil(st.grace)) .. u32(F.ACK, st.ack_bytes)
  end
  send(st, T.HELLO, 0, hello)
  if st.grace > 0 then
    -- A channel that drops before the agent has read GRACE cannot come
    -- back (the agent ends with it): one round trip settles it before the
    -- first command. An agent that could not open its attach socket sends
    -- no acknowledgement; its box works without the way back.
    st.pong_event = core.event()
    send(st, T.PING, 0, "hello")
    if not st.pong_event:wait(math.max(0.001, deadline - core.now())) or st.dead then
      M.lost(st, st.dead or "the agent did not answer its first ping in time")
      return nil, st.dead, "agent_unavailable"
    end
    st.pong_event = nil
    st.attachable = st.acks_seen
  end
  st.hello_done = true
  st.last_rx = core.now()
  watch(st)
  return st
end

-- A lost agent is replaced before the next command: every process of the
-- box goes first (backend.clear: the lost agent, its supervisors, whatever
-- its commands left, detached or stopped), then a fresh agent is placed.
local function alive(st, deadline)
  if not st.dead then return true end
  local box = st.boxref[1]
  if st.closed or not box then return nil, "the box is closed", "box_gone" end
  local was = st.dead
  local pol = box:policy()
  if box.impl.clear then
    local ok, why, code = box.impl.clear(box.handle,
      math.min(core.now() + pol.agent.clear_timeout, deadline or math.huge))
    if not ok then
      return nil, "the box's agent was lost (" .. tostring(was) .. ") and its processes could not be ended: " ..
        tostring(why), code or "agent_lost"
    end
  end
  local fresh, why, code = M.open(box, pol, st, deadline)
  if not fresh then
    st.dead = st.dead or was
    if code == "disk_exceeded" or code == "box_gone" or code == "daemon_unavailable" then return nil, why, code end
    return nil, "the box's agent was lost (" .. tostring(was) .. ") and could not be started again: " .. tostring(why), code or "agent_lost"
  end
  return true
end

-- Commands -------------------------------------------------------------------------------

local function new_job(st, req, kind)
  local id = st.next_id
  st.next_id = id + 1
  local job = {
    id = id, st = st, kind = kind, marker = req.marker, eof = {}, owed = { 0, 0 },
    chunk_limit = req.chunk_limit or (1 << 20), stdin_unacked = 0,
    sink = core.stream.sink { capture = req.capture, chunks = req.chunks, chunk_limit = req.chunk_limit },
  }
  job.stream = setmetatable({ sink = job.sink, job = job }, JobStream)
  st.jobs[id] = job
  return job
end

-- Sends data as the job's stdin within the agent's window, then its end.
local function feed_stdin(st, job, data)
  local box = st.boxref[1]
  local chunk = box and box:policy().agent.stdin_chunk or 65536
  local pos = 1
  while pos <= #data and not st.dead and not job.completed do
    if job.stdin_unacked >= st.window then
      job.stdin_event = core.event()
      job.stdin_event:wait()
      job.stdin_event = nil
    else
      local n = math.min(chunk, #data - pos + 1, st.window - job.stdin_unacked)
      job.stdin_unacked = job.stdin_unacked + n
      if not send(st, T.STDIN, job.id, data:sub(pos, pos + n - 1)) then return end
      pos = pos + n
    end
  end
  if not st.dead then send(st, T.STDIN_EOF, job.id) end
end

local function spawn_payload(req, flags, default_user, box_env)
  local parts = {}
  for _, a in ipairs(req.argv) do parts[#parts + 1] = field(F.ARGV, a) end
  local named = {}
  for _, e in ipairs(req.env or {}) do
    parts[#parts + 1] = field(F.ENV, e)
    named[e:match("^[^=]*")] = true
  end
  for _, e in ipairs(box_env or {}) do
    if not named[e:match("^[^=]*")] then parts[#parts + 1] = field(F.ENV, e) end
  end
  if req.cwd then parts[#parts + 1] = field(F.CWD, tostring(req.cwd)) end
  local user = req.user or default_user
  if user then parts[#parts + 1] = field(F.USER, tostring(user)) end
  parts[#parts + 1] = u32(F.FLAGS, flags)
  return table.concat(parts)
end

function M.start(st, req)
  local ok, err, code = alive(st, req.deadline)
  if not ok then return nil, err, code end
  local flags = (req.stdin and STDIN_PIPE or 0) | (st.pol.agent.private_output and SOCK_OUTPUT or 0)
  local payload = spawn_payload(req, flags, st.default_user, st.env)
  if #payload > A.MAX_PAYLOAD then
    return nil, string.format("the command and its environment are %d bytes, more than the agent takes (%d)",
      #payload, A.MAX_PAYLOAD), "too_large"
  end
  local job = new_job(st, req, "command")
  job.req = req
  if not send(st, T.SPAWN, job.id, payload) then return nil, st.dead, "agent_lost" end
  if req.stdin then
    if #req.stdin == 0 then send(st, T.STDIN_EOF, job.id)
    else core.spawn(feed_stdin, st, job, req.stdin) end
  end
  return job
end

-- A command that ended with SIGKILL's status may have met the OOM killer:
-- the backend can tell (oom_check sets job.oom_killed, job.memory_limit).
function M.finish(st, job)
  if job.error then return nil, job.error, job.error_code end
  local box = st.boxref and st.boxref[1]
  if job.status == 137 and box and box.impl.oom_check and not job.oom_checked then
    job.oom_checked = true
    box.impl.oom_check(box.handle, job)
  end
  return job.status
end

-- The exit signal, for results: job.signal when the agent saw one.
function M.signal_of(job) return job.signal end

function M.kill(st, job, signal, deadline)
  if st.dead then return nil, st.dead, "agent_lost" end
  local sig = SIGNALS[tostring(signal or "KILL"):gsub("^SIG", "")]
  if not sig then return nil, "unknown signal " .. tostring(signal), "bad_signal" end
  job.kill_event = core.event()
  if not send(st, T.SIGNAL, job.id, string.char(sig, 1)) then return nil, st.dead, "agent_lost" end
  local left = deadline and math.max(0.001, deadline - core.now()) or nil
  local got = job.kill_event:wait(left)
  job.kill_event = nil
  if st.dead then return nil, st.dead, "agent_lost" end
  if not got then
    -- An agent that confirms no kill in time (stopped, hung) serves no
    -- command either: it is given up now, and the next command places a
    -- fresh one after the box's processes are gone (alive).
    local why = "the agent did not confirm the kill in time"
    M.lost(st, why, "agent_unresponsive")
    return nil, why, "agent_unresponsive"
  end
  return true
end

-- Files -----------------------------------------------------------------------------------

-- read_file(st, path, max, deadline) -> bytes | nil, message, code. Stops
-- and kills the reader past max bytes (a FIFO, /dev/zero never end).
function M.read_file(st, path, max, deadline)
  local ok, err, code = alive(st, deadline)
  if not ok then return nil, err, code end
  local job = new_job(st, { capture = { stdout = { head = max + 1, tail = 0 }, stderr = { head = 4096, tail = 0 },
    output = { head = 0, tail = 0 } } }, "read")
  local over = core.event()
  job.on_bytes = function(j) if select(3, j.sink:captured("stdout")) > max then over:set() end end
  if not send(st, T.READ_FILE, job.id, field(F.PATH, path)) then return nil, st.dead, "agent_lost" end
  local finished = core.spawn(function() job.sink:wait(math.max(0.001, deadline - core.now())) over:set() end)
  over:wait()
  finished:cancel()
  local _, _, total = job.sink:captured("stdout")
  if total > max then
    M.kill(st, job, "KILL", core.now() + 5)
    job.stream:close()
    return nil, string.format("%s has more than the %d bytes allowed by policy (files.max_read)", path, max), "too_large"
  end
  if not job.sink:info().eof then
    M.kill(st, job, "KILL", core.now() + 5)
    job.stream:close()
    return nil, "timed out reading " .. path, "timeout"
  end
  st.jobs[job.id] = nil
  if job.error then return nil, job.error, job.error_code end
  if job.status ~= 0 then
    local msg = job.sink:captured("stderr")
    return nil, (msg ~= "" and msg or ("cannot read " .. path)), "not_found"
  end
  return (job.sink:captured("stdout"))
end

-- write_file(st, path, data, opts, deadline) -> true | nil, message, code
function M.write_file(st, path, data, opts, deadline)
  local ok, err, code = alive(st, deadline)
  if not ok then return nil, err, code end
  local job = new_job(st, { capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 },
    output = { head = 0, tail = 0 } } }, "write")
  local payload = field(F.PATH, path) .. u32(F.FLAGS, opts.make_parents and MKDIRS or 0)
  if opts.mode then payload = payload .. u32(F.MODE, opts.mode) end
  if not send(st, T.WRITE_FILE, job.id, payload) then return nil, st.dead, "agent_lost" end
  feed_stdin(st, job, data)
  if job.sink:wait(math.max(0.001, deadline - core.now())) ~= "eof" then
    M.kill(st, job, "KILL", core.now() + 5)
    job.stream:close()
    return nil, "timed out writing " .. path, "timeout"
  end
  st.jobs[job.id] = nil
  if job.error then return nil, job.error, job.error_code end
  if job.status ~= 0 then
    return nil, (job.sink:captured("stderr")), "write_failed"
  end
  return true
end

function M.close(st)
  if st.closed then return end
  st.closed = true
  M.lost(st, "the box was closed")
end

return M

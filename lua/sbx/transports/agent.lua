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
-- sets the name (the box's environment). A backend may also provide
-- oom_killed(handle) -> killed, memory_limit: asked after a command ended
-- with SIGKILL's status, it says whether the box's OOM killer did it.
--
-- Every byte from the box is untrusted: a malformed or unauthenticated
-- frame, a frame for no job, an agent that goes quiet past its pings, all
-- end the channel; the box's pending commands fail with "agent_lost" and
-- the next command places a fresh agent (never the copy left in the box).
local core = require "sbx.core"
local A = core.agent

local M = { name = "agent" }

local T = {
  HELLO = 0x01, SPAWN = 0x10, STDIN = 0x11, STDIN_EOF = 0x12, SIGNAL = 0x13, CREDIT = 0x14,
  FORGET = 0x15, READ_FILE = 0x20, WRITE_FILE = 0x21, PING = 0x30,
  STARTED = 0x90, OUT = 0x91, EOF = 0x92, EXIT = 0x93, DONE = 0x94, KILLED = 0x95, MARK = 0x96,
  ERROR = 0xA3, PONG = 0xB1,
}
local F = { ARGV = 1, ENV = 2, CWD = 3, USER = 4, FLAGS = 5, PATH = 6, MAX = 7, MODE = 8,
  CODE = 9, MESSAGE = 10, VERSION = 11, PID = 12, ARCH = 13, WINDOW = 14 }
local STDIN_PIPE, SESSION, MKDIRS = 1, 4, 1
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

local function random_bytes(n)
  local f = io.open("/dev/urandom", "rb")
  if not f then return nil end
  local b = f:read(n)
  f:close()
  return b and #b == n and b or nil
end

-- Frames out ------------------------------------------------------------------------

local function send(st, ftype, id, payload)
  if st.dead then return nil, st.dead, "agent_lost" end
  local frame = A.encode(ftype, id, payload or "", st.mac and st.key or nil, st.seq_out)
  st.seq_out = st.seq_out + 1
  local q, err = st.ch:write(frame)
  if not q then
    M.lost(st, "the channel to the agent closed: " .. tostring(err))
    return nil, st.dead, "agent_lost"
  end
  return q
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
  if job.session and (job.status ~= nil or job.done or job.error) then
    -- The session's shell ended (exit in a command, or it was killed): the
    -- running command ends with the shell's status; the next gets a new one.
    local cur = job.session.current
    if cur and cur.shell_job == job and not cur.completed then
      cur.completed = true
      cur.status = job.status
      if job.signal then cur.signal = job.signal end
      if cur.status == nil then
        cur.error, cur.error_code = job.error or "the session's shell ended", job.error_code or "session_lost"
        cur.sink:finish(cur.error_code, cur.error)
      else
        cur.sink:finish()
      end
      if cur.mark_event then cur.mark_event:set() end
    end
    if job.session.job == job then job.session.reset_pending = true end
  end
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

-- The decoder hands OUT frames over as (bytes, stream).
dispatch[T.OUT] = function(st, job, bytes, s)
  if s ~= 1 and s ~= 2 then return M.lost(st, "output for an unknown stream") end
  if job.session then
    -- A session shell's output belongs to the command it is running.
    local cur = job.session.current
    if cur and cur.shell_job == job and not cur.completed then cur.sink:push(s == 1 and "stdout" or "stderr", bytes) end
    send(st, T.CREDIT, job.id, string.pack(">BI4", s, #bytes))
    return
  end
  local q = job.sink:push(s == 1 and "stdout" or "stderr", bytes)
  if job.on_bytes then job.on_bytes(job) end
  if q and q > job.chunk_limit then
    job.owed[s] = job.owed[s] + #bytes       -- given back at take()
  elseif job.credit_stream and job.credit_stream ~= s and job.credit > 0 then
    send(st, T.CREDIT, job.id, string.pack(">BI4", job.credit_stream, job.credit))
    job.credit = 0
    give_credit(st, job, s, #bytes)
  else
    give_credit(st, job, s, #bytes)
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
  if job.completed and job.closed_by_host then st.jobs[job.id] = nil end
end

dispatch[T.MARK] = function(st, job, p)
  if #p < 8 or not job.session then return M.lost(st, "a mark for a job that is no session") end
  local seq, status = string.unpack(">I4i4", p)
  local cur = job.session.current
  if cur and cur.shell_job == job and cur.seq == seq and not cur.completed then
    if status > 128 and status < 160 then cur.signal = status - 128 end
    cur.status = status
    cur.completed = true
    cur.sink:finish()
    if cur.mark_event then cur.mark_event:set() end
  end
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

dispatch[T.ERROR] = function(_, job, p)
  local f = fields(p) or {}
  job.error = tostring(f[F.MESSAGE] or "the agent refused the command")
  job.error_code = tostring(f[F.CODE] or "agent_error")
  complete(job)
end

-- M.lost(st, why): the channel is gone; every pending command fails.
function M.lost(st, why)
  if st.dead then return end
  st.dead = why
  pcall(st.ch.close, st.ch)
  for _, job in pairs(st.jobs) do
    local cur = job.session and job.session.current
    if cur and not cur.completed then
      cur.completed = true
      cur.sink:finish("agent_lost", "the box's agent was lost: " .. why)
    end
    if not job.completed then
      job.completed = true
      job.sink:finish("agent_lost", "the box's agent was lost: " .. why)
    end
    if job.kill_event then job.kill_event:set() end
    if job.stdin_event then job.stdin_event:set() end
  end
  if st.hello_event then st.hello_event:set() end
end

local function on_frame(st, ftype, id, payload, stream)
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
  h(st, job, payload, stream)
end

-- The channel reader: one task per box.
local function reader(st)
  local ch, dec = st.ch, st.dec
  while not st.dead do
    local ev = ch:wait()
    if ev == "data" or ev == "eof" then
      local bytes = ch:take(true)
      if bytes and #bytes > 0 then
        dec:feed(bytes)
        while not st.dead do
          local ftype, id, payload, stream = dec:next()
          if ftype == nil then break end
          if ftype == false then M.lost(st, payload) break end
          on_frame(st, ftype, id, payload, stream)
        end
      end
    end
    if ev == "eof" then
      local info = ch:info()
      M.lost(st, info.error or "the agent ended the channel")
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
      else
        local pol = st.pol.agent
        if st.ping_sent then
          if now - st.ping_sent >= pol.ping_timeout then
            M.lost(st, string.format("the agent did not answer a ping within %g s", pol.ping_timeout))
            channels[st] = nil
          else
            nearest = math.min(nearest, st.ping_sent + pol.ping_timeout - now)
          end
        elseif now - st.last_rx >= pol.ping_interval then
          st.ping_sent = now
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

-- open(box, pol) -> state | nil, reason, code
function M.open(box, pol)
  local backend = box.backend
  if not backend.agent_channel then
    return nil, string.format("the %s backend cannot carry sbx-agent", box.backend_name), "unsupported"
  end
  local key = random_bytes(A.KEY)
  if not key then return nil, "no random bytes for the agent's key", "no_random" end
  local deadline = core.now() + pol.agent.start_timeout
  local ch, mac_or_err, extra = backend.agent_channel(box.handle, { key = key, deadline = deadline, pol = pol })
  if not ch then return nil, mac_or_err, extra end
  local st = {
    -- Weak: the channel's tasks must not keep a dropped box from its
    -- collector (whose __gc removes it).
    boxref = setmetatable({ box }, { __mode = "v" }),
    ch = ch, key = key, mac = mac_or_err == true, seq_out = 0,
    dec = A.decoder(mac_or_err == true and key or nil), jobs = {}, next_id = 1,
    window = pol.agent.window, hello_event = core.event(),
    default_user = type(extra) == "table" and extra.default_user or nil,
    env = type(extra) == "table" and extra.env or nil,
  }
  -- The mode byte and the key go before any frame.
  local ok, err = ch:write((st.mac and "M" or "P") .. key)
  if not ok then ch:close() return nil, "cannot write to the agent: " .. tostring(err), "agent_unavailable" end
  st.reader = core.spawn(reader, st)
  st.reader:unref()
  if not st.hello_event:wait(math.max(0.001, deadline - core.now())) or not st.hello then
    local why = st.dead or "the agent did not say hello in time"
    local said = ch.captured and ch:captured("stderr") or ""
    if said ~= "" then why = why .. " (" .. said:gsub("%s+$", "") .. ")" end
    M.lost(st, why)
    return nil, why, "agent_unavailable"
  end
  st.hello_event = nil
  if st.agent_version ~= A.VERSION then
    M.lost(st, "the agent speaks protocol " .. tostring(st.agent_version))
    return nil, st.dead, "agent_unavailable"
  end
  send(st, T.HELLO, 0, u32(F.VERSION, A.VERSION) .. u32(F.WINDOW, st.window))
  st.pol = pol
  st.last_rx = core.now()
  watch(st)
  return st
end

-- A lost agent is replaced before the next command: placed anew.
local function alive(st)
  if not st.dead then return true end
  local box = st.boxref[1]
  if st.closed or not box then return nil, "the box is closed", "box_gone" end
  local fresh, why, code = M.open(box, box:policy())
  if not fresh then return nil, "the box's agent was lost (" .. tostring(st.dead) .. ") and could not be started again: " .. tostring(why), code or "agent_lost" end
  for k in pairs(st) do st[k] = nil end
  for k, v in pairs(fresh) do st[k] = v end
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
  local ok, err, code = alive(st)
  if not ok then return nil, err, code end
  local payload = spawn_payload(req, req.stdin and STDIN_PIPE or 0, st.default_user, st.env)
  if #payload > A.MAX_PAYLOAD then
    return nil, string.format("the command and its environment are %d bytes, more than the agent takes (%d)",
      #payload, A.MAX_PAYLOAD), "too_large"
  end
  local job = new_job(st, req, "command")
  if not send(st, T.SPAWN, job.id, payload) then return nil, st.dead, "agent_lost" end
  if req.stdin then
    if #req.stdin == 0 then send(st, T.STDIN_EOF, job.id)
    else core.spawn(feed_stdin, st, job, req.stdin) end
  end
  return job
end

function M.finish(st, job)
  if job.error then return nil, job.error, job.error_code end
  local box = job.status == 137 and st.boxref and st.boxref[1]
  if box and box.backend.oom_killed and not job.oom_checked then
    job.oom_checked = true
    job.oom_killed, job.memory_limit = box.backend.oom_killed(box.handle)
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
  if not got then return nil, "the agent did not confirm the kill in time", "agent_unresponsive" end
  return true
end

-- Files -----------------------------------------------------------------------------------

-- read_file(st, path, max, deadline) -> bytes | nil, message, code. Stops
-- and kills the reader past max bytes (a FIFO, /dev/zero never end).
function M.read_file(st, path, max, deadline)
  local ok, err, code = alive(st)
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
  local ok, err, code = alive(st)
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

-- Sessions: a persistent shell ------------------------------------------------------------
-- A session is a SESSION job running a shell whose stdin is the host's:
-- each command goes in as one line,
--   __sbx_run '<the command, single-quoted>' </dev/null 3>&-; printf '<seq> %d\n' "$?" >&3
-- (__sbx_run() { command eval "$1"; }, with trap 'return 130' INT) so the
-- shell keeps its directory, variables and functions; a syntax error is an
-- error of that command (command eval does not end the shell); the
-- command runs without the status pipe (fd 3 closed) and without the
-- shell's stdin. The agent answers each status line with MARK after the
-- command's output: the boundary and the exit status never come from
-- anything a command prints.

local Session = {}
Session.__index = Session

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function start_shell(sess)
  local st = sess.st
  local ok, err, code = alive(st)
  if not ok then return nil, err, code end
  local payload = spawn_payload(sess.spec, STDIN_PIPE | SESSION, st.default_user, st.env)
  local job = new_job(st, { capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 0, tail = 0 },
    output = { head = 0, tail = 0 } } }, "session")
  job.session = sess
  if not send(st, T.SPAWN, job.id, payload) then return nil, st.dead, "agent_lost" end
  -- Each command runs in a function, so an interrupt (the timeout) returns
  -- from it: the rest of that command never runs, the shell stays.
  send(st, T.STDIN, job.id, "__sbx_run() { command eval \"$1\"; }; trap 'return 130' INT\n")
  sess.job = job
  return true
end

-- open_session(st, spec) -> session | nil, message, code. spec: argv of
-- the shell, env, cwd, user.
function M.open_session(st, spec)
  spec = { argv = spec.argv, env = spec.env, cwd = spec.cwd, user = spec.user }
  local sess = setmetatable({ st = st, spec = spec, seq = 0 }, Session)
  local ok, err, code = start_shell(sess)
  if not ok then return nil, err, code end
  return sess
end

-- The transport functions of a session (box.lua runs session commands
-- through them, as it runs commands through a transport).
M.session_transport = { name = "session" }
local ST = M.session_transport

function ST.start(sess, req)
  local st = sess.st
  if sess.closed then return nil, "the session is closed", "closed" end
  if not sess.job or sess.job.completed or st.dead then
    local ok, err, code = start_shell(sess)
    if not ok then return nil, err, code end
    sess.reset_pending = true
  end
  sess.seq = sess.seq + 1
  local cmd = {
    seq = sess.seq, marker = req.marker, eof = {}, owed = { 0, 0 }, st = st, id = sess.job.id, shell_job = sess.job,
    sink = core.stream.sink { capture = req.capture, chunks = req.chunks, chunk_limit = req.chunk_limit },
    session_reset = sess.reset_pending or nil,
  }
  sess.reset_pending = nil
  cmd.stream = cmd.sink
  sess.current = cmd
  local line = string.format("__sbx_run %s </dev/null 3>&-; printf '%d %%d\n' \"$?\" >&3\n",
    quote(req.session_command), cmd.seq)
  if not send(st, T.STDIN, sess.job.id, line) then return nil, st.dead, "agent_lost" end
  return cmd
end

function ST.finish(_, cmd)
  if cmd.error then return nil, cmd.error, cmd.error_code end
  return cmd.status
end

-- A timeout: the running command's processes go (the shell's children);
-- when the shell itself was the work (a builtin loop), the shell goes too
-- and the next command gets a new one (session_reset).
function ST.kill(sess, cmd, signal, deadline)
  local st = sess.st
  if st.dead then return nil, st.dead, "agent_lost" end
  local sig = SIGNALS[tostring(signal or "KILL"):gsub("^SIG", "")] or 9
  cmd.mark_event = cmd.mark_event or core.event()
  send(st, T.SIGNAL, sess.job.id, string.char(sig, 2))
  local half = math.max(0.001, ((deadline or core.now() + 2) - core.now()) / 2)
  if cmd.completed or cmd.mark_event:wait(half) then return true end
  send(st, T.SIGNAL, sess.job.id, string.char(9, 1))
  sess.job.completed = true
  sess.reset_pending = true
  cmd.session_reset = true
  if not cmd.completed then
    cmd.completed = true
    cmd.sink:finish()
  end
  return true
end

function Session:close()
  if self.closed then return end
  self.closed = true
  local st = self.st
  if self.job and not st.dead then
    send(st, T.SIGNAL, self.job.id, string.char(9, 1))
    send(st, T.FORGET, self.job.id)
  end
end

function M.close(st)
  if st.closed then return end
  st.closed = true
  M.lost(st, "the box was closed")
end

return M

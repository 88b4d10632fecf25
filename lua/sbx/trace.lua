-- Call traces: every sandbox call of every box as JSON Lines, one object per
-- line, flushed per line:
--   { seq, t, box, op, args = {...}, result = {...} | error = { message, code }, duration }
-- seq numbers calls in the order they started (concurrent calls may end, and
-- so be written, out of seq order); t is the start in seconds since the trace
-- started; duration is the call's own.
--
-- How it hooks in: while a trace records, the Box methods (sbx.box's
-- metatable, box.Box) are replaced by recording wrappers and box.tracer is
-- set; sbx.trace.stop() puts the originals back. With no trace, nothing is
-- wrapped: the only cost left is one nil check in sbx.box{} (box.tracer).
-- A call made by another box method (write_file runs exec) is not recorded
-- on its own: only the outermost call of each task is.
--
-- Started by sbx.trace.start(path, opts), or at the first sbx.box{} by the
-- policy's trace.path or the SBX_TRACE environment variable.
-- sbx.backends.replay answers box calls from such a file.
local core = require "sbx.core"
local json = core.json
local boxmod = require "sbx.box"
local file = require "sbx.trace_file"

local M = {}

local OPS = file.ops
M.ops = OPS

local state              -- the recording trace, or nil
local originals = {}     -- op -> the unwrapped Box method
local depth = setmetatable({}, { __mode = "k" })   -- coroutine -> nesting of traced calls
local autostart_done = false


-- Values ---------------------------------------------------------------------------

-- The file's format (bytes, plain values, reading one back) is
-- sbx.trace_file's, a leaf sbx.backends.replay reads without this module.
M.bytes_out = file.bytes_out
M.bytes_in = file.bytes_in
M.plain = file.plain
M.load = file.load

local function copy(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = copy(x) end
  return c
end

-- Redaction ---------------------------------------------------------------------
--
-- Three rules, applied to every string of every record (and to bytes before
-- they are base64-encoded, so a secret is not hidden from them by encoding):
--   * env values whose names match policy.trace.redact are "[redacted]";
--   * those values (of min_value_bytes or more), the password of every URL
--     seen, and the listed secrets are replaced wherever they appear, in
--     this record and every later one;
--   * scheme://user:password@host keeps its scheme and host, its userinfo
--     is "[redacted]" (a user alone, as in ssh://git@host, is kept).

local MASK = "[redacted]"

-- A name pattern compared with an upper-cased name: its letters upper-cased,
-- its %-escapes kept ("%w" must not become "%W").
local function upper_pattern(p)
  return (p:gsub("(%%?)(.)", function(esc, c) return esc == "" and c:upper() or esc .. c end))
end

-- Remembers a redacted value so it is replaced wherever it appears.
local function learn(st, value, min)
  if type(value) ~= "string" or #value < (min or 1) or st.known[value] then return end
  st.known[value] = true
  st.secrets[#st.secrets + 1] = value
  -- Longest first: a secret that contains another is replaced whole.
  table.sort(st.secrets, function(a, b) return #a > #b end)
end

local function redact_urls(st, s)
  if not st.url_credentials or not s:find("://", 1, true) then return s end
  -- Up to the last @ before the path: a password may hold an unencoded @.
  return (s:gsub("(%a[%w+.%-]*://)([^%s/?#]*)@", function(scheme, userinfo)
    local pass = userinfo:match("^[^:]*:(.*)$")
    if not pass then return nil end
    learn(st, pass, st.min_value_bytes)
    return scheme .. MASK .. "@"
  end))
end

local function redact_literals(st, s)
  for _, secret in ipairs(st.secrets) do
    if s:find(secret, 1, true) then s = s:gsub(secret:gsub("%p", "%%%0"), MASK) end
  end
  return s
end

-- One string, all rules: for bytes about to be encoded.
local function scrub_string(st, s)
  if type(s) ~= "string" then return s end
  return redact_literals(st, redact_urls(st, s))
end

-- Every string of v through f (in place for tables).
local function each_string(v, f)
  if type(v) == "string" then return f(v) end
  if type(v) == "table" then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    for _, k in ipairs(keys) do v[k] = each_string(v[k], f) end
  end
  return v
end

-- A record, all rules: URLs first over the whole record, so a password
-- learned from one field is replaced in every other.
local function scrub(st, rec)
  each_string(rec, function(s) return redact_urls(st, s) end)
  if #st.secrets > 0 then each_string(rec, function(s) return redact_literals(st, s) end) end
  return rec
end

local function secret_name(st, name)
  local up = name:upper()
  for _, p in ipairs(st.redact) do
    if up:find(p) then return true end
  end
  return false
end

local function redact_env(st, env)
  if type(env) ~= "table" then return env end
  local out = {}
  for k, v in pairs(env) do
    local name = tostring(k)
    if v ~= false and secret_name(st, name) then
      learn(st, tostring(v), st.min_value_bytes)
      out[name] = MASK
    else
      if type(v) == "string" then v = redact_urls(st, v) end
      out[name] = v
    end
  end
  return out
end

-- Bytes for the record: redacted, then a string or { base64 = ... }.
local function bytes_out(st, s)
  return M.bytes_out(scrub_string(st, s))
end

-- What each op records -----------------------------------------------------------

-- A result's parts as the command's exact bytes (redacted; base64 where
-- they are not UTF-8), so a replay gives back the same result.
local function parts_of(r, st)
  local p = {}
  for _, n in ipairs({ "stdout", "stderr", "output" }) do
    local x = r.parts[n]
    p[n] = { head = bytes_out(st, x.head), tail = bytes_out(st, x.tail), omitted = x.omitted, bytes = x.bytes }
  end
  return p
end

local describe = {}

function describe.exec(st, self, command, opts)
  opts = type(opts) == "table" and opts or {}
  local a = {
    command = copy(command), env = redact_env(st, opts.env), cwd = opts.cwd, user = opts.user,
    timeout = opts.timeout, shell = opts.shell,
    stdin_bytes = type(opts.stdin) == "string" and #opts.stdin or nil,
  }
  if st.record_stdin and type(opts.stdin) == "string" then a.stdin = bytes_out(st, opts.stdin) end
  return a
end

function describe.spawn(st, self, command, opts)
  opts = type(opts) == "table" and opts or {}
  local a = { command = copy(command), name = opts.name, env = redact_env(st, opts.env),
    cwd = opts.cwd, user = opts.user, stdin_bytes = type(opts.stdin) == "string" and #opts.stdin or nil }
  if st.record_stdin and type(opts.stdin) == "string" then a.stdin = bytes_out(st, opts.stdin) end
  return a
end

function describe.output(st, self, name, opts)
  opts = type(opts) == "table" and opts or {}
  return { name = name, offset = opts.offset, max_bytes = opts.max_bytes }
end
function describe.kill(st, self, name, signal) return { name = name, signal = signal } end
function describe.wait(st, self, name, timeout) return { name = name, timeout = timeout } end
function describe.write_file(st, self, path, data, opts)
  local a = { path = path, bytes = type(data) == "string" and #data or nil, timeout = type(opts) == "table" and opts.timeout or nil }
  if st.record_stdin and type(data) == "string" then a.data = bytes_out(st, data) end
  return a
end
function describe.read_file(st, self, path, opts)
  opts = type(opts) == "table" and opts or {}
  return { path = path, max_bytes = opts.max_bytes, timeout = opts.timeout }
end
function describe.close() return {} end
function describe.processes() return {} end

local outcome = {}

function outcome.exec(r, _, st)
  return {
    exit_code = r.exit_code, signal = r.signal, timed_out = r.timed_out, timeout = r.timeout,
    truncated = r.truncated, duration = r.duration, stdout_bytes = r.stdout_bytes,
    stderr_bytes = r.stderr_bytes, box_restarted = r.box_restarted, kill_error = r.kill_error,
    kill_confirmed = r.kill_confirmed, kill_method = r.kill_method, error_code = r.error_code,
    ended_processes = r.ended_processes and json.array(copy(r.ended_processes)) or nil,
    oom_killed = r.oom_killed, memory_limit = r.memory_limit,
    parts = parts_of(r, st),
  }
end
-- A copy: the record is redacted in place and the box keeps its command.
function outcome.spawn(name, self) return { name = name, command = copy(self.procs[name] and self.procs[name].command) } end
function outcome.output(o) return copy(o) end
function outcome.kill(p) return copy(p) end
function outcome.wait(p) return copy(p) end
function outcome.processes(list) return { list = json.array(copy(list)) } end
function outcome.write_file(ok) return { ok = ok } end
function outcome.read_file(data, _, st) return { data = bytes_out(st, data) } end
function outcome.close(ok) return { ok = ok } end

-- Writing ---------------------------------------------------------------------------

local function write(st, rec)
  scrub(st, rec)
  local ok, line = pcall(json.encode, rec)
  if not ok then
    line = json.encode({ seq = rec.seq, t = rec.t, box = rec.box, op = rec.op, duration = rec.duration,
      error = { message = "trace: cannot encode this call: " .. tostring(line), code = "trace_error" } })
  end
  st.file:write(line, "\n")
  st.file:flush()
end

local function next_seq(st)
  st.seq = st.seq + 1
  return st.seq
end

-- The recording wrapper of one Box method.
local function wrap(op, orig)
  local Box = boxmod.Box
  return function(self, ...)
    local st = state
    local co = coroutine.running()
    -- Not a box, a closed box or a nested call: exactly the original
    -- (a tail call, so misuse errors point where they always did).
    if not st or getmetatable(self) ~= Box or self.closed and op ~= "close" or (depth[co] or 0) > 0 then
      return orig(self, ...)
    end
    local rec = { seq = next_seq(st), box = self.id, op = op }
    local started = core.now()
    rec.t = started - st.t0
    local dok, args = pcall(describe[op], st, self, ...)
    rec.args = dok and args or { describe_error = tostring(args) }
    depth[co] = 1
    local r = table.pack(pcall(orig, self, ...))
    depth[co] = nil
    rec.duration = core.now() - started
    if not r[1] then
      local msg = r[2]
      if type(msg) == "string" then
        -- An error raised for the caller (level 2) names this wrapper: name the caller.
        local here = debug.getinfo(1, "S").short_src
        local caller = debug.getinfo(2, "Sl")
        if caller and caller.currentline and caller.currentline > 0 then
          local prefix = here:gsub("%p", "%%%0") .. ":%d+: "
          msg = msg:gsub("^" .. prefix, caller.short_src .. ":" .. caller.currentline .. ": ", 1)
        end
      end
      rec.error = { message = tostring(msg), code = "raised" }
      if state == st then write(st, rec) end
      error(msg, 0)
    end
    if r[2] == nil and op ~= "close" then
      rec.error = { message = r[3], code = r[4] }
    else
      local ook, res = pcall(outcome[op], r[2], self, st)
      rec.result = ook and res or { describe_error = tostring(res) }
    end
    if state == st then write(st, rec) end
    return table.unpack(r, 2, r.n)
  end
end

local tracer = {}
function tracer.begin() return core.now() end
function tracer.created(t0, spec, box, err, code)
  local st = state
  if not st then return end
  local env = redact_env(st, spec.env)
  local rec = {
    seq = next_seq(st), t = t0 - st.t0, box = box and box.id or json.null, op = "create",
    args = { backend = spec.backend, image = spec.image, workdir = spec.workdir, network = spec.network, env = env },
    duration = core.now() - t0,
  }
  -- box.limits too: a replayed box reports what the recorded one did
  if box then rec.result = { id = box.id, limits = box.limits or nil } else rec.error = { message = err, code = code } end
  write(st, rec)
end

-- API -----------------------------------------------------------------------------

-- sbx.trace.start(path [, opts]) -> true | nil, message
-- opts: secrets (strings replaced by "[redacted]" wherever they appear),
-- redact (env name patterns), min_value_bytes, url_credentials,
-- record_stdin; each defaults to policy.trace.
function M.start(path, opts)
  opts = opts or {}
  if type(path) ~= "string" or path == "" then error("sbx.trace.start expects a file path", 2) end
  if type(opts) ~= "table" then error("trace options must be a table", 2) end
  M.stop()
  autostart_done = true
  local pol = require("sbx.config").policy.trace or {}
  local f, err = io.open(path, opts.append and "a" or "w")
  if not f then return nil, err end
  local function opt(name)
    if opts[name] ~= nil then return opts[name] end
    return pol[name]
  end
  local st = {
    path = path, file = f, t0 = core.now(), seq = 0, secrets = {}, known = {}, redact = {},
    min_value_bytes = opt("min_value_bytes") or 8,
    url_credentials = opt("url_credentials") ~= false,
    record_stdin = opt("record_stdin"),
  }
  for _, p in ipairs(opts.redact or pol.redact or {}) do
    if type(p) ~= "string" or not pcall(string.find, "", p) then
      f:close()
      error(string.format("trace: redact pattern %s is not a Lua pattern", tostring(p)), 2)
    end
    st.redact[#st.redact + 1] = upper_pattern(p)
  end
  -- Listed secrets count whatever their length.
  for _, list in ipairs({ pol.secrets or {}, opts.secrets or {} }) do
    for _, s in ipairs(list) do
      if type(s) == "string" and s ~= "" then learn(st, s) end
    end
  end
  state = st
  local Box = boxmod.Box
  for _, op in ipairs(OPS) do
    originals[op] = originals[op] or Box[op]
    Box[op] = wrap(op, originals[op])
  end
  boxmod.tracer = tracer
  return true
end

-- sbx.trace.stop(): ends the trace and puts the plain methods back.
function M.stop()
  autostart_done = true
  local st = state
  if not st then return false end
  state = nil
  boxmod.tracer = nil
  local Box = boxmod.Box
  for op, f in pairs(originals) do Box[op] = f end
  st.file:close()
  return true
end

-- sbx.trace.active() -> the path being recorded, or nil
function M.active() return state and state.path end

-- At the first sbx.box{}: the policy's trace.path, else SBX_TRACE.
-- Until a script starts or stops a trace itself; a path that cannot be
-- opened is reported once.
local failed_path
boxmod.trace_autostart = function()
  if autostart_done then return nil end
  local pol = require("sbx.config").policy.trace
  local path = pol and pol.path or os.getenv("SBX_TRACE")
  if path and path ~= "" and path ~= failed_path then
    local ok, err = M.start(path)
    if not ok then
      failed_path = path
      autostart_done = false
      io.stderr:write("sbx: cannot start the trace: ", tostring(err), "\n")
    end
  end
  return boxmod.tracer
end

return M

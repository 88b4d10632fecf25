-- A box: one sandbox, whatever the backend. This file owns what is the same
-- everywhere (option merging, the exec loop with timeout and kill, output
-- capture into results, background processes, files); a backend owns the
-- box lifecycle (create, destroy, reap) and the command transport (start,
-- finish, kill). Backends are modules under sbx.backends with this shape:
--   create(spec) -> handle | nil, msg, code       destroy(handle, detached)
--   start(handle, req) -> job | nil, msg, code     finish(handle, job) -> exit_code | nil, msg, code
--   kill(handle, job, signal) -> true | nil, msg, code
--   restart(handle) -> true | nil, msg, code       reap(opts) -> report
-- A job carries .stream, an object with the sbx.stream methods.
local M = {}
local sbx, core

local Box = {}
Box.__index = Box
M.Box = Box              -- sbx.trace wraps its methods while a trace records

local open = {}          -- id -> { backend, handle }: what shutdown must remove
M.open_boxes = open

function M.init(s)
  sbx, core = s, s.core
  local seed = io.open("/dev/urandom", "rb")
  if seed then
    local b = seed:read(8)
    seed:close()
    math.randomseed(string.unpack("<i8", b))
  end
end

local function backend_module(name)
  local ok, mod = pcall(require, "sbx.backends." .. name)
  if not ok then
    error(string.format("unknown backend '%s' (%s)", tostring(name), tostring(mod)), 3)
  end
  return mod
end

local function random_id()
  return string.format("%016x", math.random(0))
end
M.random_id = random_id

-- sbx.box(opts) -> box | nil, message, code
function M.new(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("sbx.box expects a table of options", 2) end
  -- sbx.trace hook: M.tracer is set while a trace records (nil otherwise).
  local tr = M.tracer
  if tr == nil and M.trace_autostart then tr = M.trace_autostart() end
  local t0 = tr and tr.begin()
  local spec = sbx.merge_policy({}, sbx.policy.box)
  for k, v in pairs(opts) do spec[k] = v end
  local backend = backend_module(spec.backend)
  local handle, err, code = backend.create(spec, sbx.policy)
  if not handle then
    if tr then tr.created(t0, spec, nil, err, code) end
    return nil, err, code
  end
  local self = setmetatable({
    id = handle.id,
    backend_name = spec.backend,
    backend = backend,
    handle = handle,
    spec = spec,
    procs = {},            -- name -> process record
    proc_order = {},       -- names in start order
    counter = 0,
    closed = false,
  }, Box)
  open[self.id] = { backend = backend, handle = handle }
  -- A backend may answer at the method level (sbx.backends.replay does).
  if backend.bind then backend.bind(self, spec) end
  if tr then tr.created(t0, spec, self) end
  return self
end

function Box:__tostring()
  return string.format("sbx.box %s (%s%s)", self.id:sub(1, 12), self.backend_name, self.closed and ", closed" or "")
end

local function check_open(self)
  if getmetatable(self) ~= Box then error("box method called without a box (use box:method)", 3) end
  if self.closed then error("attempt to use a closed box", 3) end
end

-- box:close(): destroys the box and everything in it. Idempotent.
function Box:close()
  if self.closed then return true end
  self.closed = true
  open[self.id] = nil
  for _, p in pairs(self.procs) do
    if p.job and p.job.stream then pcall(p.job.stream.close, p.job.stream) end
  end
  return self.backend.destroy(self.handle)
end
Box.__close = Box.close

-- A dropped box is removed without blocking the collector.
function Box:__gc()
  if not self.closed then
    self.closed = true
    open[self.id] = nil
    pcall(self.backend.destroy, self.handle, true)
  end
end

function M.close_all()
  local tasks = {}
  for id, b in pairs(open) do
    open[id] = nil
    tasks[#tasks + 1] = core.spawn(function() b.backend.destroy(b.handle) end)
  end
  for _, t in ipairs(tasks) do t:join() end
end

function M.reap(opts)
  opts = opts or {}
  local backend = backend_module(opts.backend or sbx.policy.box.backend)
  return backend.reap(opts, sbx.policy)
end

-- Commands --------------------------------------------------------------------

local function env_list(...)
  local merged = {}
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if t then
      if type(t) ~= "table" then error("env must be a table of NAME = value", 4) end
      for k, v in pairs(t) do merged[k] = v end
    end
  end
  local list = {}
  for k, v in pairs(merged) do
    if v ~= false then list[#list + 1] = tostring(k) .. "=" .. tostring(v) end
  end
  table.sort(list)
  return list
end

-- Turns one captured stream into { head, tail, omitted, bytes } of valid UTF-8.
local function capture_part(stream, name)
  local head, tail, total, omitted = stream:captured(name)
  local text = sbx.text
  if #tail > 0 then
    local cut, dropped_h, dropped_t
    head, dropped_h = text.head_cut(head)
    cut, dropped_t = text.tail_cut(tail)
    tail = cut
    omitted = omitted + dropped_h + dropped_t
  end
  return {
    head = (text.sanitize(head)),
    tail = (text.sanitize(tail)),
    omitted = omitted,
    bytes = total,
  }
end

local function part_text(part, marker)
  if part.omitted == 0 then return part.head .. part.tail end
  return part.head .. marker(part) .. part.tail
end

local function omitted_marker(part)
  return string.format("\n...[%d bytes omitted]...\n", part.omitted)
end

function M.build_result(job, fields)
  local s = job.stream
  local r = fields or {}
  r.parts = {
    stdout = capture_part(s, "stdout"),
    stderr = capture_part(s, "stderr"),
    output = capture_part(s, "output"),
  }
  local marker = sbx.policy.omitted_marker or omitted_marker
  r.stdout = part_text(r.parts.stdout, marker)
  r.stderr = part_text(r.parts.stderr, marker)
  r.output = part_text(r.parts.output, marker)
  r.stdout_bytes = r.parts.stdout.bytes
  r.stderr_bytes = r.parts.stderr.bytes
  r.truncated = r.parts.stdout.omitted > 0 or r.parts.stderr.omitted > 0 or r.parts.output.omitted > 0
  return r
end

-- The argv for a command string or list, by policy.
local function command_argv(self, command, opts)
  if type(command) == "table" then
    if #command == 0 then error("an argv table must not be empty", 3) end
    local argv = {}
    for i, a in ipairs(command) do argv[i] = tostring(a) end
    return argv
  elseif type(command) == "string" then
    return sbx.policy.shell_argv(opts.shell or self.spec.shell or sbx.policy.exec.shell, command)
  end
  error("command must be a string or an argv table", 3)
end

local function make_request(self, command, opts, capture)
  local pol = sbx.policy.exec
  local marker = random_id()
  local env = env_list(pol.env, opts.env)
  env[#env + 1] = "SBX_JOB=" .. marker
  return {
    argv = command_argv(self, command, opts),
    env = env,
    cwd = opts.cwd,
    user = opts.user,
    stdin = opts.stdin,
    marker = marker,
    capture = capture or pol.capture,
    chunks = opts.on_output ~= nil,
    chunk_limit = pol.chunk_limit,
  }
end

local function clamp_timeout(t)
  local pol = sbx.policy.exec
  if t == nil then t = pol.timeout end
  if type(t) ~= "number" then error("timeout must be a number of seconds", 3) end
  if t <= 0 then error("timeout must be positive", 3) end
  if pol.max_timeout and t > pol.max_timeout then t = pol.max_timeout end
  return t
end

-- The in-box kill: every process whose environment carries the job's marker
-- (children, grandchildren, even those that called setsid) gets the signal.
-- Markers are 16 hex digits, so no marker is a prefix of another. Backends
-- run this argv inside the box; it prints how many processes it signalled.
local KILL_SCRIPT = [[
sig=$1; m="SBX_JOB=$2"; n=0
for round in 1 2 3; do
  found=0
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    if grep -qs "$m" "$p/environ" 2>/dev/null; then
      kill -s "$sig" "$pid" 2>/dev/null && found=$((found+1))
    fi
  done
  n=$((n+found))
  [ "$sig" = KILL ] || break
  [ $found -eq 0 ] && break
done
echo "$n"
]]

-- The request a backend starts to signal a job's tree: signal with or
-- without "SIG", marker from the job. Small captures: it prints a count.
function M.kill_request(signal, marker)
  signal = tostring(signal or "KILL"):gsub("^SIG", "")
  return {
    argv = { "sh", "-c", KILL_SCRIPT, "sh", signal, marker }, env = {},
    capture = { stdout = { head = 256, tail = 0 }, stderr = { head = 1024, tail = 0 }, output = { head = 1024, tail = 0 } },
  }
end

-- Kills a job's whole process tree; falls back to restarting the box when
-- the kill cannot run. Returns what happened for the result.
local function kill_tree(self, job, signal)
  local pol = sbx.policy.exec
  local ok, err = self.backend.kill(self.handle, job, signal or "KILL")
  if ok and job.stream:wait(pol.kill_grace) == "eof" then return {} end
  if job.stream:info().eof then return {} end
  if pol.on_unkillable == "restart" then
    local rok, rerr = self.backend.restart(self.handle)
    job.stream:wait(pol.kill_grace)
    return { box_restarted = rok and true or false, kill_error = err or rerr }
  end
  return { kill_error = err or "the process did not stop" }
end

-- box:exec(command, opts) -> result
-- opts: timeout, env, cwd, user, stdin (bytes), on_output(stream, text),
-- shell. The result has exit_code (nil when killed), stdout, stderr, output
-- (both interleaved), timed_out, truncated, duration, byte counts, parts.
-- Infrastructure failures return nil, message, code.
function Box:exec(command, opts)
  check_open(self)
  opts = opts or {}
  if type(opts) ~= "table" then error("exec options must be a table", 2) end
  local timeout = clamp_timeout(opts.timeout)
  local on_output = opts.on_output
  if on_output ~= nil and type(on_output) ~= "function" then error("on_output must be a function", 2) end
  local req = make_request(self, command, opts)
  local started = core.now()
  local job, err, code = self.backend.start(self.handle, req)
  if not job then return nil, err, code end
  local stream = job.stream
  local deadline = started + timeout
  local timed_out = false
  local ok, perr = pcall(function()
    while true do
      local left = deadline - core.now()
      local ev = left > 0 and stream:wait(left) or "timeout"
      if ev == "data" or (ev == "eof" and on_output) then
        local out, errs = stream:take()
        if on_output then
          if #out > 0 then on_output("stdout", out) end
          if #errs > 0 then on_output("stderr", errs) end
        end
      end
      if ev == "eof" then break end
      if ev == "timeout" then timed_out = true; break end
    end
  end)
  if not ok then
    -- Cancelled, interrupted, or the callback raised: the command must not
    -- outlive the call that started it.
    pcall(kill_tree, self, job)
    stream:close()
    error(perr, 0)
  end
  local fields = { timed_out = timed_out, timeout = timeout, command = command }
  if timed_out then
    for k, v in pairs(kill_tree(self, job)) do fields[k] = v end
    stream:close()
  else
    local info = stream:info()
    if info.error_code then
      stream:close()
      return nil, info.error, info.error_code
    end
    local exit_code, ferr, fcode = self.backend.finish(self.handle, job)
    if exit_code == nil then return nil, ferr, fcode end
    fields.exit_code = exit_code
    if exit_code >= 128 and exit_code < 160 then fields.signal = exit_code - 128 end
  end
  fields.duration = core.now() - started
  return M.build_result(job, fields)
end

-- Background processes ----------------------------------------------------------

local function proc_view(p)
  return {
    name = p.name,
    command = p.command,
    status = p.status,
    exit_code = p.exit_code,
    error = p.error,
    started = p.started,
    elapsed = (p.ended or core.now()) - p.started,
    output_bytes = p.job and select(3, p.job.stream:captured("output")) or 0,
  }
end

-- box:spawn(command, opts) -> name | nil, message, code
-- opts: name, env, cwd, user, stdin. The output goes to a bounded log.
function Box:spawn(command, opts)
  check_open(self)
  opts = opts or {}
  local bpol = sbx.policy.background
  local name = opts.name
  if name == nil or name == "" then
    repeat
      self.counter = self.counter + 1
      name = sbx.policy.process_name(self, self.counter)
    until not self.procs[name]
  else
    if type(name) ~= "string" or #name > bpol.max_name_length or not name:match(bpol.name_pattern) then
      return nil, string.format("invalid process name '%s': use up to %d letters, digits, '_', '.' or '-'",
        tostring(name), bpol.max_name_length), "invalid_name"
    end
    local old = self.procs[name]
    if old and old.status == "running" then
      return nil, string.format("a process named '%s' is still running; kill it or choose another name", name), "name_in_use"
    end
  end
  local req = make_request(self, command, opts, { stdout = { head = 0, tail = 0 }, stderr = { head = 0, tail = 0 }, output = bpol.log })
  req.chunks = false
  local job, err, code = self.backend.start(self.handle, req)
  if not job then return nil, err, code end
  local p = {
    name = name, command = type(command) == "table" and table.concat(command, " ") or command,
    status = "running", started = core.now(), job = job, done = core.event(),
  }
  if not self.procs[name] then self.proc_order[#self.proc_order + 1] = name end
  self.procs[name] = p
  -- A watcher per process: learns the exit code as soon as the stream ends.
  core.spawn(function()
    job.stream:wait()
    p.ended = p.ended or core.now()
    if p.status == "running" then
      local info = job.stream:info()
      if info.error_code then
        p.status, p.error = "failed", info.error
      else
        local exit_code, ferr = self.backend.finish(self.handle, job)
        if exit_code then
          p.status, p.exit_code = "exited", exit_code
        else
          p.status, p.error = "failed", ferr
        end
      end
    end
    p.done:set()
  end)
  return name
end

-- box:processes() -> list of { name, command, status, exit_code, elapsed, output_bytes }
-- status is "running", "exited", "killed" or "failed"; elapsed stops at exit.
function Box:processes()
  check_open(self)
  local list = {}
  for _, name in ipairs(self.proc_order) do list[#list + 1] = proc_view(self.procs[name]) end
  return list
end

local function get_proc(self, name)
  local p = self.procs[name]
  if not p then
    local names = table.concat(self.proc_order, ", ")
    return nil, string.format("no process named '%s' (known: %s)", tostring(name), names ~= "" and names or "none"), "not_found"
  end
  return p
end

-- box:output(name, {offset=0, max_bytes=}) -> { text, offset, next_offset, skipped, total, process }
function Box:output(name, opts)
  check_open(self)
  opts = opts or {}
  local p, err, code = get_proc(self, name)
  if not p then return nil, err, code end
  local offset = opts.offset or 0
  local max = opts.max_bytes or sbx.policy.background.read_max
  local bytes, next_offset, skipped = p.job.stream:read("output", offset, max)
  -- Never hand out half a character: keep it for the next read.
  local whole, held = sbx.text.head_cut(bytes)
  if p.status ~= "running" and next_offset >= select(3, p.job.stream:captured("output")) then held = 0; whole = bytes end
  return {
    text = (sbx.text.sanitize(whole)),
    offset = offset,
    skipped = skipped,
    next_offset = next_offset - held,
    total = select(3, p.job.stream:captured("output")),
    process = proc_view(p),
  }
end

-- box:kill(name, signal) -> process view | nil, message, code. Kills the tree.
function Box:kill(name, signal)
  check_open(self)
  local p, err, code = get_proc(self, name)
  if not p then return nil, err, code end
  if p.status ~= "running" then return proc_view(p) end
  signal = signal or "KILL"
  local ok, kerr, kcode = self.backend.kill(self.handle, p.job, signal)
  if not ok then return nil, kerr, kcode end
  if signal == "KILL" then
    p.status = "killed"
    p.ended = core.now()
    if not p.done:wait(sbx.policy.exec.kill_grace) then p.job.stream:close() end
  end
  return proc_view(p)
end

-- box:wait(name, timeout) -> process view, or nil, "timeout", "timeout"
function Box:wait(name, timeout)
  check_open(self)
  local p, err, code = get_proc(self, name)
  if not p then return nil, err, code end
  if not p.done:wait(timeout) then return nil, "timeout", "timeout" end
  return proc_view(p)
end

-- Files ------------------------------------------------------------------------------

-- box:write_file(path, data) -> true | nil, message, code. Goes through exec
-- stdin, which works on read-only roots and tmpfs mounts alike.
function Box:write_file(path, data, opts)
  check_open(self)
  if type(path) ~= "string" or path == "" then error("path must be a non-empty string", 2) end
  if type(data) ~= "string" then error("data must be a string", 2) end
  local pol = sbx.policy.files
  if #data > pol.max_write then
    return nil, string.format("%d bytes is more than the policy's max_write (%d)", #data, pol.max_write), "too_large"
  end
  local script = pol.make_parents and 'mkdir -p "$(dirname "$1")" && cat > "$1"' or 'cat > "$1"'
  local r, err, code = self:exec({ "sh", "-c", script, "sh", path }, { stdin = data, timeout = (opts and opts.timeout) })
  if not r then return nil, err, code end
  if r.exit_code ~= 0 then
    return nil, string.format("cannot write %s: %s", path, (r.stderr:gsub("%s+$", ""))), "write_failed"
  end
  return true
end

-- box:read_file(path) -> bytes | nil, message, code
function Box:read_file(path, opts)
  check_open(self)
  if type(path) ~= "string" or path == "" then error("path must be a non-empty string", 2) end
  local max = (opts and opts.max_bytes) or sbx.policy.files.max_read
  local req = make_request(self, { "cat", "--", path }, opts or {},
    { stdout = { head = max + 1, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } })
  local job, err, code = self.backend.start(self.handle, req)
  if not job then return nil, err, code end
  job.stream:wait(opts and opts.timeout or sbx.policy.exec.timeout)
  local info = job.stream:info()
  if not info.eof then job.stream:close(); return nil, "timed out reading " .. path, "timeout" end
  if info.error_code then return nil, info.error, info.error_code end
  local exit_code, ferr, fcode = self.backend.finish(self.handle, job)
  if not exit_code then return nil, ferr, fcode end
  local data, _, total = job.stream:captured("stdout")
  if exit_code ~= 0 then
    local msg = job.stream:captured("stderr")
    return nil, string.format("cannot read %s: %s", path, (msg:gsub("%s+$", ""))), "not_found"
  end
  if total > max then
    return nil, string.format("%s has more than the %d bytes allowed by policy (files.max_read)", path, max), "too_large"
  end
  return data
end

-- Tools for a model bound to this box.
function Box:tools()
  check_open(self)
  return sbx.tools.for_box(self)
end

return M

-- The replay backend: a box that answers from a recorded trace (sbx.trace)
-- without Docker or any other daemon.
--   sbx.box{ backend = "replay", trace = "trace.jsonl" [, trace_box = id or n] }
-- The box stands for one recorded box: trace_box (its id, or n for the n-th
-- create of the trace), else the next recorded box this process has not
-- replayed yet. Its calls are matched in order per op: the n-th exec of the
-- replayed box gets the n-th recorded exec of that box, and so on for spawn,
-- output, kill, wait, processes, write_file and read_file. A command (or a
-- process name, a path) that differs from the recorded one returns
--   nil, "replay mismatch: expected ... got ...", "replay_mismatch"
-- ("[redacted]" in a recorded command matches anything).
--
-- Design: replay answers at the Box method level. bind() sets the replay
-- methods on the box itself (they shadow the Box metatable's), so exec gets
-- the recorded duration, timed_out, box_restarted and process views get the
-- recorded elapsed times: a fake stream under the real exec loop would
-- measure new durations and go through the kill path for a timeout. Results
-- are still rebuilt by the same code as live ones: box.build_result reads
-- the recorded parts from a fake stream (captured(name) -> head, tail,
-- total, omitted), so stdout, stderr, output and truncated come out exactly
-- as the policy's omitted marker makes them, and the policy formats the
-- tool texts as usual. The transport functions (start, finish, kill,
-- restart) are never reached and say so.
local job = require "sbx.job"
local trace = require "sbx.trace_file"
local function sbx_text(s) return require("sbx.util").model_text(s) end

local M = {}

-- Box options only this backend takes.
function M.options(check)
  return { trace = check.str(), trace_box = check.rule({ "string", "integer" }) }
end

local claimed = {}        -- trace path -> number of recorded creates handed out

local function mismatch(msg) return nil, "replay mismatch: " .. msg, "replay_mismatch" end

local function show(command)
  if type(command) == "table" then
    local q = {}
    for i, a in ipairs(command) do q[i] = string.format("%q", tostring(a)) end
    return "{" .. table.concat(q, ", ") .. "}"
  end
  return string.format("%q", tostring(command))
end

-- A recorded string equals a live one; "[redacted]" stands for anything.
local function same_string(recorded, live)
  if recorded == live then return true end
  if type(recorded) ~= "string" or type(live) ~= "string" then return false end
  if not recorded:find("[redacted]", 1, true) then return false end
  local pat = {}
  local pos = 1
  while true do
    local a, b = recorded:find("[redacted]", pos, true)
    pat[#pat + 1] = recorded:sub(pos, (a or 0) - 1):gsub("%p", "%%%0")
    if not a then break end
    pat[#pat + 1] = ".-"
    pos = b + 1
  end
  return live:find("^" .. table.concat(pat) .. "$") ~= nil
end

local function same_command(recorded, live)
  if type(live) == "table" then
    if type(recorded) ~= "table" or #recorded ~= #live then return false end
    for i = 1, #live do
      if not same_string(recorded[i], tostring(live[i])) then return false end
    end
    return true
  end
  return same_string(recorded, live)
end

-- create(spec) -> handle: the recorded box's calls, per op, in seq order.
function M.create(spec)
  local path = spec.trace
  if type(path) ~= "string" then
    return nil, "the replay backend needs trace = a trace file (sbx.trace)", "invalid_options"
  end
  local records, err = trace.load(path)
  if not records then return nil, "cannot read the trace: " .. tostring(err), "trace_unavailable" end
  local creates = {}
  for _, r in ipairs(records) do
    if r.op == "create" then creates[#creates + 1] = r end
  end
  local id, create
  local want = spec.trace_box
  if math.type(want) == "integer" then
    create = creates[want]
    if not create then return mismatch(string.format("the trace has %d boxes, not %d", #creates, want)) end
  elseif type(want) == "string" then
    id = want
    for _, c in ipairs(creates) do if c.box == want then create = c end end
  else
    local n = (claimed[path] or 0) + 1
    create = creates[n]
    if not create then
      return mismatch(string.format("expected no more boxes (the trace has %d), got another sbx.box{}", #creates))
    end
    claimed[path] = n
  end
  if create then
    if create.error then return nil, create.error.message, create.error.code end
    id = create.box
  end
  local queues = {}
  for _, r in ipairs(records) do
    if r.box == id and r.op ~= "create" then
      local q = queues[r.op]
      if not q then q = { n = 0 }; queues[r.op] = q end
      q[#q + 1] = r
    end
  end
  -- box.limits: what the recorded box reported, if the trace has it; the
  -- replay itself enforces nothing and refuses nothing.
  local limits = create and type(create.result) == "table" and create.result.limits or nil
  return { id = id, path = path, queues = queues, spec = spec, limits = limits }
end

function M.destroy() return true end
function M.reap() return { removed = {}, kept = 0 } end

local function transport()
  return nil, "the replay backend answers box calls from its trace; it runs nothing", "unsupported"
end
M.start, M.finish, M.kill, M.restart = transport, transport, transport, transport

-- Methods ---------------------------------------------------------------------------

local function check(self)
  if self.closed then error("attempt to use a closed box", 3) end
end

-- The next recorded call of op, or nil + mismatch.
local function next_call(self, op, what)
  local q = self.handle.queues[op]
  local n = (q and q.n or 0) + 1
  if q then q.n = n end
  local rec = q and q[n]
  if not rec then
    return mismatch(string.format("expected no more %s calls (the trace has %d), got %s %s",
      op, q and #q or 0, op, what))
  end
  return rec
end

-- The recorded answer: nil, message, code for a recorded failure; raises a
-- recorded raise.
local function answer(rec)
  if rec.error then
    if rec.error.code == "raised" then error(rec.error.message, 0) end
    return nil, rec.error.message, rec.error.code
  end
  return rec.result
end

local function rebuild(command, res)
  local parts = res.parts
  local stream = {}
  function stream.captured(_, name)
    local p = parts[name]
    return trace.bytes_in(p.head), trace.bytes_in(p.tail), p.bytes, p.omitted
  end
  return job.build_result({ stream = stream }, {
    timed_out = res.timed_out, timeout = res.timeout, command = command,
    exit_code = res.exit_code, signal = res.signal, duration = res.duration,
    box_restarted = res.box_restarted, kill_error = res.kill_error,
    kill_confirmed = res.kill_confirmed, kill_method = res.kill_method, error_code = res.error_code,
    ended_processes = res.ended_processes, oom_killed = res.oom_killed, memory_limit = res.memory_limit,
  })
end

local methods = {}

function methods.exec(self, command, opts)
  check(self)
  if type(command) ~= "string" and type(command) ~= "table" then
    error("command must be a string or an argv table", 2)
  end
  opts = opts or {}
  local rec, err, code = next_call(self, "exec", show(command))
  if not rec then return nil, err, code end
  if not same_command(rec.args.command, command) then
    return mismatch(string.format("expected exec %s got exec %s", show(rec.args.command), show(command)))
  end
  local res, aerr, acode = answer(rec)
  if not res then return nil, aerr, acode end
  local r = rebuild(command, res)
  if opts.on_output then
    -- on_output gets text, as from a live box.
    if #r.stdout > 0 then opts.on_output("stdout", (sbx_text(r.stdout))) end
    if #r.stderr > 0 then opts.on_output("stderr", (sbx_text(r.stderr))) end
  end
  return r
end

function methods.spawn(self, command, opts)
  check(self)
  local rec, err, code = next_call(self, "spawn", show(command))
  if not rec then return nil, err, code end
  if not same_command(rec.args.command, command) then
    return mismatch(string.format("expected spawn %s got spawn %s", show(rec.args.command), show(command)))
  end
  local res, aerr, acode = answer(rec)
  if not res then return nil, aerr, acode end
  local name = res.name
  -- tools read box.procs[name].command after a spawn.
  if not self.procs[name] then self.proc_order[#self.proc_order + 1] = name end
  self.procs[name] = { name = name, command = res.command, status = "running" }
  return name
end

local function by_name(op)
  return function(self, name, ...)
    check(self)
    local rec, err, code = next_call(self, op, string.format("%q", tostring(name)))
    if not rec then return nil, err, code end
    if rec.args.name ~= name then
      return mismatch(string.format("expected %s of %q got %s of %q", op, tostring(rec.args.name), op, tostring(name)))
    end
    local res, aerr, acode = answer(rec)
    if not res then return nil, aerr, acode end
    return res
  end
end
methods.output = by_name("output")
methods.kill = by_name("kill")
methods.wait = by_name("wait")

function methods.processes(self)
  check(self)
  local rec, err, code = next_call(self, "processes", "")
  if not rec then return nil, err, code end
  local res = answer(rec)
  return res.list or {}
end

function methods.write_file(self, path, data)
  check(self)
  if type(path) ~= "string" or path == "" then error("path must be a non-empty string", 2) end
  if type(data) ~= "string" then error("data must be a string", 2) end
  local rec, err, code = next_call(self, "write_file", string.format("%q", path))
  if not rec then return nil, err, code end
  if rec.args.path ~= path then
    return mismatch(string.format("expected write_file %q got write_file %q", tostring(rec.args.path), path))
  end
  local res, aerr, acode = answer(rec)
  if not res then return nil, aerr, acode end
  return res.ok
end

function methods.read_file(self, path)
  check(self)
  if type(path) ~= "string" or path == "" then error("path must be a non-empty string", 2) end
  local rec, err, code = next_call(self, "read_file", string.format("%q", path))
  if not rec then return nil, err, code end
  if rec.args.path ~= path then
    return mismatch(string.format("expected read_file %q got read_file %q", tostring(rec.args.path), path))
  end
  local res, aerr, acode = answer(rec)
  if not res then return nil, aerr, acode end
  return trace.bytes_in(res.data)
end

-- bind(box): the replay methods shadow the Box ones on this box only.
function M.bind(box)
  for name, f in pairs(methods) do box[name] = f end
end

-- Forgets which recorded boxes this process replayed (all traces, or one).
function M.reset(path)
  if path then claimed[path] = nil else claimed = {} end
end

return M

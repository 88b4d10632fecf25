-- A box: one sandbox, whatever the backend. This file owns what is the same
-- everywhere (option merging, the policy a box runs under, hooks and
-- budgets, the exec loop with timeout and kill, output capture into
-- results, background processes, files); a backend owns the box lifecycle
-- (create, destroy, restart, reap: the contract is sbx.backend, written
-- there once and checked when a backend loads) and a transport
-- (sbx.transports: the contract is written there) runs its commands:
-- "agent" over one channel to sbx-agent, or "exec" through the backend's
-- per-command functions.
--
-- Policy: every call reads the box's policy (box:policy()): the live
-- sbx.policy, or for a box made with sbx.box{ policy = overlay } that
-- overlay merged over the live policy. Every hook gets it as its last
-- argument.
local M = {}
local core = require "sbx.core"
local config = require "sbx.config"
local util = require "sbx.util"
local tasks_mod = require "sbx.tasks"
local policy_check = require "sbx.policy_check"
local limits_mod = require "sbx.limits"
local job_mod = require "sbx.job"

local Box = {}
Box.__index = Box
M.Box = Box              -- sbx.trace wraps its methods while a trace records

local open = {}          -- id -> { backend, handle }: what shutdown must remove
M.open_boxes = open

-- init(sbx): the facade calls it once. Nothing is left to wire: this
-- module reads the live policy from sbx.config, never the facade, and
-- sbx.job seeds math.random when it loads.
function M.init() end

local transports = require "sbx.transports"
local session_shell = require "sbx.session_shell"
local run_hook   -- below: a policy hook under its deadline

-- "auto" (the default backend): local for what only it can run (image
-- "host", a "rootfs:" image, layers); docker when a daemon is named (the
-- docker_host option or policy, DOCKER_HOST: asking for a daemon is asking
-- for docker, and a dead one is an error, not a silent change of backend).
-- Else the local backend where it isolates fully here (user namespaces, a
-- proc of the box's own, cgroups for memory, pids and cpu:
-- backends.local.full) and has the box's image without a registry or a
-- daemon (images.available) and can hold every isolation option the box
-- sets (backends.local.limits), unless policy.local.auto is false: it starts
-- and runs commands many times faster than Docker (README, Numbers). Else
-- docker when a daemon answers on one of the usual sockets, else local
-- (what it cannot enforce, box.limits says). The daemon is asked once per
-- process: one that starts later is not noticed.
local daemon_answers
function M.backend_name(name, opts, pol)
  if name ~= "auto" then return name end
  pol = pol or config.policy
  -- What only the local backend can run comes first: no daemon takes it.
  local image = opts and opts.image or pol.box.image
  if type(image) == "string" and (image == "host" or image:match("^rootfs:")) then return "local" end
  if opts and opts.layers then return "local" end
  local env = os.getenv("DOCKER_HOST")
  if (opts and opts.docker_host) or pol.box.docker_host or (env and env ~= "") then return "docker" end
  if pol["local"].auto and type(image) == "string" then
    local lb = require "sbx.backends.local"
    if lb.full(pol) and require("sbx.images").available(image, { policy = pol }) then
      -- and it can hold every option the box sets (network = "bridge" it cannot)
      local spec = {}
      for k, v in pairs(pol.box) do spec[k] = v end
      for k, v in pairs(opts or {}) do spec[k] = v end
      -- (and takes every option given: Docker's host_config it does not)
      local holds = opts == nil or policy_check.box_options(opts, lb) == true
      for k, l in pairs(holds and lb.limits(spec, pol) or {}) do
        if l.enforced == false and spec[k] ~= nil and spec[k] ~= false then holds = false end
      end
      if holds then return "local" end
    end
  end
  if daemon_answers == nil then
    daemon_answers = require("sbx.backends.docker").connect(nil, core.now() + pol.docker.auto_timeout) and true or false
  end
  return daemon_answers and "docker" or "local"
end

local function backend_module(name)
  local ok, mod = pcall(require("sbx.backend").load, name)
  if not ok then error(mod, 3) end
  return mod
end

local random_id = job_mod.random_id
M.random_id = random_id

-- The policy of a box made with an overlay: merged again whenever the live
-- policy changed (sbx.use_policy bumps sbx.policy_generation).
local function merged_policy(overlay)
  return util.merge(util.deep_copy(config.policy), overlay)
end

-- sbx.box(opts) -> box | nil, message, code. Unknown options and options of
-- the wrong type raise (did you mean ...?); so does a bad policy overlay.
function M.new(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("sbx.box expects a table of options", 2) end
  local overlay, pol = nil, config.policy
  if opts.policy ~= nil then
    overlay = config.load(opts.policy)
    pol = merged_policy(overlay)
    local ok, msg = policy_check.policy(pol)
    if not ok then error(msg, 2) end
  end
  local backend_name = M.backend_name(opts.backend or pol.box.backend, opts, pol)
  local backend = backend_module(backend_name)
  local ok, msg = policy_check.box_options(opts, backend)
  if not ok then error("sbx.box: " .. msg, 2) end
  -- sbx.trace hook: M.tracer is set while a trace records (nil otherwise).
  local tr = M.tracer
  if tr == nil and M.trace_autostart then tr = M.trace_autostart() end
  local t0 = tr and tr.begin()
  local spec = util.merge({}, util.deep_copy(pol.box))
  for k, v in pairs(opts) do if k ~= "policy" then spec[k] = v end end
  spec.backend = backend_name
  -- Isolation the backend cannot enforce is refused before anything exists.
  local limits, lerr, lcode = limits_mod.resolve(backend, spec, opts, pol)
  if limits == nil then
    if tr then tr.created(t0, spec, nil, lerr, lcode) end
    return nil, lerr, lcode
  end
  local handle, err, code = backend.create(spec, pol)
  if not handle then
    -- A backend that cannot work here at all: sbx run says this one line
    -- when the script raises it (assert), without a Lua traceback.
    if code == "unsupported" then M.last_refusal = err end
    if tr then tr.created(t0, spec, nil, err, code) end
    return nil, err, code
  end
  local self = setmetatable({
    id = handle.id,
    -- The backend this box runs on ("auto" resolved): "docker", "local", ...
    backend = spec.backend,
    backend_name = spec.backend,   -- the same (older name)
    impl = backend,                -- the backend's module
    handle = handle,
    spec = spec,
    procs = {},            -- name -> process record
    proc_order = {},       -- names in start order
    finished = {},         -- records of ended processes whose logs are kept, oldest first
    retained_bytes = 0,    -- host memory those logs hold (policy.background.retain_bytes)
    counter = 0,
    closed = false,
    overlay = overlay,     -- this box's policy overlay, if any
    usage = { commands = 0, seconds = 0, output_bytes = 0 },
    -- option -> { requested, enforced, note } (sbx.limits), or false
    limits = limits_mod.merge(limits, handle.limits) or false,
  }, Box)
  -- A backend that formats a text later (a disk freeze) finds the box's own
  -- policy here: handle.policy() (weakly held: the handle never keeps the
  -- box alive).
  local boxref = setmetatable({ self }, { __mode = "v" })
  handle.policy = function()
    local b = boxref[1]
    return b and b:policy() or config.policy
  end
  if overlay then self.pol, self.pol_generation = pol, config.generation end
  open[self.id] = { backend = backend, handle = handle }
  -- A backend may answer at the method level (sbx.backends.replay does).
  if backend.bind then
    backend.bind(self, spec)
  else
    local tmod, tstate, reason = transports.choose(self, pol, opts)
    if not tmod then
      open[self.id] = nil
      pcall(backend.destroy, handle, false, core.now() + pol.box.destroy_timeout)
      if tr then tr.created(t0, spec, nil, tstate, reason) end
      return nil, tstate, reason
    end
    self.tmod, self.tstate = tmod, tstate
    self.transport, self.transport_reason = tmod.name, reason
  end
  if tr then tr.created(t0, spec, self) end
  return self
end

-- box:policy() -> the policy this box runs under now.
function Box:policy()
  if not self.overlay then return config.policy end
  if self.pol_generation ~= config.generation then
    self.pol, self.pol_generation = merged_policy(self.overlay), config.generation
  end
  return self.pol
end

function Box:__tostring()
  return string.format("sbx.box %s (%s%s)", self.id:sub(1, 12), self.backend_name, self.closed and ", closed" or "")
end

local function check_open(self)
  if getmetatable(self) ~= Box then error("box method called without a box (use box:method)", 3) end
  if self.closed then error("attempt to use a closed box", 3) end
end

-- box:close(): destroys the box and everything in it. Idempotent.
-- Bounded by box.destroy_timeout: past it the box is left to a background
-- retry and to `sbx reap` (nil, message, "daemon_unresponsive").
function Box:close()
  if self.closed then return true end
  self.closed = true
  open[self.id] = nil
  for _, p in pairs(self.procs) do
    if p.job and p.job.stream then pcall(p.job.stream.release, p.job.stream) end
  end
  if self.tmod then pcall(self.tmod.close, self.tstate) end
  return self.impl.destroy(self.handle, false, core.now() + self:policy().box.destroy_timeout)
end
Box.__close = Box.close

-- A dropped box is removed without blocking the collector.
function Box:__gc()
  if not self.closed then
    self.closed = true
    open[self.id] = nil
    pcall(self.impl.destroy, self.handle, true)
  end
end

-- Functions close_all runs first, before it reads the open set: sbx.pool
-- stops its creations there (a box a pool was still making would land in
-- the set after it was emptied) and drains its boxes.
M.before_close_all = {}

-- At exit: every open box at once, all within one destroy_timeout.
function M.close_all()
  for _, f in ipairs(M.before_close_all) do pcall(f) end
  local tasks = {}
  local deadline = core.now() + config.policy.box.destroy_timeout
  for id, b in pairs(open) do
    open[id] = nil
    tasks[#tasks + 1] = core.spawn(function() b.backend.destroy(b.handle, false, deadline) end)
  end
  for _, t in ipairs(tasks) do t:join() end
end

function M.reap(opts)
  opts = opts or {}
  local name = opts.backend or config.policy.box.backend
  if name == "auto" then
    -- Both backends auto may have used: docker where a daemon answers.
    local out = { removed = {}, kept = 0 }
    local names = { "local" }
    if M.backend_name("auto", opts, config.policy) == "docker" then table.insert(names, 1, "docker") end
    for _, n in ipairs(names) do
      local r, err, code = backend_module(n).reap(opts, config.policy)
      if not r then return nil, err, code end
      for _, x in ipairs(r.removed or {}) do out.removed[#out.removed + 1] = x end
      out.kept = out.kept + (r.kept or 0)
    end
    return out
  end
  return backend_module(name).reap(opts, config.policy)
end

-- Commands --------------------------------------------------------------------

-- Merges env tables (later ones win) into NAME = value; false removes a name.
local function env_map(...)
  local merged = {}
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if t then
      if type(t) ~= "table" then error("env must be a table of NAME = value", 4) end
      for k, v in pairs(t) do merged[k] = v end
    end
  end
  return merged
end

-- NAME = value as the sorted "NAME=value" list a backend passes on.
local function env_list(map)
  local list = {}
  for k, v in pairs(map) do
    if v ~= false then list[#list + 1] = tostring(k) .. "=" .. tostring(v) end
  end
  table.sort(list)
  return list
end

-- What a command is made of reaches the box as C strings, where a NUL byte
-- would cut it short: such a request is refused, never changed. Env names
-- are what a shell can export. Returns nil or the message of the first
-- problem.
local ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"

local function request_problem(req)
  if type(req.command) == "string" and req.command:find("\0", 1, true) then
    return string.format("the command contains a NUL byte (at byte %d)", req.command:find("\0", 1, true))
  end
  for i, a in ipairs(req.argv) do
    if a:find("\0", 1, true) then return string.format("argument %d of the command contains a NUL byte", i) end
  end
  for k, v in pairs(req.env) do
    if type(k) ~= "string" or not k:match(ENV_NAME) then
      return string.format("env name %s is not a valid name (letters, digits and '_', not starting with a digit)",
        type(k) == "string" and string.format("%q", k) or tostring(k))
    end
    if v ~= false and tostring(v):find("\0", 1, true) then return string.format("env %s contains a NUL byte", k) end
  end
  if req.cwd ~= nil and type(req.cwd) ~= "string" then return "cwd must be a string" end
  if req.user ~= nil and type(req.user) ~= "string" and math.type(req.user) ~= "integer" then
    return "user must be a name or a numeric id"
  end
  for _, f in ipairs { "cwd", "user" } do
    if req[f] ~= nil and tostring(req[f]):find("\0", 1, true) then return f .. " contains a NUL byte" end
  end
end

local function check_path(path, level)
  if type(path) ~= "string" or path == "" then error("path must be a non-empty string", level + 1) end
  if path:find("\0", 1, true) then error("path must not contain a NUL byte", level + 1) end
end

-- build_result(job, fields [, pol]) -> the result table of a finished job
-- (sbx.job).
M.build_result = job_mod.build_result

-- The argv for a command string or list, by policy.
local function command_argv(self, pol, command, shell)
  if type(command) == "table" then
    if #command == 0 then error("an argv table must not be empty", 4) end
    local argv = {}
    for i, a in ipairs(command) do argv[i] = tostring(a) end
    return argv
  elseif type(command) == "string" then
    return pol.shell_argv(shell or self.spec.shell or pol.exec.shell, command, pol)
  end
  error("command must be a string or an argv table", 4)
end

local function clamp_timeout(pol, t)
  if t == nil then t = pol.exec.timeout end
  if type(t) ~= "number" or t ~= t then error("timeout must be a number of seconds", 4) end
  if t <= 0 then error("timeout must be positive", 4) end
  if pol.exec.max_timeout and t > pol.exec.max_timeout then t = pol.exec.max_timeout end
  return t
end

-- The transport request for a command described by req (see admit).
local function make_request(req, stdin, capture, chunks, pol)
  local marker = random_id()
  local env = env_list(req.env)
  env[#env + 1] = "SBX_JOB=" .. marker
  return {
    argv = req.argv,
    env = env,
    cwd = req.cwd,
    user = req.user,
    stdin = stdin,
    marker = marker,
    capture = capture or pol.exec.capture,
    chunks = chunks,
    chunk_limit = pol.exec.chunk_limit,
  }
end

local SOURCES = { exec = true, spawn = true, tool = true, harness = true, session = true }

-- The description of a user command that hooks see and may change:
-- { command, argv, env, cwd, user, timeout, stdin_bytes, background, source }.
local function describe(self, pol, command, opts, background)
  local source = opts.source or (background and "spawn" or "exec")
  if not SOURCES[source] then error("source must be exec, spawn, tool, harness or session", 3) end
  if opts.stdin ~= nil and type(opts.stdin) ~= "string" then error("stdin must be a string of bytes", 3) end
  local req = {
    command = command,
    argv = command_argv(self, pol, command, opts.shell),
    env = env_map(pol.exec.env, opts.env),
    cwd = opts.cwd,
    user = opts.user,
    timeout = not background and clamp_timeout(pol, opts.timeout) or nil,
    stdin_bytes = opts.stdin and #opts.stdin or nil,
    background = background,
    source = source,
  }
  local problem = request_problem(req)
  if problem then error(problem, 3) end
  return req
end

-- What a box has used: the settled counters (box.usage) plus what its
-- running background processes have used so far (their wall time and
-- output as they go, not only when they end), and seconds no less than the
-- CPU time of every process in the box where the backend can measure it
-- (usage.cpu_seconds, kept by the budget watcher).
local function live_usage(self)
  local u = self.usage
  local seconds, bytes, now = u.seconds, u.output_bytes, core.now()
  for _, p in pairs(self.procs) do
    if p.status == "running" and p.job then
      local info = p.job.stream:info()
      seconds = seconds + (now - p.started)
      bytes = bytes + info.stdout_bytes + info.stderr_bytes
    end
  end
  if u.cpu_seconds and u.cpu_seconds > seconds then seconds = u.cpu_seconds end
  return { commands = u.commands, seconds = seconds, output_bytes = bytes }
end

-- The first budget a box has used up: which, used, limit.
local function spent_budget(self, pol)
  local b, u = pol.budget or {}, live_usage(self)
  for _, which in ipairs { "commands", "seconds", "output_bytes" } do
    if b[which] and u[which] >= b[which] then return which, u[which], b[which] end
  end
end

-- The budget watcher: while a box has a seconds or output_bytes budget,
-- every policy.budget_poll seconds it reads the box's CPU time
-- (backend.cpu_seconds: Docker's stats, the local backend's cpu cgroup) and
-- what its background processes have used; past a budget it stops them
-- all (their status "killed", error the budget's message) and ends every
-- other process of the box (backend.clear), detached ones included. Later
-- commands are refused with "budget_exceeded". Holds the box weakly.
local function budget_watch(ref)
  while true do
    local self = ref[1]
    if not self or self.closed then return end
    local pol = self:policy()
    local b = pol.budget or {}
    if not (b.seconds or b.output_bytes) then self.budget_task = nil return end
    if self.impl.cpu_seconds then
      local cpu = self.impl.cpu_seconds(self.handle, core.now() + pol.budget_poll * 5)
      if cpu then self.usage.cpu_seconds = cpu end
    end
    local which, used, limit = spent_budget(self, pol)
    if which == "seconds" or which == "output_bytes" then
      self.budget_tripped = pol.format_budget_exceeded(which, used, limit, pol)
      for _, name in ipairs(self.proc_order) do
        local p = self.procs[name]
        if p.status == "running" then
          pcall(self.kill, self, name)
          if p.status == "running" or p.status == "killed" then
            p.status, p.error, p.ended = "killed", self.budget_tripped, p.ended or core.now()
          end
        end
      end
      if self.impl.clear then
        pcall(self.impl.clear, self.handle, core.now() + pol.exec.kill_grace * 3)
      end
      self.budget_task = nil
      return
    end
    -- the box may be collected while this task sleeps (a weak ref holds it)
    self = nil -- luacheck: ignore 311
    core.sleep(pol.budget_poll)
  end
end

local function watch_budget(self, pol)
  local b = pol.budget or {}
  if self.budget_task or self.budget_tripped or not (b.seconds or b.output_bytes) then return end
  self.budget_task = core.spawn(budget_watch, setmetatable({ self }, { __mode = "v" }))
  self.budget_task:unref()
end

-- A hook's changed request, checked: a mistake in a policy is an error
-- that says which hook and which field.
local function take_changed(self, pol, orig, new)
  if type(new) ~= "table" then error("hooks.before_exec must return nothing, a request table or false, message", 0) end
  local r = {}
  for k, v in pairs(orig) do r[k] = v end
  for k, v in pairs(new) do r[k] = v end
  if new.command ~= nil and new.command ~= orig.command and new.argv == orig.argv then
    r.argv = command_argv(self, pol, new.command)
  end
  if type(r.argv) ~= "table" or #r.argv == 0 then error("hooks.before_exec: argv must be a non-empty list", 0) end
  for i, a in ipairs(r.argv) do r.argv[i] = tostring(a) end
  if type(r.env) ~= "table" then error("hooks.before_exec: env must be a table of NAME = value", 0) end
  local problem = request_problem(r)
  if problem then error("hooks.before_exec: " .. problem, 0) end
  if not orig.background then r.timeout = clamp_timeout(pol, r.timeout) end
  r.background, r.source, r.stdin_bytes = orig.background, orig.source, orig.stdin_bytes
  return r
end

-- A string of the request longer than the box's kernel execs: the message
-- saying which, or nil.
local function too_long(req, pol)
  local limit = pol.exec.max_arg_bytes
  for i, a in ipairs(req.argv) do
    if #a > limit then
      local which = (type(req.command) == "string" and a == req.command) and "command" or "argument " .. i
      return pol.format_arg_too_long(which, #a, pol)
    end
  end
  for k, v in pairs(req.env) do
    if v ~= false and #k + 1 + #tostring(v) > limit then
      return pol.format_arg_too_long("env " .. k, #k + 1 + #tostring(v), pol)
    end
  end
end

-- Runs a policy hook under its deadline (sbx.deadline): true, results...,
-- or false, message, "hook_timeout" when it did not return in limit
-- seconds. Its errors and an interrupt go on up as they are.
run_hook = function(pol, which, limit, hook, ...)
  local r = table.pack(core.deadline(limit, hook, ...))
  if r[1] then return table.unpack(r, 1, r.n) end
  if r[3] == "timeout" then return false, pol.format_hook_timeout(which, limit), "hook_timeout" end
  error(r[2], 0)
end

-- Admission of a user command: budgets, then policy.hooks.before_exec.
-- Returns the request to run, or nil, message, code. A refused command
-- counts against no budget; an admitted one counts as a command at once.
local function admit(self, pol, req)
  local which, used, limit = spent_budget(self, pol)
  if which then return nil, pol.format_budget_exceeded(which, used, limit, pol), "budget_exceeded" end
  if self.budget_tripped then return nil, self.budget_tripped, "budget_exceeded" end
  watch_budget(self, pol)
  local hook = pol.hooks and pol.hooks.before_exec
  if hook then
    -- Within the command's deadline: the hook's time is the command's.
    local limit = math.min(pol.hooks.timeout, req.timeout or math.huge)
    local t0 = core.now()
    local ok, verdict, message = run_hook(pol, "before_exec", limit, hook, self, req, pol)
    if not ok then return nil, verdict, message end
    local spent = core.now() - t0
    if verdict == false then
      return nil, message ~= nil and tostring(message) or pol.denied_message, "denied"
    elseif verdict ~= nil and verdict ~= true then
      req = take_changed(self, pol, req, verdict)
    end
    if req.timeout then
      -- The hook's time is taken from the command's (in a copy: the hook
      -- may keep the req it saw).
      local left = req.timeout - spent
      if left <= 0 then return nil, pol.format_hook_timeout("before_exec", limit), "hook_timeout" end
      local r = {}
      for k, v in pairs(req) do r[k] = v end
      r.timeout = left
      req = r
    end
  end
  local long = too_long(req, pol)
  if long then return nil, long, "exec_failed" end
  local seconds = pol.budget and pol.budget.seconds
  local used = seconds and live_usage(self).seconds
  if seconds and req.timeout and seconds - used < req.timeout then
    req.timeout = seconds - used
    req.budget_capped = true
  end
  self.usage.commands = self.usage.commands + 1
  return req
end

-- What a finished user command used.
local function account(self, seconds, output_bytes)
  local u = self.usage
  u.seconds = u.seconds + seconds
  u.output_bytes = u.output_bytes + output_bytes
end

local function after_exec(self, pol, req, result)
  local hook = pol.hooks and pol.hooks.after_exec
  if not hook then return result end
  local ok, replaced, msg = run_hook(pol, "after_exec", pol.hooks.timeout, hook, self, req, result, pol)
  if not ok then return nil, replaced, msg end
  if replaced ~= nil then
    if type(replaced) ~= "table" then error("hooks.after_exec must return nothing or a result table", 0) end
    return replaced
  end
  return result
end

-- The in-box kill and clear of a job's processes live in sbx.job (a leaf
-- the backends require without this module).
M.kill_request = job_mod.kill_request
M.clear_request = job_mod.clear_request

-- A stream's transport failure in the backend's words (Docker: a socket
-- that is gone or refuses is "daemon_unavailable"): message, code.
local function stream_failure(self, info)
  if self.impl.stream_error then return self.impl.stream_error(self.handle, info) end
  return info.error, info.error_code
end


-- Waits until a killed job's stream ends, by deadline: true once it did.
local function stream_ends(stream, deadline)
  while true do
    if stream:info().eof then return true end
    local left = deadline - core.now()
    if left <= 0 then return false end
    local ev = stream:wait(left)
    if ev == "eof" then return true end
    if ev == "data" then stream:take() end
    if ev == "timeout" then return false end
  end
end

-- Kills a job's whole process tree, all within exec.kill_grace seconds;
-- falls back to restarting the box when the kill cannot run (and the daemon
-- answers). Returns the fields it adds to the result: kill_confirmed (the
-- job's stream ended), and when it did not, kill_error and error_code
-- ("daemon_unresponsive" when the daemon did not answer in time).
-- When the in-box kill cannot run or does not end the job, a backend that
-- can reach the box's processes from outside (backend.host_kill: Docker on
-- this host) kills just the job's tree; restarting the whole box is the last
-- resort, and the result then lists the background processes it ended.
local function kill_tree(self, pol, job, signal, tm, ts)
  tm, ts = tm or self.tmod, ts or self.tstate
  local grace = pol.exec.kill_grace
  local deadline = core.now() + grace
  -- While the kill runs, the command's output keeps being read: a stream
  -- nobody reads can hold up the daemon's other execs, the kill's own too.
  local draining = true
  local drainer = core.spawn(function()
    while draining and not job.stream:info().eof do
      if job.stream:wait(0.05) == "data" then job.stream:take() end
    end
  end)
  local ok, err, code = tm.kill(ts, job, signal or "KILL", deadline)
  draining = false
  drainer:join()
  -- A stream that ended because its transport failed (a lost agent, a
  -- daemon gone) confirms nothing about the processes.
  local function confirmed() local i = job.stream:info() return i.eof and not i.error_code end
  if ok and stream_ends(job.stream, deadline) and confirmed() then return { kill_confirmed = true } end
  if confirmed() then return { kill_confirmed = true } end
  -- Nothing answers (a frozen daemon, a stopped agent): no fallback would
  -- either; say so by the deadline.
  if code == "daemon_unresponsive" or code == "agent_unresponsive" or code == "agent_lost" or tm ~= self.tmod then
    return { kill_confirmed = false, kill_error = err, error_code = code or "kill_failed" }
  end
  if self.impl.host_kill then
    local hdeadline = core.now() + grace
    local hok = self.impl.host_kill(self.handle, job, hdeadline)
    if hok and stream_ends(job.stream, hdeadline) then
      return { kill_confirmed = true, kill_method = "host" }
    end
  end
  if pol.exec.on_unkillable == "restart" then
    local ended_processes = {}
    for _, name in ipairs(self.proc_order) do
      local p = self.procs[name]
      if p.status == "running" and p.job ~= job then ended_processes[#ended_processes + 1] = name end
    end
    local restart_deadline = core.now() + grace
    local rok, rerr, rcode = self.impl.restart(self.handle, restart_deadline)
    local ended = rok and stream_ends(job.stream, restart_deadline)
    if rok then
      for _, name in ipairs(ended_processes) do
        local p = self.procs[name]
        p.status, p.error, p.ended = "killed", "the box was restarted", p.ended or core.now()
      end
    end
    return { box_restarted = rok and true or false, kill_confirmed = ended or false,
      ended_processes = rok and ended_processes or nil,
      kill_error = err or rerr, error_code = not ended and (rcode or "kill_failed") or nil }
  end
  return { kill_confirmed = false, kill_error = err or "the process did not stop", error_code = "kill_failed" }
end

-- Runs a transport request to its end or its timeout: the result, or nil,
-- message, code. Used for user commands and sbx's own helpers alike.
local function run_request(self, pol, treq, timeout, on_output, command, tm, ts)
  tm, ts = tm or self.tmod, ts or self.tstate
  local started = core.now()
  -- Creating the command is bounded by its own timeout: a daemon frozen
  -- before the call gives "daemon_unresponsive" then, not minutes later.
  treq.deadline = started + timeout
  local job, err, code = tm.start(ts, treq)
  if not job then return nil, err, code end
  job.started = job.started or started
  local stream = job.stream
  local deadline = started + timeout
  -- A transport whose command starts late (Fargate: the SSM agent's first
  -- read waits 1 s) says when it started (job.ready_at) and how long it may
  -- take to (job.start_timeout): the timeout counts from the start.
  local function current_deadline()
    if not job.start_timeout then return deadline, deadline end
    if job.ready_at then return job.ready_at + timeout, job.ready_at + timeout end
    local limit = started + job.start_timeout
    return limit, math.min(limit, core.now() + (job.ready_poll or 0.05))
  end
  local timed_out = false
  local ok, perr = pcall(function()
    while true do
      local limit, wake = current_deadline()
      local left = wake - core.now()
      local ev = left > 0 and stream:wait(left) or "timeout"
      if ev == "timeout" and core.now() < limit then ev = "again" end
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
    pcall(kill_tree, self, pol, job, nil, tm, ts)
    stream:close()
    error(perr, 0)
  end
  local fields = { timed_out = timed_out, timeout = timeout, command = command }
  if timed_out then
    for k, v in pairs(kill_tree(self, pol, job, nil, tm, ts)) do fields[k] = v end
    stream:close()
  else
    local info = stream:info()
    if info.error_code then
      stream:close()
      return nil, stream_failure(self, info)
    end
    local exit_code, ferr, fcode = tm.finish(ts, job, core.now() + pol.exec.kill_grace)
    if exit_code == nil then return nil, ferr, fcode end
    fields.exit_code = exit_code
    if exit_code >= 128 and exit_code < 160 then fields.signal = exit_code - 128 end
  end
  fields.duration = core.now() - started
  return M.build_result(job, fields, pol)
end

-- box:exec(command, opts) -> result
-- opts: timeout, env, cwd, user, stdin (bytes), on_output(stream, text),
-- shell, source (who asks: "exec" by default; tools, the harness and
-- sessions say so). The result has exit_code (nil when killed), stdout,
-- stderr, output (both interleaved), timed_out, truncated, duration, byte
-- counts, parts. Infrastructure failures return nil, message, code; so do
-- commands the policy refuses ("denied", "budget_exceeded").
function Box:exec(command, opts)
  check_open(self)
  opts = opts or {}
  if type(opts) ~= "table" then error("exec options must be a table", 2) end
  local on_output = opts.on_output
  if on_output ~= nil and type(on_output) ~= "function" then error("on_output must be a function", 2) end
  local pol = self:policy()
  local req, err, code = admit(self, pol, describe(self, pol, command, opts, false))
  if not req then return nil, err, code end
  local treq = make_request(req, opts.stdin, nil, on_output ~= nil, pol)
  local started = core.now()
  local r, rerr, rcode = run_request(self, pol, treq, req.timeout, on_output, req.command)
  if not r then
    account(self, core.now() - started, 0)
    return nil, rerr, rcode
  end
  account(self, r.duration, (r.stdout_bytes or 0) + (r.stderr_bytes or 0))
  -- Timed out at the budget's cap: the budget is spent, whatever the
  -- timer's rounding left over.
  if r.timed_out and req.budget_capped then
    self.usage.seconds = math.max(self.usage.seconds, pol.budget.seconds)
  end
  return after_exec(self, pol, req, r)
end

-- sbx's own commands (file transfer): no hooks, no budgets.
function M.helper_exec(self, argv, opts)
  local pol = self:policy()
  local req = { argv = argv, env = {}, cwd = opts.cwd, user = opts.user }
  local treq = make_request(req, opts.stdin, opts.capture, false, pol)
  return run_request(self, pol, treq, clamp_timeout(pol, opts.timeout), nil, argv)
end

-- Background processes ----------------------------------------------------------

-- Bytes a process has printed (stdout and stderr), kept or not.
local function output_bytes(p)
  if p.output_bytes then return p.output_bytes end
  if not p.job then return 0 end
  local info = p.job.stream:info()
  return info.stdout_bytes + info.stderr_bytes
end

local function proc_view(p)
  return {
    name = p.name,
    command = p.command,
    status = p.status,
    exit_code = p.exit_code,
    error = p.error,
    started = p.started,
    elapsed = (p.ended or core.now()) - p.started,
    output_bytes = output_bytes(p),
    evicted = p.evicted,
    oom_killed = p.oom_killed,
    memory_limit = p.memory_limit,
  }
end

-- Frees a finished process's log for real (the C buffers now, not at the
-- next collection); its record stays, with its byte count.
local function evict(self, p)
  if p.evicted or not p.job then return end
  p.output_bytes = output_bytes(p)
  p.job.stream:release()
  p.job, p.evicted = nil, true
  self.retained_bytes = self.retained_bytes - (p.held or 0)
  for i, q in ipairs(self.finished) do
    if q == p then table.remove(self.finished, i) break end
  end
end

-- The logs of finished processes share one budget per box
-- (policy.background.retain_bytes): a process that ends adds its log, and
-- the oldest finished logs are freed until the rest fit.
local function retain(self, p, pol)
  if self.closed or not p.job then return end
  p.held = p.job.stream:info().held_bytes
  self.retained_bytes = self.retained_bytes + p.held
  self.finished[#self.finished + 1] = p
  local budget = pol.background.retain_bytes
  while self.retained_bytes > budget and self.finished[1] do
    evict(self, self.finished[1])
  end
end

-- box:spawn(command, opts) -> name | nil, message, code
-- opts: name, env, cwd, user, stdin, shell, source. The output goes to a
-- bounded log. Hooks and budgets apply as to box:exec (a background process
-- has no timeout; its time and output count when it ends).
function Box:spawn(command, opts)
  check_open(self)
  opts = opts or {}
  if type(opts) ~= "table" then error("spawn options must be a table", 2) end
  local pol = self:policy()
  local bpol = pol.background
  local name = opts.name
  if name ~= nil and name ~= "" then
    if type(name) ~= "string" or #name > bpol.max_name_length or not name:match(bpol.name_pattern) then
      return nil, string.format("invalid process name '%s': use up to %d letters, digits, '_', '.' or '-'",
        tostring(name), bpol.max_name_length), "invalid_name"
    end
    local old = self.procs[name]
    if old and old.status == "running" then
      return nil, string.format("a process named '%s' is still running; kill it or choose another name", name), "name_in_use"
    end
  end
  local req, err, code = admit(self, pol, describe(self, pol, command, opts, true))
  if not req then return nil, err, code end
  if name == nil or name == "" then
    repeat
      self.counter = self.counter + 1
      name = pol.process_name(self, self.counter, pol)
    until not self.procs[name]
  end
  local treq = make_request(req, opts.stdin,
    { stdout = { head = 0, tail = 0 }, stderr = { head = 0, tail = 0 }, output = bpol.log }, false, pol)
  local started = core.now()
  local job, jerr, jcode = self.tmod.start(self.tstate, treq)
  if not job then return nil, jerr, jcode end
  job.started = job.started or started
  local p = {
    name = name, command = type(command) == "table" and table.concat(command, " ") or command,
    status = "running", started = core.now(), job = job, done = core.event(),
  }
  local old = self.procs[name]
  if old then evict(self, old) else self.proc_order[#self.proc_order + 1] = name end
  self.procs[name] = p
  -- A watcher per process: learns the exit code as soon as the stream ends.
  core.spawn(function()
    job.stream:wait()
    p.ended = p.ended or core.now()
    if p.status == "running" then
      local info = job.stream:info()
      if info.error_code then
        p.status, p.error = "failed", (stream_failure(self, info))
      else
        local exit_code, ferr = self.tmod.finish(self.tstate, job)
        -- box:kill may have said "killed" while finish waited on the daemon.
        if p.status == "running" and exit_code then
          p.status, p.exit_code = "exited", exit_code
          p.oom_killed, p.memory_limit = job.oom_killed, job.memory_limit
        elseif p.status == "running" then
          p.status, p.error = "failed", ferr
        end
      end
    end
    local view = proc_view(p)
    account(self, view.elapsed, view.output_bytes)
    retain(self, p, self:policy())
    p.done:set()
    if not self.closed then after_exec(self, self:policy(), req, view) end
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
-- An offset past the end reads nothing (next_offset is the end); max_bytes
-- beyond what the log keeps reads what it keeps. The log of a finished
-- process freed by policy.background.retain_bytes is nil, message, "evicted".
function Box:output(name, opts)
  check_open(self)
  opts = opts or {}
  if type(opts) ~= "table" then error("output options must be a table", 2) end
  local pol = self:policy()
  local offset, max = opts.offset or 0, opts.max_bytes or pol.background.read_max
  if type(offset) ~= "number" or offset ~= offset or offset < 0 then error("offset must be a number >= 0", 2) end
  if type(max) ~= "number" or max ~= max or max < 1 then error("max_bytes must be a number >= 1", 2) end
  local p, err, code = get_proc(self, name)
  if not p then return nil, err, code end
  if p.evicted then return nil, pol.format_evicted(proc_view(p), pol), "evicted" end
  local total = output_bytes(p)
  offset = math.floor(math.min(offset, total))
  max = math.floor(math.min(max, math.max(total - offset, 1)))
  local bytes, next_offset, skipped = p.job.stream:read("output", offset, max)
  -- Never hand out half a character: keep it for the next read.
  local whole, held = core.text.head_cut(bytes)
  if p.status ~= "running" and next_offset >= total then held = 0; whole = bytes end
  local text, replaced = util.model_text(whole)
  return {
    text = text,
    replaced = replaced,
    offset = offset,
    skipped = skipped,
    next_offset = next_offset - held,
    total = total,
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
  local ok, kerr, kcode = self.tmod.kill(self.tstate, p.job, signal, core.now() + self:policy().exec.kill_grace)
  if not ok then return nil, kerr, kcode end
  if signal == "KILL" then
    p.status = "killed"
    p.ended = core.now()
    if not p.done:wait(self:policy().exec.kill_grace) then p.job.stream:close() end
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
  check_path(path, 2)
  if type(data) ~= "string" then error("data must be a string", 2) end
  local pol = self:policy().files
  if #data > pol.max_write then
    return nil, string.format("%d bytes is more than the policy's max_write (%d)", #data, pol.max_write), "too_large"
  end
  if self.tmod.write_file then
    local timeout = clamp_timeout(self:policy(), opts and opts.timeout)
    return self.tmod.write_file(self.tstate, path, data, { make_parents = pol.make_parents }, core.now() + timeout)
  end
  local script = pol.make_parents and 'mkdir -p "$(dirname "$1")" && cat > "$1"' or 'cat > "$1"'
  local r, err, code = M.helper_exec(self, { "sh", "-c", script, "sh", path },
    { stdin = data, timeout = opts and opts.timeout })
  if not r then return nil, err, code end
  if r.exit_code ~= 0 then
    return nil, string.format("cannot write %s: %s", path, (r.stderr:gsub("%s+$", ""))), "write_failed"
  end
  return true
end

-- box:read_file(path, opts) -> bytes | nil, message, code
-- opts: max_bytes (policy files.max_read), timeout (policy exec.timeout).
-- Some files never end (/dev/zero, a FIFO, a file growing as it is read):
-- reading stops once more than max_bytes have arrived ("too_large") or at
-- the timeout ("timeout"), and then the reader's processes in the box are
-- killed, so no cat outlives the call.
function Box:read_file(path, opts)
  check_open(self)
  check_path(path, 2)
  local pol = self:policy()
  local max = (opts and opts.max_bytes) or pol.files.max_read
  local timeout = (opts and opts.timeout) or pol.exec.timeout
  if type(max) ~= "number" or not (max >= 0) then error("max_bytes must be a number >= 0", 2) end
  max = math.floor(math.min(max, 2 ^ 53))
  if type(timeout) ~= "number" or not (timeout > 0) then error("timeout must be a positive number of seconds", 2) end
  if self.tmod.read_file then
    return self.tmod.read_file(self.tstate, path, max, core.now() + timeout)
  end
  return M.capture_stdout(self, { "cat", "--", path }, path, max, timeout)
end

-- box.capture_stdout(self, argv, what, max, timeout) -> bytes | nil,
-- message, code: sbx's own command (no hooks, no budgets), its stdout kept
-- whole up to max bytes ("too_large" past that, "timeout" at the
-- timeout, and then its processes are killed); a non-zero exit is
-- "not_found" with its stderr. what names the thing read in messages.
function M.capture_stdout(self, argv, what, max, timeout)
  local pol = self:policy()
  local req = { argv = argv, env = {} }
  -- Chunks on, so each arrival wakes this task and the count is seen at
  -- once; the queued copies are dropped, the capture keeps the bytes.
  local treq = make_request(req, nil,
    { stdout = { head = max + 1, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } }, true, pol)
  local job, err, code = self.tmod.start(self.tstate, treq)
  if not job then return nil, err, code end
  local stream = job.stream
  local deadline = core.now() + timeout
  -- The stream is closed first: a daemon still pushing bytes into a stream
  -- nobody reads holds up the exit of every exec in the box, the kill's too.
  local function stop()
    stream:close()
    pcall(self.tmod.kill, self.tstate, job, "KILL", core.now() + pol.exec.kill_grace)
  end
  local ok, ev = pcall(function()
    while true do
      local left = deadline - core.now()
      local e = left > 0 and stream:wait(left) or "timeout"
      if e == "data" then stream:take(true) end
      if stream:info().stdout_bytes > max then return "too_large" end
      if e ~= "data" then return e end
    end
  end)
  if not ok then
    -- Cancelled or interrupted: the reader must not outlive the call.
    stop()
    error(ev, 0)
  end
  if ev == "too_large" then
    stop()
    return nil, string.format("%s has more than the %d bytes allowed by policy", what, max), "too_large"
  elseif ev == "timeout" then
    stop()
    return nil, "timed out reading " .. what, "timeout"
  end
  local info = stream:info()
  if info.error_code then return nil, stream_failure(self, info) end
  local exit_code, ferr, fcode = self.tmod.finish(self.tstate, job)
  if not exit_code then return nil, ferr, fcode end
  if exit_code ~= 0 then
    local msg = stream:captured("stderr")
    return nil, string.format("cannot read %s: %s", what, (msg:gsub("%s+$", ""))), "not_found"
  end
  return (stream:captured("stdout"))
end

-- Sessions: shell state carried from command to command ----------------------------

local Session = {}
Session.__index = Session
M.Session = Session

-- box:session([opts]) -> session | nil, message, code. Commands that keep
-- the shell's directory, variables, functions, aliases, options and umask
-- from one to the next (session:exec(command, opts), session:close()).
-- Each command is a new shell process on the box's transport: its exit
-- status is that process's (waitpid), its output ends with it, and nothing
-- a command prints or defines changes what sbx reports about it or a later
-- one (sbx.session_shell says what carries over and how). A timeout kills
-- the command's whole tree at once (its next step never runs); the session
-- goes on from the state before it, and the result says session_reset.
-- opts: env, cwd (of the first command), user; shell (the launcher argv;
-- the policy's exec.session_shell).
function Box:session(opts)
  check_open(self)
  opts = opts or {}
  if opts.shell ~= nil and (type(opts.shell) ~= "table" or #opts.shell == 0) then
    error("session shell must be a non-empty argv list", 2)
  end
  local pol = self:policy()
  local id = random_id()
  return setmetatable({ box = self, lock = tasks_mod.semaphore(1), env = opts.env, cwd = opts.cwd, user = opts.user,
    launcher = opts.shell or pol.exec.session_shell, state = string.format(pol.exec.session_state, id) }, Session)
end

-- session:exec(command, opts) -> result | nil, message, code. command is a
-- string for the shell. opts: timeout, on_output. Hooks and budgets apply
-- (source "session"); one command at a time.
function Session:exec(command, opts)
  local box = self.box
  check_open(box)
  if self.closed then error("attempt to use a closed session", 2) end
  if type(command) ~= "string" then error("a session runs command strings", 2) end
  opts = opts or {}
  local pol = box:policy()
  local req, err, code = admit(box, pol, describe(box, pol, command, { timeout = opts.timeout, source = "session",
    env = self.env, cwd = self.cwd, user = self.user }, false))
  if not req then return nil, err, code end
  if type(req.command) ~= "string" then error("hooks.before_exec: a session command must stay a string", 0) end
  req.argv = session_shell.argv(self.launcher, req.command)
  local env = {}
  for k, v in pairs(req.env) do env[k] = v end
  env.SBX_SESSION_STATE = self.state
  req.env = env
  local long = too_long(req, pol)
  if long then return nil, long, "exec_failed" end
  self.lock:acquire()
  local treq = make_request(req, nil, nil, opts.on_output ~= nil, pol)
  local started = core.now()
  local ok, r, rerr, rcode = pcall(run_request, box, pol, treq, req.timeout, opts.on_output, req.command)
  self.lock:release()
  if not ok then error(r, 0) end
  if not r then
    account(box, core.now() - started, 0)
    return nil, rerr, rcode
  end
  -- A timed-out command was killed before it could save its state.
  if r.timed_out then r.session_reset = true end
  account(box, r.duration, (r.stdout_bytes or 0) + (r.stderr_bytes or 0))
  return after_exec(box, pol, req, r)
end

-- The state file stays in the box (it goes with the box).
function Session:close()
  self.closed = true
end
Session.__close = Session.close

-- Tools for a model bound to this box.
function Box:tools()
  check_open(self)
  return require("sbx.tools").for_box(self)
end

return M

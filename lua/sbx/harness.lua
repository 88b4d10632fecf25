-- sbx.harness: run a list of evaluation tasks, each in its own box, with
-- bounded concurrency, results as JSON Lines, resume, progress and a summary.
--
--   local sbx = require "sbx"
--   local summary = sbx.harness.run {
--     tasks = {
--       { id = "add", files = { ["/work/t.sh"] = "test $((1+1)) = 2" },
--         setup = { "echo ready" }, run = "sh /work/t.sh", timeout = 30 },
--       { id = "grep", run = "echo hello > /tmp/o", check = "grep -q hello /tmp/o",
--         outputs = { "/tmp/o" } },        -- what a fresh check box gets (grade.lua)
--       { id = "lua", run = function(box, task) return box:exec("true") end,
--         check = function(box, task) return box:read_file("/etc/hostname") ~= nil end,
--         outputs = {} },
--     },
--     concurrency = 8, box = { image = "sbx-busybox:latest" },
--     out = "results.jsonl",            -- appended as each task ends; resumable
--     progress = "auto",                -- "tty" (one live line), "plain", "none"
--     pool = 8,                         -- warm boxes (default policy.pool.size; 0: none)
--   }
--   print(summary.passed, summary.failed, summary.errors, summary.interrupted)
--
-- A task passes when its check exits 0 (or returns truthy, for a Lua
-- function), or, without a check, when run exits 0. "failed" is the verdict
-- on the task (a failing setup command, run timing out, a failing check);
-- "error" is the harness or the daemon failing (no box, a Lua error, a
-- write that could not happen). When `out` exists, ids with a passed or
-- failed line are skipped; error ones run again. On SIGINT/SIGTERM no new
-- task starts, finished results stay in the file, every box is closed and
-- the summary says interrupted = true.
--
-- With a pool (opts.pool, else policy.pool.size; 0: none) a task whose
-- box options equal the run's (no task box, or one that resolves to the
-- same spec: pool:matches) takes a box made ahead of it from a warm pool
-- (sbx.pool); any other task makes its own. A pooled box has no sbx.task
-- label. summary.pool counts both.
--
-- Command line: sbx eval TASKS.jsonl|TASKS.lua [--concurrency N]
--   [--backend B] [--image I] [--out results.jsonl] [--report report.html]
--   [--pool N]
local M = {}

-- What this runner uses of sbx's API, from the modules below the facade
-- (which exports sbx.harness, so the runner never requires it): the same
-- functions and the live policy (sbx.config).
local core = require "sbx.core"
local config = require "sbx.config"
local util = require "sbx.util"
local tasks_mod = require "sbx.tasks"
local API = setmetatable({
  core = core, json = core.json, now = core.now, deadline = core.deadline,
  model_text = util.model_text, merge_policy = util.merge, deep_copy = util.deep_copy,
  spawn = tasks_mod.spawn, semaphore = tasks_mod.semaphore,
  box = function(...) return require("sbx.box").new(...) end,
  pool = function(...) return require("sbx.pool").new(...) end,
}, { __index = function(_, k) if k == "policy" then return config.policy end end })
local function lib() return API end

local function is_null(v, json) return v == nil or v == json.null end

local function warn(...)
  io.stderr:write("sbx eval: ", table.concat({ ... }), "\n")
end

-- Ordered JSON objects for readable lines.
local function ordered(t, keys)
  return setmetatable(t, { __jsonorder = keys })
end

local RESULT_KEYS = { "id", "status", "passed", "reason", "error", "code", "duration", "started_at", "start_offset", "phases" }
local PHASE_KEYS = { "exit_code", "timed_out", "oom_killed", "truncated", "duration", "stdout_bytes", "stderr_bytes", "signal", "refused", "value", "output" }

-- Tasks ---------------------------------------------------------------------

-- The key a task id is known by, in this run and in a results file read
-- back: an id and its JSON round trip have the same key (1.0 comes back
-- as 1, 2^53 as 9007199254740992), and floats are told apart exactly.
local function id_key(id)
  if math.type(id) == "float" then
    if id == math.floor(id) and math.abs(id) < 2 ^ 63 then return string.format("%d", id) end
    return string.format("%.17g", id)
  end
  return tostring(id)
end
M.id_key = id_key

-- Why an id cannot be written to a results line as it is, or nil: JSON
-- text holds only UTF-8 (other bytes would be replaced, and two ids could
-- become one) and finite numbers.
local function id_problem(id)
  if type(id) == "string" then
    local ok, at = utf8.len(id)
    if not ok then return string.format("id is not valid UTF-8 (byte %d); ids are written to JSON results, so they must be text", at) end
  elseif type(id) == "number" and (id ~= id or id == math.huge or id == -math.huge) then
    return "id must be a finite number"
  end
end

-- Checks one task table; returns it or raises a usage error.
local function validate(t, i, seen, json)
  if type(t) ~= "table" then error(string.format("task #%d is not a table", i), 0) end
  if is_null(t.id, json) or t.id == "" then error(string.format("task #%d has no id", i), 0) end
  if type(t.id) ~= "string" and type(t.id) ~= "number" then
    error(string.format("task #%d: id must be a string or a number", i), 0)
  end
  local problem = id_problem(t.id)
  if problem then error(string.format("task #%d: %s", i, problem), 0) end
  local id, key = tostring(t.id), id_key(t.id)
  if seen[key] then error(string.format("task #%d: duplicate id '%s'", i, id), 0) end
  seen[key] = true
  local function cmd_ok(v)
    return v == nil or type(v) == "string" or type(v) == "function" or type(v) == "table"
  end
  for _, k in ipairs { "run", "check", "box", "files", "setup", "timeout" } do
    if t[k] == json.null then t[k] = nil end
  end
  require("sbx.grade").validate(t, id, json)
  if t.run == nil and t.check == nil then error(string.format("task '%s' has neither run nor check", id), 0) end
  if not cmd_ok(t.run) or not cmd_ok(t.check) then
    error(string.format("task '%s': run and check must be a command string, an argv list or a function", id), 0)
  end
  if t.setup ~= nil and type(t.setup) ~= "table" and type(t.setup) ~= "string" and type(t.setup) ~= "function" then
    error(string.format("task '%s': setup must be a list of commands", id), 0)
  end
  if t.files ~= nil and type(t.files) ~= "table" then error(string.format("task '%s': files must map path to content", id), 0) end
  if t.box ~= nil and type(t.box) ~= "table" then error(string.format("task '%s': box must be a table of options", id), 0) end
  if t.timeout ~= nil and (type(t.timeout) ~= "number" or t.timeout <= 0) then
    error(string.format("task '%s': timeout must be a positive number of seconds", id), 0)
  end
  return t
end

-- The environment of a Lua task file: pure functions, nothing that reaches
-- the host, no metatable shared with sbx (sbx.taskenv).
local taskenv = require "sbx.taskenv"
M.task_env = taskenv.new

-- What a task's phase function gets: the box's methods and counters, not
-- the box (whose backend and handle reach the daemon).
local VIEW_METHODS = { "exec", "spawn", "processes", "output", "kill", "wait", "write_file", "read_file", "tools" }

-- A copy of v with no table shared with sbx (and no metatable): the
-- counters a task could otherwise reset (usage), the policy's tool schemas.
local function plain(v, depth)
  if type(v) ~= "table" or (depth or 0) > 32 then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = plain(x, (depth or 0) + 1) end
  return out
end

local function box_view(box)
  local view = {}
  for _, m in ipairs(VIEW_METHODS) do
    view[m] = function(_, ...) return box[m](box, ...) end
  end
  -- The tools without the list's box field (the box itself) and with
  -- schemas of their own.
  view.tools = function()
    local out = {}
    for i, t in ipairs(box:tools()) do
      out[i] = { name = t.name, description = t.description, schema = plain(t.schema), order = plain(t.order), run = t.run }
    end
    return out
  end
  return setmetatable(view, {
    __index = function(_, k)
      if k == "id" then return box.id end
      if k == "usage" or k == "limits" then return plain(box[k]) end
    end,
    __newindex = function() error("a task's box view is read-only", 2) end,
    __metatable = false,
  })
end
M.box_view = box_view

-- harness.load_tasks(path) -> list | nil, message. A .jsonl file holds one
-- JSON task per line; a .lua file returns a list of tasks.
function M.load_tasks(path)
  local json = lib().json
  if path:match("%.lua$") then
    -- A task file may come from a stranger: its chunk runs with pure
    -- functions only (no io, os, require, load, debug), and its phase
    -- functions get a box view with the box's methods, nothing behind them.
    -- Its chunk runs under policy.harness.load_timeout, and what it
    -- returns is copied into plain data there (no metamethod of the file's
    -- runs later outside a deadline).
    local chunk, err = loadfile(path, "t", taskenv.new())
    if not chunk then return nil, err end
    local limit = lib().policy.harness.load_timeout
    local ok, tasks, code = lib().deadline(limit, function()
      local list = chunk()
      if type(list) ~= "table" then error("must return a list of tasks", 0) end
      return taskenv.copy(list, "tasks")
    end)
    if not ok then
      if code == "interrupted" then error(tasks, 0) end
      if code == "timeout" then
        return nil, string.format("%s: did not load within %g s (policy harness.load_timeout)", path, limit)
      end
      return nil, path .. ": " .. tostring(tasks)
    end
    return tasks
  end
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local tasks, n = {}, 0
  for line in f:lines() do
    n = n + 1
    if line:match("%S") then
      local t, jerr = json.decode(line)
      if type(t) ~= "table" then
        f:close()
        return nil, string.format("%s:%d: %s", path, n, jerr or "a task must be a JSON object")
      end
      local problem = id_problem(t.id)
      if problem then
        f:close()
        return nil, string.format("%s:%d: task %s", path, n, problem)
      end
      tasks[#tasks + 1] = t
    end
  end
  f:close()
  return tasks
end

-- Results file ---------------------------------------------------------------

-- Reads an existing results file: id -> last result, and the list of results
-- in file order (last line per id wins). Malformed lines are warned about.
local function read_results(path, json)
  local f = io.open(path, "rb")
  if not f then return {}, {}, false end
  local by_id, n = {}, 0
  local data = f:read("a")
  f:close()
  for line in data:gmatch("([^\n]*)\n?") do
    n = n + 1
    if line:match("%S") then
      local r = json.decode(line)
      if type(r) == "table" and r.id ~= nil and r.id ~= json.null and type(r.status) == "string" then
        by_id[id_key(r.id)] = r
      else
        warn(string.format("%s:%d: ignoring a malformed line", path, n))
      end
    end
  end
  local list = {}
  for _, r in pairs(by_id) do list[#list + 1] = r end
  table.sort(list, function(a, b) return tostring(a.id) < tostring(b.id) end)
  return by_id, list, #data > 0 and data:sub(-1) ~= "\n"
end

-- Running one task ------------------------------------------------------------

-- An infrastructure failure, raised as a table so it is told from a verdict.
local function infra(msg, code)
  error({ harness_error = true, message = tostring(msg), code = code }, 0)
end

local function summarize(sbx, r, pol)
  local p = {
    exit_code = r.exit_code,
    timed_out = r.timed_out and true or false,
    truncated = r.truncated and true or false,
    duration = r.duration,
    stdout_bytes = r.stdout_bytes,
    stderr_bytes = r.stderr_bytes,
    signal = r.signal,
    oom_killed = r.oom_killed,
  }
  if r.parts and r.parts.output then
    p.output = pol.format_output(r.parts.output, pol)
  else
    p.output = (sbx.model_text(r.output or ""))
  end
  return ordered(p, PHASE_KEYS)
end

-- A command the policy refused ("denied" by hooks.before_exec, over a
-- budget) or one that filled the box's disk: in the run, the task's own
-- doing (failed); in a setup or a check, an error.
local REFUSED = { denied = true, budget_exceeded = true, disk_exceeded = true }

-- Runs one command (string, argv or function) in the box: phase record, ok.
local function run_command(sbx, box, task, cmd, phase)
  local pol = box:policy()
  if type(cmd) == "function" then
    -- Under the task's timeout (sbx.deadline): a loop or a wait that never
    -- ends times the phase out. The function gets a copy of its task, and
    -- what it returns is copied into plain data before sbx reads it.
    local limit = task.timeout or pol.exec.timeout
    if pol.exec.max_timeout and limit > pol.exec.max_timeout then limit = pol.exec.max_timeout end
    local t0 = sbx.now()
    local done, v, code = sbx.deadline(limit, function()
      local out = cmd(box_view(box), taskenv.copy(task, "task"))
      local tv = type(out)
      if tv == "userdata" or tv == "thread" or tv == "function" then return true end
      return taskenv.copy(out, "the returned value")
    end)
    local dt = sbx.now() - t0
    if not done then
      if code == "timeout" then return ordered({ duration = dt, timed_out = true }, PHASE_KEYS), false end
      error(v, 0)
    end
    if type(v) == "table" and (v.exit_code ~= nil or v.timed_out ~= nil) and v.duration then
      local p = summarize(sbx, v, pol)
      p.duration = dt
      return p, v.exit_code == 0 and not v.timed_out
    end
    local p = ordered({ duration = dt, value = (type(v) ~= "table" and v ~= nil) and v or nil }, PHASE_KEYS)
    if type(p.value) == "string" and #p.value > pol.harness.value_max then p.value = p.value:sub(1, pol.harness.value_max) end
    if type(p.value) ~= "string" and type(p.value) ~= "number" and type(p.value) ~= "boolean" then p.value = nil end
    return p, v and true or false
  end
  local r, err, code = box:exec(cmd, { timeout = task.timeout, source = "harness" })
  if not r then
    if REFUSED[code] and phase == "run" then
      return ordered({ refused = code, value = tostring(err) }, PHASE_KEYS), false, code
    end
    infra((phase == "check" and "check: " or phase == "setup" and "setup: " or "") .. tostring(err), code)
  end
  return summarize(sbx, r, pol), r.exit_code == 0 and not r.timed_out
end

-- The box options a task may set (task files are data, often a stranger's):
-- names from policy.harness.task_box_options, numbers that only lower the
-- effective value, a network of "none" only (always allowed, as is a
-- read-only root). Returns nil or a message.
local NEVER_FROM_TASK = { policy = true, labels = true, backend = true, transport = true }

-- The name (policy.harness.task_host_access) of a task's box option that
-- reaches the host, or nil.
local PATH_IMAGES = { oci = true, ["docker-archive"] = true, ["oci-archive"] = true }
local function host_access(k, v)
  if k == "docker_host" or k == "host_config" or k == "layers" then return k end
  if k == "network" and v == "host" then return "network:host" end
  if k == "image" and type(v) == "string" then
    if v == "host" then return "image:host" end
    local transport = v:match("^([%w%-]+):")
    if transport == "rootfs" then return "image:rootfs" end
    if PATH_IMAGES[transport] then return "image:path" end
  end
end
local LOWER_ONLY = { memory = true, cpus = true, pids = true, disk = true, lifetime = true }

local function task_box_error(pol, base, task_box)
  local allowed = {}
  for _, n in ipairs(pol.harness.task_box_options or {}) do allowed[n] = true end
  local host_ok = {}
  for _, n in ipairs(pol.harness.task_host_access or {}) do host_ok[n] = true end
  local keys = {}
  for k in pairs(task_box) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = task_box[k]
    if NEVER_FROM_TASK[k] then
      return string.format("the task's box sets '%s', which a task file may never set", k)
    end
    local access = host_access(k, v)
    if access and not host_ok[access] then
      return string.format("the task's box sets '%s' to reach the host (%s), which a task file may do only when the harness's policy allows it by name (policy.harness.task_host_access)",
        k, access)
    end
    if access then goto next_option end
    -- Tightening is always allowed: no network, a read-only root.
    local tightens = (k == "network" and v == "none") or (k == "read_only" and v == true)
    if not allowed[k] and not tightens then
      return string.format("the task's box sets '%s', which the policy does not let a task set (policy.harness.task_box_options: %s)",
        k, table.concat(pol.harness.task_box_options or {}, ", "))
    end
    if LOWER_ONLY[k] then
      local limit = base[k]
      if type(v) ~= "number" then
        return string.format("the task's box option '%s' must be a number, not %s", k, type(v))
      end
      if type(limit) == "number" and v > limit then
        return string.format("the task's box option '%s' (%s) may only lower the policy's value (%s)", k, tostring(v), tostring(limit))
      end
    elseif k == "network" and v ~= "none" then
      return string.format("the task's box option 'network' may only be \"none\", not %q", tostring(v))
    elseif k == "read_only" and v ~= true and base.read_only == true then
      return "the task's box option 'read_only' may not turn a read-only root writable"
    end
    ::next_option::
  end
end

-- The options of a task's box: the run's (opts.box, opts.backend), then
-- what the task may set of its own. Without a task: the run's, which a
-- pool's boxes are made with.
local function box_options(sbx, opts, task)
  local spec = {}
  for k, v in pairs(opts.box or {}) do spec[k] = v end
  if opts.backend then spec.backend = opts.backend end
  if task and task.box then
    local base = sbx.merge_policy(sbx.deep_copy(sbx.policy.box), spec)
    local msg = task_box_error(sbx.policy, base, task.box)
    if msg then infra(msg, "bad_task") end
    for k, v in pairs(task.box) do spec[k] = v end
  end
  return spec
end

-- A fresh box's options also carry the task's id (label sbx.task); a box
-- taken from a pool was made before its task was known and has none.
local function labelled(spec, task)
  local out = {}
  for k, v in pairs(spec) do out[k] = v end
  local labels = {}
  for k, v in pairs(spec.labels or {}) do labels[k] = v end
  labels["sbx.task"] = tostring(task.id)
  out.labels = labels
  return out
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

-- The body of one task, in its box. Fills res; raises on infrastructure errors.
local function task_body(sbx, box, task, res, gctx)
  for _, path in ipairs(sorted_keys(task.files or {})) do
    local data = task.files[path]
    if type(data) ~= "string" then infra(string.format("files['%s'] must be a string", tostring(path)), "bad_task") end
    local ok, err, code = box:write_file(path, data, { timeout = task.timeout })
    if not ok then infra(err, code) end
  end
  local setup = task.setup
  if setup ~= nil and (type(setup) ~= "table" or (getmetatable(setup) and getmetatable(setup).__call)) then setup = { setup } end
  if setup and #setup > 0 then
    res.phases.setup = sbx.json.array {}
    for i, cmd in ipairs(setup) do
      local p, ok = run_command(sbx, box, task, cmd, "setup")
      res.phases.setup[i] = p
      if not ok then
        res.reason = string.format("setup command %d %s", i,
          p.timed_out and "timed out" or ("exited " .. tostring(p.exit_code)))
        return false
      end
    end
  end
  if task.run ~= nil then
    local p, ok, refused = run_command(sbx, box, task, task.run, "run")
    res.phases.run = p
    if refused then res.reason = "run refused by the policy (" .. refused .. "): " .. p.value; return false end
    if p.timed_out then res.reason = "run timed out"; return false end
    if task.check == nil then
      if not ok then res.reason = "run exited " .. tostring(p.exit_code) .. (p.oom_killed and " (out of memory)" or "") end
      return ok
    end
  end
  -- Where and how the check runs: grade.lua.
  gctx.res, gctx.infra = res, infra
  gctx.run_command = function(b, cmd, phase) return run_command(sbx, b, task, cmd, phase) end
  return require("sbx.grade").check(gctx, box, task)
end

local function is_interrupt(e)
  local kind = core.is_cancel(e)
  return kind == "interrupted" or kind == "cancelled"
end

-- The task's box: taken from the run's pool when its options equal the
-- pool's (pool:matches: resolved under the policy, compared deeply), else
-- made fresh. Raises infra errors.
local function task_box(sbx, opts, task, pooling)
  local spec = box_options(sbx, opts, task)
  if pooling and pooling.pool:matches(spec) then
    -- At most this many more takes come: the pool keeps no more ready.
    pooling.left = pooling.left - 1
    pooling.pool:resize(math.min(pooling.size, math.max(pooling.left, 0)))
    local b, err, code = pooling.pool:take()
    if not b then infra(err, code) end
    pooling.taken = pooling.taken + 1
    return b
  end
  if pooling then pooling.fresh = pooling.fresh + 1 end
  local bok, b, err, code = pcall(sbx.box, labelled(spec, task))
  if not bok then
    -- A bad option (a typo, a wrong type) in the task's box is the task's
    -- fault; anything else (an interrupt) goes on up.
    local msg = type(b) == "string" and b:match("sbx%.box: (.*)$")
    if not msg then error(b, 0) end
    infra(msg, "bad_task")
  end
  if not b then infra(err, code) end
  return b
end

-- Runs one task: always returns a result (nil + "interrupted" when a signal
-- stopped it before it finished). The box is always closed.
local function run_task(sbx, opts, task, t_run0, pooling)
  local res = ordered({
    id = task.id,
    started_at = os.date("!%Y-%m-%dT%H:%M:%SZ"),
    start_offset = sbx.now() - t_run0,
    phases = ordered({}, { "setup", "run", "check_setup", "check" }),
  }, RESULT_KEYS)
  local t0 = sbx.now()
  local boxes = {}
  local ok, verdict = pcall(function()
    local b = task_box(sbx, opts, task, pooling)
    boxes[1] = b
    -- grade.lua closes the run's box before a check in a fresh one
    -- (never from the pool: a check box counts as no task's).
    local gctx = { opts = opts,
      close_run_box = function() local _ = b.closed or b:close() end,
      new_box = function()
        local nb = task_box(sbx, opts, task, nil)
        boxes[#boxes + 1] = nb
        return nb
      end }
    return task_body(sbx, b, task, res, gctx)
  end)
  for _, box in ipairs(boxes) do
    -- The verdict stands, but a box that would not go away is worth saying.
    local cok, cres, cmsg = true, true, nil
    if not box.closed then cok, cres, cmsg = pcall(box.close, box) end
    if not cok or not cres then
      warn(string.format("task '%s': closing its box: %s", tostring(task.id), tostring(cok and cmsg or cres)))
    end
  end
  res.duration = sbx.now() - t0
  if ok then
    res.passed = verdict and true or false
    res.status = res.passed and "passed" or "failed"
    if res.passed then res.reason = nil end
    return res
  end
  local e = verdict
  if type(e) == "table" and e.harness_error then
    res.error, res.code = e.message, e.code
  else
    if is_interrupt(e) then return nil, "interrupted" end
    res.error = tostring(e)
  end
  res.status, res.passed, res.reason = "error", false, nil
  return res
end

-- Statistics and output ---------------------------------------------------------

local function percentile(sorted, q)
  if #sorted == 0 then return nil end
  local i = math.max(1, math.min(#sorted, math.ceil(q * #sorted)))
  return sorted[i]
end

local function fmt_time(s)
  if not s then return "-" end
  if s < 60 then return string.format("%.2fs", s) end
  return string.format("%d:%02d", math.floor(s / 60), math.floor(s % 60))
end

-- harness.error_reason(result) -> "code: message" for a result in "error"
-- (its first line, cut at policy.harness.error_chars), or nil.
function M.error_reason(r)
  if r.status ~= "error" or (r.error == nil and r.code == nil) then return nil end
  local msg = tostring(r.error or ""):match("^[^\n]*")
  local max = lib().policy.harness.error_chars
  if #msg > max then
    -- Cut before a UTF-8 continuation byte, never inside a character.
    local cut = max
    while cut > 0 and (msg:byte(cut + 1) or 0) & 0xC0 == 0x80 do cut = cut - 1 end
    msg = msg:sub(1, cut) .. "..."
  end
  if r.code and r.code ~= "" and msg:sub(1, #tostring(r.code) + 1) ~= tostring(r.code) .. ":" then
    msg = tostring(r.code) .. ": " .. msg
  end
  return msg
end

-- harness.format_summary(summary) -> text: counts, rates, times, the slowest.
function M.format_summary(s)
  local lines = {}
  local function add(...) lines[#lines + 1] = string.format(...) end
  add("%-12s %d", "tasks", s.total)
  if s.skipped > 0 then add("%-12s %d (already in %s)", "skipped", s.skipped, tostring(s.out)) end
  add("%-12s %d", "passed", s.passed)
  add("%-12s %d", "failed", s.failed)
  add("%-12s %d", "error", s.errors)
  if s.not_run > 0 then add("%-12s %d", "not run", s.not_run) end
  add("%-12s %s", "pass rate", s.pass_rate and string.format("%.1f%% (%d/%d)", 100 * s.pass_rate, s.passed, s.ran) or "-")
  if s.skipped > 0 and s.overall then
    add("%-12s %d passed, %d failed, %d error (with earlier results)", "overall",
      s.overall.passed, s.overall.failed, s.overall.errors)
  end
  if s.pool then
    add("%-12s %d: %d task(s) took a ready box, %d made their own; %d box(es) made, %d unused, %d creation failure(s)",
      "pool", s.pool.size, s.pool.taken, s.pool.fresh, s.pool.created, s.pool.retired, s.pool.failures)
  end
  add("%-12s %s", "wall time", fmt_time(s.wall_time))
  add("%-12s median %s, p90 %s", "task time", fmt_time(s.median), fmt_time(s.p90))
  if s.error_list and #s.error_list > 0 then
    add("errors:")
    for _, r in ipairs(s.error_list) do add("  %-30s %s", tostring(r.id), M.error_reason(r) or "") end
    local more = s.errors - #s.error_list
    if more > 0 then
      add("  ... and %d more%s", more, s.out and (" (every reason is in " .. tostring(s.out) .. ")") or "")
    end
  end
  if #s.slowest > 0 then
    add("slowest:")
    for _, r in ipairs(s.slowest) do
      add("  %-30s %-7s %s", tostring(r.id), r.status, fmt_time(r.duration))
    end
  end
  if s.interrupted then add("interrupted: %d task(s) did not finish; run again with the same --out to resume", s.not_run) end
  return table.concat(lines, "\n") .. "\n"
end

local function detect_progress(mode)
  if mode == nil or mode == "auto" then
    local p = io.popen("test -t 2 && echo tty")
    local out = p and p:read("a") or ""
    if p then p:close() end
    return out:match("tty") and "tty" or "plain"
  end
  if mode ~= "tty" and mode ~= "plain" and mode ~= "none" then
    error("progress must be \"auto\", \"tty\", \"plain\" or \"none\"", 3)
  end
  return mode
end

-- harness.run(opts) -> summary. See the top of this file.
function M.run(opts)
  local sbx = lib()
  local json, core = sbx.json, sbx.core
  if type(opts) ~= "table" or type(opts.tasks) ~= "table" then
    error("harness.run expects { tasks = list, ... }", 2)
  end
  local concurrency = opts.concurrency or sbx.policy.harness.concurrency
  if math.type(concurrency) ~= "integer" or concurrency < 1 then
    error("concurrency must be a positive integer", 2)
  end
  local progress = detect_progress(opts.progress)
  local err_out = opts.progress_stream or io.stderr
  local seen, tasks = {}, {}
  if opts.check_box ~= nil and opts.check_box ~= "fresh" and opts.check_box ~= "same" then
    error("check_box must be \"fresh\" or \"same\"", 2)
  end
  for i, t in ipairs(opts.tasks) do
    tasks[i] = validate(t, i, seen, json)
    require("sbx.grade").require_outputs(t, opts, sbx.policy)
  end

  -- Resume.
  local done_before, previous, pending = {}, {}, {}
  local out_file
  if opts.out then
    local by_id, list, partial = read_results(opts.out, json)
    previous = list
    done_before = by_id
    out_file = assert(io.open(opts.out, "ab"))
    if partial then out_file:write("\n") end
  end
  local skipped = 0
  for _, t in ipairs(tasks) do
    local prev = done_before[id_key(t.id)]
    if prev and (prev.status == "passed" or prev.status == "failed") then
      skipped = skipped + 1
    else
      pending[#pending + 1] = t
    end
  end

  -- A warm pool for the tasks whose box is the run's own (opts.pool, else
  -- policy.pool.size; 0: none): sized to at most those tasks, shrinking as
  -- they start, so no box is made that no task takes. A pool that cannot
  -- be made leaves every task to make its own box, and say why.
  local pooling
  local pool_size = opts.pool
  if pool_size == nil then pool_size = sbx.policy.pool.size end
  if math.type(pool_size) ~= "integer" or pool_size < 0 then error("pool must be an integer >= 0", 2) end
  if pool_size > 0 and #pending > 0 then
    local pok, pool = pcall(sbx.pool, { size = pool_size, box = box_options(sbx, opts, nil) })
    if pok and pool then
      local matching = 0
      for _, t in ipairs(pending) do
        local bok, spec = pcall(box_options, sbx, opts, t)
        if bok and pool:matches(spec) then matching = matching + 1 end
      end
      if matching > 0 then
        pool:resize(math.min(pool_size, matching))
        pooling = { pool = pool, size = pool_size, left = matching, taken = 0, fresh = 0 }
      else
        pool:close()
      end
    end
  end

  local t_run0 = sbx.now()
  local signals0 = core.signals()
  local results = {}
  local counts = { passed = 0, failed = 0, error = 0 }
  local state = { stopping = false, running = 0, unfinished = 0 }
  local total = #pending
  local line_width = 0

  local function show_progress(r)
    local done = #results
    local why = r.status == "error" and M.error_reason(r)
    if progress == "plain" then
      err_out:write(string.format("[%d/%d] %s %s %s%s\n", done, total, tostring(r.id), r.status, fmt_time(r.duration),
        why and (": " .. why) or ""))
    elseif progress == "tty" then
      -- An error's reason gets a line of its own above the live line.
      if why then err_out:write(string.format("\r%s error: %s\27[K\n", tostring(r.id), why)) end
      local elapsed = sbx.now() - t_run0
      local rate = done / math.max(elapsed, 1e-3)
      local eta = rate > 0 and (total - done) / rate or nil
      local line = string.format("[%d/%d] %d passed, %d failed, %d error  %.0f%% pass  %.2f tasks/s  ETA %s",
        done, total, counts.passed, counts.failed, counts.error,
        done > 0 and 100 * counts.passed / done or 0, rate, eta and fmt_time(eta) or "-")
      line_width = math.max(line_width, #line)
      err_out:write("\r", line, "\27[K")
    end
    err_out:flush()
  end

  local function record(r)
    results[#results + 1] = r
    counts[r.status] = counts[r.status] + 1
    if out_file then
      local ok, line = pcall(json.encode, r)
      if not ok then
        -- A value JSON cannot hold (a function's return value): keep the verdict.
        r.phases = nil
        line = json.encode(r)
      end
      out_file:write(line, "\n")
      out_file:flush()
    end
    show_progress(r)
    if opts.on_result then
      local ok, e = pcall(opts.on_result, r)
      if not ok then warn("on_result: ", tostring(e)) end
    end
  end

  local sem = sbx.semaphore(concurrency)
  local spawned = {}
  local function interrupted_now() return core.signals() > signals0 end

  local function worker(task)
    state.running = state.running + 1
    local ok, r, why = pcall(run_task, sbx, opts, task, t_run0, pooling)
    state.running = state.running - 1
    sem:release()
    if not ok then
      -- run_task itself failed (a bug or a signal in its bookkeeping).
      if is_interrupt(r) then state.stopping = true; state.unfinished = state.unfinished + 1; return end
      r = ordered({ id = task.id, status = "error", passed = false, error = tostring(r),
        phases = ordered({}, {}) }, RESULT_KEYS)
    elseif r == nil then
      state.stopping = true
      state.unfinished = state.unfinished + 1
      return why
    end
    if interrupted_now() and r.status == "error" and is_interrupt(r.error) then
      state.stopping = true
      state.unfinished = state.unfinished + 1
      return
    end
    record(r)
  end

  if progress == "tty" and total > 0 then show_progress({}) end
  for _, task in ipairs(pending) do
    if state.stopping or interrupted_now() then state.stopping = true; break end
    local ok, e = pcall(sem.acquire, sem)
    if not ok then
      if not is_interrupt(e) then error(e, 0) end
      state.stopping = true
      break
    end
    if state.stopping or interrupted_now() then sem:release(); state.stopping = true; break end
    spawned[#spawned + 1] = sbx.spawn(worker, task)
  end
  -- Wait for every started task; a signal while waiting only stops new starts.
  for _, t in ipairs(spawned) do
    while true do
      local ok, e = pcall(t.join, t)
      if ok then break end
      if not is_interrupt(e) then error(e, 0) end
      state.stopping = true
    end
    local rok, rerr = t:result()
    if rok == false then warn("a task failed: ", tostring(rerr)) end
  end
  if out_file then out_file:close() end
  if progress == "tty" and total > 0 then err_out:write("\n") end
  local pool_summary
  if pooling then
    -- The boxes no task took go now, not at exit.
    pcall(pooling.pool.close, pooling.pool)
    local st = pooling.pool:stats()
    pool_summary = { size = pooling.size, taken = pooling.taken, fresh = pooling.fresh,
      created = st.created, retired = st.retired, failures = st.failures, last_error = st.last_error }
  end

  local durations, by_time = {}, {}
  for i, r in ipairs(results) do
    durations[i] = r.duration or 0
    by_time[i] = r
  end
  table.sort(durations)
  table.sort(by_time, function(a, b) return (a.duration or 0) > (b.duration or 0) end)
  local slowest = {}
  for i = 1, math.min(sbx.policy.harness.slowest, #by_time) do slowest[i] = by_time[i] end
  local error_list = {}
  for _, r in ipairs(results) do
    if r.status == "error" and #error_list < lib().policy.harness.error_lines then error_list[#error_list + 1] = r end
  end
  local ran = #results
  local summary = {
    total = #tasks,
    pending = total,
    ran = ran,
    skipped = skipped,
    passed = counts.passed,
    failed = counts.failed,
    errors = counts.error,
    not_run = total - ran,
    interrupted = state.stopping or interrupted_now(),
    pass_rate = ran > 0 and counts.passed / ran or nil,
    wall_time = sbx.now() - t_run0,
    median = percentile(durations, 0.5),
    p90 = percentile(durations, 0.9),
    slowest = slowest,
    error_list = error_list,
    results = results,
    previous = previous,
    out = opts.out,
    pool = pool_summary,
  }
  -- Every result for the task list: this run's, then earlier ones not rerun.
  local all, have = {}, {}
  for _, r in ipairs(results) do all[#all + 1] = r; have[id_key(r.id)] = true end
  local overall = { passed = 0, failed = 0, errors = 0 }
  for _, t in ipairs(tasks) do
    local id = id_key(t.id)
    local prev = done_before[id]
    if not have[id] and prev then all[#all + 1] = prev; have[id] = true end
  end
  for _, r in ipairs(all) do
    if r.status == "passed" then overall.passed = overall.passed + 1
    elseif r.status == "failed" then overall.failed = overall.failed + 1
    else overall.errors = overall.errors + 1 end
  end
  summary.all, summary.overall = all, overall
  if progress ~= "none" then
    local so = opts.summary_stream or err_out
    so:write(M.format_summary(summary))
    so:flush()
  end
  return summary
end

-- The HTML report: sbx.report (cli.lua writes it for --report).
local report = require "sbx.report"
M.report_html, M.write_report, M.escape_html = report.html, report.write, report.escape_html

return M

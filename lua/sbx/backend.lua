-- The backend contract, written once. A backend is a module
-- sbx.backends.<name> (tests/lib/fake_backend.lua is the smallest worked
-- example; docs/architecture.md says how to add one). It owns a box's
-- lifecycle; a transport (sbx.transports) runs the box's commands through
-- the functions below. sbx.box and sbx.pool load a backend with load(),
-- which checks the module against CONTRACT and raises, naming what is
-- missing or mistyped, before any box exists.
--
-- Every function may yield (it runs in a coroutine on the loop). Contract
-- errors raise; environmental failures return nil, message, code (codes:
-- README, "The contract"). A deadline is a core.now() time; a function
-- given none uses its policy's timeout.
--
-- Every backend has the lifecycle half. A box runs its commands in one of
-- three ways, and a backend provides at least one: per-command functions
-- (start and finish, and kill where the exec transport's kill_by_exec
-- will not do: the exec transport), an agent channel
-- (agent_channel: the agent transport), or method-level answers (bind: the
-- replay backend, whose boxes answer from a recorded trace).
local M = {}

-- name, type, when it is required, what it is. "required": always;
-- "exec": start and finish, both or neither; "agent": with agent_channel;
-- "optional": never (kill only with start and finish).
M.CONTRACT = {
  { "options", "function", "required",
    "options(check) -> { name = rule }: the box options only this backend takes (sbx.policy_check rules)" },
  { "create", "function", "required",
    "create(spec, pol) -> handle | nil, message, code: handle.id names the box; handle.limits (optional) " ..
    "adds what the server said about isolation. Bounded by spec.create_timeout; a cancel or a signal " ..
    "during it leaves nothing behind" },
  { "destroy", "function", "required",
    "destroy(handle, detached, deadline) -> true | nil, message, code: removes the box and everything in " ..
    "it; idempotent; detached = true from a finalizer (must not block); past the deadline the box is " ..
    "left to reap" },
  { "reap", "function", "required",
    "reap(opts, pol) -> { removed = { id, ... }, kept = n } | nil, message, code: removes boxes of this " ..
    "backend whose owner process is gone or whose deadline passed; opts.all every box, opts.dry_run only " ..
    "reports" },
  { "restart", "function", "unless bind",
    "restart(handle, deadline) -> true | nil, message, code: every process of the box ends, its files " ..
    "stay (the last resort of a kill that cannot run); \"unsupported\" where a box cannot restart in place" },
  { "limits", "function", "optional",
    "limits(spec, pol) -> { option = { enforced = kind | false, note = text } }: how this backend " ..
    "enforces each isolation option of sbx.limits.OPTIONS for this spec (absent: it declares nothing, " ..
    "box.limits = false)" },
  { "start", "function", "exec",
    "start(handle, req) -> job | nil, message, code: one command (req as in sbx.transports); job.stream " ..
    "has the sbx.stream methods" },
  { "finish", "function", "exec",
    "finish(handle, job, deadline) -> exit_code | nil, message, code: after job.stream ended; a command " ..
    "ended by signal N is 128 + N" },
  { "kill", "function", "optional",
    "kill(handle, job, signal, deadline) -> true | nil, message, code: signal to the job's whole process " ..
    "tree; without it the exec transport runs sbx.job.kill_request as another command (sbx.job.kill_by_exec)" },
  { "text_argv", "string", "optional",
    "why an argv, env, cwd or user must be UTF-8 text on the exec transport (a JSON API)" },
  { "agent_channel", "function", "optional",
    "agent_channel(handle, { key, deadline, pol }) -> channel, mac, extra | nil, reason, code: places " ..
    "sbx-agent and opens its channel (transports/agent.lua)" },
  { "agent_attach", "function", "agent",
    "agent_attach(handle, { name, deadline, pol }) -> channel | nil, reason, code: a new channel to the " ..
    "running agent after a dropped one" },
  { "bind", "function", "optional",
    "bind(box, spec): sets the box's methods itself (no transport is chosen)" },
  { "clear", "function", "optional",
    "clear(handle, deadline) -> true | nil, message, code: ends every process of the box but its " ..
    "lifetime process (a lost agent's box, a box past its budget)" },
  { "ping", "function", "optional",
    "ping(handle) -> true | nil, message, code: does the box's server answer?" },
  { "oom_check", "function", "optional",
    "oom_check(handle, job): after a SIGKILL status, sets job.oom_killed (and job.memory_limit) when " ..
    "the box's OOM killer did it" },
  { "cpu_seconds", "function", "optional",
    "cpu_seconds(handle, deadline) -> seconds | nil: CPU time of every process the box ever ran " ..
    "(budgets)" },
  { "host_kill", "function", "optional",
    "host_kill(handle, job, deadline) -> count | nil, message, code: the job's processes killed from " ..
    "the host, for a box that cannot fork its in-box kill" },
  { "stream_error", "function", "optional",
    "stream_error(handle, info) -> message, code: what an exec stream's transport failure means" },
}

local by_name = {}
for _, c in ipairs(M.CONTRACT) do by_name[c[1]] = c end

-- check(mod, name) -> mod. Raises "backend '<name>' breaks the backend
-- contract (sbx.backend): ..." listing every problem.
function M.check(mod, name)
  local problems = {}
  local function missing(field)
    problems[#problems + 1] = string.format("it has no %s (%s)", field, by_name[field][4])
  end
  if type(mod) ~= "table" then
    error(string.format("backend '%s' breaks the backend contract (sbx.backend): its module is a %s, not a table",
      tostring(name), type(mod)), 0)
  end
  for _, c in ipairs(M.CONTRACT) do
    local field, want = c[1], c[2]
    local v = mod[field]
    if v ~= nil and type(v) ~= want then
      problems[#problems + 1] = string.format("its %s is a %s, not a %s", field, type(v), want)
    end
  end
  for _, c in ipairs(M.CONTRACT) do
    if c[3] == "required" and mod[c[1]] == nil then missing(c[1]) end
  end
  local has_exec = mod.start ~= nil or mod.finish ~= nil or mod.kill ~= nil
  if has_exec then
    for _, f in ipairs { "start", "finish" } do
      if mod[f] == nil then missing(f) end
    end
  end
  if mod.agent_attach ~= nil and mod.agent_channel == nil then missing("agent_channel") end
  if mod.bind == nil and mod.restart == nil then missing("restart") end
  if not has_exec and mod.agent_channel == nil and mod.bind == nil then
    problems[#problems + 1] = "it has no way to run a command (start and finish; agent_channel; or bind)"
  end
  if #problems > 0 then
    error(string.format("backend '%s' breaks the backend contract (sbx.backend): %s", tostring(name),
      table.concat(problems, "; ")), 0)
  end
  return mod
end

local checked = setmetatable({}, { __mode = "k" })

-- load(name) -> module. Raises for an unknown backend (with require's
-- reason) and for one that breaks the contract.
function M.load(name)
  local ok, mod = pcall(require, "sbx.backends." .. tostring(name))
  if not ok then
    error(string.format("unknown backend '%s' (%s)", tostring(name), tostring(mod)), 0)
  end
  if not checked[mod] then
    M.check(mod, name)
    checked[mod] = true
  end
  return mod
end

return M

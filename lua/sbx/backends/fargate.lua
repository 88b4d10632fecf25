-- The Fargate backend: a box is an ECS task on Fargate whose container
-- sleeps for the box's lifetime; commands run through ECS Exec, one SSM data
-- channel each (sbx.aws.ssm_session). The box contract is box.lua's.
--
-- Protocol facts (docs/aws-protocol.md 1.8): the agent execs the command
-- on a PTY without a shell and reports no exit status for ECS Exec, so
-- every command runs inside a small sh wrapper that
--   1. puts the PTY in raw mode (no CR-LF translation, no echo, no signals
--      from input bytes) and prints a ready marker with stty's status and a
--      public per-command id,
--   2. reads one line from the PTY: a secret of 128 random bits that sbx
--      sends only after the ready marker, so echo is already off,
--   3. runs the command in a subshell without the secret, after the start
--      check (transports/start_check.lua: a missing cwd or program is
--      exec_failed, its marker cut from the output), with stdin from
--      /dev/null, or from exactly N bytes of the PTY when the caller gives
--      stdin (sent after a stdin marker that says the secret line is read),
--   4. prints an exit marker with the secret and $? through the shell's
--      builtin printf.
-- The markers are cut out of the output, and so is the PTY's echo of the
-- secret line where there is one (no stty); CR-LF is normalised only when
-- stty was missing.
--
-- Why a secret read from the PTY: the exit marker is the only exit status
-- there is, so whoever can print it can report any status (in an eval
-- harness, a reward hack). Anything in an argv or an environment is
-- readable by every process in the box (/proc/*/cmdline, /proc/*/environ),
-- so the secret is in neither: not in the sh -c string, never exported,
-- never an external command's argument. It exists only in the wrapper's
-- shell variable and, on the way in, in the PTY's input queue, which the
-- wrapper drains before the command starts. Only a marker with the secret
-- counts, and only the first: markers printed later, by the command or by
-- background processes, are ignored, and those printed earlier cannot know
-- the secret.
--
-- What remains on this transport, because the command runs as the same user
-- on the same PTY as the wrapper (the in-box agent planned in the transport
-- issue, which reports exit statuses itself, closes these by construction):
--   - a process of that user can read the wrapper's memory while the command
--     runs (/proc/<pid>/mem, ptrace; a grep of the wrapper's heap finds the
--     secret where Yama's ptrace_scope is 0 or absent), and so forge a marker;
--   - a process left running by an earlier command can open the next
--     command's PTY (/proc/<wrapper>/fd/0) and race the wrapper's read for
--     the secret line (or stop the wrapper first), then print a marker
--     with it;
--   - any process can write to another command's PTY: a command's output is
--     only as trustworthy as the box (the secret protects its exit status).
-- And on any transport, root in the box (most images) can replace /bin/sh
-- or put a stty or head early in PATH, and so own the later wrappers; on
-- AWS the SSM agent itself runs in the task, where root can ptrace it.
local M = {}
-- ExecuteCommand takes the command line in JSON: UTF-8 text only.
M.text_argv = "ECS ExecuteCommand takes the command as JSON text"

local config = require "sbx.config"
local core = require "sbx.core"
local util = require "sbx.util"
local json = core.json
local owner = require "sbx.owner"
local session_mod = require "sbx.aws.ssm_session"
local start_check = require "sbx.transports.start_check"

local function pol_f() return config.policy.fargate end

-- Clients and one-time work, per process -------------------------------------------

local clients = {}              -- region/profile key -> { ecs, iam }
local once = {}                 -- key -> { done = event, ok, err, code, value }

-- Runs fn once per key even when many boxes ask at the same time. Those
-- who waited share its result, failure included; a failure is not kept, so
-- a later box tries again (and so does a waiter whose runner was cancelled).
local function run_once(key, fn)
  local o = once[key]
  if o then
    o.done:wait()
    if o.ok then return o.value end
    if o.err then return nil, o.err, o.code end
    return run_once(key, fn)
  end
  o = { done = core.event() }
  once[key] = o
  local ok, value, err, code = pcall(fn)
  if not ok then
    once[key] = nil
    o.done:set()
    error(value, 0)
  end
  if value == nil then
    o.err, o.code = err, code
    once[key] = nil
  else
    o.ok, o.value = true, value
  end
  o.done:set()
  if value == nil then return nil, err, code end
  return value
end

local function get_clients(spec)
  local aws = require "sbx.aws.client"
  local key = table.concat({ tostring(spec.region), tostring(spec.profile), tostring(spec.endpoint_url),
    -- Explicit credentials count by a hash: a client never serves other keys.
    spec.credentials and core.sigv4.sha256(tostring(spec.credentials.access_key) .. "\0" ..
      tostring(spec.credentials.secret_key) .. "\0" .. tostring(spec.credentials.session_token)) or "" }, "|")
  local c = clients[key]
  if c then return c end
  local opts = { region = spec.region, profile = spec.profile, credentials = spec.credentials, endpoint = spec.endpoint_url }
  local ecs, err, code = aws.new("ecs", opts)
  if not ecs then return nil, err, code end
  local iam, ierr, icode = aws.new("iam", opts)
  if not iam then return nil, ierr, icode end
  c = { ecs = ecs, iam = iam, key = key }
  clients[key] = c
  return c
end

-- Box options only this backend takes: every policy.fargate knob.
function M.options(check) return check.section_rules("fargate") end

-- policy.fargate of pol (the box's policy, its overlay included; default
-- the live one) with the box's options over it, key by key.
local function fspec(spec, pol)
  local base = pol and pol.fargate or pol_f()
  local f = {}
  for k, v in pairs(base) do f[k] = v end
  for k, v in pairs(spec) do if base[k] ~= nil or f[k] == nil then f[k] = v end end
  return f
end

-- Cluster and roles ---------------------------------------------------------------------

local function ensure_cluster(c, f)
  return run_once(c.key .. "|cluster|" .. f.cluster, function()
    local out, err, code = c.ecs:call("DescribeClusters", { clusters = json.array { f.cluster } })
    if not out then return nil, err, code end
    for _, cl in ipairs(out.clusters or {}) do
      if cl.status == "ACTIVE" then return cl.clusterArn end
    end
    local made, merr, mcode = c.ecs:call("CreateCluster", {
      clusterName = f.cluster,
      settings = json.array { { name = "containerInsights", value = "disabled" } },
    })
    if not made then return nil, merr, mcode end
    return made.cluster.clusterArn
  end)
end

-- A role by name: its ARN, created (with its policies) when missing.
-- Returns arn, created.
local function ensure_role(c, f, name, kind)
  return run_once(c.key .. "|role|" .. name, function()
    local got, err, code = c.iam:call("GetRole", { RoleName = name })
    if got then return { arn = got.Role.Arn, created = false } end
    if code ~= "NoSuchEntity" then return nil, err, code end
    local made, merr, mcode = c.iam:call("CreateRole", {
      RoleName = name, AssumeRolePolicyDocument = f.trust_policy,
      Description = "sbx Fargate boxes (" .. kind .. " role)",
    })
    if not made then
      -- Another process made it between our GetRole and CreateRole.
      if mcode ~= "EntityAlreadyExists" then return nil, merr, mcode end
      got, err, code = c.iam:call("GetRole", { RoleName = name })
      if not got then return nil, err, code end
      return { arn = got.Role.Arn, created = false }
    end
    local ok, perr, pcode
    if kind == "task" then
      ok, perr, pcode = c.iam:call("PutRolePolicy", { RoleName = name, PolicyName = f.exec_policy_name, PolicyDocument = f.exec_policy })
    else
      ok, perr, pcode = c.iam:call("AttachRolePolicy", { RoleName = name, PolicyArn = f.execution_policy_arn })
    end
    if not ok then return nil, perr, pcode end
    return { arn = made.Role.Arn, created = true, at = core.now() }
  end)
end

local function roles(c, f)
  local task, exec_role = { arn = f.task_role_arn }, { arn = f.execution_role_arn }
  local err, code
  if not task.arn then
    task, err, code = ensure_role(c, f, f.task_role, "task")
    if not task then return nil, "cannot ensure the task role: " .. err, code end
  end
  if not exec_role.arn then
    exec_role, err, code = ensure_role(c, f, f.execution_role, "execution")
    if not exec_role then return nil, "cannot ensure the execution role: " .. err, code end
  end
  -- A role made in the last iam_propagation seconds may not be usable yet.
  local fresh_until = 0
  for _, r in ipairs { task, exec_role } do
    if r.created then fresh_until = math.max(fresh_until, r.at + f.iam_propagation) end
  end
  return { task = task.arn, execution = exec_role.arn, fresh_until = fresh_until }
end

-- Isolation ---------------------------------------------------------------------------------
-- What an ECS task definition can hold on Fargate (ECS's task definition
-- differences for Fargate; sbx.limits has the rule for the rest): the task
-- size and a container memory limit, Linux capabilities (drop any; add only
-- SYS_PTRACE), an init process, ulimits, 20 to 200 GiB of ephemeral storage.
-- Not there: a pids limit, dockerSecurityOptions (no-new-privileges), tmpfs.
-- Not with ECS Exec, which runs every command: a read-only root (the exec
-- agent writes into the container) and a network without egress (the agent
-- reaches the SSM endpoints through the task's network interface; only the
-- VPC can narrow that: private subnets, VPC endpoints, security groups).

local MiB, GiB = 1024 * 1024, 1024 * 1024 * 1024

-- ECS task sizes are numbers of units or strings such as "2 GB", "1 vCPU".
local function task_mib(v)
  local n, unit = tostring(v):match("^%s*([%d.]+)%s*(%a*)%s*$")
  n = tonumber(n)
  if not n then return nil end
  return unit:upper() == "GB" and n * 1024 or n
end
local function task_vcpus(v)
  local n, unit = tostring(v):match("^%s*([%d.]+)%s*(%a*)%s*$")
  n = tonumber(n)
  if not n then return nil end
  return unit:upper() == "VCPU" and n or n / 1024
end

local function cap_name(c) return (tostring(c):upper():gsub("^CAP_", "")) end

-- The container memory limit (MiB) for spec, when below the task size.
local function container_mib(f)
  if not f.memory then return nil end
  local mib, task = math.floor(f.memory / MiB), task_mib(f.task_memory)
  if task and mib < task then return mib end
end

-- The ephemeral storage (GiB) for spec, when above Fargate's 20 GiB default.
local function storage_gib(f)
  if not f.disk or f.disk < 21 * GiB then return nil end
  return math.min(200, math.floor(f.disk / GiB))
end

local NETWORK_NOTE = "the ECS Exec agent that runs every command needs egress to the SSM endpoints, so the task " ..
  "has the network its subnets, security groups and assign_public_ip give it; narrow it in the VPC " ..
  "(private subnets with VPC endpoints, a security group that allows only those)"

-- limits(spec, pol): what a Fargate task enforces for spec (sbx.limits).
function M.limits(spec, pol)
  local f = fspec(spec, pol)
  local out = {}
  local mem, vcpus = task_mib(f.task_memory), task_vcpus(f.task_cpu)
  if f.memory then
    local mib = container_mib(f)
    if mib and mib < 6 then
      out.memory = { enforced = false, note = "ECS's smallest container memory limit is 6 MiB" }
    elseif mib then
      out.memory = { enforced = "platform", note = string.format("a %d MiB container limit in a %s MiB task", mib, tostring(mem)) }
    else
      out.memory = { enforced = "platform", note = string.format("the task size caps it lower or equal: %s MiB (policy.fargate.task_memory)", tostring(mem)) }
    end
  end
  if f.cpus then
    if vcpus and f.cpus >= vcpus then
      out.cpus = { enforced = "platform", note = string.format("the task size caps it at %g vCPU (policy.fargate.task_cpu)", vcpus) }
    else
      out.cpus = { enforced = false, note = string.format("Fargate caps CPU only by the task size, %s vCPU here: set policy.fargate.task_cpu = %d " ..
        "(with a matching task_memory) for %g CPUs", tostring(vcpus), math.floor(f.cpus * 1024 + 0.5), f.cpus) }
    end
  end
  out.pids = { enforced = false, note = "ECS has no pids limit for Fargate tasks; a fork bomb is bounded by the task's memory" }
  if f.disk then
    local gib = storage_gib(f)
    if f.disk >= 20 * GiB then
      out.disk = { enforced = "platform", note = string.format("%d GiB of ephemeral storage for the task (the image counts too)", gib or 20) }
    else
      out.disk = { enforced = false, note = "Fargate's smallest ephemeral storage is 20 GiB, the task's own: " ..
        "a box cannot fill a disk other boxes use, but nothing stops it below 20 GiB" }
    end
  end
  if f.network == "none" then
    out.network = { enforced = false, note = NETWORK_NOTE }
  elseif f.network == "bridge" then
    out.network = { enforced = "platform", note = "the task's awsvpc network: what its subnets and security groups allow" }
  else
    out.network = { enforced = false, note = string.format("Fargate tasks use awsvpc networking; there is no Docker network %q", tostring(f.network)) }
  end
  out.read_only = { enforced = false, note = "ECS Exec's agent writes into the container: with a read-only root no command could run" }
  out.cap_drop = { enforced = "platform", note = "linuxParameters.capabilities.drop" }
  local others = {}
  for _, c in ipairs(f.cap_add or {}) do
    if cap_name(c) ~= "SYS_PTRACE" then others[#others + 1] = cap_name(c) end
  end
  out.cap_add = #others == 0 and { enforced = "platform", note = "linuxParameters.capabilities.add (Fargate: SYS_PTRACE only)" }
    or { enforced = false, note = "Fargate adds no capability but SYS_PTRACE, not " .. table.concat(others, ", ") }
  out.no_new_privileges = { enforced = false, note = "dockerSecurityOptions (no-new-privileges) is not valid on Fargate" }
  out.init = { enforced = "platform", note = "linuxParameters.initProcessEnabled" }
  out.ulimits = { enforced = "platform", note = "ulimits in the container definition (Fargate sets nofile to 65535 unless given)" }
  out.tmpfs = { enforced = false, note = "linuxParameters.tmpfs is not supported on Fargate" }
  return out
end

-- Task definitions, shared by content -------------------------------------------------------

local taskdef_users = {}        -- arn -> boxes of this process using it

-- The container's isolation settings, from the box spec (see M.limits).
local function isolation(c, f)
  local lp = { initProcessEnabled = f.init and true or false }
  local drop, add = {}, {}
  for _, x in ipairs(f.cap_drop or {}) do drop[#drop + 1] = cap_name(x) end
  for _, x in ipairs(f.cap_add or {}) do add[#add + 1] = cap_name(x) end
  if #drop > 0 or #add > 0 then
    lp.capabilities = {}
    if #drop > 0 then lp.capabilities.drop = json.array(drop) end
    if #add > 0 then lp.capabilities.add = json.array(add) end
  end
  c.linuxParameters = lp
  c.memory = container_mib(f)
  if f.ulimits and next(f.ulimits) then
    local l = {}
    for name, v in pairs(f.ulimits) do
      l[#l + 1] = { name = name, softLimit = math.floor(v), hardLimit = math.floor(v) }
    end
    table.sort(l, function(a, b) return a.name < b.name end)
    c.ulimits = json.array(l)
  end
end

local function taskdef_body(f, r)
  local body = {
    family = "",
    networkMode = "awsvpc",
    requiresCompatibilities = json.array { "FARGATE" },
    cpu = tostring(f.task_cpu), memory = tostring(f.task_memory),
    taskRoleArn = r.task, executionRoleArn = r.execution,
    containerDefinitions = json.array { {
      name = f.container, image = f.image, essential = true,
      -- The lifetime comes per box as a command override.
      entryPoint = json.array { "sleep" }, command = json.array { "86400" },
      workingDirectory = f.workdir,
      environment = json.array((function()
        local l = {}
        for k, v in pairs(f.env or {}) do l[#l + 1] = { name = tostring(k), value = tostring(v) } end
        table.sort(l, function(a, b) return a.name < b.name end)
        return l
      end)()),
    } },
  }
  isolation(body.containerDefinitions[1], f)
  local gib = storage_gib(f)
  if gib then body.ephemeralStorage = { sizeInGiB = gib } end
  local hash = core.sigv4.sha256(json.encode(body))
  body.family = f.family_prefix .. hash:sub(1, 20)
  return body
end

local function ensure_taskdef(c, f, r)
  local body = taskdef_body(f, r)
  return run_once(c.key .. "|taskdef|" .. body.family, function()
    local got = c.ecs:call("DescribeTaskDefinition", { taskDefinition = body.family })
    if got and got.taskDefinition and got.taskDefinition.status == "ACTIVE" then
      return got.taskDefinition.taskDefinitionArn
    end
    local made, err, code = c.ecs:call("RegisterTaskDefinition", body)
    if not made then return nil, "cannot register the task definition: " .. err, code end
    return made.taskDefinition.taskDefinitionArn
  end)
end

local function forget_taskdef(c, f, r)
  once[c.key .. "|taskdef|" .. taskdef_body(f, r).family] = nil
end

-- Waiting for tasks: one DescribeTasks per cluster and poll for every waiting box ------

local pollers = {}              -- client key|cluster -> { waiting = { arn -> entry } }

local function agent_running(t)
  for _, ct in ipairs(t.containers or {}) do
    for _, a in ipairs(ct.managedAgents or {}) do
      if a.name == "ExecuteCommandAgent" and a.lastStatus == "RUNNING" then return true end
    end
  end
  return false
end

local function poll(c, f, key)
  local p = pollers[key]
  while next(p.waiting) do
    core.sleep(f.poll_interval)
    local arns = {}
    for arn in pairs(p.waiting) do arns[#arns + 1] = arn end
    for i = 1, #arns, 100 do
      local batch = table.move(arns, i, math.min(i + 99, #arns), 1, {})
      local out, err, code = c.ecs:call("DescribeTasks", { cluster = f.cluster, tasks = json.array(batch) })
      if not out then
        for _, arn in ipairs(batch) do
          if p.waiting[arn] then p.waiting[arn].last_error = { err, code } end
        end
      end
      for _, t in ipairs(out and out.tasks or {}) do
        local w = p.waiting[t.taskArn]
        if w then
          w.task = t
          if t.lastStatus == "STOPPED" then
            w.result = { nil, "the task stopped before it ran: " .. tostring(t.stoppedReason or t.stopCode), "task_stopped" }
          elseif t.lastStatus == "RUNNING" and agent_running(t) then
            w.result = { t }
          end
          if w.result then
            p.waiting[t.taskArn] = nil
            w.done:set()
          end
        end
      end
    end
  end
  pollers[key] = nil
end

local function wait_running(c, f, arn)
  local key = c.key .. "|" .. f.cluster
  local p = pollers[key]
  local w = { done = core.event() }
  if not p then
    p = { waiting = {} }
    pollers[key] = p
    p.waiting[arn] = w
    core.spawn(poll, c, f, key)
  else
    p.waiting[arn] = w
  end
  if not w.done:wait(f.start_timeout) then
    p.waiting[arn] = nil
    local t = w.task
    if t and t.lastStatus == "RUNNING" then
      return nil, string.format("the task runs but its ExecuteCommandAgent did not connect within %gs " ..
        "(the task role needs the ssmmessages permissions and a network path to the SSM endpoints)", f.start_timeout),
        "agent_not_connected"
    end
    local last = w.last_error and (": last DescribeTasks error: " .. tostring(w.last_error[1])) or ""
    return nil, string.format("the task did not reach RUNNING within %gs (last status %s)%s", f.start_timeout,
      t and t.lastStatus or "unknown", last), "timeout"
  end
  return table.unpack(w.result, 1, 3)
end

-- Lifecycle ---------------------------------------------------------------------------------

local function tags(f)
  local t = owner.labels(f.lifetime, f.labels)
  local l = {}
  for k, v in pairs(t) do l[#l + 1] = { key = k, value = v } end
  table.sort(l, function(a, b) return a.key < b.key end)
  return json.array(l)
end

local function list_of(v)
  if v == nil then return nil end
  if type(v) == "string" then return json.array { v } end
  return json.array(v)
end

local function task_id(arn) return arn:match("([^/]+)$") end

local function stop_task(c, f, arn)
  return c.ecs:call("StopTask", { cluster = f.cluster, task = arn, reason = f.stop_reason })
end

-- create(spec, policy) -> handle | nil, message, code
function M.create(spec, pol)
  local f = fspec(spec, pol)
  if not f.subnets or #f.subnets == 0 then
    return nil, "a Fargate box needs subnets (sbx.box{ backend = \"fargate\", subnets = { \"subnet-...\" } } or policy.fargate.subnets)", "invalid_spec"
  end
  local c, err, code = get_clients(f)
  if not c then return nil, err, code end
  local cluster_arn
  cluster_arn, err, code = ensure_cluster(c, f)
  if not cluster_arn then return nil, "cannot ensure the ECS cluster '" .. f.cluster .. "': " .. err, code end
  local r
  r, err, code = roles(c, f)
  if not r then return nil, err, code end
  local td
  td, err, code = ensure_taskdef(c, f, r)
  if not td then return nil, err, code end

  local run = {
    cluster = f.cluster, taskDefinition = td, launchType = "FARGATE", count = 1,
    enableExecuteCommand = true, startedBy = f.started_by,
    networkConfiguration = { awsvpcConfiguration = {
      subnets = list_of(f.subnets), securityGroups = list_of(f.security_groups or {}),
      assignPublicIp = f.assign_public_ip,
    } },
    overrides = { containerOverrides = json.array { {
      name = f.container, command = json.array { tostring(math.floor(f.lifetime)) },
    } } },
    tags = tags(f),
  }
  local task
  local retried_taskdef = false
  while true do
    local out, rerr, rcode = c.ecs:call("RunTask", run)
    if out and out.tasks and out.tasks[1] then task = out.tasks[1]; break end
    if out then
      local fl = out.failures and out.failures[1] or {}
      return nil, "RunTask failed: " .. tostring(fl.reason) .. (fl.detail and (" (" .. fl.detail .. ")") or ""), "run_failed"
    end
    if rcode == "ClientException" and tostring(rerr):find("nactive") and not retried_taskdef then
      -- Another process deregistered the shared definition: register again.
      retried_taskdef = true
      forget_taskdef(c, f, r)
      td, err, code = ensure_taskdef(c, f, r)
      if not td then return nil, err, code end
      run.taskDefinition = td
    elseif (rcode == "ClientException" or rcode == "InvalidParameterException") and core.now() < r.fresh_until
        and tostring(rerr):lower():find("role") then
      core.sleep(f.iam_retry_interval)   -- a new role is still propagating through IAM
    else
      return nil, "cannot start the Fargate task: " .. tostring(rerr), rcode
    end
  end
  taskdef_users[td] = (taskdef_users[td] or 0) + 1
  local h = {
    id = task_id(task.taskArn), arn = task.taskArn, cluster = f.cluster, container = f.container,
    clients = c, f = f, taskdef = td, sessions = {},
  }
  local ok, running, werr, wcode = pcall(wait_running, c, f, task.taskArn)
  if not ok then
    -- Interrupted or cancelled: the task exists, so stop it before going on.
    pcall(M.destroy, h)
    error(running, 0)
  end
  if not running then
    M.destroy(h)
    return nil, werr, wcode
  end
  return h
end

-- destroy(handle, detached): stops the task (no waiting for it to drain) and
-- deregisters the task definition when this was its last box here.
function M.destroy(h, detached)
  if h.destroyed then return true end
  h.destroyed = true
  for s in pairs(h.sessions) do s:close() end
  local c, f = h.clients, h.f
  local function go()
    local out, err, code = stop_task(c, f, h.arn)
    local n = (taskdef_users[h.taskdef] or 1) - 1
    taskdef_users[h.taskdef] = n > 0 and n or nil
    if n <= 0 and f.deregister_task_definitions then
      for k in pairs(once) do
        if k:find("|taskdef|", 1, true) and once[k].value == h.taskdef then once[k] = nil end
      end
      c.ecs:call("DeregisterTaskDefinition", { taskDefinition = h.taskdef })
    end
    if not out and code ~= "InvalidParameterException" then return nil, err, code end
    return true
  end
  if detached then core.spawn(go) return true end
  return go()
end

-- Commands ------------------------------------------------------------------------------------

local shq = util.shell_quote

-- The exit marker's secret: 128 bits from the CSPRNG, never shown to the
-- command (see the top of this file).
local function new_secret()
  return core.random.hex(16)
end

-- The wrapper's sh -c string; id is the public per-command id of the ready
-- marker. The secret is not in it (see the top of this file).
local function wrapper(req, id, check_id)
  local parts = {
    -- No allexport (bash takes it from SHELLOPTS), and no sbx_secret
    -- imported from the environment: read must make a plain shell variable.
    "set +a; unset sbx_secret",
    "stty raw -echo 2>/dev/null; s=$?; printf '__SBX_%s_R%d__' " .. id .. " \"$s\"",
    -- The command runs only once the secret is in.
    "IFS= read -r sbx_secret || exit 125",
  }
  if req.stdin then
    -- bash's read takes all the PTY has (it cannot seek back on a PTY), so
    -- stdin is sent only once the secret line is read: after this marker.
    parts[#parts + 1] = "printf '__SBX_%s_S__' " .. id
  end
  local inner = { "unset sbx_secret" }
  local setup = {}
  if not req.cwd and req.workdir then
    -- The box's directory, as Docker boxes start there; never fatal.
    setup[#setup + 1] = "{ cd " .. shq(req.workdir) .. " 2>/dev/null || true; }"
  end
  local exports = {}
  for _, kv in ipairs(req.env or {}) do
    local k, v = kv:match("^([%a_][%w_]*)=(.*)$")
    if k then exports[#exports + 1] = k .. "=" .. shq(v) end
  end
  if #exports > 0 then setup[#setup + 1] = "export " .. table.concat(exports, " ") end
  -- The start check (transports/start_check.lua): a missing cwd or program
  -- is exec_failed, not an exit status the command could have chosen.
  for _, l in ipairs(start_check.lines(req, check_id or id, setup)) do inner[#inner + 1] = l end
  local argv = {}
  for i, a in ipairs(req.argv) do argv[i] = shq(a) end
  local cmd = table.concat(argv, " ")
  if req.stdin then
    cmd = "head -c " .. #req.stdin .. " | " .. cmd
  else
    cmd = cmd .. " </dev/null"
  end
  inner[#inner + 1] = cmd
  -- A subshell without the secret: an argv that names a builtin (set, eval)
  -- runs in it and finds nothing; the environment given by the caller cannot
  -- overwrite the secret either.
  -- The wrapper's own stderr goes nowhere while the command runs, so the
  -- shell's job report ("Killed" when a timeout killed the command) is not
  -- mistaken for the command's output; the subshell keeps the PTY (fd 3).
  table.insert(inner, 1, "exec 2>&3 3>&-")
  parts[#parts + 1] = "exec 3>&2 2>/dev/null; ( " .. table.concat(inner, "; ") .. " ); s=$?; exec 2>&3 3>&-"
  -- printf must be the shell's builtin (dash, bash, busybox ash): an empty
  -- PATH makes a shell without one fail here instead of putting the secret
  -- in an external printf's argv.
  parts[#parts + 1] = "PATH=/dev/null printf '__SBX_%s_E%d__' \"$sbx_secret\" \"$s\""
  -- The agent splits the command like a POSIX shell and execs it directly.
  return "/bin/sh -c " .. shq(table.concat(parts, "; "))
end
M.wrapper = wrapper

-- Cuts the markers out of the output: the ready marker and the stdin
-- marker (public id), the exit marker (secret), and the PTY's echo of the
-- secret line where the PTY still echoed (no stty). Holds back only the
-- bytes that could still be the start of one of them. Only a marker with
-- the secret counts, and only the first: nothing after it is output.
-- on_stdin, when given, fires at the stdin marker.
local function marker_filter(id, secret, emit, on_ready, on_stdin)
  local ready_pat = "__SBX_" .. id .. "_R(%d+)__"
  local ready_fixed = "__SBX_" .. id .. "_R"
  local stdin_marker = on_stdin and "__SBX_" .. id .. "_S__"
  local exit_fixed = "__SBX_" .. secret .. "_E"
  local exit_pat = "__SBX_" .. secret .. "_E(%d+)__"
  local echo_line = secret .. "\r\n"
  local buf, state, crlf, held_cr = "", "pre", false, false
  local echo_cut = false
  local fl = {}

  local function out(x)
    if x == "" then return end
    if crlf then
      if held_cr then x = "\r" .. x; held_cr = false end
      if x:sub(-1) == "\r" then x = x:sub(1, -2); held_cr = true end
      x = x:gsub("\r\n", "\n")
    end
    if x ~= "" then emit(x) end
  end

  -- Length of the longest suffix of buf that may begin a marker.
  local function partial(fixed)
    local n = #buf
    for k = math.min(n, #fixed + 12), 1, -1 do
      local suf = buf:sub(n - k + 1)
      if k <= #fixed then
        if fixed:sub(1, k) == suf then return k end
      elseif suf:sub(1, #fixed) == fixed and suf:sub(#fixed + 1):match("^%d*_?$") then
        return k
      end
    end
    return 0
  end

  -- Length of the longest suffix of buf that may begin the echoed line.
  local function partial_echo()
    local n = #buf
    for k = math.min(n, #echo_line - 1), 1, -1 do
      if buf:sub(n - k + 1) == echo_line:sub(1, k) then return k end
    end
    return 0
  end

  function fl.feed(bytes)
    if state == "done" then return end
    buf = buf .. bytes
    if state == "pre" then
      local i, j, st = buf:find(ready_pat)
      if not i then
        local keep = partial(ready_fixed)
        out(buf:sub(1, #buf - keep))
        buf = buf:sub(#buf - keep + 1)
        return
      end
      out(buf:sub(1, i - 1))
      buf = buf:sub(j + 1)
      state = "body"
      crlf = st ~= "0"
      on_ready(crlf)
    end
    if stdin_marker then
      local si, sj = buf:find(stdin_marker, 1, true)
      if si then
        buf = buf:sub(1, si - 1) .. buf:sub(sj + 1)
        stdin_marker = nil
        on_stdin()
      end
    end
    local i, _, code = buf:find(exit_pat)
    if not echo_cut then
      -- The echo comes before the command's output (the wrapper reads the
      -- line first), but a process writing to this PTY could put bytes in
      -- front of it; so it is looked for anywhere before the exit marker.
      local ei, ej = buf:find(secret, 1, true)
      if ei and (not i or ei < i) then
        local after = buf:sub(ej + 1, ej + 2)
        local len = (after == "\r\n" and 2) or (after:sub(1, 1) == "\n" and 1) or nil
        if len then
          buf = buf:sub(1, ei - 1) .. buf:sub(ej + len + 1)
          echo_cut = true
          i, _, code = buf:find(exit_pat)
        end
      end
    end
    if i then
      out(buf:sub(1, i - 1))
      fl.exit_code = tonumber(code)
      buf, state = "", "done"
      return
    end
    local keep = partial(exit_fixed)
    if stdin_marker then keep = math.max(keep, partial(stdin_marker)) end
    if not echo_cut then keep = math.max(keep, partial_echo()) end
    out(buf:sub(1, #buf - keep))
    buf = buf:sub(#buf - keep + 1)
  end

  function fl.flush()
    if state ~= "done" then out(buf) end
    if held_cr then held_cr = false; emit("\r") end
    buf, state = "", "done"
  end
  return fl
end
M.marker_filter = marker_filter

-- ExecuteCommand, retried while the agent is not connected yet.
local function execute(h, command)
  local c, f = h.clients, h.f
  local deadline = core.now() + f.exec_connect_timeout
  local delay = f.exec_connect_backoff.base
  while true do
    local out, err, code = c.ecs:call("ExecuteCommand", {
      cluster = h.cluster, task = h.arn, container = h.container, command = command, interactive = true,
    })
    if out then return out end
    if code ~= "TargetNotConnectedException" or core.now() + delay > deadline then
      return nil, "ExecuteCommand failed: " .. tostring(err), code
    end
    core.sleep(delay)
    delay = math.min(delay * 2, f.exec_connect_backoff.max)
  end
end

-- start(handle, req) -> job | nil, message, code
function M.start(h, req)
  if req.user then
    return nil, "ECS Exec runs every command as root whatever the image's USER (the SSM agent runs as root in the "
      .. "container and starts sessions as itself); a per-command user needs the agent transport on Fargate", "unsupported"
  end
  local id = require("sbx.job").random_id()
  local secret, serr0 = new_secret()
  if not secret then return nil, serr0, "no_random" end
  if not req.cwd and h.f.workdir then
    local r2 = {}
    for k, v in pairs(req) do r2[k] = v end
    r2.workdir = h.f.workdir
    req = r2
  end
  local check_id = require("sbx.job").random_id()
  local out, err, code = execute(h, wrapper(req, id, check_id))
  if not out then return nil, err, code end
  local pol = h.f.ssm
  local sink = core.stream.sink { capture = req.capture, chunks = req.chunks, chunk_limit = req.chunk_limit }
  -- The timeout counts from the ready marker (run_request in box.lua):
  -- start_timeout bounds the wait for it, ready_at is when it came.
  local job = { stream = sink, marker = req.marker, session_id = out.session and out.session.sessionId,
    start_timeout = h.f.command_start_timeout, ready_poll = h.f.ready_poll }
  local s
  local secret_sent = core.event()
  local check = start_check.filter(check_id, function(bytes) sink:push("stdout", bytes) end)
  -- Output before the ready marker (a login banner) is not the command's
  -- stdout start, where the start check's marker is looked for.
  local ready = false
  local filter = marker_filter(id, secret, function(bytes)
    if ready then check.feed(bytes) else sink:push("stdout", bytes) end
  end, function()
    ready = true
    job.ready_at = job.ready_at or core.now()
    -- Echo is off now (where stty exists).
    core.spawn(function()
      s:send(secret .. "\n")
      secret_sent:set()
    end)
  end, req.stdin and function()
    -- Never ahead of the secret line, even when the marker was forged.
    if #req.stdin > 0 then core.spawn(function() secret_sent:wait() s:send(req.stdin) end) end
  end)
  local limit = req.chunk_limit or 1 << 20
  local serr, scode
  s, serr, scode = session_mod.open {
    url = out.session.streamUrl, token = out.session.tokenValue, pol = pol,
    on_output = function(bytes)
      filter.feed(bytes)
      -- The SSM agent ends a session when the last holder of its PTY closes
      -- it, not when the command exits (docs/aws-protocol.md 1.9): a
      -- process left in the background would hold the result. The exit
      -- marker is the end: nothing after it is output.
      if filter.exit_code and not job.ended_at_marker then
        job.ended_at_marker = true
        core.spawn(function() s:close() end)
      end
    end,
    room = req.chunks and function(timeout)
      return sink:wait_room(limit, timeout) ~= "timeout"
    end or nil,
  }
  if not s then return nil, serr, scode end
  job.session = s
  -- a helper past its deadline (sbx.job.run_helper) ends its session
  job.abandon = function() sink:close() s:close() end
  h.sessions[s] = true
  core.spawn(function()
    local r = s:wait()
    h.sessions[s] = nil
    filter.flush()
    check.flush()
    job.exit_code = filter.exit_code
    if check.failed then
      job.exit_code = nil
      sink:finish("exec_failed", start_check.message(check.failed, req, config.policy))
    elseif r.reason == "closed" then
      if r.exit_code and not job.exit_code then job.exit_code = r.exit_code end
      sink:finish()
    elseif r.reason == "cancelled" then
      sink:finish()
    else
      -- The channel is gone but the command may still run: kill it there.
      if r.reason == "disconnected" and not h.destroyed and job.exit_code == nil and not req.is_kill then
        local kok, kerr
        for attempt = 1, h.f.drop_kill_attempts do
          kok, kerr = require("sbx.job").kill_by_exec(M, h, job, "KILL", core.now() + h.f.ssm.connect_timeout)
          if kok or h.destroyed then break end
          if attempt < h.f.drop_kill_attempts then core.sleep(h.f.drop_kill_delay) end
        end
        if kok then r.message = r.message .. "; the command was killed"
        else r.message = r.message .. "; killing the command failed: " .. tostring(kerr) end
      end
      sink:finish(r.code or r.reason, r.message)
    end
  end)
  return job
end

-- The agent's channel ----------------------------------------------------------------

-- One ECS Exec session whose PTY becomes a channel: a small sh script turns
-- echo and line editing off (stty raw), says the task's architecture, reads
-- a length line and exactly that many bytes (a fresh sbx-agent, into a new
-- private directory: a copy left in the task is never trusted) and execs it
-- with args. Where the image has no stty the PTY stays cooked while the
-- agent is uploaded, so the upload is text: lines of octal escapes
-- (\ooo, three digits each) that the shell's printf turns back into bytes,
-- ended by a "." line; the PTY echoes them (cut with the rest of the
-- loader's output), and the agent, started with --say-raw, makes the PTY
-- raw itself and says so before the host sends anything else.
-- -> channel | nil, reason, code
local AGENT_READY = "__SBXAGENT_"
local TEXT_LINE_BYTES = 240            -- bytes per text line: 961 characters, far below a cooked PTY's 4095
local OCTAL = {}
for i = 0, 255 do OCTAL[string.char(i)] = string.format("\\%03o", i) end
local function text_upload(bin)
  local lines = {}
  for i = 1, #bin, TEXT_LINE_BYTES do
    lines[#lines + 1] = bin:sub(i, i + TEXT_LINE_BYTES - 1):gsub(".", OCTAL)
  end
  lines[#lines + 1] = "."
  return table.concat(lines, "\n") .. "\n"
end

local function run_agent(h, opts, args)
  -- The relay escapes what the agent sends: the SSM agent turns every
  -- EF BF BD of the output into a lone EF (docs/aws-protocol.md 1.9).
  local argstr = " " .. core.agent.escape_arg .. (#args > 0 and (" " .. table.concat(args, " ")) or "")
  local unescape = core.agent.pty_decoder()
  local script = 'if stty raw -echo 2>/dev/null; then t=; else t=text_; fi; ' ..
    'printf "' .. AGENT_READY .. '%s%s__\\n" "$t" "$(uname -m)"; IFS= read -r n || exit 125; umask 077; ' ..
    'd=$(mktemp -d 2>/dev/null) || exit 125; ' ..
    'if [ -z "$t" ]; then head -c "$n" > "$d/a"; ' ..
    'else while IFS= read -r l && [ "$l" != . ]; do printf "$l"; done > "$d/a"; fi && chmod 700 "$d/a" && ' ..
    'printf "' .. AGENT_READY .. 'go__\\n" && if [ -z "$t" ]; then exec "$d/a"' .. argstr ..
    '; else exec "$d/a" ' .. core.agent.say_raw .. argstr .. '; fi'
  local out, err, code = execute(h, "sh -c " .. shq(script))
  if not out then return nil, err, code end
  local sink = core.stream.sink { chunks = true, chunk_limit = opts.pol.agent.channel_buffer,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 0, tail = 0 }, output = { head = 4096, tail = 0 } } }
  local ready, go, said = core.event(), core.event(), ""
  local placed, seen, text = false, "", false
  -- The loader's lines end in CR-LF while the PTY is cooked (no stty).
  local GO = { AGENT_READY .. "go__\n", AGENT_READY .. "go__\r\n" }
  local s, serr, scode = session_mod.open {
    url = out.session.streamUrl, token = out.session.tokenValue, pol = h.f.ssm,
    on_output = function(bytes)
      if placed then
        local clear, why = unescape:decode(bytes)
        if clear then sink:push("stdout", clear)
        elseif not sink:info().eof then sink:finish("bad_frame", why) end
        return
      end
      if #seen < 512 then seen = seen .. bytes:sub(1, 512 - #seen) end
      -- Only the tail matters while looking for a marker (the echo of a
      -- text upload is hundreds of kilobytes).
      said = (said .. bytes)
      if not ready:is_set() and said:find(AGENT_READY .. "[%w_]+__\r?\n") then ready:set() end
      local stop
      if text then
        local _, e = said:find(core.agent.raw_line, 1, true)
        stop = e
      else
        for _, m in ipairs(GO) do
          local _, e = said:find(m, 1, true)
          if e then stop = e break end
        end
      end
      if stop then
        -- The loader is done (and, with a text upload, the agent has made
        -- the PTY raw): what follows is the agent's.
        placed = true
        local rest = said:sub(stop + 1)
        if #rest > 0 then
          local clear, why = unescape:decode(rest)
          if clear then sink:push("stdout", clear)
          else sink:finish("bad_frame", why) end
        end
        go:set()
        return
      end
      if #said > 65536 then said = said:sub(-256) end
      if not ready:is_set() and #seen >= 512 then ready:set() go:set() end
    end,
    room = function(timeout)
      return sink:wait_room(opts.pol.agent.channel_buffer, timeout) ~= "timeout"
    end,
  }
  if not s then return nil, serr, scode end
  -- The channel lives as long as the box: `sbx run` ends when its script
  -- does, and closes the box after (the session's tasks do not hold it).
  s:unref()
  h.sessions[s] = true
  core.spawn(function()
    local r = s:wait()
    h.sessions[s] = nil
    if r.reason == "closed" or r.reason == "cancelled" then sink:finish()
    else sink:finish(r.code or r.reason, r.message) end
  end):unref()
  ready:wait(math.max(0.001, opts.deadline - core.now()))
  local arch = said:match(AGENT_READY .. "([%w_]+)__\r?\n")
  local function fail(msg, c) s:close() return nil, msg, c or "agent_unavailable" end
  if not arch then return fail("the agent's loader did not start: " .. seen:sub(1, 200)) end
  if arch:match("^text_") then text, arch = true, arch:sub(6) end
  local bin = core.agent.binary(arch)
  if not bin then return fail("this build of sbx carries no agent for " .. arch, "unsupported") end

  -- Writes go out in order through one sender (a send may wait for the
  -- session's window): the agent's length and bytes first.
  local upload = text and text_upload(bin) or bin
  local queue, queued, wake = { #bin .. "\n" .. upload }, #upload, core.event()
  local sender = core.spawn(function()
    while not sink:info().eof do
      local bytes = table.remove(queue, 1)
      if bytes then
        queued = queued - #bytes
        if not s:send(bytes) then break end
      else
        wake:clear()
        wake:wait()
      end
    end
  end)
  sender:unref()
  -- Nothing more goes in until the loader has read exactly the agent's
  -- bytes (busybox head reads ahead through stdio and would eat the key).
  go:wait(math.max(0.001, opts.deadline - core.now()))
  if not placed then return fail("the agent's loader did not finish: " .. said:sub(-200)) end
  return require("sbx.channel").over_sink(sink, {
    ended = "the session ended",
    write = function(bytes)
      queue[#queue + 1] = bytes
      queued = queued + #bytes
      wake:set()
      return queued
    end,
    close = function()
      s:close()
      wake:set()       -- the sender sees the end and goes
    end,
  })
end

-- agent_channel(handle, { key, deadline, pol }) -> channel, true, extra |
-- nil, reason, code. The agent keeps the PTY raw. Other processes of the
-- task's user could write into a PTY, so every frame is authenticated (mac
-- = true). Without stty the agent makes the PTY raw itself. When a
-- session ends, the SSM agent kills the process it started and closes the
-- PTY (amazon-ssm-agent, agent/session/shell: execCmd.Kill, then the pty
-- file closed; docs/aws-protocol.md 1.9): so the agent runs beside that process
-- (relay = true) and outlives a dropped session.
function M.agent_channel(h, opts)
  local ch, err, code = run_agent(h, opts, {})
  if not ch then return nil, err, code end
  return ch, true, { relay = true }
end

-- agent_attach(handle, { name, deadline, pol }) -> channel | nil, reason,
-- code: a new session whose freshly placed agent relays to the running one.
function M.agent_attach(h, opts)
  if not tostring(opts.name):match("^[%w%-]+$") then error("agent_attach: a bad socket name", 2) end
  return run_agent(h, opts, { "attach", opts.name })
end

-- finish(handle, job) -> exit_code | nil, message, code
function M.finish(_, job)
  if job.exit_code then return job.exit_code end
  return nil, "the command ended without reporting its exit status (killed, or the shell wrapper could not run)", "no_exit_code"
end

-- clear(handle, deadline) -> true | nil, message, code: ends every process
-- of the task's container but its lifetime process and ECS Exec's own
-- (fargate.exec_agent_paths; the session's shell is the script's ancestor
-- and spared too): a lost agent's box before a fresh agent is placed, a
-- box past its budget. ExecuteCommand runs as root, so every process of
-- the box can be reached. A task cannot restart in place: processes that
-- did not end (a box at its pids limit) are an error.
function M.clear(h, deadline)
  local job_mod = require "sbx.job"
  local req = job_mod.clear_request(h.f.exec_agent_paths)
  req.user = nil
  local exit_code, kjob, code = job_mod.run_helper(M, h, req, deadline or core.now() + h.f.ssm.connect_timeout,
    "ending the box's processes")
  if exit_code == nil then return nil, kjob, code end
  local n = tostring((kjob.stream:captured("stdout"))):match("(%d+)%s*$")
  if exit_code == 0 and n == "0" then return true end
  return nil, string.format("%s of the box's processes did not end (exit %s): %s", tostring(n or "some"),
    tostring(exit_code), (kjob.stream:captured("output"))), "kill_failed"
end

-- restart(handle): a Fargate task cannot be restarted in place.
function M.restart()
  return nil, "a Fargate box cannot be restarted in place; close it and create a new one", "unsupported"
end

-- Reaper --------------------------------------------------------------------------------------

-- reap(opts) -> { removed = {...}, kept = n }: stops sbx tasks (startedBy
-- policy.fargate.started_by) whose owner process is gone (same host) or
-- whose deadline has passed. opts.all stops every sbx task of the cluster;
-- opts.dry_run only reports.
function M.reap(opts)
  opts = opts or {}
  local f = fspec(opts)
  local c, err, code = get_clients(f)
  if not c then return nil, err, code end
  local arns, token = {}, nil
  repeat
    local out, lerr, lcode = c.ecs:call("ListTasks", {
      cluster = f.cluster, startedBy = f.started_by, desiredStatus = "RUNNING", nextToken = token,
    })
    if not out then
      if lcode == "ClusterNotFoundException" then return { removed = {}, kept = 0 } end
      return nil, lerr, lcode
    end
    for _, a in ipairs(out.taskArns or {}) do arns[#arns + 1] = a end
    token = out.nextToken
  until not token
  local all = {}
  for i = 1, #arns, 100 do
    local batch = table.move(arns, i, math.min(i + 99, #arns), 1, {})
    local out, derr, dcode = c.ecs:call("DescribeTasks", { cluster = f.cluster, tasks = json.array(batch), include = json.array { "TAGS" } })
    if not out then return nil, derr, dcode end
    for _, t in ipairs(out.tasks or {}) do all[#all + 1] = t end
  end
  local now = os.time()
  return owner.reap_each(all, opts, {
    reason = function(t)
      local tg = {}
      for _, kv in ipairs(t.tags or {}) do tg[kv.key] = kv.value end
      return tg["sbx"] == "1" and owner.reap_reason(tg, opts, now) or nil
    end,
    name = function(t) return t.taskArn, task_id(t.taskArn) end,
    remove = function(t) stop_task(c, f, t.taskArn) end,
  })
end

return M

-- The Fargate backend's lifecycle: create (run-task, wait), destroy,
-- restart (unsupported).
local core = require "sbx.core"
local json = require("sbx.core").json
local owner = require "sbx.owner"
local clients = require "sbx.backends.fargate.clients"
local cluster = require "sbx.backends.fargate.cluster"
local taskdefs = require "sbx.backends.fargate.taskdefs"
local waiting = require "sbx.backends.fargate.waiting"
local fspec = clients.fspec
local get_clients = clients.get_clients
local once = clients.once
local ensure_cluster = cluster.ensure_cluster
local roles = cluster.roles
local ensure_taskdef = taskdefs.ensure_taskdef
local forget_taskdef = taskdefs.forget_taskdef
local taskdef_users = taskdefs.taskdef_users
local wait_running = waiting.wait_running

local M = {}

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

-- restart(handle): a Fargate task cannot be restarted in place.
function M.restart()
  return nil, "a Fargate box cannot be restarted in place; close it and create a new one", "unsupported"
end

M.stop_task = stop_task
M.task_id = task_id

return M

-- The Fargate backend's cluster and roles, made once when asked.
local core = require "sbx.core"
local json = require("sbx.core").json
local clients = require "sbx.backends.fargate.clients"
local run_once = clients.run_once

local M = {}

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

M.ensure_cluster = ensure_cluster
M.roles = roles

return M

-- The Fargate backend's task definitions, shared by content.
local core = require "sbx.core"
local json = require("sbx.core").json
local clients = require "sbx.backends.fargate.clients"
local isolation = require "sbx.backends.fargate.isolation"
local once = clients.once
local run_once = clients.run_once
local cap_name = isolation.cap_name
local container_mib = isolation.container_mib
local storage_gib = isolation.storage_gib

local M = {}

-- Task definitions, shared by content -------------------------------------------------------

local taskdef_users = {}        -- arn -> boxes of this process using it

-- The container's isolation settings, from the box spec (see isolation.limits).
local function container_isolation(c, f)
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
  container_isolation(body.containerDefinitions[1], f)
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

M.ensure_taskdef = ensure_taskdef
M.forget_taskdef = forget_taskdef
M.taskdef_users = taskdef_users

return M

-- The Fargate backend's isolation: task sizes and how Fargate holds each
-- option (sbx.limits).
local clients = require "sbx.backends.fargate.clients"
local fspec = clients.fspec

local M = {}

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

M.cap_name = cap_name
M.container_mib = container_mib
M.storage_gib = storage_gib

return M

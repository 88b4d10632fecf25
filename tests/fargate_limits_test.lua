-- needs: docker, python3
-- Isolation on Fargate boxes, against the AWS stand-in (which runs each
-- task as a real container from the task definition sbx registered): what
-- ECS can hold goes into the task definition and holds in the box; what it
-- cannot is refused when set explicitly ("unsupported", before any AWS
-- call) and reported honestly when it is a default (network = "none": the
-- exec agent needs egress to SSM).
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"

local st = assert(H.standin())
sbx.use_policy {
  fargate = {
    endpoint_url = st.url, credentials = st.credentials, region = "us-east-1",
    subnets = { "subnet-0standin" }, security_groups = { "sg-0standin" },
    poll_interval = 0.1, start_timeout = 60, exec_connect_timeout = 10,
  },
}
local MiB, GiB = 1024 * 1024, 1024 * 1024 * 1024

local function calls(name) return (assert(st:state()).calls or {})[name] or 0 end

-- The task definition a box runs under, and the container the stand-in made.
local function taskdef(box)
  local out = assert(box.handle.clients.ecs:call("DescribeTaskDefinition", { taskDefinition = box.handle.taskdef }))
  return out.taskDefinition, out.taskDefinition.containerDefinitions[1]
end
local function container(box)
  for _, t in ipairs(assert(st:state()).tasks) do
    if t.taskArn == box.handle.arn then return H.container(t.containers[1].runtimeId, st.docker_host) end
  end
end
local function has(list, x)
  for _, v in ipairs(list or {}) do if v == x then return true end end
  return false
end
-- Is capability bit n in the box's effective set? (NET_RAW 13, CHOWN 0, SYS_PTRACE 19)
local function cap_bit(box, n)
  local r = assert(box:exec("grep CapEff /proc/self/status"))
  local hex = r.stdout:match("CapEff:%s*(%x+)")
  return hex and (tonumber(hex, 16) >> n) & 1 == 1
end

-- Defaults: applied as closely as Fargate allows, reported honestly ---------------------

local box, err, code = sbx.box { backend = "fargate", image = H.busybox }
tap.ok(box, "a default Fargate box is created", tostring(err) .. " " .. tostring(code))
if not box then tap.diag(st:log()) st:stop() tap.done() return end
local L = box.limits
tap.is(L.network.requested, "none", "box.limits.network: none was requested")
tap.is(L.network.enforced, false, "and is not enforced")
tap.like(L.network.note, "SSM", "because the exec agent needs egress to SSM")
tap.like(L.network.note, "a default", "a default, so the box was not refused")
tap.is(L.pids.enforced, false, "no pids limit on Fargate, reported")
tap.is(L.no_new_privileges.enforced, false, "no no-new-privileges on Fargate, reported")
tap.is(L.disk.enforced, false, "10 GiB of disk is below Fargate's 20 GiB storage, reported")
tap.is(L.memory.enforced, "platform", "memory is held by the platform")
tap.is(L.cpus.enforced, "platform", "cpus by the task size")
tap.is(L.cap_drop.enforced, "platform", "cap_drop by the task definition")
tap.is(L.init.enforced, "platform", "init too")

local td, cd = taskdef(box)
tap.is(cd.memory, 1024, "the default 1 GiB is the container's memory limit (ECS MiB) in the 2 GiB task")
tap.ok(has(cd.linuxParameters.capabilities.drop, "NET_RAW"), "the default cap_drop is in linuxParameters")
tap.is(cd.linuxParameters.initProcessEnabled, true, "and initProcessEnabled")
tap.is(td.ephemeralStorage, nil, "no ephemeral storage beyond Fargate's default")
local c = container(box)
tap.is(c and c.HostConfig.Memory, 1 * GiB, "the stand-in's container holds that memory limit")
local r = assert(box:exec("cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"))
tap.is(r.stdout, tostring(1 * GiB) .. "\n", "and the box sees it")
tap.is(cap_bit(box, 13), false, "NET_RAW is gone from the box's effective capabilities")
tap.is(cap_bit(box, 0), true, "CHOWN (not dropped) is still there")
box:close()

-- Explicit options ECS can hold: they hold ---------------------------------------------------

box, err = sbx.box { backend = "fargate", image = H.busybox, memory = 256 * MiB,
  cap_drop = { "NET_RAW", "CHOWN" }, cap_add = { "SYS_PTRACE" }, ulimits = { nofile = 1000 },
  disk = 50 * GiB, network = "bridge" }
tap.ok(box, "a Fargate box with explicit memory, capabilities, ulimits, disk and network", err)
if box then
  tap.is(box.limits.memory.enforced, "platform", "memory: platform")
  tap.is(box.limits.disk.enforced, "platform", "disk of 50 GiB: platform (ephemeral storage)")
  tap.is(box.limits.network.enforced, "platform", "network = bridge: the task's own network")
  td, cd = taskdef(box)
  tap.is(cd.memory, 256, "memory: 256 MiB container limit in the task definition")
  tap.is(td.ephemeralStorage and td.ephemeralStorage.sizeInGiB, 50, "disk: ephemeralStorage 50 GiB")
  tap.ok(has(cd.linuxParameters.capabilities.add, "SYS_PTRACE"), "cap_add: SYS_PTRACE in the task definition")
  tap.is(cd.ulimits and cd.ulimits[1].name, "nofile", "ulimits in the task definition")
  r = assert(box:exec("cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"))
  tap.is(r.stdout, tostring(256 * MiB) .. "\n", "the box is held to 256 MiB")
  r = assert(box:exec("ulimit -n"))
  tap.is(r.stdout, "1000\n", "and to 1000 open files")
  tap.is(cap_bit(box, 0), false, "CHOWN is dropped")
  tap.is(cap_bit(box, 19), true, "SYS_PTRACE is added")
  r = assert(box:exec("touch /tmp/f && chown 1 /tmp/f; echo $?"))
  tap.isnt(r.stdout, "0\n", "chown fails without CHOWN")
  box:close()
end

-- Explicit options ECS cannot hold: refused, before any AWS call -----------------------

local before_run, before_reg = calls("ecs.RunTask"), calls("ecs.RegisterTaskDefinition")
for _, case in ipairs {
  { { pids = 64 }, "pids = 64" },
  { { read_only = true }, "read_only = true" },
  { { network = "none" }, "network = \"none\"" },
  { { no_new_privileges = true }, "no_new_privileges = true" },
  { { cap_add = { "NET_ADMIN" } }, "cap_add" },
  { { tmpfs = { ["/tmp"] = "size=1m" } }, "tmpfs" },
  { { disk = 100 * MiB }, "disk" },
  { { cpus = 0.25 }, "cpus = 0.25" },
} do
  local o = case[1]
  o.backend, o.image = "fargate", H.busybox
  local nb, e, k = sbx.box(o)
  tap.ok(nb == nil and k == "unsupported", "explicit " .. case[2] .. " is refused with unsupported", e)
  tap.like(e, (case[2]:gsub("%p", "%%%0")), "the message names it")
end
sbx.use_policy { box = { pids = 100 } }
local nb, e, k = sbx.box { backend = "fargate", image = H.busybox }
tap.is(k, "unsupported", "a policy that sets pids is explicit too")
tap.like(e, "pids = 100 %(policy%)", "and says so")
sbx.use_policy { box = { pids = require("sbx.policy").box.pids } }
tap.is(calls("ecs.RunTask"), before_run, "no task was started for a refused box")
tap.is(calls("ecs.RegisterTaskDefinition"), before_reg, "no task definition registered")

-- strict_limits: the defaults Fargate cannot hold are refused too ------------------------

nb, e, k = sbx.box { backend = "fargate", image = H.busybox, strict_limits = true }
tap.is(k, "unsupported", "strict_limits refuses Fargate's defaults")
tap.like(e, "pids = 512 %(a default, refused by policy.box.strict_limits%)", "naming each")
tap.like(e, "network = \"none\"", "network among them")
box, err = sbx.box { backend = "fargate", image = H.busybox, strict_limits = true,
  pids = false, network = "bridge", no_new_privileges = false, disk = false }
tap.ok(box, "with every limit either held or given up explicitly, a strict box is created", err)
if box then
  local all = true
  for name, entry in pairs(box.limits) do
    if entry.enforced == false and entry.note ~= "nothing requested" then all = false; tap.diag(name) end
  end
  tap.ok(all, "and everything it asks is enforced")
  box:close()
end

-- A box overlay's policy.fargate is that box's: its task size.
box, err = sbx.box { backend = "fargate", image = H.busybox, transport = "exec",
  policy = { fargate = { task_cpu = "512", task_memory = "1024" } } }
tap.ok(box, "a box with a policy overlay for fargate", err)
if box then
  local td = taskdef(box)
  tap.ok(td.cpu == "512" and td.memory == "1024", "the overlay's task_cpu and task_memory size its task (" ..
    tostring(td.cpu) .. ", " .. tostring(td.memory) .. ")")
  box:close()
end

st:stop()
tap.done()

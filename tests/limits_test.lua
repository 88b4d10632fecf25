-- needs: nothing
-- Isolation limits without a daemon: what every box reports in box.limits,
-- which options are refused ("unsupported") and when (set explicitly, or a
-- default under strict_limits), and what Fargate declares it can hold.
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"

package.loaded["sbx.backends.fake"] = require "fake_backend"
local fake = package.loaded["sbx.backends.fake"]
local fargate = require "sbx.backends.fargate"
local defaults = require "sbx.policy"

-- Defaults and the contract ---------------------------------------------------------

local function fake_box(opts)
  opts.backend = "fake"
  return sbx.box(opts)
end

local b = assert(fake_box {})
tap.is(type(b.limits), "table", "every box has box.limits")
local names = {}
for _, n in ipairs(require("sbx.limits").OPTIONS) do names[#names + 1] = n end
tap.is(table.concat(names, ","),
  "memory,cpus,pids,disk,network,read_only,cap_drop,cap_add,no_new_privileges,init,ulimits,tmpfs",
  "the isolation options, listed in one place")
local all = true
for _, n in ipairs(names) do
  local e = b.limits[n]
  if type(e) ~= "table" or e.enforced == nil or type(e.note) ~= "string" then all = false end
end
tap.ok(all, "one entry { requested, enforced, note } per option")
tap.is(b.limits.disk.requested, 10 * 1024 * 1024 * 1024, "disk is a box option, 10 GiB by default")
tap.is(b.limits.memory.enforced, "daemon", "an enforced option says by whom")
tap.is(b.limits.read_only.enforced, false, "read_only = false asks nothing")
tap.is(b.limits.read_only.note, "nothing requested", "and says so")
tap.is(b.limits.cap_drop.requested[1], "NET_RAW", "requested is the value the box asked for")
b.spec.cap_drop[1] = "changed"
tap.is(b.limits.cap_drop.requested[1], "NET_RAW", "a copy of it")
b:close()

-- A default the backend cannot enforce: applied as closely as it can, reported.
local created = fake.created
b = assert(fake_box { isolation = { pids = false } })
tap.is(b.limits.pids.enforced, false, "a default pids the backend cannot enforce: enforced = false")
tap.like(b.limits.pids.note, "a default", "the note says it was a default")
b:close()

-- Set explicitly: refused before anything is created.
created = fake.created
local nb, err, code = fake_box { isolation = { pids = false }, pids = 64 }
tap.is(nb, nil, "an explicit option the backend cannot enforce refuses the box")
tap.is(code, "unsupported", "with code unsupported")
tap.like(err, "pids = 64 %(box options%)", "the message names the option, value and source")
tap.is(fake.created, created, "and nothing was created")
nb, err, code = fake_box { isolation = { pids = false, read_only = false }, pids = 64, read_only = true }
tap.like(err, "pids = 64.*read_only = true", "every refused option is named at once")

-- A value that asks nothing is never refused.
b = assert(fake_box { isolation = { pids = false, tmpfs = false }, pids = false, tmpfs = {} })
tap.is(b.limits.pids.note, "nothing requested", "pids = false asks nothing, even where pids cannot be enforced")
b:close()

-- A policy overlay that changes a default is explicit; one that repeats it is not.
sbx.use_policy { box = { pids = 100 } }
nb, err, code = fake_box { isolation = { pids = false } }
tap.is(code, "unsupported", "sbx.use_policy setting pids counts as explicit")
tap.like(err, "pids = 100 %(policy%)", "and the message says it came from the policy")
sbx.use_policy { box = { pids = defaults.box.pids } }
b, err = fake_box { isolation = { pids = false } }
tap.ok(b, "a policy that repeats the built-in default is not explicit", err)
if b then b:close() end
nb, err, code = fake_box { isolation = { read_only = false }, policy = { box = { read_only = true } } }
tap.is(code, "unsupported", "a box's own policy overlay counts as explicit")

-- strict_limits: defaults are held to the same rule.
nb, err, code = fake_box { isolation = { pids = false }, strict_limits = true }
tap.is(code, "unsupported", "strict_limits refuses a default the backend cannot enforce")
tap.like(err, "strict_limits", "and says why")
sbx.use_policy { box = { strict_limits = true } }
nb, err, code = fake_box { isolation = { no_new_privileges = false } }
tap.is(code, "unsupported", "policy.box.strict_limits = true does the same for every box")
b, err = fake_box { isolation = { pids = false }, pids = false }
tap.ok(b, "under strict_limits, pids = false is the way to accept no pids limit", err)
if b then b:close() end
b = assert(fake_box {})
tap.ok(b.limits.pids.enforced, "an enforceable default passes under strict_limits")
b:close()
sbx.use_policy { box = { strict_limits = false } }

-- A backend declaring a kind that does not exist is a bug, raised.
tap.checkerr("not a kind of enforcement", fake_box, { isolation = { memory = "hopefully" } })

-- Validation of the new knobs.
tap.checkerr("box option disk must be", sbx.box, { backend = "fake", disk = "lots" })
b = assert(fake_box { disk = false })
tap.is(b.limits.disk.enforced, false, "disk = false: no limit")
b:close()
tap.checkerr("box.strict_limits must be", sbx.use_policy, { box = { strict_limits = "yes" } })
tap.checkerr("docker.disk_poll must be", sbx.use_policy, { docker = { disk_poll = 0 } })

-- Fargate: what a task definition can hold -------------------------------------------------

local function fdecl(over)
  local spec = sbx.merge_policy(sbx.deep_copy(sbx.policy.box), over or {})
  spec.backend = "fargate"
  return fargate.limits(spec, sbx.policy)
end
local d = fdecl()
tap.is(d.memory.enforced, "platform", "Fargate memory: the container's hard limit in the task")
tap.is(d.cpus.enforced, "platform", "Fargate cpus: the task size")
tap.is(d.pids.enforced, false, "Fargate has no pids limit")
tap.is(d.network.enforced, false, "network = none cannot hold on Fargate")
tap.like(d.network.note, "SSM", "because the exec agent needs egress to SSM")
tap.is(d.cap_drop.enforced, "platform", "cap_drop: linuxParameters.capabilities.drop")
tap.is(d.init.enforced, "platform", "init: initProcessEnabled")
tap.is(d.no_new_privileges.enforced, false, "no_new_privileges: dockerSecurityOptions is not valid on Fargate")
tap.is(d.disk.enforced, false, "10 GiB of disk: below Fargate's smallest ephemeral storage")
tap.is(fdecl({ disk = 50 * 1024 * 1024 * 1024 }).disk.enforced, "platform", "50 GiB: ephemeralStorage")
tap.is(fdecl({ read_only = true }).read_only.enforced, false, "read_only: ECS Exec needs a writable root")
tap.is(fdecl({ cap_add = { "SYS_PTRACE" } }).cap_add.enforced, "platform", "cap_add SYS_PTRACE: Fargate allows it")
tap.is(fdecl({ cap_add = { "NET_ADMIN" } }).cap_add.enforced, false, "any other cap_add: not on Fargate")
tap.is(fdecl({ tmpfs = { ["/tmp"] = "size=1m" } }).tmpfs.enforced, false, "tmpfs: not on Fargate")
tap.is(fdecl({ cpus = 0.5 }).cpus.enforced, false, "half a CPU in a 1-vCPU task: not a cap")
tap.is(fdecl({ cpus = 2 }).cpus.enforced, "platform", "2 CPUs in a 1-vCPU task: the task caps it lower")
tap.is(fdecl({ network = "bridge" }).network.enforced, "platform", "network = bridge: the task's awsvpc network")

-- Refused before any AWS call: no endpoint, no credentials needed.
for _, case in ipairs {
  { { pids = 64 }, "pids" }, { { read_only = true }, "read_only" }, { { network = "none" }, "network" },
  { { cap_add = { "NET_ADMIN" } }, "cap_add" }, { { disk = 100 * 1024 * 1024 }, "disk" },
} do
  local o = case[1]
  o.backend, o.image = "fargate", "x"
  nb, err, code = sbx.box(o)
  tap.is(code, "unsupported", "Fargate refuses an explicit " .. case[2] .. " before any AWS call")
  tap.like(err, case[2], "naming it")
end
nb, err, code = sbx.box { backend = "fargate", image = "x" }
tap.is(code, "invalid_spec", "Fargate defaults are not refused (the box fails later, for its missing subnets)")
nb, err, code = sbx.box { backend = "fargate", image = "x", strict_limits = true }
tap.is(code, "unsupported", "under strict_limits Fargate's defaults are refused")
tap.like(err, "pids.*network.*no_new_privileges", "all of them")

-- Replay: whatever the trace recorded, or false -------------------------------------------

do
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write('{"seq":1,"t":0,"box":"a1","op":"create","args":{"backend":"docker"},"result":{"id":"a1"}}\n')
  f:write('{"seq":2,"t":0,"box":"b2","op":"create","args":{"backend":"docker"},"result":{"id":"b2",' ..
    '"limits":{"pids":{"requested":512,"enforced":"daemon","note":"PidsLimit"}}}}\n')
  f:close()
  local r1 = assert(sbx.box { backend = "replay", trace = path, trace_box = 1, pids = 64 })
  tap.is(r1.limits, false, "a replayed box without recorded limits: box.limits = false, nothing refused")
  local r2 = assert(sbx.box { backend = "replay", trace = path, trace_box = 2 })
  tap.is(r2.limits and r2.limits.pids.enforced, "daemon", "a replayed box reports what was recorded")
  os.remove(path)
end

tap.done()

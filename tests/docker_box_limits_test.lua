-- needs: docker
-- box.limits on the Docker backend, against the real daemon: what a box
-- asked for, that the daemon holds it (checked from the daemon's side), and
-- strict_limits (everything Docker is asked here it enforces: the disk by a
-- quota or, on this daemon, by sbx's watcher).
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"

local MiB = 1024 * 1024

local box = H.box {}
local L = box.limits
local asked = { "memory", "cpus", "pids", "disk", "network", "cap_drop", "no_new_privileges", "init" }
for _, name in ipairs(asked) do
  tap.ok(L[name] and L[name].enforced, "a default Docker box: " .. name .. " is enforced", L[name] and L[name].note)
end
tap.is(L.memory.enforced, "daemon", "memory by the daemon")
tap.is(L.memory.requested, 1024 * MiB, "the default memory was requested")
tap.is(L.network.requested, "none", "and network none")
tap.is(L.disk.enforced, "watched", "the disk limit is watched here (overlay2 on ext4)")
tap.is(L.read_only.enforced, false, "read_only = false asks nothing")
tap.is(L.tmpfs.note, "nothing requested", "nor does an empty tmpfs")
box:close()

-- Explicit options: reported as asked, and the daemon holds them.
box = H.box { memory = 128 * MiB, pids = 50, read_only = true, tmpfs = { ["/work"] = "rw,size=8m" },
  cap_drop = { "ALL" }, ulimits = { nofile = 512, nproc = 4096 } }   -- nproc too: Podman needs both
L = box.limits
tap.is(L.memory.requested, 128 * MiB, "explicit memory is reported")
tap.is(L.read_only.enforced, "daemon", "read_only = true: the daemon")
tap.is(L.cap_drop.requested[1], "ALL", "cap_drop as asked")
tap.is(L.ulimits.requested.nofile, 512, "ulimits as asked")
local hc = H.container(box.id).HostConfig
tap.ok(hc.Memory == 128 * MiB and hc.PidsLimit == 50 and hc.ReadonlyRootfs == true,
  "and the daemon holds memory, pids and the read-only root")
local r = assert(box:exec("ulimit -n; touch /x 2>&1 || echo ro"))
tap.like(r.stdout, "^512\n.*ro\n$", "the box sees them")
box:close()

-- host_config replacing an isolation field is said in the note.
box = H.box { host_config = { PidsLimit = 77 } }
tap.like(box.limits.pids.note, "host_config.PidsLimit replaces", "host_config overriding pids shows in box.limits")
box:close()

-- strict_limits: nothing to refuse on Docker.
box = H.box { strict_limits = true }
tap.ok(box, "a strict Docker box with the defaults is created: Docker enforces every default")
box:close()

tap.done()

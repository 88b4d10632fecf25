-- needs: docker, local, root
-- The local backend's limits, tried by hostile commands, as root (cgroups)
-- and as the unprivileged users (rlimits): a fork bomb, memory hogs, a disk
-- filler, a CPU spinner, and what box.limits says about each.
local sbx = require "sbx"
local tap = require "tap"
local L = require "local_helper"

local MiB = 1024 * 1024
local root = L.role == "root"
local rootfs = L.my_rootfs(os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12")

-- What box.limits says ------------------------------------------------------------------
do
  local box = assert(L.box { memory = 256 * MiB, pids = 100 })
  local l = box.limits
  if root then
    tap.is(l.memory.enforced, "cgroup", "memory: a cgroup (" .. tostring(l.memory.note) .. ")")
    tap.is(l.pids.enforced, "cgroup", "pids: a cgroup")
    tap.is(l.cpus.enforced, "cgroup", "cpus: a cgroup")
  else
    tap.is(l.memory.enforced, "rlimit", "memory: an rlimit (" .. tostring(l.memory.note) .. ")")
    tap.is(l.pids.enforced, "rlimit", "pids: an rlimit")
    tap.is(l.cpus.enforced, false, "cpus: not enforced without a cgroup, and says why")
    tap.like(l.cpus.note, "default, applied as closely", "a default cpus limit is kept, not refused")
  end
  if root then
    tap.is(l.disk.enforced, "kernel", "disk: a sized tmpfs")
  else
    tap.is(l.disk.enforced, "watched", "disk: a directory on disk, watched (local_disk_test.lua)")
  end
  tap.is(l.network.enforced, "kernel", "network none: a namespace")
  tap.is(l.no_new_privileges.enforced, "kernel", "no_new_privileges")
  box:close()
end

-- Explicit isolation the backend cannot hold is refused before anything exists.
do
  local b, err, code = sbx.box { backend = "local", image = "rootfs:" .. rootfs, network = "bridge" }
  tap.ok(b == nil and code == "unsupported", "network = \"bridge\" is refused: " .. tostring(err))
  b, err, code = sbx.box { backend = "local", image = "rootfs:" .. rootfs, tmpfs = { ["/x"] = "size=1m,noexec" } }
  tap.ok(b == nil and code == "unsupported", "a tmpfs option bubblewrap lacks is refused: " .. tostring(err))
  if not root then
    b, err, code = sbx.box { backend = "local", image = "rootfs:" .. rootfs, cpus = 0.5 }
    tap.ok(b == nil and code == "unsupported", "cpus without a cgroup is refused when asked for: " .. tostring(err))
  end
end

-- A fork bomb stops at the pids limit; the box and the host live on. A
-- watcher started before it counts the box's processes while it runs,
-- with builtins only (it cannot fork either once the box is full).
do
  local box = assert(L.box { pids = 64 })
  assert(box:exec("mkfifo /tmp/tick"))
  -- (it watches until told to stop, and the bomb starts only once it
  -- watches: a fixed window could close before a slow start)
  assert(box:spawn([[exec 9<>/tmp/tick; max=0; for i in $(seq 1200); do n=0; for p in /proc/[0-9]*; do n=$((n+1)); done
    [ $n -gt $max ] && max=$n; echo $max > /tmp/max; [ -e /tmp/stop ] && break; read -t 0.05 -u 9; done]], { name = "watch" }))
  assert(box:exec("i=0; while [ ! -s /tmp/max ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done"))
  local r = assert(box:exec("bomb() { bomb | bomb & }; bomb; sleep 4", { timeout = 4 }))
  tap.ok(r.timed_out, "the fork bomb ran until its timeout")
  assert(box:exec("touch /tmp/stop"))
  box:wait("watch", 20)
  local max = tonumber((assert(box:exec("cat /tmp/max")).stdout))
  tap.ok(max and max <= 64, "the box never held more processes than its pids limit (at most " .. tostring(max) .. ")")
  tap.ok(max and max >= 40, "and the bomb did fill it")
  r = assert(box:exec("echo alive"))
  tap.is(r.stdout, "alive\n", "the box still runs commands after the bomb")
  box:close()
end

-- Memory.
do
  local box = assert(L.box { memory = 64 * MiB })
  local r = assert(box:exec("tail /dev/zero", { timeout = 60 }))
  if root then
    tap.is(r.exit_code, 137, "a memory hog is killed (137)")
    tap.is(r.oom_killed, true, "and the result says the OOM killer did it")
    tap.is(r.memory_limit, 64 * MiB, "with the box's limit")
    -- Many processes together: the cgroup counts the box, not a process.
    r = assert(box:exec("for i in 1 2 3 4; do (head -c 40m /dev/zero | tail > /dev/null; echo \"$i=$?\") & done; wait",
      { timeout = 60 }))
    tap.like(r.stdout, "=137", "four 40 MiB processes under a 64 MiB box: the box limit holds (" ..
      r.stdout:gsub("\n", " ") .. ")")
  else
    tap.ok(r.exit_code ~= 0 and r.exit_code ~= nil, "a memory hog fails at its RLIMIT_DATA (exit " ..
      tostring(r.exit_code) .. ": " .. r.stderr:gsub("%s+$", "") .. ")")
    tap.like(r.stderr, "memory", "and says so")
  end
  r = assert(box:exec("echo alive"))
  tap.is(r.stdout, "alive\n", "the box lives on")
  box:close()
end

-- Disk: a tmpfs of that size; the image and other boxes never see the writes.
do
  local before = L.sh("ls -la " .. L.q(rootfs .. "/etc") .. " | md5sum")
  local box = assert(L.box { disk = 32 * MiB })
  local other = assert(L.box {})
  local r, err, code = box:exec("dd if=/dev/zero of=/fill bs=1M count=100 2>&1; echo rc=$?; df -k / | tail -1",
    { timeout = 60 })
  if root then
    tap.like(r and r.stdout, "No space left on device", "writing past the disk limit fails with ENOSPC")
    local size = tonumber(r.stdout:match("\n%S+%s+(%d+)"))
    tap.ok(size and size <= 32 * 1024, "the box's root has the limit's size (" .. tostring(size) .. " KiB)")
  else
    -- A user's layer is on disk, measured every policy.local.disk_poll:
    -- the writer may finish first, the box is stopped at the next poll.
    local t0 = sbx.now()
    while code ~= "disk_exceeded" and sbx.now() - t0 < 60 do
      sbx.sleep(0.1)
      r, err, code = box:exec("true")
    end
    tap.is(code, "disk_exceeded", "writing past the disk limit stops the box: " .. tostring(err))
    box:close()
    box = assert(L.box { disk = 32 * MiB })
  end
  r = assert(box:exec("echo changed >> /etc/hostname; touch /etc/newfile; rm -f /etc/issue; echo done"))
  tap.is(r.stdout, "done\n", "the box changes image files as it likes")
  tap.is(L.sh("ls -la " .. L.q(rootfs .. "/etc") .. " | md5sum"), before, "the image's directory is unchanged")
  tap.is(sbx.core.path_type(rootfs .. "/fill"), nil, "and holds no file the box wrote")
  r = assert(other:exec("test -e /fill && echo seen || echo unseen; test -e /etc/newfile && echo seen || echo unseen"))
  tap.is(r.stdout, "unseen\nunseen\n", "another box of the same image sees none of it")
  if root then
    r = assert(box:exec("rm /fill && echo freed"))
    tap.is(r.stdout, "freed\n", "a full box can free space")
  end
  box:close()
  other:close()
end

-- CPU: a spinner gets at most its quota (cgroup only).
if root then
  local box = assert(L.box { cpus = 0.2 })
  local r = assert(box:exec("start=$(cut -d' ' -f14,15 /proc/$$/stat); timeout 2 sh -c 'while :; do :; done'; " ..
    "cat /proc/$$/stat | cut -d' ' -f16,17", { timeout = 10 }))
  local u, s = r.stdout:match("(%d+) (%d+)")
  local cpu = (tonumber(u) or 0) + (tonumber(s) or 0)
  -- Children's time in clock ticks (100/s): 2 s at 0.2 CPUs is about 40.
  tap.ok(cpu > 0 and cpu <= 60, "a 2 s spinner at cpus = 0.2 gets about 0.4 s of CPU (" .. cpu / 100 .. " s)")
  box:close()
else
  tap.skip("cpus quota", "no cgroup for an unprivileged user on this host")
end

-- ulimits, read_only and tmpfs mounts.
do
  local box = assert(L.box { ulimits = { nofile = 64 }, tmpfs = { ["/scratch"] = "size=8m,mode=1777" } })
  local r = assert(box:exec("ulimit -n; df -k /scratch | tail -1; dd if=/dev/zero of=/scratch/f bs=1M count=16 2>&1 | grep -o 'No space left' ; stat -c %a /scratch"))
  tap.like(r.stdout, "^64\n", "ulimits: nofile is the box's")
  tap.like(r.stdout, "8192", "a tmpfs of its size")
  tap.like(r.stdout, "No space left", "that fills at that size")
  tap.like(r.stdout, "1777\n$", "with its mode")
  box:close()
  box = assert(L.box { read_only = true })
  r = assert(box:exec("touch /x 2>&1; touch /work/x 2>&1; echo rc=$?"))
  tap.like(r.stdout, "Read%-only file system", "read_only: the root cannot be written")
  tap.like(r.stdout, "rc=1", "nor the workdir")
  tap.is(box.limits.read_only.enforced, "kernel", "read_only is held by a read-only mount")
  box:close()
end

L.relay_users(tap, "tests/local_limits_test.lua", os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12")
tap.done()

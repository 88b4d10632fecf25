-- needs: docker, local, root
-- A local box's writable layer on disk, not in host memory (issue 17 attack
-- 7): a user's box kept its files in a tmpfs that no memory cgroup
-- counted, so a box limited to 256 MiB pinned its whole disk limit (10 GiB
-- by default) of host RAM. For a user (policy.local.layer = "auto") the
-- layer is a directory under ~/.cache/sbx/local, measured inside the box's
-- user namespace and the box stopped past policy.box.disk. Run as root
-- (layer = "disk" asked for; "auto" keeps the tmpfs where a memory cgroup
-- counts it) and again as the unprivileged users.
local sbx = require "sbx"
local tap = require "tap"
local L = require "local_helper"

local MiB = 1024 * 1024
local root = L.role == "root"

local function shmem()
  local f = assert(io.open("/proc/meminfo"))
  local text = f:read("a")
  f:close()
  return tonumber(text:match("\nShmem:%s+(%d+) kB")) * 1024
end

if root then
  local b = assert(L.box {})
  if b.limits.memory.enforced == "cgroup" then
    tap.is(b.limits.disk.enforced, "kernel", "with a memory cgroup, layer = \"auto\" keeps the tmpfs (the cgroup counts it)")
  else
    tap.is(b.limits.disk.enforced, "watched", "without a memory cgroup, layer = \"auto\" is on disk")
  end
  b:close()
  sbx.use_policy { ["local"] = { layer = "disk" } }
end

-- 300 MiB written by a box with the default disk limit.
do
  local box = assert(L.box {})
  tap.is(box.limits.disk.enforced, "watched", "the layer is on disk, watched: " .. box.limits.disk.note)
  local before = shmem()
  local r = assert(box:exec("dd if=/dev/zero of=/tmp/big bs=1M count=300 conv=fsync status=none && stat -c %s /tmp/big",
    { timeout = 300 }))
  local grew = shmem() - before
  tap.is(r.stdout, (300 * MiB) .. "\n", "the box wrote 300 MiB " .. r.stderr)
  tap.ok(grew < 100 * MiB, string.format("host shared memory (Shmem) grew by %d MiB, not by 300", grew // MiB))
  -- Files of other ids of the box, in a directory its user cannot enter:
  -- close removes them too (inside the box's id map).
  r = assert(box:exec("mkdir -p /tmp/d/e && echo x > /tmp/d/e/f && chown -R 1000:1000 /tmp/d 2>/dev/null; " ..
    "chmod 700 /tmp/d /tmp/d/e; chmod 400 /tmp/d/e/f; rm -rf /etc/issue /usr/share/doc; ls /tmp/d/e"))
  tap.is(r.stdout, "f\n", "the box made a private directory tree (and whiteouts of image files)")
  local dir = box.handle.disk
  tap.ok(dir and sbx.core.path_type(dir) == "dir", "its layer is a directory on the host: " .. tostring(dir))
  tap.ok(box:close(), "the box closes")
  tap.is(sbx.core.path_type(dir), nil, "and its layer is gone, files of every id in it")
end

-- Past its disk limit a box is stopped: the writing command and every later
-- one fail with disk_exceeded.
do
  local box = assert(L.box { disk = 32 * MiB })
  local r, err, code = box:exec("i=0; while :; do dd if=/dev/zero of=/tmp/f$i bs=1M count=8 status=none || break; " ..
    "i=$((i+1)); done; echo stopped at $i", { timeout = 300 })
  tap.is(code, "disk_exceeded", "writing past disk fails: " .. tostring(err or (r and r.stdout)))
  local _, err2, code2 = box:exec("echo after")
  tap.is(code2, "disk_exceeded", "and the box runs no more commands: " .. tostring(err2))
  local dir = box.handle.disk
  box:close()
  tap.is(sbx.core.path_type(dir), nil, "close removes its layer")
end

-- kill -9 of sbx leaves a layer on disk; `sbx reap --backend local` removes
-- it, files of every id in it.
do
  local bin = os.getenv("SBX_BIN") or "build/sbx"
  local script = os.tmpname() .. ".lua"
  local f = assert(io.open(script, "w"))
  f:write([[
local sbx = require "sbx"
local L = require "local_helper"
sbx.use_policy { ["local"] = { layer = "disk" } }
local b = assert(L.box {})
assert(b:exec("mkdir -p /tmp/d/e && echo x > /tmp/d/e/f && chown -R 1000:1000 /tmp/d 2>/dev/null; chmod 700 /tmp/d /tmp/d/e"))
print("READY " .. b.handle.disk)
io.stdout:flush()
sbx.sleep(120)
]])
  f:close()
  local out = os.tmpname()
  local pid = tonumber((L.sh(string.format("%s run %s > %s 2>&1 & echo $!", L.q(bin), L.q(script), L.q(out)))))
  local dir
  local t0 = sbx.now()
  while not dir and sbx.now() - t0 < 60 do
    local o = io.open(out)
    dir = o and o:read("a"):match("READY (%S+)")
    if o then o:close() end
    if not dir then sbx.sleep(0.05) end
  end
  tap.ok(dir and sbx.core.path_type(dir) == "dir", "a child sbx made a box with a disk layer: " .. tostring(dir))
  L.sh("kill -9 " .. pid)
  t0 = sbx.now()
  while #L.host_procs("bwrap.*" .. tostring(dir):match("[^/]+$")) > 0 and sbx.now() - t0 < 30 do sbx.sleep(0.05) end
  tap.ok(dir and sbx.core.path_type(dir) == "dir", "kill -9 of sbx leaves the layer")
  local r = L.sh(L.q(bin) .. " reap --backend local")
  tap.is(dir and sbx.core.path_type(dir), nil, "sbx reap --backend local removes it: " .. r:gsub("\n", " | "))
  os.remove(script)
  os.remove(out)
  -- A layer whose record is gone (an older reaper took it) goes once stale.
  local orphan = dir and (dir:match("^(.*)/[^/]+$") .. "/0000orphan" .. sbx.core.pid())
  L.sh("mkdir -p " .. L.q(orphan .. "/upper/x") .. " && touch -d '2 hours ago' " .. L.q(orphan))
  r = L.sh(L.q(bin) .. " reap --backend local")
  tap.is(sbx.core.path_type(orphan), nil, "and a stale layer without a box record: " .. r:gsub("\n", " | "))
end

L.relay_users(tap, "tests/local_disk_test.lua", os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12")
tap.done()

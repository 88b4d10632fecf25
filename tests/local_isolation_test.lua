-- needs: docker, local, root, perl
-- The local backend's isolation, tried by a hostile command in the box, as
-- root and as the unprivileged users: the seccomp filter (even with
-- CAP_SYS_ADMIN in the box), capabilities, no_new_privs, /proc/sys, the
-- host's files and processes, the agent itself, sbx's open files, the
-- network, and image = "host".
local sbx = require "sbx"
local tap = require "tap"
local L = require "local_helper"
local H = require "helper"

local root = L.role == "root"
local rootfs = L.my_rootfs(os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12")

-- A raw syscall from perl: "ret errno-name" (x86_64 numbers). args may use
-- @s, the strings given (perl's syscall needs writable strings).
local function sys(box, nr, args, strings)
  local decl = "my @s = (" .. table.concat((function()
    local t = {}
    for i, v in ipairs(strings or {}) do t[i] = '"' .. v .. '"' end
    return t
  end)(), ", ") .. "); "
  local r = assert(box:exec(string.format([[perl -e ']] .. decl .. [[$!=0; my $r = syscall(%d%s); ]] ..
    [[print $r, " ", ($r < 0 ? (($!{EPERM} && "EPERM") || ($!{ENOSYS} && "ENOSYS") || ($!+0)) : "ok"), "\n"; exit 0' 2>&1 | head -1]],
    nr, args and (", " .. args) or "")))
  return (r.stdout:gsub("%s+$", ""))
end

-- Host things a box must not reach: a file, and open descriptors.
local marker = string.format("/tmp/sbx-local-marker-%d-%d", sbx.core.pid(), math.random(1e9))
do
  local f = assert(io.open(marker, "w"))
  f:write("host secret\n")
  f:close()
end
local held = assert(io.open(marker, "r"))    -- an open host file while boxes start

local box = assert(L.box {})

-- seccomp and no_new_privs --------------------------------------------------------------
do
  local r = assert(box:exec("grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"))
  tap.like(r.stdout, "NoNewPrivs:%s+1", "no_new_privs is set")
  tap.like(r.stdout, "Seccomp:%s+2", "a seccomp filter is loaded")
  tap.like(sys(box, 165, "$s[0], $s[1], $s[2], 0, 0", { "none", "/mnt", "tmpfs" }), "EPERM", "mount(2) fails")
  tap.like(sys(box, 272, "0x10000000"), "EPERM", "unshare(CLONE_NEWUSER) fails")
  -- clone with a namespace flag: without the filter the child would print too.
  tap.is(sys(box, 56, "0x10000011, 0, 0, 0, 0"), "-1 EPERM", "clone(CLONE_NEWUSER) fails")
  tap.is(sys(box, 435, "0, 0"), "-1 ENOSYS", "clone3 says ENOSYS (libc falls back to clone)")
  tap.like(sys(box, 308, "0, 0"), "EPERM", "setns fails")
  tap.like(sys(box, 250, "0, -4, 0"), "EPERM", "keyctl fails (the user keyring is the host's)")
  tap.like(sys(box, 248, "$s[0], $s[1], $s[2], 1, -4", { "user", "k", "v" }), "EPERM", "add_key fails")
  tap.like(sys(box, 321, "0, 0, 0"), "EPERM", "bpf fails")
  tap.like(sys(box, 425, "1, 0"), "EPERM", "io_uring_setup fails")
  tap.like(sys(box, 298, "0, 0, -1, -1, 0"), "EPERM", "perf_event_open fails")
  tap.like(sys(box, 161, "$s[0]", { "/tmp" }), "EPERM", "chroot fails")
  r = assert(box:exec("unshare -U true 2>&1; unshare -rm true 2>&1; nsenter -t 1 -m true 2>&1; echo end"))
  tap.ok(not r.stdout:find("^end") and r.stdout:find("end\n$"), "unshare and nsenter fail: " .. r.stdout:gsub("\n", " | "))
  -- Even root with CAP_SYS_ADMIN in the box's user namespace (which the
  -- kernel would let mount a tmpfs) cannot mount: the filter holds.
  local admin = assert(L.box { cap_add = { "SYS_ADMIN" } })
  r = assert(admin:exec("grep CapEff /proc/self/status; mount -t tmpfs none /mnt 2>&1; echo rc=$?"))
  tap.like(r.stdout, "rc=[1-9]", "mount fails even with cap_add SYS_ADMIN")
  tap.like(sys(admin, 272, "0x00020000"), "EPERM", "and so does unshare(CLONE_NEWNS)")
  admin:close()
end

-- Capabilities -----------------------------------------------------------------------------
do
  -- bubblewrap 0.8 narrows the bounding set only in user namespaces it
  -- makes itself; no_new_privs keeps an exec from gaining anything beyond
  -- what the process held (tried: root execs a child, caps must not grow).
  local r = assert(box:exec("grep -E '^Cap(Inh|Prm|Eff|Amb):' /proc/self/status; sh -c \"grep '^CapPrm:' /proc/self/status\" | sed 's/CapPrm/Child/'"))
  local function set(name) return tonumber(r.stdout:match(name .. ":%s+(%x+)"), 16) or -1 end
  local function has(v, bit) return v & (1 << bit) ~= 0 end
  local ok = true
  for _, n in ipairs { "CapInh", "CapPrm", "CapEff", "CapAmb" } do
    if has(set(n), 21) then ok = false end
  end
  tap.ok(ok, "no CAP_SYS_ADMIN in any set a process can use")
  tap.is(set("Child"), set("CapPrm"), "an exec'd child holds no more than its parent (no_new_privs)")
  local eff = set("CapEff")
  tap.ok(not has(eff, 13) and not has(eff, 27), "the policy's cap_drop holds (no NET_RAW, no MKNOD)")
  tap.ok(has(eff, 0) and has(eff, 7), "Docker's defaults are there (CHOWN, SETUID)")
  r = assert(box:exec("mknod /tmp/mem c 1 1 2>&1; echo rc=$?"))
  tap.like(r.stdout, "rc=1", "no device nodes: " .. r.stdout:gsub("\n", " "))
  local nochown = assert(L.box { cap_drop = { "CHOWN" } })
  r = assert(nochown:exec("touch /tmp/f && chown 1:1 /tmp/f 2>&1; echo rc=$?"))
  tap.like(r.stdout, "rc=1", "cap_drop = { \"CHOWN\" }: chown fails")
  nochown:close()
end

-- /proc/sys: the kernel's knobs (core_pattern runs a program as the host's root).
do
  local before = H.sh("cat /proc/sys/kernel/core_pattern")
  local r = assert(box:exec("(echo '|/tmp/evil' > /proc/sys/kernel/core_pattern) 2>&1; (echo 5 > /proc/sys/kernel/printk_ratelimit) 2>&1; echo rc=$?"))
  tap.like(r.stdout, "Read%-only file system", "/proc/sys is read-only in the box")
  tap.is(H.sh("cat /proc/sys/kernel/core_pattern"), before, "the host's core_pattern is unchanged")
  r = assert(box:exec("cat /proc/sys/kernel/hostname; hostname"))
  tap.like(r.stdout, "^" .. box.id:sub(1, 12), "its values are the box's own (the hostname)")
  r = assert(box:exec("(echo 1 > /proc/sysrq-trigger) 2>&1; echo rc=$?"))
  tap.like(r.stdout, "rc=1", "no sysrq-trigger")
end

-- The host's device nodes (issue 17): as root, box root is host root to the
-- nodes bubblewrap binds into /dev; chmod, chown and touch in the box must
-- leave the host's inodes as they were, while the devices still work.
do
  local nodes = { "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty" }
  local busybox = sbx.policy["local"].busybox
  local watched = table.concat(nodes, " ") .. (sbx.core.path_type(busybox) and (" " .. busybox) or "")
  -- mode, owner, group and the change time to the nanosecond
  local function host_stat() return (H.sh("stat -L -c '%n %a %u %g %z' " .. watched)) end
  local before = host_stat()
  -- Each change sets what is there already (a failing run must not break
  -- the host's /dev/null for everyone else); the ctime still tells.
  local r = assert(box:exec("for d in " .. table.concat(nodes, " ") .. " /dev/sbx-agent /dev/busybox-sbx; do " ..
    "chmod a+r $d; chown 0:0 $d; chgrp 0 $d; touch $d; touch -a $d; done 2>&1; echo end"))
  tap.like(r.stdout, "end\n$", "the box tried chmod, chown, chgrp and touch on every host node it sees")
  -- setxattr(2) on each: metadata too (x86_64 number 188).
  local xattr = {}
  for _, d in ipairs(nodes) do
    xattr[#xattr + 1] = sys(box, 188, "$s[0], $s[1], $s[2], 1, 0", { d, "user.sbx", "1" })
  end
  tap.ok(not table.concat(xattr, " "):find("ok"), "setxattr on them fails: " .. table.concat(xattr, ", "))
  tap.is(host_stat(), before, "the host's device nodes (and sbx's busybox) keep mode, owner and ctime", r.stdout)
  if root then
    tap.like(r.stdout, "chmod: changing permissions of '/dev/null': Read%-only file system",
      "as root the box's nodes are read-only binds (EROFS), not its own to change")
  end
  r = assert(box:exec("stat -c '%a' /dev/null /dev/zero /dev/full /dev/urandom"))
  tap.is(r.stdout, string.rep("666\n", 4), "the box still sees them as they are on the host")
  r = assert(box:exec("echo hi > /dev/null && echo null; head -c 3 /dev/zero | od -An -tx1; " ..
    "head -c 16 /dev/urandom | wc -c; head -c 16 /dev/random | wc -c; (echo x > /dev/full) 2>&1 | grep -c 'No space'"))
  tap.is(r.stdout, "null\n 00 00 00\n16\n16\n1\n", "and /dev/null, zero, urandom, random and full still work")
end

-- The host's files and processes ----------------------------------------------------------
do
  local r = assert(box:exec("cat " .. marker .. " 2>&1; ls /sys | wc -l; cat /etc/hostname"))
  tap.ok(not r.stdout:find("host secret"), "a host file is not in the box")
  r = assert(box:exec("grep -rl 'host secret' /tmp /run /var/tmp /proc/1/root/tmp 2>/dev/null; echo end"))
  tap.is(r.stdout, "end\n", "nor anywhere the box can look")
  r = assert(box:exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"))
  tap.ok(not r.stdout:find("sbx run", 1, true) and not r.stdout:find("bwrap", 1, true),
    "no host process is visible (not sbx, not bubblewrap)")
  r = assert(box:exec("test -S /var/run/docker.sock || test -S /run/docker.sock && echo reachable || echo absent"))
  tap.is(r.stdout, "absent\n", "the Docker daemon's socket is out of reach")
  r = assert(box:exec("(echo x > /dev/sbx-agent) 2>&1; echo rc=$?; kill -9 1; sleep 0.2; echo alive"))
  tap.like(r.stdout, "rc=1", "the agent's binary cannot be changed")
  tap.like(r.stdout, "alive", "kill -9 1 in the box changes nothing")
  r = assert(box:exec("echo still"))
  tap.is(r.stdout, "still\n", "the agent (PID 1) survived")
  r = assert(box:exec("cat /proc/1/environ 2>&1 | head -c 100; echo; ls /proc/1/fd 2>&1 | head -3"))
  tap.like(r.stdout, "Permission denied", "the agent's memory and descriptors are not readable in the box")
  if root then
    -- From the host: nothing of sbx's (the open marker file) reached the
    -- box's first processes.
    local leaked = {}
    for _, pid in ipairs(sbx.core.sandbox.list("/proc")) do
      if pid:match("^%d+$") then
        local stat = H.sh("cat /proc/" .. pid .. "/stat 2>/dev/null")
        local ppid = stat:match("^%d+ %b() %S+ (%d+)")
        if pid == tostring(box.handle.pid) or ppid == tostring(box.handle.pid) then
          for _, fd in ipairs(sbx.core.sandbox.list("/proc/" .. pid .. "/fd") or {}) do
            local st = sbx.core.sandbox.stat("/proc/" .. pid .. "/fd/" .. fd)
            if st and st.target and st.target:find(marker, 1, true) then leaked[#leaked + 1] = pid .. ":" .. fd end
          end
        end
      end
    end
    tap.is(#leaked, 0, "a file the script holds open does not reach bubblewrap or the agent")
  else
    tap.skip("open files do not leak", "reading another process's fds needs root")
  end
end

-- Ids: as root, and for a user /etc/subuid grants a range, the box maps
-- 65536 ids, so files of system users (apt's _apt) work; a user without a
-- range gets one id, and such a chown is refused.
do
  local function mapped(file)
    local n = 0
    for count in assert(box:exec("cat " .. file)).stdout:gmatch("%d+%s+%d+%s+(%d+)") do n = n + tonumber(count) end
    return n
  end
  local uids, gids = mapped("/proc/self/uid_map"), mapped("/proc/self/gid_map")
  local r = assert(box:exec("touch /tmp/ids; chown _apt:nogroup /tmp/ids 2>&1 && stat -c '%U:%G' /tmp/ids"))
  if L.role == "single" then
    tap.ok(uids == 1 and gids == 1, "one id mapped (uid_map, gid_map)", uids .. " " .. gids)
    tap.ok(not r.stdout:find("_apt:nogroup", 1, true), "so a system user's file cannot be owned", r.stdout)
  else
    tap.ok(uids == 65536 and gids == 65536, "65536 uids and gids mapped", uids .. " " .. gids)
    tap.like(r.stdout, "_apt:nogroup\n$", "a file of a system user (apt's _apt) can be owned")
  end
end

-- The network ---------------------------------------------------------------------------------
do
  local url, port, stop = H.start_python_server([[
import os, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"host-server")
    def log_message(self, *a): pass
]])
  local _ = url
  local probe = string.format([[exec 3<>/dev/tcp/127.0.0.1/%d && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && cat <&3 | tail -1; echo; ]] ..
    [[timeout 3 bash -c 'exec 3<>/dev/tcp/1.1.1.1/53' 2>&1 | head -1; echo end]], port)
  local r = assert(box:exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"))
  tap.is(r.stdout, "lo\n", "network none: only loopback")
  r = assert(box:exec(probe, { timeout = 10 }))
  tap.ok(not r.stdout:find("host-server"), "a server on the host's loopback is out of reach")
  tap.like(r.stdout, "unreachable", "the outside is unreachable")
  local hostnet = assert(L.box { network = "host" })
  r = assert(hostnet:exec(probe, { timeout = 10 }))
  tap.like(r.stdout, "host%-server", "network = \"host\": the host's loopback server answers")
  hostnet:close()
  stop()
end

-- image = "host": the host's files, read-only, its daemons' sockets masked.
do
  local hb = assert(sbx.box { backend = "local", image = "host", disk = 16 * 1024 * 1024 })
  local r = assert(hb:exec("cat /etc/hostname; cat " .. marker .. " 2>&1; (echo x > /etc/sbx-test) 2>&1; echo rc=$?; " ..
    "ls /run | wc -l; test -e /var/run/docker.sock && echo sock || echo nosock; echo w > /work/w && cat /work/w; " ..
    "dd if=/dev/zero of=/work/big bs=1M count=32 2>&1 | grep -o 'No space left'"))
  tap.like(r.stdout, "^" .. H.sh("cat /etc/hostname"):gsub("%p", "%%%0"), "the host's files are there")
  tap.like(r.stdout, "rc=1", "read-only")
  tap.like(r.stdout, "\n0\nnosock\n", "/run is an empty directory of the box's: no daemon socket")
  tap.like(r.stdout, "\nw\n", "the workdir is writable")
  tap.like(r.stdout, "No space left", "within the disk limit")
  tap.is(sbx.core.path_type("/etc/sbx-test"), nil, "and nothing reached the host's /etc")
  hb:close()
end

box:close()
held:close()
os.remove(marker)
L.relay_users(tap, "tests/local_isolation_test.lua", os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12")
tap.done()

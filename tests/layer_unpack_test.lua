-- needs: python3, root
-- core.layer.unpack against hostile and broken layers, built here with
-- Python's tarfile: every bad entry is a clear error, nothing is written
-- outside the directory being unpacked, and a good layer comes out as
-- overlayfs expects (whiteouts, opaque directories, modes, links). Also as
-- an unprivileged user (setpriv), and the small calls the cache relies on.
local sbx = require "sbx"
local t = require "tap"
local H = require "helper"
local layer = sbx.core.layer

local base = assert(layer.mkdtemp("/tmp/sbx-layer-test-"))
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Makes every tar this file needs in base/tars: one Python run.
local MAKE = [=[
import gzip, hashlib, io, os, sys, tarfile, time
out = sys.argv[1]
os.makedirs(out, exist_ok=True)

def info(name, type=tarfile.REGTYPE, data=b"", mode=0o644, **kw):
    ti = tarfile.TarInfo(name)
    ti.type = type
    ti.mode = mode
    ti.mtime = 1700000000
    ti.uid, ti.gid = kw.pop("uid", 0), kw.pop("gid", 0)
    for k, v in kw.items():
        setattr(ti, k, v)
    if type == tarfile.REGTYPE:
        ti.size = len(data)
    return ti, (io.BytesIO(data) if type == tarfile.REGTYPE else None)

def tar(entries, fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for e in entries:
            tf.addfile(*(info(e[0], **e[1]) if isinstance(e, tuple) else info(e)))
    return buf.getvalue()

def write(name, data, gz=True):
    blob = gzip.compress(data, mtime=0) if gz else data
    open(os.path.join(out, name), "wb").write(blob)
    print(name, "sha256:" + hashlib.sha256(blob).hexdigest(), "sha256:" + hashlib.sha256(data).hexdigest())

D, S, L, C, B, F = tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE
good = tar([
    ("etc", dict(type=D, mode=0o755)),
    ("etc/hostname", dict(data=b"box\n")),
    ("etc/alternatives", dict(type=D)),
    ("etc/alternatives/pager", dict(type=S, linkname="/usr/bin/less")),
    ("usr/bin/tool", dict(data=b"#!/bin/sh\n", mode=0o4755)),
    ("usr/bin/tool2", dict(type=L, linkname="usr/bin/tool")),
    ("usr/bin/rel", dict(type=S, linkname="../lib/x")),
    ("ro", dict(type=D, mode=0o555)),
    ("ro/file", dict(data=b"x" * 5000, mode=0o400)),
    ("/abs/path", dict(data=b"abs")),
    ("./dot/./file", dict(data=b"dot")),
    ("var/.wh.cache", {}),
    ("opq/.wh..wh..opq", {}),
    ("opq/new", dict(data=b"n")),
    ("same/keep", dict(data=b"k")),
    ("same/.wh.keep", {}),
    ("fifo", dict(type=F, mode=0o600)),
    ("replaced", dict(type=D)),
    ("replaced/inner", dict(data=b"i")),
    ("replaced", dict(data=b"now a file")),
    ("owned", dict(data=b"o", uid=1234, gid=4321)),
    ("ünï", dict(data=b"utf8")),
])
write("good.tar.gz", good)
write("good.tar", good, gz=False)
write("dotdot.tar.gz", tar([("../escape", dict(data=b"x"))]))
write("dotdot_mid.tar.gz", tar([("a/../../escape", dict(data=b"x"))]))
write("abs_symlink.tar.gz", tar([("link", dict(type=S, linkname=sys.argv[2])), ("link/pwned", dict(data=b"x"))]))
write("rel_symlink.tar.gz", tar([("up", dict(type=S, linkname="../outside")), ("up/pwned", dict(data=b"x"))]))
write("symlink_dir_file.tar.gz", tar([("d", dict(type=D)), ("d/l", dict(type=S, linkname="/")), ("d/l/etc/pwned", dict(data=b"x"))]))
write("hardlink_out.tar.gz", tar([("hl", dict(type=L, linkname="../outside/secret"))]))
write("hardlink_abs.tar.gz", tar([("hl", dict(type=L, linkname="/etc/passwd"))]))
write("hardlink_via_symlink.tar.gz", tar([("sl", dict(type=S, linkname="/etc")), ("hl", dict(type=L, linkname="sl/passwd"))]))
write("device.tar.gz", tar([("dev/null", dict(type=C, devmajor=1, devminor=3)), ("ok", dict(data=b"ok"))]))
write("blockdev.tar.gz", tar([("sda", dict(type=B, devmajor=8, devminor=0))]))
# A header that declares 10 GB, and no data behind it.
hdr = tarfile.TarInfo("huge"); hdr.size = 10 * 1000 ** 3; hdr.mtime = 0
write("huge.tar.gz", hdr.tobuf(tarfile.GNU_FORMAT) + b"\0" * 1024)
write("whiteout_dotdot.tar.gz", tar([("d/.wh...", {})]))
write("deep.tar.gz", tar([("/".join(["d"] * 300) + "/f", dict(data=b"x"))]))
write("many.tar.gz", tar([("f%d" % i, dict(data=b"")) for i in range(50)]))
write("slow.tar", tar([("d%d/f%d" % (i // 100, i), dict(data=b"x" * 100)) for i in range(20000)]), gz=False)
g = gzip.compress(good, mtime=0)
open(os.path.join(out, "truncated.tar.gz"), "wb").write(g[: len(g) // 2])
c = bytearray(g); c[len(c) // 2] ^= 0xFF
open(os.path.join(out, "corrupt.tar.gz"), "wb").write(bytes(c))
open(os.path.join(out, "garbage.bin"), "wb").write(os.urandom(4096))
open(os.path.join(out, "empty"), "wb").write(b"")
]=]

local tars = base .. "/tars"
local script = base .. "/make.py"
do
  local f = assert(io.open(script, "w"))
  f:write(MAKE)
  f:close()
end
local listing, rc = H.sh(string.format("/usr/bin/python3 %s %s %s", q(script), q(tars), q(base .. "/outside")))
t.is(rc, 0, "the test layers were built")
local digests = {}
for name, d, diff in listing:gmatch("(%S+) (sha256:%x+) (sha256:%x+)") do digests[name] = { d, diff } end

-- A fresh target: base/N/dest, beside base/N/outside (which must stay empty).
local n = 0
local function fresh()
  n = n + 1
  local dir = base .. "/" .. n
  assert(layer.mkdirs(dir .. "/dest"))
  assert(layer.mkdirs(dir .. "/outside"))
  return dir
end

local function untouched(dir, what)
  local list = assert(layer.list(dir .. "/outside"))
  local around = assert(layer.list(dir))
  table.sort(around)
  t.ok(#list == 0 and #around == 2, what .. ": nothing written outside the target",
    table.concat(list, ",") .. " | " .. table.concat(around, ","))
end

local function unpack(name, opts)
  local dir = fresh()
  local o = { file = tars .. "/" .. name, dest = dir .. "/dest" }
  for k, v in pairs(opts or {}) do o[k] = v end
  local r, err, code = layer.unpack(o)
  return r, err, code, dir
end

-- Bad input -------------------------------------------------------------------

local function refused(name, want_code, pattern, opts)
  local r, err, code, dir = unpack(name, opts)
  t.ok(r == nil and code == want_code and tostring(err):find(pattern) ~= nil,
    string.format("%s: %s", name, want_code), string.format("got %s, %s, %s", tostring(r), tostring(err), tostring(code)))
  untouched(dir, name)
  return err, dir
end

refused("dotdot.tar.gz", "unsafe_entry", "%.%./escape")
refused("dotdot_mid.tar.gz", "unsafe_entry", "a/%.%./%.%./escape")
refused("abs_symlink.tar.gz", "unsafe_entry", "link/pwned.*symlink")
refused("rel_symlink.tar.gz", "unsafe_entry", "up/pwned")
refused("symlink_dir_file.tar.gz", "unsafe_entry", "d/l/etc/pwned")
t.ok(not layer.stat("/etc/pwned") and not layer.stat(base .. "/outside/pwned"), "no file appeared through a symlink")
refused("hardlink_out.tar.gz", "unsafe_entry", "hard link hl")
local before = assert(layer.stat("/etc/passwd"))
refused("hardlink_abs.tar.gz", "unsafe_entry", "not a file this layer holds")
refused("hardlink_via_symlink.tar.gz", "unsafe_entry", "hard link hl")
local after = assert(layer.stat("/etc/passwd"))
t.ok(before.ino == after.ino, "the host's /etc/passwd is untouched")
refused("device.tar.gz", "device", "dev/null is a character device node %(1:3%)")
refused("blockdev.tar.gz", "device", "sda is a block device node")
do
  local r, err, code, dir = unpack("device.tar.gz", { devices = "skip" })
  t.ok(r and r.skipped == 1 and layer.stat(dir .. "/dest/ok") and not layer.stat(dir .. "/dest/dev/null"),
    "devices = skip drops the node and keeps the rest", tostring(err) .. " " .. tostring(code))
end
local huge_start = sbx.now()
local _, hdir = refused("huge.tar.gz", "too_large", "huge declares 10000000000 bytes", { max_bytes = 8 * 2 ^ 30 })
t.ok(sbx.now() - huge_start < 2 and not layer.stat(hdir .. "/dest/huge"), "a 10 GB declared size is refused before anything is written")
refused("whiteout_dotdot.tar.gz", "unsafe_entry", "whiteout that names no entry")
refused("deep.tar.gz", "unsafe_entry", "nests deeper than 256")
refused("many.tar.gz", "too_large", "more than 10 entries", { max_entries = 10 })
refused("truncated.tar.gz", "bad_layer", "corrupt or truncated")
refused("truncated.tar.gz", "digest_mismatch", "not " .. digests["good.tar.gz"][1], { digest = digests["good.tar.gz"][1] })
refused("corrupt.tar.gz", "digest_mismatch", "corrupted or replaced", { digest = digests["good.tar.gz"][1] })
refused("corrupt.tar.gz", "bad_layer", "")
refused("good.tar.gz", "digest_mismatch", "config's diff id", { diff_id = "sha256:" .. string.rep("0", 64) })
refused("garbage.bin", "bad_layer", "")
refused("empty", "bad_layer", "")
t.checkerr("digests as sha256", layer.unpack, { file = tars .. "/good.tar", dest = base, digest = "md5:00" })
t.checkerr("needs file and dest", layer.unpack, { dest = base })
t.checkerr("devices must be", layer.unpack, { file = tars .. "/good.tar", dest = base, devices = "make" })

-- A good layer -------------------------------------------------------------------

local function check_good(name, opts, label)
  local r, err, code, dir = unpack(name, opts)
  t.ok(r, label .. ": unpacked", tostring(err) .. " " .. tostring(code))
  if not r then return end
  local d = dir .. "/dest"
  t.is(r.digest, digests[name][1], label .. ": the blob's digest")
  t.is(r.diff_id, digests[name][2], label .. ": the diff id")
  t.is(layer.read(d .. "/etc/hostname", 100), "box\n", label .. ": a file")
  local link = layer.stat(d .. "/etc/alternatives/pager")
  t.ok(link and link.type == "link", label .. ": an absolute symlink is kept as a symlink")
  local tool, tool2 = layer.stat(d .. "/usr/bin/tool"), layer.stat(d .. "/usr/bin/tool2")
  t.ok(tool and tool.mode == tonumber("4755", 8) and tool2 and tool.ino == tool2.ino,
    label .. ": setuid mode kept, hard link shares the inode")
  local ro = layer.stat(d .. "/ro")
  t.ok(ro and ro.mode == tonumber("555", 8) and layer.stat(d .. "/ro/file").mode == tonumber("400", 8),
    label .. ": directory and file modes applied after the content")
  t.ok(layer.stat(d .. "/abs/path") and layer.stat(d .. "/dot/file"), label .. ": absolute and ./ names land inside")
  t.ok(math.abs(layer.stat(d .. "/etc/hostname").mtime - 1700000000) < 1, label .. ": mtimes kept")
  local wo = H.sh("stat -c '%F %t:%T' " .. q(d .. "/var/cache"))
  t.like(wo, "character special file 0:0", label .. ": .wh.NAME became a 0/0 character device")
  local x = H.sh("/usr/bin/python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], \"user.overlay.opaque\"))' " .. q(d .. "/opq"))
  t.like(x, "b'y'", label .. ": .wh..wh..opq made the directory opaque (user.overlay.opaque)")
  t.is(layer.read(d .. "/same/keep", 10), "k", label .. ": a whiteout does not hide its own layer's file")
  t.is(layer.stat(d .. "/fifo").type, "other", label .. ": a FIFO")
  t.is(layer.read(d .. "/replaced", 100), "now a file", label .. ": a later entry replaces a directory")
  t.ok(layer.stat(d .. "/ünï"), label .. ": a UTF-8 name")
  t.ok(r.whiteouts == 2 and r.entries > 20 and r.bytes > 5000, label .. ": counts", sbx.json.encode(r))
  return dir, r
end

local gdir = check_good("good.tar.gz", { digest = digests["good.tar.gz"][1], diff_id = digests["good.tar.gz"][2] }, "gzip")
check_good("good.tar", { digest = digests["good.tar"][1], diff_id = digests["good.tar"][2] }, "plain tar")
t.is(layer.stat(gdir .. "/dest/owned").uid, layer.euid() == 0 and 1234 or layer.euid(),
  "as root the tar's owners are kept")

if os.execute("command -v zstd >/dev/null 2>&1") then
  os.execute(string.format("zstd -q -f %s -o %s", q(tars .. "/good.tar"), q(tars .. "/good.tar.zst")))
  local r, err = unpack("good.tar.zst", { diff_id = digests["good.tar"][2] })
  t.ok(r and r.diff_id == digests["good.tar"][2], "a zstd layer", err)
else
  t.skip("a zstd layer", "no zstd command")
end

-- A task cancelled while its layer unpacks: the wait ends at once, the
-- thread stops soon after, and the loop goes on.
do
  local dir = fresh()
  local task = sbx.spawn(function()
    return layer.unpack { file = tars .. "/slow.tar", dest = dir .. "/dest" }
  end)
  sbx.sleep(0.05)
  local t0 = sbx.now()
  task:cancel()
  local done = task:join(5)
  local ok, res = task:result()
  t.ok(done and not ok and tostring(res):find("cancel") and sbx.now() - t0 < 1,
    "a cancelled unpack ends its task at once", tostring(res))
  sbx.sleep(0.5)
  local r = layer.unpack { file = tars .. "/good.tar", dest = fresh() .. "/dest" }
  t.ok(r and layer.remove(dir .. "/dest"), "and the next unpack runs; the half-written tree is removable")
end

-- Removal keeps to the tree, whatever the modes.
do
  local victim = base .. "/victim"
  assert(layer.mkdirs(victim .. "/keep"))
  os.execute("echo precious > " .. q(victim .. "/keep/file"))
  os.execute(string.format("ln -s %s %s", q(victim .. "/keep"), q(gdir .. "/dest/ro/escape")))
  os.execute("chmod 000 " .. q(gdir .. "/dest/ro"))
  t.ok(layer.remove(gdir .. "/dest"), "remove: a layer with read-only directories")
  t.ok(not layer.stat(gdir .. "/dest") and layer.read(victim .. "/keep/file", 100) == "precious\n",
    "remove: gone, and the symlink's target untouched")
  t.ok(layer.remove(gdir .. "/nothing"), "remove: a missing path is fine")
end

-- Unprivileged: the same layer as user 65534 (whiteouts need no privilege).
do
  local udir = base .. "/unpriv"
  assert(layer.mkdirs(udir .. "/dest"))
  os.execute("chown -R 65534:65534 " .. q(udir) .. " && chmod 755 " .. q(base))
  local prog = udir .. "/run.lua"
  local f = assert(io.open(prog, "w"))
  f:write(string.format([[
    local layer = require("sbx").core.layer
    local r, err, code = layer.unpack { file = %q, dest = %q }
    print(r and ("ok " .. r.whiteouts) or ("fail " .. tostring(err) .. " " .. tostring(code)))
  ]], tars .. "/good.tar.gz", udir .. "/dest"))
  f:close()
  if layer.euid() == 0 and os.execute("command -v setpriv >/dev/null 2>&1") then
    local out = H.sh(string.format("chmod 755 %s && setpriv --reuid=65534 --regid=65534 --clear-groups %s run %s",
      q(tars), q(H.sbx_bin), q(prog)))
    t.like(out, "^ok 2", "unprivileged: the layer unpacks, whiteouts included")
    t.is((layer.stat(udir .. "/dest/owned") or {}).uid, 65534, "unprivileged: files belong to the user")
    t.like(H.sh("stat -c '%F %t:%T' " .. q(udir .. "/dest/var/cache")), "character special file 0:0",
      "unprivileged: the whiteout is a 0/0 character device")
  else
    t.skip("unprivileged unpack", "needs root and setpriv")
    t.skip("unprivileged ownership", "needs root and setpriv")
    t.skip("unprivileged whiteout", "needs root and setpriv")
  end
end

-- The small calls ------------------------------------------------------------------

do
  local root = base .. "/root"
  assert(layer.mkdirs(root .. "/blobs"))
  os.execute(string.format("echo inside > %s/blobs/a && ln -s /etc/passwd %s/blobs/abs && ln -s ../../../../etc/passwd %s/blobs/rel",
    q(root), q(root), q(root)))
  t.is(layer.read("blobs/a", 100, root), "inside\n", "read: inside the root")
  local v, _, code = layer.read("blobs/abs", 10000, root)
  t.ok(v == nil and code == "ENOENT", "read: an absolute symlink resolves inside the root", tostring(v))
  v, _, code = layer.read("blobs/rel", 10000, root)
  t.ok(v == nil and code == "ENOENT", "read: a ../ symlink stops at the root", tostring(v))
  v, _, code = layer.read("blobs/a", 3, root)
  t.is(code, "too_large", "read: past max is too_large")
  t.is(layer.sha256("abc"), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256")
  local l1 = assert(layer.lock(base .. "/lock", "ex"))
  local l2, err, c2 = layer.lock(base .. "/lock", "sh")
  t.ok(l2 == nil and c2 == "busy", "lock: a held lock is busy", tostring(err))
  l1:close()
  local l3 = layer.lock(base .. "/lock", "sh")
  local l4 = layer.lock(base .. "/lock", "sh")
  t.ok(l3 and l4 and l3:held(), "lock: shared locks share")
  t.ok(layer.lock(base .. "/lock", "ex") == nil, "lock: exclusive waits for shared ones")
  l3:close() l4:close()
  t.ok(layer.machine():match("^%w"), "machine")
end

-- scan: the members of an archive, small ones with their content.
do
  local s = assert(layer.scan(tars .. "/good.tar.gz", { small = 4 }))
  local seen = {}
  for _, e in ipairs(s.entries) do seen[e.name] = e end
  t.ok(seen["etc/hostname"] and seen["etc/hostname"].type == "f" and s.files["etc/hostname"] == "box\n",
    "scan: small files come with their content")
  t.ok(seen["ro/file"] and not s.files["ro/file"], "scan: larger ones only listed")
  t.ok(seen["usr/bin/tool2"].type == "h" and seen["usr/bin/tool2"].link == "usr/bin/tool", "scan: hard links")
  local bad, _, code = layer.scan(tars .. "/truncated.tar.gz")
  t.ok(bad == nil and code == "bad_image", "scan: a truncated archive")
end

layer.remove(base)
t.done()

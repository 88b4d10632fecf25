-- needs: docker
-- Files in and out of a box, through exec stdin, so read-only roots and
-- tmpfs mounts work too; sizes are bounded by policy.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local box = H.box()
local blob = {}
for i = 0, 255 do blob[#blob + 1] = string.char(i) end
blob = table.concat(blob):rep(1000)
tap.ok(box:write_file("/work/sub/dir/blob.bin", blob), "write a binary file into a new directory")
tap.is(box:read_file("/work/sub/dir/blob.bin"), blob, "read it back byte for byte")
tap.is(assert(box:exec("wc -c < /work/sub/dir/blob.bin")).stdout, "256000\n", "the box sees the same size")
tap.ok(box:write_file("/work/empty", ""), "an empty file")
tap.is(box:read_file("/work/empty"), "", "reads back empty")
local big = string.rep("0123456789", 2 * 1024 * 1024)
tap.ok(box:write_file("/tmp/big", big), "a 20 MB file")
tap.is(#assert(box:exec("cat /tmp/big | wc -c")).stdout, 9, "arrives whole")

local x, err, code = box:read_file("/no/such/file")
tap.is(code, "not_found", "reading a missing file")
tap.like(err, "No such file", "with the box's reason")
x, err, code = box:read_file("/tmp/big", { max_bytes = 1000 })
tap.is(code, "too_large", "a file over the read limit")
sbx.use_policy { files = { max_write = 100 } }
x, err, code = box:write_file("/tmp/x", string.rep("x", 101))
tap.is(code, "too_large", "a write over the policy limit")
sbx.use_policy { files = { max_write = 256 * 1024 * 1024 } }
tap.checkerr("path must be", function() box:write_file(nil, "x") end)
box:close()

-- A read-only root with a tmpfs work dir: the archive API would fail here.
local ro = H.box { read_only = true, tmpfs = { ["/work"] = "rw,exec,size=16m" } }
tap.ok(ro:write_file("/work/hello.txt", "hi"), "write into tmpfs under a read-only root")
tap.is(ro:read_file("/work/hello.txt"), "hi", "and read it back")
x, err, code = ro:write_file("/etc/nope", "x")
tap.is(code, "write_failed", "the read-only root refuses")
tap.like(err, "Read%-only file system", "and says why")
ro:close()

-- Bound from the host (a daemon on this host), the agent needs nothing
-- writable in the box: a read-only root with no tmpfs at all runs on it.
local bro = H.box { image = H.busybox, read_only = true, transport = "agent" }
tap.ok(bro.handle.agent_bound ~= nil, "read-only root, no tmpfs, the daemon on this host: the agent is bound in")
tap.is(bro:exec("echo bound").stdout, "bound\n", "and runs commands")
bro:close()

-- Uploaded (a remote daemon's way, as policy.docker.agent_bind = false
-- makes it here): on a read-only root the agent goes to a tmpfs mounted
-- with exec; where there is none, "auto" falls back to the exec transport
-- and says why, and "agent" refuses the box.
sbx.use_policy { docker = { agent_bind = false } }
local bytes = {}
for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
bytes = table.concat(bytes):rep(3)
local aro = H.box { image = H.busybox, read_only = true, tmpfs = { ["/work"] = "rw,exec,size=16m" }, transport = "auto" }
tap.is(aro.transport, "agent", "read-only root with an exec tmpfs: the agent is placed there")
tap.ok(aro:write_file("/work/b.bin", bytes), "write every byte value through the agent")
tap.is(aro:read_file("/work/b.bin"), bytes, "and read them back exactly")
aro:close()
-- No tmpfs at all: no writable directory (Docker), unless the daemon
-- mounts a tmpfs on a read-only root's /tmp by itself (Podman).
local bare = H.box { image = H.busybox, read_only = true, transport = "auto" }
if bare.transport == "exec" then
  tap.like(bare.transport_reason, "no writable directory", "read-only root, no tmpfs: exec, and transport_reason says why")
else
  tap.like(bare:exec("grep ' /tmp ' /proc/mounts").stdout, "^tmpfs /tmp ",
    "read-only root, no tmpfs asked: the agent only where the daemon mounted a tmpfs on /tmp itself")
end
bare:close()
-- (/tmp explicitly noexec below.)
local fro = H.box { image = H.busybox, read_only = true, tmpfs = { ["/tmp"] = "rw,noexec,size=8m" }, transport = "auto" }
tap.is(fro.transport, "exec", "read-only root, only a noexec tmpfs: auto falls back to the exec transport")
tap.like(fro.transport_reason, "Permission denied", "box.transport_reason says why")
tap.is(fro:exec("echo still").stdout, "still\n", "and its commands run")
fro:close()
local nbox, nerr, ncode = sbx.box { image = H.busybox, read_only = true, tmpfs = { ["/tmp"] = "rw,noexec,size=8m" },
  transport = "agent" }
tap.ok(nbox == nil and ncode ~= nil, "transport = \"agent\" where it cannot be placed (a noexec tmpfs): no box (" ..
  tostring(ncode) .. ")", tostring(nerr))
tap.like(nerr, "Permission denied", "and the message says why")
if nbox then nbox:close() end
sbx.use_policy { docker = { agent_bind = true } }
tap.done()

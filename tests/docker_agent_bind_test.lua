-- The agent bound read-only from the host (policy.docker.agent_bind), on
-- the real daemon: where the daemon is on this host a box gets the host's
-- copy of sbx-agent as a read-only bind instead of an upload, from a file
-- named by its content in a directory only sbx's user may write; a file of
-- other bytes at that name is replaced before use; a directory another
-- user owns and a box with CAP_SYS_ADMIN fall back to the upload, and
-- every box still runs on the agent; a bound agent that does not run is
-- placed the other way (the transport's retry, on the fake backend).
-- needs: docker, root
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local core = sbx.core
local S = core.sandbox

local arch = (io.open("/proc/sys/kernel/arch"):read("l"))
local bin = core.agent.binary(arch)
local hash = core.sigv4.sha256(bin):sub(1, 16)
local base = os.tmpname()
os.remove(base)
assert(S.mkdir(base, tonumber("755", 8)))

local read = H.slurp
-- Whether the box holds an agent that is not a mountpoint (an upload).
local function uploaded(box)
  local r = box:exec("for p in /.sbx-agent-*; do [ -e \"$p\" ] && ! grep -q \" $p \" /proc/mounts && echo \"$p\"; done; true")
  return r.stdout ~= ""
end

-- A bound box ---------------------------------------------------------------------------
local dir = base .. "/agent"
sbx.use_policy { docker = { agent_dir = dir } }
-- Other bytes already at the file's name: replaced before any box uses it.
assert(S.mkdir(dir, tonumber("700", 8)))
local file = string.format("%s/sbx-agent-%s-%s", dir, arch, hash)
assert(S.install(file, "#!/bin/sh\ntouch /tmp/pwned\n", tonumber("755", 8)))
local box = H.box { image = H.busybox, transport = "agent" }
tap.is(box.transport, "agent", "the box runs on the agent")
tap.is(box.handle.agent_bound, "/.sbx-agent-" .. hash, "its agent is the host's copy, named by its content")
tap.ok(read(file) == bin, "a file of other bytes at that name was replaced by libsbx's agent before use")
local fst = S.stat(file)
tap.is(string.format("%o", fst.mode), "555", "the host file is mode 0555")
tap.is(string.format("%o", S.stat(dir).mode), "700", "in a directory only sbx's user may enter")
local m = box:exec("grep ' " .. box.handle.agent_bound .. " ' /proc/mounts")
tap.like(m.stdout, "^%S+ %S+ %S+ ro[, ]", "inside the box it is a read-only mount (" .. m.stdout:gsub("%s+$", "") .. ")")
tap.is(uploaded(box), false, "no copy was uploaded beside it")
local r = box:exec("echo x > " .. box.handle.agent_bound .. " 2>&1; rm -f " .. box.handle.agent_bound ..
  " 2>&1; test -e /tmp/pwned && echo pwned; echo done")
tap.like(r.stdout, "done\n$", "root in the box tries to rewrite and remove it")
tap.ok(not r.stdout:find("pwned"), "the planted script never ran")
tap.ok(read(file) == bin, "and the host's file is unchanged")
tap.is(box:exec({ "/bin/echo", "fine" }).stdout, "fine\n", "commands run")
box:close()

-- Falls back to the upload ---------------------------------------------------------------
local function upload_box(what, opts)
  opts.image, opts.transport = H.busybox, "agent"
  local b, err = sbx.box(opts)
  tap.ok(b and b.transport == "agent", what .. ": the box still runs on the agent", err)
  if not b then return end
  tap.is(b.handle.agent_bound, nil, what .. ": no bind")
  tap.is(uploaded(b), true, what .. ": the agent was uploaded")
  tap.is(b:exec("echo ok").stdout, "ok\n", what .. ": commands run")
  b:close()
end
upload_box("CAP_SYS_ADMIN (a box that could remount the bind)", { cap_add = { "SYS_ADMIN" } })

local other = base .. "/other"
assert(S.mkdir(other, tonumber("700", 8)))
H.sh("chown 65534 " .. other)
sbx.use_policy { docker = { agent_dir = other } }
upload_box("a directory another user owns", {})
tap.is(read(string.format("%s/sbx-agent-%s-%s", other, arch, hash)), nil, "nothing was written into it")

-- A source mount's noexec does not reach the bind (the runtime's read-only
-- remount clears it): the bound agent still runs.
local nx = base .. "/noexec"
assert(S.mkdir(nx, tonumber("700", 8)))
local out, code = H.sh("mount -t tmpfs -o noexec,mode=700 sbx-test " .. nx)
if code ~= 0 then
  tap.skip("a bound file from a noexec mount", "cannot mount a tmpfs here: " .. out)
else
  sbx.use_policy { docker = { agent_dir = nx } }
  local b = H.box { image = H.busybox, transport = "agent" }
  if b.handle.daemon.podman then
    -- Podman keeps the source's noexec on the bind: the agent does not
    -- run from it, and the backend places it the other way (extra.retry).
    tap.ok(b.handle.agent_bound == nil and b:exec("echo nx").stdout == "nx\n",
      "Podman: a bound file from a noexec mount does not run; the agent is uploaded and the box works")
  else
    tap.ok(b.handle.agent_bound ~= nil and b:exec("echo nx").stdout == "nx\n",
      "a bound file from a noexec mount on the host runs in the box")
  end
  b:close()
  H.sh("umount " .. nx)
end

-- Where a bound agent does not run (SELinux's labels, which this machine
-- lacks), the backend says it can place it another way (extra.retry) and
-- the transport asks once more: the contract, on a fake backend whose
-- first channel ends before any hello.
local fake = require "fake_backend"
package.loaded["sbx.backends.fake"] = fake
local A = core.agent
local calls, retries = 0, 0
local function channel(says_hello)
  local sink = core.stream.sink { chunks = true, capture = { stdout = { head = 0, tail = 0 },
    stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } } }
  local ch = {}
  function ch.write() return 0 end
  function ch.wait(_, t) return sink:wait(t) end
  function ch.take(_, raw) return sink:take(raw) end
  function ch.info() return sink:info() end
  function ch.captured(_, name) return sink:captured(name) end
  function ch.close() if not sink:info().eof then sink:finish() end end
  core.spawn(function()
    if says_hello then
      local hello = string.pack(">Bs4", 11, string.pack(">I4", A.VERSION)) .. string.pack(">Bs4", 12, string.pack(">I4", 1))
      sink:push("stdout", A.encode(0x01, 0, hello))
    else
      sink:push("stderr", "exec /.sbx-agent: permission denied")
      sink:finish()
    end
  end)
  return ch
end
local function fake_box(can_retry)
  calls, retries = 0, 0
  local placed_other = false
  fake.agent_channel = function()
    calls = calls + 1
    local extra = {}
    if not placed_other then
      extra.retry = function()
        retries = retries + 1
        placed_other = can_retry
        return can_retry
      end
    end
    return channel(placed_other), false, extra
  end
  local b, err, ecode = sbx.box { backend = "fake", transport = "agent" }
  fake.agent_channel = nil
  return b, err, ecode
end
local fb, ferr = fake_box(true)
tap.ok(fb and fb.transport == "agent", "a channel that ends before the hello, with another way: the box runs on the agent", ferr)
tap.ok(calls == 2 and retries == 1, "placed twice, one retry (" .. calls .. ", " .. retries .. ")")
if fb then fb:close() end
fb, ferr = fake_box(false)
tap.ok(fb == nil and calls == 1 and retries == 1, "without another way: no box, one attempt (" .. calls .. ")", ferr)
tap.like(ferr, "permission denied", "and the error says why")
H.sh("rm -rf " .. base)
tap.done()

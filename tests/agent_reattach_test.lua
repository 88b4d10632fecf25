-- needs: docker, socat
-- A dropped channel to the agent is opened again and nothing is lost: the
-- connection to the daemon is cut under running commands (a real socket
-- proxy whose connections are killed), and a background process, a command
-- streaming output, a command reading stdin and a session all go on, every
-- byte exactly once. The way back is guarded: a command in the box that
-- finds the agent's attach socket gets nothing without the box's key (as
-- root) or not even a challenge (as another user); a process that answers
-- on that socket without the key is refused by the host. Without a way back
-- (none allowed, or none possible) the pending commands fail with
-- agent_lost and the agent ends its commands after its grace.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local core = sbx.core

sbx.use_policy { agent = { reattach_timeout = 20, attach_timeout = 5 } }

-- A proxy in front of the daemon: its per-connection children can be killed
-- (a dropped connection), its listener stays.
local sock = string.format("/tmp/sbx-reattach-%d.sock", core.pid())
os.remove(sock)
local pgid = H.sh(string.format("setsid socat UNIX-LISTEN:%s,fork UNIX-CONNECT:%s >/dev/null 2>&1 & echo $!", sock, H.daemon_socket())):match("%d+")
for _ = 1, 100 do
  if core.path_type(sock) then break end
  sbx.sleep(0.05)
end
local function cut() H.sh("pkill -9 -P " .. pgid) end

local box = assert(sbx.box { image = H.image, docker_host = "unix://" .. sock, transport = "agent" })
tap.is(box.transport, "agent", "a box on the agent, through the proxy")
local st = box.tstate
local agent_pid = st.agent_pid

local function host_sh(cmd) return (H.sh(cmd):gsub("%s+$", "")) end
local want_md5 = host_sh("seq 1 2000000 | md5sum")
local lines = {}
for i = 1, 200000 do lines[i] = string.format("%07d", i) end
local input = table.concat(lines, "\n") .. "\n"
local path = os.tmpname()
local w = assert(io.open(path, "wb"))
w:write(input)
w:close()
local want_sha = host_sh("sha256sum < " .. path .. " | cut -d' ' -f1")
os.remove(path)

local session = assert(box:session())
assert(session:exec("cd /tmp && X=kept"))

local bg = assert(box:spawn("i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo tick $i; sleep 0.05; done"))
local streaming = sbx.spawn(function()
  return { box:exec("seq 1 2000000 | md5sum; seq 1 2000000 | wc -l >&2", { timeout = 120 }) }
end)
local reading = sbx.spawn(function()
  return { box:exec("sleep 0.5; sha256sum | cut -d' ' -f1", { stdin = input, timeout = 120 }) }
end)
local ticker = sbx.spawn(function()
  return { box:exec("for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; sleep 0.1; done", { timeout = 120 }) }
end)
sbx.sleep(0.2)
-- Three drops while they run.
for _ = 1, 3 do
  cut()
  sbx.sleep(0.4)
end

local r = sbx.wait(streaming)[1]
tap.is(r and r.stdout, want_md5 .. "\n", "2,000,000 lines streamed across three drops: every byte once (md5)")
tap.is(r and r.stderr, "2000000\n", "stderr kept apart across the drops")
tap.is(r and r.exit_code, 0, "with its exit status")
r = sbx.wait(reading)[1]
tap.is(r and r.stdout, want_sha .. "\n", "1.6 MB of stdin sent across the drops: the command read it exactly (sha256)")
r = sbx.wait(ticker)[1]
tap.is(r and r.stdout, "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", "a slow command's output in order, nothing doubled")

local view = box:wait(bg, 30)
tap.is(view and view.exit_code, 0, "the background process ran to its end across the drops")
local out = box:output(bg, { max_bytes = 100000 })
local n, in_order = 0, true
for line in out.text:gmatch("[^\n]+") do
  n = n + 1
  if line ~= "tick " .. n then in_order = false end
end
tap.ok(n == 60 and in_order, "its log is whole: 60 ticks in order (" .. n .. ")")

local s = session:exec("echo $X; pwd")
tap.is(s and s.stdout, "kept\n/tmp\n", "the session kept its shell: variables and directory")
tap.ok((st.reattached or 0) >= 1, "the channel was opened again (" .. tostring(st.reattached) .. " times)")
tap.is(st.agent_pid, agent_pid, "to the same agent, not a new one")
tap.is(box:exec("echo fine").stdout, "fine\n", "commands go on")

-- The attach socket from inside the box ------------------------------------------------
local name = box:exec("grep -o '@sbx-agent-[0-9a-f]*' /proc/net/unix | head -1").stdout:gsub("%s+$", ""):sub(2)
tap.like(name, "^sbx%-agent%-%x+$", "a command can find the agent's attach socket (" .. name .. ")")
local bin = box:exec("ls /.sbx-agent-* | head -1").stdout:gsub("%s+$", "")
-- As root: the challenge comes, a wrong answer ends the connection.
-- (The relay ends when its input does: the input stays open a while.)
r = box:exec(string.format("(printf '%%0112d' 0; sleep 2) | %s attach %s | head -c 100; echo", bin, name))
tap.like(r.stdout, "^SBXA%x+\n$", "root gets the challenge, and after a wrong proof not one byte more")
tap.is(#r.stdout, 37, "exactly the challenge (" .. #r.stdout .. " bytes)")
-- As another user: not even the challenge.
box:exec(string.format("cp %s /tmp/relay && chmod 755 /tmp/relay", bin))
r = box:exec(string.format("(echo x; sleep 2) | /tmp/relay attach %s | head -c 100; echo end", name), { user = "nobody" })
tap.is(r.stdout, "end\n", "another user's connection is closed at once, without a challenge")
local before = st.reattached
tap.is(box:exec("echo still").stdout, "still\n", "the box's channel is untouched by both")
tap.is(st.reattached, before, "no re-attach was needed")

-- Grace: with no way back, the agent ends its commands and leaves --------------------
sbx.use_policy { agent = { reattach_timeout = 20, attach_timeout = 5, reattach_grace = 2 } }
local gbox = assert(sbx.box { image = H.image, docker_host = "unix://" .. sock, transport = "agent" })
assert(gbox:spawn("sleep 300"))
local gpid = gbox.tstate.agent_pid
local backend = gbox.impl
local attach = backend.agent_attach
backend.agent_attach = function() return nil, "the test allows no way back", "unsupported" end
local pending = sbx.spawn(function() return { gbox:exec("sleep 60") } end)
sbx.sleep(0.3)
cut()
r = sbx.wait(pending)
backend.agent_attach = attach
tap.is(r[3], "unsupported", "without a way back the pending command fails at once (" .. tostring(r[2]) .. ")")
local function in_box(cmd) return H.sh("docker exec " .. gbox.id .. " sh -c '" .. cmd .. "'") end
local left
for _ = 1, 60 do
  left = in_box('ps -eo pid,args | grep -v grep | grep -c "sleep 300"'):gsub("%s+$", "")
  if left == "0" then break end
  sbx.sleep(0.1)
end
tap.is(left, "0", "the agent ended its commands after its grace")
tap.is(in_box("kill -0 " .. gpid .. " 2>/dev/null && echo alive || echo gone"):gsub("%s+$", ""), "gone", "and left")
tap.is(gbox:exec("echo new").stdout, "new\n", "the next command places a fresh agent")
gbox:close()

-- Keep-alives: a proxy that cuts connections idle for 3 s (as ECS Exec
-- and load balancers cut idle streams) never cuts a box that pings every
-- 0.5 s; a box that pings rarely is cut, and comes back by re-attaching.
-- (3 s, not less: the proxy also carries the create requests, and a loaded
-- daemon can be silent for over a second while it creates a container.)
do
  local isock = string.format("/tmp/sbx-idle-%d.sock", core.pid())
  os.remove(isock)
  local ipg = H.sh(string.format("setsid socat -T 3 UNIX-LISTEN:%s,fork UNIX-CONNECT:%s >/dev/null 2>&1 & echo $!",
    isock, H.daemon_socket())):match("%d+")
  for _ = 1, 100 do
    if core.path_type(isock) then break end
    sbx.sleep(0.05)
  end
  local pinged = assert(sbx.box { image = H.busybox, docker_host = "unix://" .. isock, transport = "agent",
    policy = { agent = { ping_interval = 0.5, ping_timeout = 5 } } })
  local rare = assert(sbx.box { image = H.busybox, docker_host = "unix://" .. isock, transport = "agent",
    policy = { agent = { ping_interval = 30 } } })
  sbx.sleep(7)
  tap.is(pinged:exec("echo alive").stdout, "alive\n", "keep-alives: after 7 s idle behind a 3 s idle cut, the box answers")
  tap.is(pinged.tstate.reattached, nil, "on the channel it always had (no re-attach)")
  tap.is(rare:exec("echo back").stdout, "back\n", "without keep-alives the idle channel is cut, and the box answers")
  tap.ok((rare.tstate.reattached or 0) >= 1, "after re-attaching (" .. tostring(rare.tstate.reattached) .. ")")
  pinged:close(); rare:close()
  H.sh("kill -- -" .. ipg)
  os.remove(isock)
end

-- reattach_grace = 0: a drop is the end of the agent at once --------------------------
sbx.use_policy { agent = { reattach_grace = 0 } }
local zbox = assert(sbx.box { image = H.image, docker_host = "unix://" .. sock, transport = "agent" })
assert(zbox:spawn("sleep 300"))
pending = sbx.spawn(function() return { zbox:exec("sleep 60") } end)
sbx.sleep(0.3)
cut()
r = sbx.wait(pending)
tap.is(r[3], "agent_lost", "grace 0: the pending command fails with agent_lost")
for _ = 1, 50 do
  left = H.sh("docker exec " .. zbox.id .. " sh -c 'ps -eo args | grep -v grep | grep -c \"sleep 300\"'"):gsub("%s+$", "")
  if left == "0" then break end
  sbx.sleep(0.1)
end
tap.is(left, "0", "and the agent ended its commands with the channel")
zbox:close()

-- The host checks the agent: a process on the socket without the key is refused ------
local fake = require "fake_backend"
package.loaded["sbx.backends.fake"] = fake
local A = core.agent
-- A channel whose far end is the test: script(sink, bytes) sees each write.
local function fake_channel(script)
  local sink = core.stream.sink { chunks = true, capture = { stdout = { head = 0, tail = 0 },
    stderr = { head = 0, tail = 0 }, output = { head = 0, tail = 0 } } }
  local ch = {}
  function ch.write(_, b) if script then script(sink, b) end return 0 end
  function ch.wait(_, t) return sink:wait(t) end
  function ch.take(_, raw) return sink:take(raw) end
  function ch.info() return sink:info() end
  function ch.close() if not sink:info().eof then sink:finish() end end
  return ch, sink
end
local first
fake.agent_channel = function()
  -- Answers the host's first PING ("hello") as an agent with its attach
  -- socket open does: AGENT_ACK, then PONG.
  local ch, sink = fake_channel(function(sink, b)
    if b:find("hello", 1, true) then
      sink:push("stdout", A.encode(0xB2, 0, string.pack(">I8", 0)) .. A.encode(0xB1, 0, "hello"))
    end
  end)
  first = sink
  local hello = string.pack(">Bs4", 11, string.pack(">I4", A.VERSION)) .. string.pack(">Bs4", 12, string.pack(">I4", 1))
  sink:push("stdout", A.encode(0x01, 0, hello))
  return ch, false, {}
end
local answered = 0
fake.agent_attach = function()
  local ch, sink = fake_channel(function(sink, b)
    if #b == 112 then
      answered = answered + 1
      sink:push("stdout", string.rep("ab", 40))   -- a "proof" made without the key
    end
  end)
  sink:push("stdout", "SBXA" .. string.rep("0", 32))
  return ch
end
sbx.use_policy { agent = { reattach_grace = 60 } }
local fbox = assert(sbx.box { backend = "fake", transport = "agent" })
tap.is(fbox.transport, "agent", "a fake backend's box on a scripted agent")
local hung = sbx.spawn(function() return { fbox:exec("sleep 10", { timeout = 30 }) } end)
sbx.sleep(0.05)
first:finish()   -- the channel drops
r = sbx.wait(hung)
tap.is(r[3], "agent_lost", "an impostor on the attach socket: the pending command fails with agent_lost")
tap.like(r[2], "could not prove the box's key", "because it could not prove the key")
tap.is(answered, 1, "after one attempt (no retry against an impostor)")
fbox:close()

-- An agent that answers the first PING without AGENT_ACK has no attach
-- socket: its box works, and a drop ends its commands at once, no attach.
local attaches = 0
fake.agent_channel = function()
  local ch, sink = fake_channel(function(sink, b)
    if b:find("hello", 1, true) then sink:push("stdout", A.encode(0xB1, 0, "hello")) end
  end)
  first = sink
  local hello = string.pack(">Bs4", 11, string.pack(">I4", A.VERSION)) .. string.pack(">Bs4", 12, string.pack(">I4", 1))
  sink:push("stdout", A.encode(0x01, 0, hello))
  return ch, false, {}
end
fake.agent_attach = function() attaches = attaches + 1 end
local nbox = assert(sbx.box { backend = "fake", transport = "agent" })
hung = sbx.spawn(function() return { nbox:exec("sleep 10", { timeout = 30 }) } end)
sbx.sleep(0.05)
first:finish()
r = sbx.wait(hung)
tap.is(r[3], "agent_lost", "no AGENT_ACK to the first ping: a drop fails the pending command")
tap.is(attaches, 0, "and no attach is tried")
nbox:close()

H.sh("kill -- -" .. pgid)
tap.done()

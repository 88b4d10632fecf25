-- needs: docker
-- The agent transport under attack and faults, on Docker: a hostile command
-- cannot reach the agent's channel (its fds, its memory), cannot forge an
-- exit status by printing frame-shaped bytes, cannot get a replaced agent
-- binary run; an agent that is killed or stops answering fails the pending
-- commands with agent_lost, never a hang, and the next command places a
-- fresh agent. A hostile "agent" that sends malformed frames (a fake
-- backend's channel here) is an error on that box only.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local core = sbx.core

sbx.use_policy { agent = { ping_interval = 1, ping_timeout = 1, attach_timeout = 2 } }
local box = H.box { image = H.image, transport = "agent" }
tap.is(box.transport, "agent", "the box runs on the agent")

-- The agent's pid, as a command in the box sees it.
local function agent_pid(b)
  -- /proc/<agent>/exe is unreadable (undumpable); its name in stat is not.
  -- The agent, not one of its per-command supervisors (forks with its
  -- name): the one whose parent is outside the box (PPid 0).
  local r = (b or box):exec([[for p in /proc/[0-9]*; do s=$(cat $p/stat 2>/dev/null); case "$s" in *"(.sbx-agent"*) set -- $s; [ "$4" = 0 ] && echo ${p#/proc/};; esac; done]])
  return r and r.stdout:match("(%d+)")
end
local pid = agent_pid()
tap.ok(pid ~= nil, "the agent is a process in the box (" .. tostring(pid) .. ")")

-- Its channel and memory are out of reach, although commands run as root.
local r = box:exec("id -u; ls /proc/" .. pid .. "/fd 2>&1; echo x > /proc/" .. pid .. "/fd/1 && echo wrote || echo refused; " ..
  "cat /proc/" .. pid .. "/environ >/dev/null 2>&1 && echo env || echo noenv; " ..
  "dd if=/proc/" .. pid .. "/mem bs=1 count=1 skip=4096 >/dev/null 2>&1 && echo mem || echo nomem")
tap.like(r.stdout, "^0\n", "the command runs as root")
tap.like(r.stdout, "refused\n", "writing into the agent's channel (/proc/<agent>/fd/1) is refused")
tap.like(r.stdout, "noenv\n", "its environment is unreadable")
tap.like(r.stdout, "nomem\n$", "its memory is unreadable (undumpable: no ptrace access)")
-- ptrace from inside the box: a static program of the test's own (the
-- images have no debugger), run as root in the box.
do
  local src = os.tmpname() .. ".c"
  local bin = src:gsub("%.c$", "")
  local f = assert(io.open(src, "w"))
  f:write([[
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
int main(int argc, char **argv) {
  long r = ptrace(PTRACE_ATTACH, atoi(argv[1]), 0, 0);
  printf("attach %ld %s\n", r, r == 0 ? "ok" : strerror(errno));
  r = ptrace(PTRACE_SEIZE, atoi(argv[1]), 0, 0);
  printf("seize %ld %s\n", r, r == 0 ? "ok" : strerror(errno));
  return 0;
}
]])
  f:close()
  local out, code = H.sh(string.format("cc -static -O -o %s %s", bin, src))
  assert(code == 0, "cannot build the ptrace program: " .. out)
  local pf = assert(io.open(bin, "rb"))
  local prog = pf:read("a")
  pf:close()
  os.remove(src); os.remove(bin)
  assert(box:write_file("/tmp/tracer", prog))
  r = box:exec("chmod 700 /tmp/tracer && /tmp/tracer " .. pid)
  tap.like(r.stdout, "^attach %-1 Operation not permitted\nseize %-1 Operation not permitted\n$",
    "PTRACE_ATTACH and PTRACE_SEIZE on the agent fail, as root in the box", r.stdout .. r.stderr)
  r = box:exec("sleep 30 & /tmp/tracer $!; kill $!")
  tap.like(r.stdout, "^attach 0 ok", "while the same program may trace an ordinary process of the box (the refusal is the agent's own)", r.stdout .. r.stderr)
end

-- Printed frames are output, not frames.
local fake_exit = string.pack(">BBI4I4i4", 0x93, 0, 1, 4, 0) .. string.pack(">BBI4I4", 0x94, 0, 1, 0)
tap.ok(box:write_file("/tmp/frames.bin", fake_exit:rep(50)), "a file of frame-shaped bytes")
r = box:exec("cat /tmp/frames.bin /tmp/frames.bin >&2; cat /tmp/frames.bin; exit 7")
tap.is(r.exit_code, 7, "printing EXIT and DONE frames changes no exit status")
tap.is(r.stdout_bytes, #fake_exit * 50, "they arrive as the command's output, byte for byte")

-- A replaced agent binary is never run. Bound from the host (a daemon on
-- this host): the box cannot replace the file, not even as root (a
-- read-only mountpoint), and a lost agent's successor is the host's copy.
tap.ok(box.handle.agent_bound ~= nil, "the agent is bound read-only from the host (" .. tostring(box.handle.agent_bound) .. ")")
local REPLACE = "p=$(ls -d /.sbx-agent-* | head -1); rm -f $p; printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > $p; " ..
  "chmod +x $p; echo $p; head -c 4 $p | od -An -c | tr -d ' \\n'; echo"
r = box:exec(REPLACE)
local old_path, magic = r.stdout:match("^(%S+)\n(.-)\n$")
tap.is(magic, "177ELF", "root in the box cannot remove, rewrite or chmod the bound agent (" .. r.stderr:gsub("%s+", " ") .. ")")
local function kill_and_back(b, agent)
  local t0 = sbx.now()
  local slow = sbx.spawn(function() return { b:exec("sleep 30", { timeout = 60 }) } end)
  sbx.sleep(0.3)
  b:exec({ "kill", "-9", agent })
  local res = sbx.wait(slow)
  tap.ok(res[1] == nil and res[3] == "agent_lost", "killing the agent fails the pending command with agent_lost", res[2])
  tap.ok(sbx.now() - t0 < 10, "at once, not at its timeout")
  r = b:exec("echo back; test -e /tmp/pwned && echo pwned || echo clean")
  tap.is(r and r.stdout, "back\nclean\n", "the next command runs on a fresh agent, not the replaced file")
  return b:exec("ls -d /.sbx-agent-*").stdout
end
local paths = kill_and_back(box, pid)
tap.is(paths, old_path .. "\n", "the fresh agent is the bound host copy again, the only one in the box")

-- Uploaded per box (a remote daemon's way, policy.docker.agent_bind =
-- false): the box may replace its copy; a lost agent is placed anew at a
-- new path, never the one left in the box.
sbx.use_policy { docker = { agent_bind = false } }
local ubox = H.box { image = H.image, transport = "agent" }
sbx.use_policy { docker = { agent_bind = true } }
tap.ok(ubox.transport == "agent" and ubox.handle.agent_bound == nil, "with agent_bind = false the agent is uploaded")
do
  local upid = agent_pid(ubox)
  r = ubox:exec(REPLACE)
  old_path, magic = r.stdout:match("^(%S+)\n(.-)\n$")
  tap.is(magic, "#!/b", "an uploaded copy can be replaced by root in the box")
  paths = kill_and_back(ubox, upid)
  -- The replaced copy, the relay that looked for the dead agent, the new agent.
  tap.ok(select(2, paths:gsub("\n", "")) >= 2 and old_path ~= "", "placed anew beside the replaced copy (" .. paths:gsub("\n", " ") .. ")")
end
ubox:close()

-- An agent that stops answering: its pings go unanswered, agent_lost.
local AGENTS = [[for p in /proc/[0-9]*; do s=$(cat $p/stat 2>/dev/null); case "$s" in *"(.sbx-agent"*) set -- $s; [ "$4" = 0 ] && echo ${p#/proc/};; esac; done]]
local new_pid = agent_pid()
-- Stopped from outside (a docker exec of its own), not by one of its jobs.
-- Every agent-named process outside a job: a relay left from the earlier
-- loss may be listed before the agent (each is stopped, the agent surely).
local all = box:exec(AGENTS)
local pids = (all and all.stdout or new_pid or ""):gsub("%s+", " ")
local t0 = sbx.now()
H.sh("docker exec " .. box.id .. " kill -STOP " .. pids)
-- The docker CLI holds sbx's loop while it runs (io.popen): with pings a
-- second apart the loss may be noticed before the next command starts, and
-- that command then runs on a fresh agent. Either way no command waits on
-- the stopped agent past ping_interval + ping_timeout.
local r2, err, code = box:exec("echo after-stop", { timeout = 30 })
local took = sbx.now() - t0
if r2 then
  local now_agents = (box:exec(AGENTS) or {}).stdout or ""
  local fresh = true
  for p in pids:gmatch("%d+") do if (" " .. now_agents:gsub("%s+", " ") .. " "):find(" " .. p .. " ", 1, true) and
      H.sh("docker exec " .. box.id .. " cat /proc/" .. p .. "/stat"):match("%) T ") then fresh = false end end
  tap.ok(r2.stdout == "after-stop\n" and fresh, "a stopped agent: lost after its pings, the command ran on a fresh agent",
    "agents now: " .. now_agents:gsub("%s+", " ") .. "; stopped: " .. pids)
else
  tap.ok(code == "agent_lost", "a stopped agent: agent_lost after its pings (" .. tostring(err) .. ")")
end
tap.ok(took < 10, "within ping_interval + ping_timeout, not the command's timeout (" .. string.format("%.1f s", took) .. ")")
tap.is(box:exec("echo again").stdout, "again\n", "and the box goes on with a fresh agent")
box:close()

-- Another box is untouched by all this.
local other = H.box { image = H.busybox, transport = "agent" }
tap.is(other:exec("echo fine").stdout, "fine\n", "another box is untouched")
other:close()

-- A hostile agent: a fake backend whose channel carries what the test
-- writes. Malformed frames are an error on that box, never a crash.
local fake = require "fake_backend"
package.loaded["sbx.backends.fake"] = fake
local A = core.agent
local function hostile(bytes_after_hello)
  local sink
  fake.agent_channel = function()
    sink = core.stream.sink { chunks = true, capture = { stdout = { head = 0, tail = 0 },
      stderr = { head = 0, tail = 0 }, output = { head = 0, tail = 0 } } }
    local ch = {}
    function ch.write(_, b) return 0 end
    function ch.wait(_, t) return sink:wait(t) end
    function ch.take(_, raw) return sink:take(raw) end
    function ch.info() return sink:info() end
    function ch.close() if not sink:info().eof then sink:finish() end end
    core.spawn(function()
      local hello = string.pack(">Bs4", 11, string.pack(">I4", A.VERSION)) .. string.pack(">Bs4", 12, string.pack(">I4", 1))
      sink:push("stdout", A.encode(0x01, 0, hello))
      core.sleep(0.05)
      sink:push("stdout", bytes_after_hello)
    end)
    return ch, false
  end
  local b = assert(sbx.box { backend = "fake", transport = "agent" })
  local rr, e, c = b:exec("true", { timeout = 5 })
  b:close()
  fake.agent_channel = nil
  return rr, e, c
end
local rr, e, c = hostile(string.pack(">BBI4I4", 0x91, 0, 1, (1 << 20) + 1))
tap.ok(rr == nil and c == "agent_lost" and tostring(e):find("longer than the protocol allows"), "an oversized frame: agent_lost, said why (" .. tostring(e) .. ")")
rr, e, c = hostile(A.encode(0x93, 77, string.pack(">i4", 0)))
tap.ok(rr == nil and c == "agent_lost" and tostring(e):find("never started"), "a frame for a job never started: agent_lost (" .. tostring(e) .. ")")
rr, e, c = hostile(A.encode(0x91, 1, "\9garbage"))
tap.ok(rr == nil and c == "agent_lost", "output for an unknown stream: agent_lost (" .. tostring(e) .. ")")
rr, e, c = hostile(A.encode(0xEE, 1, ""))
tap.ok(rr == nil and c == "agent_lost", "an unknown frame type: agent_lost (" .. tostring(e) .. ")")
tap.done()

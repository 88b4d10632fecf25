-- needs: docker
-- True words about a box's agent, on Docker: a lost agent takes every
-- process of the box with it before the next command starts; an agent a
-- command stops is given up at that command's timeout and replaced, so the
-- next command runs; a kill nobody confirmed is never reported as a kill;
-- a daemon that dies mid-command is daemon_unavailable, not a timeout.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local box = H.box { image = H.image, transport = "agent" }
tap.is(box.transport, "agent", "the box runs on the agent")

-- The command's supervisor is its shell's parent; the agent is the
-- supervisor's parent (field 4 of /proc/PID/stat).
local AGENT_OF = [[sup=$PPID; read -r s < /proc/$sup/stat; s=${s##*) }; set -- $s; agent=$2]]

-- 1. A command that kills its supervisor, then the agent: it is agent_lost,
-- and nothing it left runs on under the box's init.
local r, err, code = box:exec(AGENT_OF .. "\n" .. [[
setsid sleep 1001 </dev/null >/dev/null 2>&1 &
( sleep 1002 ) &
kill -9 $sup; kill -9 $agent; sleep 30]], { timeout = 60, shell = "sh" })
tap.ok(r == nil and code == "agent_lost", "a command that kills its supervisor and the agent: agent_lost", err)
r = box:exec("echo fresh")
tap.is(r and r.stdout, "fresh\n", "the next command runs on a fresh agent")
tap.is(#H.procs_matching(box, "sleep 100[12]"), 0, "no process of the lost agent's box runs on (its detached sleep included)")
tap.is(#H.procs_matching(box, "^%d+ sleep 30"), 0, "nor the command itself")
tap.is(#H.procs_matching(box, "^%d+ sleep %d+ $"), 1, "the box's own lifetime process lives")

-- Background processes go with the lost agent too: they are reported failed.
local bg = assert(box:spawn("sleep 1003"))
r, err, code = box:exec(AGENT_OF .. "; kill -9 $sup; kill -9 $agent; sleep 30", { timeout = 60, shell = "sh" })
tap.is(code, "agent_lost", "again: agent_lost")
local view = box:wait(bg, 30)
tap.is(view and view.status, "failed", "a background process of the lost agent is failed")
tap.is(#H.procs_matching(box, "sleep 1003"), 0, "and its process is gone from the box")

-- 2. A command that stops the agent (SIGSTOP): at its timeout the kill is
-- not confirmed, the agent is given up, and the next command gets a fresh
-- one (not ~45 s of timeouts until the pings give up).
r, err, code = box:exec(AGENT_OF .. "; echo $agent > /tmp/stopped-agent; sleep 1004 & kill -STOP $agent; echo stopped",
  { timeout = 3, shell = "sh" })
tap.ok(r ~= nil, "the command that stopped its agent has a result", err)
r = r or {}
tap.is(r.timed_out, true, "it timed out (its exit could not be reported)")
tap.is(r.kill_confirmed, false, "kill_confirmed = false")
tap.is(r.error_code, "agent_unresponsive", "error_code = agent_unresponsive")
local text = sbx.policy.format_result(r)
tap.ok(not text:find("were killed"), "the model is not told its processes were killed", text)
tap.like(text, "could not be confirmed", "it is told the kill could not be confirmed")
r, err, code = box:exec("echo next", { timeout = 20 })
tap.is(r and r.stdout, "next\n", "the next command runs, on a fresh agent (" .. tostring(err) .. ")")
tap.is(#H.procs_matching(box, "sleep 1004"), 0, "what the stopped agent's command left is gone")
r = box:exec([[read -r p < /tmp/stopped-agent; read -r s < /proc/$p/stat && echo "$s" || echo gone]], { shell = "sh" })
tap.is(r and r.stdout, "gone\n", "and so is the stopped agent")
box:close()

-- The clear itself (sbx.job.clear_request), run as a grandchild: it ends
-- every other process of the box but spares its own ancestors (where a
-- platform's agent runs the exec, as ECS Exec's session worker does) and
-- processes whose command line starts with a prefix it is given (that
-- agent's install directory).
do
  local cbox = H.box { image = H.busybox, transport = "exec" }
  local req = require("sbx.job").clear_request { "/tmp/spare/" }
  local quoted = {}
  for i = 4, #req.argv do quoted[#quoted + 1] = "'" .. req.argv[i]:gsub("'", "'\\''") .. "'" end
  local script = "mkdir -p /tmp/spare && cp /bin/busybox /tmp/spare/sleep\n" ..
    "/tmp/spare/sleep 1006 </dev/null >/dev/null 2>&1 &\n" ..
    "setsid sleep 1005 </dev/null >/dev/null 2>&1 &\n" ..
    "sleep 0.2\n" ..
    "sh -c \"$CLEAR\" " .. table.concat(quoted, " ") .. "\necho parent-lived\n"
  local cr = cbox:exec(script, { shell = "sh", env = { CLEAR = req.argv[3] }, timeout = 60 })
  tap.is(cr and cr.stdout, "0\nparent-lived\n", "the clear reports nothing left and its parent shell lives on")
  tap.is(#H.procs_matching(cbox, "sleep 1005"), 0, "another process of the box is gone")
  tap.is(#H.procs_matching(cbox, "^%d+ /tmp/spare/sleep 1006"), 1, "the process under the spared prefix lives")
  cbox:close()
end

-- A confirmed kill still reads as one.
local okbox = H.box { image = H.busybox, transport = "agent" }
r = assert(okbox:exec("sleep 30", { timeout = 1 }))
tap.is(r.kill_confirmed, true, "an ordinary timeout: kill_confirmed = true")
tap.like(sbx.policy.format_result(r), "were killed", "and the model reads that it was killed")
okbox:close()

-- 4. An earlier command (a background process) writes into a later
-- command's output through /proc/PID/fd/1 and /fd/2: refused, the later
-- command's output is its own (policy.agent.private_output, off by default).
local dbox = H.box { image = H.image, transport = "agent" }
r = assert(dbox:exec("echo to-stderr > /dev/stderr; echo to-stdout > /dev/stdout"))
tap.is(r.stdout .. "|" .. r.stderr, "to-stdout\n|to-stderr\n", "by default /dev/stdout and /dev/stderr open by name")
dbox:close()
sbx.use_policy { agent = { private_output = true } }
local pbox = H.box { image = H.image, transport = "agent" }
local forger = assert(pbox:spawn([[while [ ! -s /tmp/later ]; do sleep 0.1; done; read -r p < /tmp/later
echo FORGED > /proc/$p/fd/1; a=$?; echo FORGED > /proc/$p/fd/2; b=$?
# the whole tree of the later command, its children included
for q in /proc/[0-9]*; do echo FORGED > $q/fd/1; done 2>/dev/null
echo "$a $b" > /tmp/tried.tmp; mv /tmp/tried.tmp /tmp/tried]]))
r = assert(pbox:exec([[echo $$ > /tmp/later; sleep 1000 & while [ ! -e /tmp/tried ]; do sleep 0.1; done; kill $!; echo real; echo own >&2]],
  { timeout = 60 }))
tap.is(r.stdout, "real\n", "the later command's stdout is its own")
tap.is(r.stderr, "own\n", "and so is its stderr")
local tried = pbox:read_file("/tmp/tried") or ""
tap.like(tried, "^[1-9]%d* [1-9]%d*\n$", "the forger's writes failed (" .. tried:gsub("\n", "") .. ")")
tap.is(pbox:wait(forger, 30).status, "exited", "the forger ran to its end")
-- Output still flows as before: redirections between the streams, a pipeline.
r = assert(pbox:exec("echo one; echo two >&2; (echo three 1>&2) 2>&1; seq 1 100000 | tail -1"))
tap.is(r.stdout, "one\nthree\n100000\n", "stdout through a socket: redirections and pipes as ever")
tap.is(r.stderr, "two\n", "stderr apart")
pbox:close()
sbx.use_policy { agent = { private_output = false } }

-- 3. The daemon dies mid-command (the socket sbx talks to is a proxy the
-- test kills; the machine's daemon lives): daemon_unavailable, not a
-- timed-out command whose kill nobody could confirm.
for _, transport in ipairs { "agent", "exec" } do
  local sock = string.format("/tmp/sbx-truth-%d-%s.sock", sbx.core.pid(), transport)
  os.remove(sock)
  local pgid = H.sh(string.format("setsid socat UNIX-LISTEN:%s,fork UNIX-CONNECT:%s >/dev/null 2>&1 & echo $!",
    sock, H.daemon_socket())):match("%d+")
  for _ = 1, 100 do
    if sbx.core.path_type(sock) then break end
    sbx.sleep(0.05)
  end
  pbox = assert(sbx.box { image = H.busybox, docker_host = "unix://" .. sock, transport = transport })
  tap.is(assert(pbox:exec("echo via-proxy")).stdout, "via-proxy\n", transport .. ": a box through the proxy")
  local killer = sbx.spawn(function()
    sbx.sleep(1)
    H.sh("kill -- -" .. pgid)
  end)
  r, err, code = pbox:exec("echo started; sleep 60", { timeout = 40 })
  sbx.wait(killer)
  tap.ok(r == nil and code == "daemon_unavailable",
    transport .. ": the daemon gone mid-command is daemon_unavailable (" .. tostring(code) .. ": " .. tostring(err) .. ")",
    r and string.format("timed_out=%s kill_confirmed=%s", tostring(r.timed_out), tostring(r.kill_confirmed)))
  H.api("DELETE", "/containers/" .. pbox.id .. "?force=true&v=true")
  pbox.closed = true
  os.remove(sock)
end

tap.done()

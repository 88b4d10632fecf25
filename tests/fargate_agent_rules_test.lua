-- needs: docker, python3
-- Fargate against a stand-in as strict as the SSM agent and ECS Exec
-- (docs/aws-protocol.md 1.9), each rule with what sbx does under it:
--   * the PTY is read 1024 bytes at a time with 1 ms between reads, and
--     only 1 s after the command started: a `timeout = 1` command still runs
--     (the timeout counts from the wrapper's ready marker);
--   * a session ends when the last holder of its PTY closes it, not at the
--     command's exit: a command that leaves a process with its terminal
--     still returns (sbx ends it at its exit marker);
--   * commands run as root whatever the image's USER;
--   * a session without client input for the idle limit is terminated:
--     sbx's keep-alive input keeps a quiet command alive;
--   * a full input buffer is pause_publication: sbx sends nothing new
--     until start_publication.
-- The stand-in's switches are its defaults here except where a test turns
-- a limit down (idle_timeout, input_buffer) to reach it in seconds.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local st = assert(H.standin())

local function use(extra_ssm)
  local ssm = { keepalive_interval = 300 }
  for k, v in pairs(extra_ssm or {}) do ssm[k] = v end
  -- (use_policy merges: a long interval stands for none)
  if extra_ssm and extra_ssm.keepalive_interval == false then ssm.keepalive_interval = 100000 end
  sbx.use_policy {
    box = { transport = "exec" },
    fargate = {
      endpoint_url = st.url, region = "us-east-1", credentials = st.credentials,
      subnets = { "subnet-standin" }, security_groups = { "sg-standin" },
      poll_interval = 0.1, ssm = ssm,
    },
  }
end
use()

local function sessions_matching(pat)
  local out = {}
  for _, s in ipairs(assert(st:state()).sessions) do
    if (s.command or ""):find(pat, 1, true) then out[#out + 1] = s end
  end
  return out
end

local function wait_session(pat, pred, limit)
  local deadline = sbx.core.now() + (limit or 60)
  local last
  repeat
    for _, s in ipairs(sessions_matching(pat)) do
      last = s
      if pred(s) then return s end
    end
    sbx.core.sleep(0.2)
  until sbx.core.now() > deadline
  return nil, last
end

local f0 = assert(st:faults {})
tap.ok(f0.read_pace == true and f0.agent_read_delay == 1 and f0.exec_as_root == true and f0.pty_hold == true
  and f0.idle_timeout == 1200 and f0.input_buffer == 65536,
  "the stand-in is strict by default (read pace, 1 s first read, root, PTY hold, 20 min idle, bounded input)")

do
  local box <close> = assert(sbx.box { backend = "fargate", image = H.image })
  tap.is(box.transport, "exec", "a box on the exec transport")

  -- The agent's first read is 1 s after the start; the timeout starts at the
  -- ready marker, so a 1 s command budget is the command's own.
  local r, err = box:exec("echo one-second", { timeout = 1 })
  tap.ok(r and not r.timed_out and r.exit_code == 0 and r.stdout == "one-second\n",
    "timeout = 1 on the exec transport: the command runs (" .. tostring(r and r.stdout or err) .. ")")
  local s = wait_session("one-second", function(x) return x.status == "closed" or x.status == "exited" end)
  tap.ok(s and s.ptyReads >= 1, "its session's PTY was read after the agent's wait")
  r = assert(box:exec("sleep 5; echo late", { timeout = 1 }))
  tap.ok(r.timed_out and not r.stdout:find("late", 1, true), "a command longer than its timeout is still timed out")

  -- 1024 bytes a read: 40000 bytes take at least 40 reads (a PTY gives up
  -- to 4095 at once, so an unpaced reader needs about 10).
  local n = 40000
  r = assert(box:exec("head -c " .. n .. " /dev/zero | tr '\\0' x; echo paced-output"))
  tap.is(#r.stdout, n + #"paced-output\n", "40000 bytes come back whole")
  s = wait_session("paced-output", function(x) return x.status == "closed" or x.status == "exited" end)
  tap.ok(s and s.ptyReads >= n // 1024, string.format("the stand-in read them 1024 bytes at a time (%s reads)",
    s and s.ptyReads))

  -- A process in its own session (no SIGHUP when the command's shell
  -- exits) keeps the terminal: the session stays open; sbx ends the
  -- command at its exit marker, not at the session's end.
  r, err = box:exec("setsid sh -c 'touch /tmp/holder-up; exec sleep 600' & "
    .. "while [ ! -e /tmp/holder-up ]; do sleep 0.1; done; echo held-pty", { timeout = 30 })
  tap.ok(r and not r.timed_out and r.exit_code == 0 and r.stdout == "held-pty\n",
    "a command that leaves a process with its PTY returns at its exit (" .. tostring(r and r.stdout or err) .. ")")
  s = wait_session("held-pty", function(x)
    return x.heldAfterExit or tostring(x.ptyHoldModel):find("^unavailable") ~= nil
  end, 30)
  if s and tostring(s.ptyHoldModel):find("^unavailable") then
    -- The stand-in reads the container's processes in the host's /proc (root).
    tap.skip("the stand-in kept that session open after the command's exit", "it cannot see the PTY's holders here: " .. s.ptyHoldModel)
  else
    tap.ok(s and s.heldAfterExit and #(s.ptyHolders or {}) >= 1,
      "while the stand-in kept that session open after the command's exit (PTY holders "
      .. tostring(s and sbx.json.encode(s.ptyHolders or {})) .. ")")
  end

  -- Root, whatever the image says: the exec of a plain image.
  r = assert(box:exec("id -u"))
  tap.is(r.stdout, "0\n", "commands run as root")
  local r2, e2, c2 = box:exec("id -u", { user = "nobody" })
  tap.ok(r2 == nil and c2 == "unsupported" and tostring(e2):find("as root", 1, true),
    "a per-command user on the exec transport says what ECS Exec does: " .. tostring(e2))
end

-- An image whose USER is not root: ECS Exec still runs commands as root.
do
  local tag = "sbx-test-user-65534:1"
  -- Built where the stand-in runs its tasks (Docker's own daemon, whatever
  -- DOCKER_HOST names: make test-podman points it at Podman).
  local p = io.popen("printf 'FROM " .. H.image .. "\\nUSER 65534\\n' | DOCKER_HOST=" .. st.docker_host ..
    " docker build -q -t " .. tag .. " - 2>&1")
  local out = p:read("a")
  local okb = p:close()
  if not okb then
    tap.ok(false, "docker build of a USER 65534 image: " .. out)
  else
    local box <close> = assert(sbx.box { backend = "fargate", image = tag })
    local r = assert(box:exec("id -u"))
    tap.is(r.stdout, "0\n", "an image with USER 65534: ECS Exec's command is root all the same")
    local s = wait_session("id -u", function(x) return x.execUser ~= nil end, 10)
    tap.is(s and s.execUser, "0:0", "the stand-in ran the session's process as 0:0")
  end
  os.execute("DOCKER_HOST=" .. st.docker_host .. " docker rmi -f " .. tag .. " >/dev/null 2>&1")
end

-- The idle limit: without input for idle_timeout the session is cut (the
-- process killed); sbx's keep-alive input keeps a quiet command alive.
do
  assert(st:faults { idle_timeout = 4 })
  use { keepalive_interval = 0.5 }
  local box <close> = assert(sbx.box { backend = "fargate", image = H.image })
  local r, err = box:exec("sleep 10; echo kept-alive", { timeout = 60 })
  tap.ok(r and r.exit_code == 0 and r.stdout == "kept-alive\n",
    "a 10 s silent command under a 4 s idle limit finishes with keep-alives (" .. tostring(r and r.stdout or err) .. ")")
  local s = sessions_matching("kept-alive")[1]
  tap.ok(s and not s.idleTimedOut and s.resizes >= 5,
    string.format("its session got keep-alive input (%s size messages) and was never cut", s and s.resizes))

  -- The same without keep-alives: the stand-in does cut it.
  use { keepalive_interval = false }
  local r2, err2 = box:exec("sleep 10; echo not-kept", { timeout = 60 })
  tap.ok(not (r2 and r2.stdout == "not-kept\n"), "without keep-alives the command is cut: "
    .. tostring(r2 and ("exit " .. tostring(r2.exit_code)) or err2))
  local s2 = wait_session("not-kept", function(x) return x.idleTimedOut end, 30)
  tap.ok(s2 and s2.idleTimedOut and s2.status == "timed_out", "by the stand-in's idle limit")

  -- The agent's channel is one long session: it must stay inside the limit too.
  use { keepalive_interval = 0.5 }
  local abox0, aerr = sbx.box { backend = "fargate", image = H.image, transport = "agent" }
  if not abox0 then
    for _, x in ipairs(assert(st:state()).sessions) do io.stderr:write(sbx.json.encode(x), "\n") end
  end
  local abox <close> = assert(abox0, aerr)
  tap.is(abox.transport, "agent", "a box on the agent transport")
  sbx.core.sleep(6)
  local ra = assert(abox:exec("echo agent-alive"))
  tap.is(ra.stdout, "agent-alive\n", "the agent's channel is alive after 6 s idle under a 4 s limit")
  local cut = 0
  for _, x in ipairs(assert(st:state()).sessions) do if x.idleTimedOut and not (x.command or ""):find("not-kept", 1, true) then cut = cut + 1 end end
  tap.is(cut, 0, "no other session was cut for idleness")
  assert(st:faults { idle_timeout = 1200 })
end

-- Back-pressure: a command that prints for 8 s before it reads 8 MiB of
-- stdin; once Docker's pipe and the stand-in's 64 KiB are full it pauses
-- publication. Its output during the pause proves sbx read the pause (sbx
-- acks it after the pause, on the same connection): new input after that
-- ack is counted as not honouring it. (Without honouring it, sbx sent
-- about 50 such messages in this run.)
do
  use()
  local box <close> = assert(sbx.box { backend = "fargate", image = H.image })
  local n = 8 * 1024 * 1024
  local data = string.rep("0123456789abcdef", n // 16)
  local r, err = box:exec("i=0; while [ $i -lt 40 ]; do echo tick; sleep 0.2; i=$((i+1)); done; wc -c; "
    .. "echo paused-input", { stdin = data, timeout = 300 })
  tap.ok(r and r.exit_code == 0 and tonumber(r.stdout:match("(%d+)%s*paused%-input")) == n,
    "8 MiB of stdin through the stand-in's 64 KiB input buffer arrives whole ("
    .. tostring(r and r.stdout:sub(-30) or err) .. ")")
  local s = wait_session("paused-input", function(x) return x.status == "closed" or x.status == "exited" end)
  tap.ok(s and s.pausesSent >= 1 and s.startsSent >= 1,
    string.format("the stand-in paused publication (%s pauses, %s starts)", s and s.pausesSent, s and s.startsSent))
  tap.is(s and s.inputWhilePaused, 0, "and sbx sent no new input once it had read a pause")
end

-- ECS Exec's own processes live in the container beside the box's (ECS
-- mounts the SSM agent at /ecs-execute-command-<uuid>/; the stand-in runs a
-- process there and refuses ExecuteCommand once it is gone). A lost agent's
-- box is cleared before a fresh agent is placed, and the clearing spares
-- ECS Exec's processes, so commands still reach the box.
local IN_BOX_SSM = "^%d+ /ecs%-execute%-command%-[^/]+/sleep "
do
  use()
  local box <close> = assert(sbx.box { backend = "fargate", image = H.image, transport = "agent" })
  tap.is(box.transport, "agent", "clear: a Fargate box on the agent transport")
  tap.is(#H.procs_matching(box, IN_BOX_SSM), 1, "the stand-in's in-box SSM agent runs in the container")
  local r, err, code = box:exec([[sup=$PPID; read -r s < /proc/$sup/stat; s=${s##*) }; set -- $s; agent=$2
setsid sleep 1001 </dev/null >/dev/null 2>&1 &
( sleep 1002 ) &
kill -9 $sup; kill -9 $agent; sleep 30]], { timeout = 60, shell = "sh" })
  tap.ok(r == nil and code == "agent_lost", "a command that kills its supervisor and the agent: agent_lost", err)
  r, err = box:exec("echo fresh", { timeout = 60 })
  tap.is(r and r.stdout, "fresh\n", "the next command runs on a fresh agent (" .. tostring(err) .. ")")
  tap.is(#H.procs_matching(box, "sleep 100[12]"), 0, "nothing the lost agent's command left runs on (its detached sleep included)")
  tap.is(#H.procs_matching(box, "^%d+ sleep 30"), 0, "nor the command itself")
  tap.is(#H.procs_matching(box, IN_BOX_SSM), 1, "ECS Exec's agent was spared")
end

-- The stand-in is strict about it: a box whose in-box SSM agent was killed
-- gets no new session (TargetNotConnectedException).
do
  use()
  sbx.use_policy { fargate = { exec_connect_timeout = 1 } }
  local box <close> = assert(sbx.box { backend = "fargate", image = H.image, transport = "exec" })
  sbx.use_policy { fargate = { exec_connect_timeout = 30 } }
  box:exec([[for p in /proc/[0-9]*; do c=; read -r c < $p/cmdline; case "$c" in /ecs-execute-command-*) kill -9 ${p#/proc/};; esac; done]],
    { shell = "sh", timeout = 20 })
  local r, err, code = box:exec("echo after")
  tap.ok(r == nil and code == "TargetNotConnectedException",
    "once the in-box SSM agent is gone, no command reaches the box (" .. tostring(code) .. ": " .. tostring(err) .. ")")
end

tap.done()

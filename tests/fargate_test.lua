-- needs: docker, python3
-- Fargate boxes end to end against the AWS stand-in: ECS and IAM over SigV4,
-- RunTask into a real container, commands over the SSM data channel
-- (websocket, acks, resends), the same box and tool surface as Docker, the
-- fault switches, destroy and reap.
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"

local st = assert(H.standin())
local SUBNETS = { "subnet-0standin" }

-- This file is the exec transport's (one ECS Exec session per command: the
-- wrapper, its markers, the SSM channel's faults); the agent transport on
-- Fargate is tests/conformance_fargate_test.lua and
-- agent_reattach_fargate_test.lua.
sbx.use_policy {
  box = { transport = "exec" },
  fargate = {
    endpoint_url = st.url, credentials = st.credentials, region = "us-east-1",
    subnets = SUBNETS, security_groups = { "sg-0standin" },
    poll_interval = 0.1, start_timeout = 60, exec_connect_timeout = 10,
  },
}

local function state() return assert(st:state()) end

local function task_of(box)
  for _, t in ipairs(state().tasks) do
    if t.taskArn == box.handle.arn then return t end
  end
end

local function session_stats()
  local tot = { resends = 0, frames = 0 }
  for _, s in ipairs(state().sessions) do
    tot.resends = tot.resends + (s.resends or 0)
    tot.frames = tot.frames + (s.framesSent or 0)
  end
  return tot
end

-- Bad configuration: clear errors, nothing left behind ---------------------------

local nb, e, c = sbx.box { backend = "fargate", image = H.busybox, subnets = {} }
tap.is(c, "invalid_spec", "no subnets: a clear error before any AWS call")
tap.like(tostring(e), "subnets", "which names what is missing")
nb, e, c = sbx.box { backend = "fargate", image = H.busybox, endpoint_url = "http://127.0.0.1:1" }
tap.is(nb, nil, "an unreachable endpoint fails the box")
tap.is(c, "ECONNREFUSED", "with the transport's code (after bounded retries)")
nb, e, c = sbx.box { backend = "fargate", image = H.busybox,
  credentials = { access_key = st.credentials.access_key, secret_key = "wrong-secret-value" } }
tap.is(nb, nil, "a wrong secret fails the box")
tap.ok(c == "SignatureDoesNotMatch" or c == "InvalidSignatureException", "with AWS's signature error code", c)
tap.ok(not tostring(e):find("wrong-secret-value", 1, true), "and the secret is not in the message")

-- Five boxes at once whose role cannot be made: one attempt, five clear errors.
do
  local before = st:state().calls["iam.CreateRole"] or 0
  local tasks = {}
  for i = 1, 5 do
    tasks[i] = sbx.spawn(function()
      return select(3, sbx.box { backend = "fargate", image = H.busybox, task_role = "bad role!" })
    end)
  end
  local codes = {}
  for i, tk in ipairs(tasks) do codes[i] = tostring(sbx.wait(tk)) end
  tap.is(table.concat(codes, ","), "ValidationError,ValidationError,ValidationError,ValidationError,ValidationError",
    "concurrent boxes share a failed role setup: each gets IAM's code")
  tap.is((st:state().calls["iam.CreateRole"] or 0) - before, 1, "and IAM saw one CreateRole, not five")
end

-- Creation -------------------------------------------------------------------

local t0 = sbx.now()
local box, err, code = sbx.box { backend = "fargate", image = H.busybox }
tap.ok(box, "a Fargate box is created", tostring(err) .. " " .. tostring(code))
if not box then
  tap.diag(st:log())
  st:stop()
  tap.done()
  return
end
local r = assert(box:exec("echo hello"))
tap.diag(string.format("create to first command: %.3f s", sbx.now() - t0))
tap.is(r.stdout, "hello\n", "first command: output, with the PTY's CR-LF gone")
tap.is(r.exit_code, 0, "first command: exit code 0")

local s = state()
tap.is(#s.clusters, 1, "the cluster was created")
local roles = {}
for _, role in ipairs(s.roles) do roles[role.RoleName or role.roleName or role.name] = role end
tap.ok(roles["sbx-task-role"] and roles["sbx-execution-role"], "task and execution roles were created")
local t = task_of(box)
tap.ok(t, "the task is known to ECS")
if t then
  local tags = {}
  for _, kv in ipairs(t.tags or {}) do tags[kv.key] = kv.value end
  tap.is(tags["sbx.owner.pid"], tostring(sbx.core.pid()), "tag: owner pid")
  tap.ok(tonumber(tags["sbx.deadline"]) and tonumber(tags["sbx.deadline"]) > os.time(), "tag: deadline in the future")
  tap.ok(tags["sbx.owner.host"] and tags["sbx.created"], "tags: owner host and creation time")
  tap.is(t.enableExecuteCommand, true, "RunTask asked for execute-command")
  tap.is(t.launchType, "FARGATE", "launch type FARGATE")
  tap.ok(t.cpu == "1024" and t.memory == "2048", "the task size comes from policy.fargate in ECS units",
    tostring(t.cpu) .. " " .. tostring(t.memory))
end

-- Commands -----------------------------------------------------------------------

r = assert(box:exec("echo out; echo err >&2; exit 3"))
tap.is(r.exit_code, 3, "a non-zero exit code is reported (the original never did)")
tap.is(r.output, "out\nerr\n", "stdout and stderr arrive interleaved (one PTY)")

r = assert(box:exec("printf 'a\\tb\\r\\nc'"))
tap.is(r.stdout, "a\tb\r\nc", "the command's own CR-LF and tabs pass unchanged (raw PTY)")

r = assert(box:exec("printf '\\377\\376ok'"))
tap.is(r.stdout, "\255\254ok", "non-UTF-8 bytes come back as written (results are bytes)")

r = assert(box:exec("head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END"))
tap.is(r.exit_code, 0, "3 MB of output: exit 0")
tap.ok(r.truncated, "3 MB of output is truncated by the capture policy")
tap.like(r.stdout, "END\n$", "and its tail is kept")
tap.is(r.stdout_bytes, 3000005, "every byte is counted")

r = assert(box:exec("pwd"))
tap.is(r.stdout, "/work\n", "commands start in the box's workdir, as on Docker")
r = assert(box:exec("pwd; echo $FOO", { cwd = "/tmp", env = { FOO = "b a'r" } }))
tap.is(r.stdout, "/tmp\nb a'r\n", "cwd and env")

local chunks = {}
r = assert(box:exec("for i in 1 2 3; do echo $i; sleep 0.2; done", {
  on_output = function(_, text) chunks[#chunks + 1] = text end }))
tap.ok(#chunks >= 2, "on_output streams the output as it comes (" .. #chunks .. " chunks)")
tap.is(table.concat(chunks), "1\n2\n3\n", "and streamed output is whole")

-- stdin over the data channel: all 256 byte values, through a raw PTY.
local all = {}
for i = 0, 255 do all[#all + 1] = string.char(i) end
local blob = table.concat(all):rep(40)   -- 10 KiB, ten 1 KiB input messages
tap.ok(box:write_file("/tmp/blob", blob), "write_file of 10 KiB binary")
tap.is(box:read_file("/tmp/blob"), blob, "read_file returns every byte value unchanged")

-- A timeout kills the command (the original left it running).
r = assert(box:exec("sleep 300; echo never", { timeout = 1 }))
tap.ok(r.timed_out, "timeout is reported")
tap.is(r.exit_code, nil, "no exit code for a killed command")
local ps = assert(box:exec("ps -o args | grep -c '[s]leep 300' || true"))
tap.is(ps.stdout, "0\n", "the timed-out command no longer runs in the task")

-- Without acks the agent resends every frame, again and again; with them a
-- resend happens only when an ack is later than the RTO (a loaded machine).
local stats = session_stats()
tap.ok(stats.frames > 100 and stats.resends * 10 < stats.frames, "sbx acks agent frames: resends are rare",
  string.format("%d resends for %d frames", stats.resends, stats.frames))

-- Our own input is resent until acked: the terminal size goes out at once,
-- and the agent does not ack input that arrives before the PTY is up.
r = assert(box:exec("sleep 1"))
local last
for _, ss in ipairs(state().sessions) do
  if not last or (ss.openedAt or 0) > (last.openedAt or 0) then last = ss end
end
tap.ok(last and last.lastSize and last.lastSize.cols == 300 and last.lastSize.rows == 100,
  "the terminal size from policy reaches the agent", last and sbx.json.encode(last.lastSize))
tap.ok(last and (last.inputNotReady == 0 or last.inputMessages > last.inputNotReady),
  "input the agent was not ready for was sent again", last and string.format("%d not ready, %d received",
    last.inputNotReady, last.inputMessages))

-- Background processes (the original had none).
local name = assert(box:spawn("for i in 1 2 3; do echo tick $i; sleep 0.1; done; exit 4", { name = "ticker" }))
tap.is(name, "ticker", "spawn names the process")
local view = assert(box:wait("ticker", 20))
tap.is(view.status, "exited", "background process exits")
tap.is(view.exit_code, 4, "with its exit code")
tap.is(box:output("ticker").text, "tick 1\ntick 2\ntick 3\n", "background output is kept")
assert(box:spawn("sleep 500", { name = "sleeper" }))
sbx.sleep(0.5)
local k = assert(box:kill("sleeper"))
tap.is(k.status, "killed", "kill a background process")
ps = assert(box:exec("ps -o args | grep -c '[s]leep 500' || true"))
tap.is(ps.stdout, "0\n", "the killed process is gone from the task")

-- The model's tools: the same surface and formatting as Docker.
local tools = box:tools()
local text, is_error = sbx.tools.call(tools, "bash", { command = "echo tool; exit 2" })
tap.like(text, "^%[Exit code: 2%]", "bash tool: exit code first")
tap.like(text, "tool", "bash tool: output")
tap.ok(not is_error, "a failing command is not a tool error")
text = sbx.tools.call(tools, "bash", { command = "sleep 100", run_in_background = true, name = "bg" })
tap.like(text, "bg", "bash tool: background start")
text = sbx.tools.call(tools, "list_processes", {})
tap.like(text, "bg", "list_processes shows it")
text, is_error = sbx.tools.call(tools, "bash", { command = 42 })
tap.ok(is_error, "malformed tool arguments are a tool error, not a crash")

local _, _, kcode = box:exec("id", { user = "nobody" })
tap.is(kcode, "unsupported", "a per-command user is refused clearly (ECS Exec has none)")

-- Concurrency inside one box.
local tasks = {}
for i = 1, 10 do
  tasks[i] = sbx.spawn(function() return assert(box:exec("echo " .. i)).stdout end)
end
local ok_all = true
for i, tk in ipairs(tasks) do if sbx.wait(tk) ~= i .. "\n" then ok_all = false end end
tap.ok(ok_all, "10 concurrent commands in one box, each with its own channel")

-- Faults ---------------------------------------------------------------------------

st:faults { dup_frames = true }
r = assert(box:exec("seq 1 300"))
local want = {}
for i = 1, 300 do want[i] = tostring(i) end
tap.is(r.stdout, table.concat(want, "\n") .. "\n", "duplicated frames: output exactly once")
st:faults { dup_frames = false, reorder_frames = true }
r = assert(box:exec("seq 1 300"))
tap.is(r.stdout, table.concat(want, "\n") .. "\n", "reordered frames: output in order")
st:faults { reorder_frames = false, drop_acks = 3 }
r = assert(box:exec("seq 1 300"))
tap.is(r.stdout, table.concat(want, "\n") .. "\n", "the agent ignoring our acks (so resending): output once")
st:faults { drop_acks = 0, handshake = "session_type" }
r = assert(box:exec("echo shook"))
tap.is(r.stdout, "shook\n", "a SessionType handshake is answered")
st:faults { handshake = "kms" }
local nr, kerr, kcode = box:exec("echo secret")
tap.is(nr, nil, "a KMS handshake is declined")
tap.is(kcode, "kms_unsupported", "with a clear code")
tap.like(tostring(kerr), "KMS", "and message")
st:faults { handshake = "none", drop_ws_after = 6 }  -- the kill session itself sends fewer frames
nr, kerr, kcode = box:exec("for i in $(seq 1 50); do echo line $i; sleep 0.05; done; sleep 101")
tap.is(nr, nil, "a dropped websocket fails the command")
tap.is(kcode, "disconnected", "with code disconnected")
st:faults { drop_ws_after = 0 }
ps = assert(box:exec("ps -o args | grep -c '[s]eq 1 50' || true"))
tap.is(ps.stdout, "0\n", "and the command was killed, not left running")

st:faults { throttle = 3 }
r = assert(box:exec("echo after-throttle"))
tap.is(r.stdout, "after-throttle\n", "throttled ECS calls are retried")

-- One policy field switches a harness's backend.
sbx.use_policy { box = { backend = "fargate", image = H.busybox } }
local via_policy = sbx.box {}
tap.is(via_policy and via_policy.backend_name, "fargate", "policy.box.backend = \"fargate\" is enough")
tap.is(via_policy and assert(via_policy:exec("echo p")).stdout, "p\n", "and the box works")
if via_policy then via_policy:close() end
sbx.use_policy { box = { backend = "docker", image = "debian:bookworm-slim" } }

-- Destroy ------------------------------------------------------------------------

st:faults { error5xx = 1, throttle = 2 }
local calls_before = state().calls
local second = assert(sbx.box { backend = "fargate", image = H.busybox })
local calls_after = state().calls
local function delta(op) return (calls_after[op] or 0) - (calls_before[op] or 0) end
tap.is(delta("ecs.RunTask"), 4, "a box is still made through a 5xx error and throttling: RunTask retried 3 times")
tap.is(second.handle.taskdef, box.handle.taskdef, "boxes with the same content share one task definition")
local arn = box.handle.arn
local td = box.handle.taskdef
box:close()
local stopped
for _ = 1, 100 do
  local tk
  for _, x in ipairs(state().tasks) do if x.taskArn == arn then tk = x end end
  if tk and (tk.desiredStatus == "STOPPED") then stopped = tk break end
  sbx.sleep(0.1)
end
tap.ok(stopped, "close stops the task")
local active
for _, d in ipairs(state().taskDefinitions) do if d.taskDefinitionArn == td then active = d.status end end
tap.is(active, "ACTIVE", "the shared task definition stays while another box uses it")
second:close()
for _, d in ipairs(state().taskDefinitions) do if d.taskDefinitionArn == td then active = d.status end end
tap.is(active, "INACTIVE", "and is deregistered with its last box")

-- IAM eventual consistency: RunTask fails while a new role propagates.
st:faults { role_propagation = 2 }
local before = state().calls["ecs.RunTask"] or 0
local fresh, ferr = sbx.box { backend = "fargate", image = H.busybox,
  task_role = "sbx-task-role-fresh", execution_role = "sbx-execution-role-fresh" }
tap.ok(fresh, "a box with brand-new roles is made once they propagate", ferr)
tap.ok((state().calls["ecs.RunTask"] or 0) - before >= 2, "RunTask was retried while the roles were new")
if fresh then fresh:close() end
sbx.use_policy { fargate = { iam_propagation = 0 } }
local stale, serr, scode = sbx.box { backend = "fargate", image = H.busybox,
  task_role = "sbx-task-role-fresh2", execution_role = "sbx-execution-role-fresh2" }
tap.is(stale, nil, "without the propagation window the same failure is final")
tap.is(scode, "ClientException", "and reported with ECS's code")
tap.like(tostring(serr), "unable to assume the role", "and message")
sbx.use_policy { fargate = { iam_propagation = 30 } }
st:faults { role_propagation = 0 }

-- A never-connecting exec agent: a clear error, and the task is stopped.
sbx.use_policy { fargate = { start_timeout = 3 } }
st:faults { agent_never_connects = true }
local nb
nb, kerr, kcode = sbx.box { backend = "fargate", image = H.busybox }
tap.is(nb, nil, "a box whose exec agent never connects fails")
tap.is(kcode, "agent_not_connected", "with code agent_not_connected")
st:faults { agent_never_connects = false }
sbx.use_policy { fargate = { start_timeout = 60 } }

-- A missing image: the task stops, the error says why.
nb, kerr, kcode = sbx.box { backend = "fargate", image = "sbx-no-such-image:1" }
tap.is(nb, nil, "a missing image fails the box")
tap.like(tostring(kerr), "CannotPullContainerError", "with ECS's stopped reason")

-- The harness on Fargate: `sbx eval` with a policy file, nothing else changed.
do
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local pf = assert(io.open(dir .. "/fargate-policy.lua", "w"))
  pf:write(string.format([[
return { box = { backend = "fargate" },
  fargate = { endpoint_url = %q, credentials = { access_key = %q, secret_key = %q },
    region = "us-east-1", subnets = { "subnet-0standin" }, poll_interval = 0.1 } }
]], st.url, st.credentials.access_key, st.credentials.secret_key))
  pf:close()
  local tf = assert(io.open(dir .. "/tasks.jsonl", "w"))
  tf:write('{"id":"ok","files":{"/tmp/in.txt":"41"},"run":"echo $(( $(cat /tmp/in.txt) + 1 )) > /tmp/out.txt",'
    .. '"check":"test \\"$(cat /tmp/out.txt)\\" = 42","outputs":["/tmp/out.txt"]}\n')
  tf:write('{"id":"bad","run":"exit 5"}\n')
  tf:close()
  local text, status = H.sh(string.format("%s --policy %s eval %s --image %s --concurrency 2 --out %s",
    H.sbx_bin, dir .. "/fargate-policy.lua", dir .. "/tasks.jsonl", H.busybox, dir .. "/out.jsonl"))
  tap.is(status, 0, "sbx eval runs on Fargate with a policy file", text)
  local verdicts = {}
  for line in io.lines(dir .. "/out.jsonl") do
    local res = sbx.json.decode(line)
    verdicts[res.id] = res.status
  end
  tap.is(verdicts.ok, "passed", "eval on Fargate: files, run and check")
  tap.is(verdicts.bad, "failed", "eval on Fargate: a failing task fails (it is no infrastructure error)")
  os.execute("rm -rf " .. dir)
end

-- The example, configured the SDK way: AWS_ENDPOINT_URL and AWS_* keys.
do
  local envs = string.format("AWS_ENDPOINT_URL=%s AWS_ACCESS_KEY_ID=%s AWS_SECRET_ACCESS_KEY=%s AWS_REGION=us-east-1 ",
    st.url, st.credentials.access_key, st.credentials.secret_key)
  local text, status = H.sh(envs .. H.sbx_bin .. " run lua/examples/fargate.lua " .. H.busybox .. " subnet-local")
  tap.is(status, 0, "lua/examples/fargate.lua runs against the stand-in from the environment", text)
  -- stdout and stderr are two pipes on the agent: their interleaving is
  -- the order the agent read them in.
  tap.ok(text:find("exit 3 in %d+ ms:\nLinux[^\n]*\n") and (text:find("\nout\nerr\n") or text:find("\nerr\nout\n")),
    "the example's command output and exit code", text)
  tap.like(text, "%[Exit code: 3%]\nhello", "and what the model sees")
end

-- Reap: a host killed with -9 leaves a task; sbx reap stops it.
local idfile = os.tmpname()
local child = string.format([[
local sbx = require "sbx"
sbx.use_policy { fargate = { endpoint_url = %q, credentials = { access_key = %q, secret_key = %q },
  region = "us-east-1", subnets = { "subnet-0standin" }, poll_interval = 0.1 } }
local b = assert(sbx.box { backend = "fargate", image = %q })
local f = io.open(%q, "w"); f:write(b.handle.arn, "\n"); f:close()
sbx.sleep(600)
]], st.url, st.credentials.access_key, st.credentials.secret_key, H.busybox, idfile)
local script = os.tmpname() .. ".lua"
local f = assert(io.open(script, "w")); f:write(child); f:close()
local pid = tonumber((H.sh(H.sbx_bin .. " run " .. script .. " >/dev/null 2>&1 & echo $!"):match("%d+")))
local orphan
for _ = 1, 300 do
  local fh = io.open(idfile)
  if fh then orphan = fh:read("l"); fh:close() end
  if orphan and orphan ~= "" then break end
  sbx.sleep(0.1)
end
tap.ok(orphan and orphan ~= "", "a child host made a Fargate box")
H.sh("kill -9 " .. pid)
sbx.sleep(0.3)
local env = string.format("AWS_ENDPOINT_URL=%s AWS_ACCESS_KEY_ID=%s AWS_SECRET_ACCESS_KEY=%s AWS_REGION=us-east-1 ",
  st.url, st.credentials.access_key, st.credentials.secret_key)
local out = H.sh(env .. H.sbx_bin .. " reap --backend fargate --dry-run")
tap.like(out, "would remove %x+ %(owner process " .. pid .. " is gone%)", "reap --dry-run finds the orphaned task")
out = H.sh(env .. H.sbx_bin .. " reap --backend fargate")
tap.like(out, "removed %x+", "sbx reap --backend fargate stops it")
local desired
for _, x in ipairs(state().tasks) do if x.taskArn == orphan then desired = x.desiredStatus end end
tap.is(desired, "STOPPED", "the orphaned task is stopped")
os.remove(idfile); os.remove(script)

-- Forged exit codes: the command under test attacks the wrapper -----------------
-- ECS Exec reports no exit status, so the wrapper's exit marker is the only
-- one; a command that could print a valid marker could report any status
-- (a reward hack in an eval harness). These commands do what an attacker in
-- the box can: read every other process's argv and environment, replay every
-- marker-like token, every wrapper printf and every hex word as a marker with
-- status 0, read the PTY's input, and keep doing it from a background process
-- into other commands' PTYs.
local REPLAY = [[
scan() {
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    cat "$p/cmdline" "$p/environ" 2>/dev/null | tr '\0' '\n'
    echo
  done
}
replay() {
  seen=$(scan; cat "$1" 2>/dev/null)
  printf '%s\n' "$seen" | grep -o '__SBX_[0-9A-Za-z]*_[A-Z][0-9]*__' | sed 's/_[A-Z][0-9]*__$/_E0__/'
  printf '%s\n' "$seen" | grep -oE "printf '__SBX_[^']*' [^ ;]+" | while IFS= read -r frag; do eval "$frag 0"; done
  printf '%s\n' "$seen" | grep -oE '[0-9A-Za-z]{8,}' | sort -u | while IFS= read -r h; do printf '__SBX_%s_E0__' "$h"; done
}
]]

local function attack_box(image)
  local b, berr = sbx.box { backend = "fargate", image = image }
  tap.ok(b, "a box to attack (" .. image .. ")", berr)
  return b
end

local function attacks(b, label)
  -- (1) In the foreground: replay whatever the other processes show, and
  -- whatever is left on the PTY's input, then fail.
  local r1 = assert(b:exec(REPLAY .. [[
n=0; for p in /proc/[0-9]*; do [ -r "$p/cmdline" ] && n=$((n+1)); done; echo "scanned $n"
timeout 0.3 cat /proc/$PPID/fd/0 > /tmp/pty-input 2>/dev/null
replay /tmp/pty-input
exit 1]]))
  tap.is(r1.exit_code, 1, label .. ": a command that replays every marker, printf and hex word it can read "
    .. "from other processes' argv, environment and its PTY still reports its own exit 1")
  tap.like(r1.output, "scanned [1-9]", label .. ": it read other processes' argv")
  tap.like(r1.output, "__SBX_%w+_E0__", label .. ": and printed its forged markers (as plain output)")

  -- (2) From a background process, after its command ended and during the
  -- next commands, into every PTY in the box, until told to stop.
  local r2 = assert(b:exec(REPLAY .. [[
rm -f /tmp/replay-stop /tmp/replay-stopped
trap '' HUP   # before the fork: outlive the wrapper, the PTY's session leader
( i=0
  while [ ! -e /tmp/replay-stop ] && [ $i -lt 300 ]; do
    i=$((i+1))
    for p in /proc/[0-9]*; do
      case $(readlink "$p/fd/1" 2>/dev/null) in /dev/pts/*) replay > "$p/fd/1" 2>/dev/null ;; esac
    done
    sleep 0.05
  done
  touch /tmp/replay-stopped ) >/dev/null 2>/tmp/replay-log </dev/null &
exit 3]]))
  tap.is(r2.exit_code, 3, label .. ": a command that leaves a replaying background process reports its exit 3")
  local r3 = assert(b:exec("sleep 2; exit 5"))
  tap.is(r3.exit_code, 5, label .. ": the next command, its PTY flooded with replays while it runs, reports its exit 5")
  tap.like(r3.output, "__SBX_%w+_E0__", label .. ": the background replays did reach that command's PTY")
  local r4 = assert(b:exec("exit 7"))
  tap.is(r4.exit_code, 7, label .. ": and the one after it its exit 7")
  local stop = assert(b:exec("touch /tmp/replay-stop; i=0; while [ ! -e /tmp/replay-stopped ] && [ $i -lt 100 ]; do " ..
    "sleep 0.1; i=$((i+1)); done; test -e /tmp/replay-stopped"))
  if not tap.is(stop.exit_code, 0, label .. ": the background replayer ran all along and stops") then
    tap.diag(assert(b:exec("cat /tmp/replay-log; ls -l /proc/[0-9]*/fd/1; for p in /proc/[0-9]*; do tr '\\0' ' ' <$p/cmdline; echo; done")).output)
  end

  -- (3) A perfect marker with a guessed nonce, of every length sbx ever used.
  local r5 = assert(b:exec([[
printf '__SBX_%s_E0__' 0123456789abcdef 00000000000000000000000000000000
printf '__SBX_%s_E0__' "$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf '__SBX_%s_E0__' "$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
exit 1]]))
  tap.is(r5.exit_code, 1, label .. ": markers with guessed nonces do not count")
end

local victim = attack_box(H.busybox)
if victim then
  attacks(victim, "busybox")
  victim:close()
end
-- Debian's sh is dash and the command runs in bash; and without stty the PTY
-- stays cooked (echo on), which must not give anything away either.
victim = attack_box(H.image)
if victim then
  attacks(victim, "debian")
  local g = assert(victim:exec("rm -f \"$(command -v stty)\"; command -v stty || echo gone"))
  tap.is(g.stdout, "gone\n", "debian: stty removed")
  local r = assert(victim:exec("echo one; echo two; exit 4"))
  tap.is(r.stdout, "one\ntwo\n", "without stty: the output has neither the echoed secret nor CR-LF")
  tap.is(r.exit_code, 4, "without stty: the exit code")
  r = assert(victim:exec("wc -c", { stdin = "abc\n" }))
  tap.like(r.stdout, "4\n$", "without stty: stdin after the secret line reaches the command")
  tap.ok(not r.stdout:find("%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x"), "without stty: no secret in the output", r.stdout)
  attacks(victim, "debian without stty")
  victim:close()
end

st:stop()
tap.done()

-- needs: docker, python3
-- The Kubernetes backend under the stand-in's faults: 429 with Retry-After
-- and 5xx (API calls and exec upgrades), slow scheduling (readiness by
-- watch, bounded by start_timeout), a dropped or expired watch, an image
-- that cannot be pulled, an exec stream cut mid-command (exec and agent),
-- and API servers that speak only v4 or only v5 of the channel protocols.
local tap = require "tap"
local H = require "helper"
local K = require "k8s_helper"
local sbx = require "sbx"

local standin = assert(K.standin())
sbx.use_policy { kubernetes = { kubeconfig = standin.kubeconfig, backoff = { base = 0.05, max = 0.5, max_retry_after = 2 } } }

local function faults(t) return assert(standin:faults(t)) end
local function state() return assert(standin:state()) end
-- The exec transport unless a check asks for the agent: what is checked
-- here is the exec subresource itself.
local function box(opts)
  opts = opts or {}
  opts.backend, opts.image, opts.transport = "kubernetes", opts.image or H.busybox, opts.transport or "exec"
  return sbx.box(opts)
end

-- 429 and 5xx are retried.
faults { throttle = 3 }
local t0 = sbx.now()
local b, err, code = box()
tap.ok(b, "three 429s with Retry-After: the box is still made", err)
tap.ok(sbx.now() - t0 >= 1, "after waiting what Retry-After said")
tap.is(state().faults.throttle, 0, "every 429 was answered by a retry")
faults { error5xx = 2 }
tap.ok(b and b:exec("echo ok").stdout == "ok\n", "two 500s on the exec upgrade: the command still runs")
if b then b:close() end

-- Readiness by watch, not polling.
faults { schedule_delay = 1.0 }
local before = state().calls["GET api/v1/namespaces/{ns}/pods/{name}"] or 0
t0 = sbx.now()
b, err = box()
local took = sbx.now() - t0
tap.ok(b and took >= 1 and took < 5, string.format("slow scheduling: ready after %.2fs", took), err)
local after = state()
tap.is((after.calls["GET api/v1/namespaces/{ns}/pods/{name}"] or 0) - before, 0, "no polling: not one GET of the pod while waiting")
if b then b:close() end
local watches = state().calls["GET api/v1/namespaces/{ns}/pods"] or 0
local tasks = {}
for i = 1, 10 do tasks[i] = sbx.spawn(function() local x = assert(box()) x:close() return true end) end
local all = sbx.gather(tasks)
tap.ok(#all == 10, "ten boxes waiting at once")
tap.is((state().calls["GET api/v1/namespaces/{ns}/pods"] or 0) - watches, 1, "share one watch")
faults { schedule_delay = 3 }
t0 = sbx.now()
b, err, code = box { start_timeout = 1 }
tap.ok(b == nil and code == "timeout" and err:find("start_timeout", 1, true), "past start_timeout: a timeout naming the knob", err)
tap.ok(sbx.now() - t0 < 3, "bounded by it")
sbx.sleep(0.3)
tap.is(#state().pods, 0, "and the pod is removed")

-- A watch that drops, or that expired: watched again.
faults { schedule_delay = 0.5, drop_watch_after = 1 }
b, err = box()
tap.ok(b and b:exec("true").exit_code == 0, "the watch dropped after one event: the box is still ready", err)
if b then b:close() end
faults { drop_watch_after = 1, watch_expired = 1 }
b, err = box()
tap.ok(b, "the watch dropped, and its resumption said 410 Expired: watched again from the current state", err)
tap.is(state().faults.watch_expired, 0, "(the 410 was served)")
if b then b:close() end
faults { schedule_delay = 0, drop_watch_after = 0 }

-- An image the node cannot pull.
faults { pull_fail = 1 }
b, err, code = box()
tap.ok(b == nil and code == "image_unavailable" and err:find("ErrImagePull", 1, true), "a failed pull: Kubernetes' reason", err)
sbx.sleep(0.3)
tap.is(#state().pods, 0, "and no pod is left")

-- An exec stream cut in the middle of a command (that stream only: the
-- kill that follows runs on a stream of its own).
b = assert(box())
faults { cut_exec_after = 3, cut_exec_streams = 1 }
local r
r, err, code = b:exec("echo a; sleep 0.3; echo b; sleep 0.3; echo c; sleep 0.3; echo d")
tap.ok(r == nil and code == "disconnected" and err:find("killed", 1, true), "exec: a cut stream fails the command (disconnected), which is killed in the box", err)
faults { cut_exec_after = 0 }
tap.is(b:exec("echo next").stdout, "next\n", "exec: the next command runs")
b:close()
b = assert(box { transport = "agent" })
tap.is(b.transport, "agent", "a box on the agent transport")
-- The agent's stream cut once: sbx attaches again (a new exec of a fresh
-- relay) and the command goes on, its output whole.
local agent_pid = b.tstate.agent_pid
faults { cut_exec_after = 1, cut_exec_streams = 1 }
r, err, code = b:exec("echo a; sleep 0.3; echo b; sleep 0.3; echo c")
tap.is(r and r.stdout, "a\nb\nc\n", "agent: a cut stream is opened again; the command's output is whole", err)
tap.ok((b.tstate.reattached or 0) >= 1 and b.tstate.agent_pid == agent_pid, "agent: through a new stream, to the same agent")
tap.ok(state().execs.cut >= 1, "the stand-in did cut it")
-- Cut every stream (the way back too): the pending command fails with
-- agent_lost, never hangs; then a fresh agent.
faults { cut_exec_after = 1, cut_exec_streams = 0 }
r, err, code = b:exec("echo a; sleep 0.3; echo b")
tap.ok(r == nil and code == "agent_lost", "agent: no way back: agent_lost (" .. tostring(err) .. ")")
faults { cut_exec_after = 0 }
tap.is(b:exec("echo again").stdout, "again\n", "agent: the next command places a fresh agent")
b:close()

-- A lost agent takes every process of the pod with it before the next
-- command (backend.clear, over an exec): what its commands left, detached
-- ones included; the pod's lifetime process lives.
b = assert(box { transport = "agent" })
r, err, code = b:exec([[sup=$PPID; read -r s < /proc/$sup/stat; s=${s##*) }; set -- $s; agent=$2
setsid sleep 1001 </dev/null >/dev/null 2>&1 &
( sleep 1002 ) &
kill -9 $sup; kill -9 $agent; sleep 30]], { timeout = 60, shell = "sh" })
tap.ok(r == nil and code == "agent_lost", "agent: a command that kills its supervisor and the agent: agent_lost", err)
r, err = b:exec("echo fresh", { timeout = 60 })
tap.is(r and r.stdout, "fresh\n", "agent: the next command runs on a fresh agent (" .. tostring(err) .. ")")
tap.is(#H.procs_matching(b, "sleep 100[12]"), 0, "agent: nothing the lost agent's command left runs on (its detached sleep included)")
tap.is(#H.procs_matching(b, "^%d+ sleep 30"), 0, "agent: nor the command itself")
tap.is(#H.procs_matching(b, "^%d+ sleep %d+ $"), 1, "agent: the pod's lifetime process lives")
b:close()

-- Channel protocols: an API server of before 1.30 (v4 only), and v5 only.
faults { exec_protocols = sbx.json.array { "v4" } }
b = assert(box())
r = assert(b:exec("wc -c", { stdin = ("y"):rep(70000) }))
tap.is(r.stdout:gsub("%s", ""), "70000", "v4: stdin of exactly its length (the command reads N bytes through head)")
r = assert(b:exec("cat", { stdin = "" }))
tap.is(r.stdout, "", "v4: empty stdin ends at once")
t0 = sbx.now()
r = assert(b:exec("cat"))
tap.ok(r.exit_code == 0 and sbx.now() - t0 < 5, "v4: no stdin reads /dev/null")
r = assert(b:exec("echo out; echo err >&2; exit 7"))
tap.ok(r.stdout == "out\n" and r.stderr == "err\n" and r.exit_code == 7, "v4: channels and the exit code")
b:close()
b = assert(box { transport = "agent" })
tap.is(b:exec("cat", { stdin = "agent over v4" }).stdout, "agent over v4", "v4: the agent transport needs no end of stdin")
b:close()
tap.ok((state().execs.protocols["v4.channel.k8s.io"] or 0) > 0, "the server spoke v4")
faults { exec_protocols = sbx.json.array { "v5" } }
b = assert(box())
tap.is(b:exec("wc -c", { stdin = "12345" }).stdout:gsub("%s", ""), "5", "v5 only: stdin ends with the close signal")
local v5 = state().execs.protocols["v5.channel.k8s.io"] or 0
tap.ok(v5 > 0, "the server spoke v5")
faults { exec_protocols = sbx.json.array {} }
r, err, code = b:exec("true")
tap.ok(r == nil and code == "forbidden" and err:find("403", 1, true), "no common channel protocol: the server's 403", err)
faults { exec_protocols = sbx.json.array { "v5", "v4" } }
b:close()

tap.is(#state().pods, 0, "nothing is left in the stand-in")
standin:stop()
tap.done()

-- needs: docker
-- The daemon refusing a command, and the daemon vanishing under a box:
-- errors with their codes (exec_failed, daemon_unavailable), never a
-- result that looks like the command's own exit code.
-- These are the exec transport's daemon interactions (each command is a
-- daemon exec); the agent transport's answers to the same faults are in
-- tests/agent_attack_test.lua and the conformance suite.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

sbx.use_policy { box = { transport = "exec" } }
local box = H.box()

-- What the daemon refuses: it starts no process, reports exit 126 and Pid 0.
local huge = "echo " .. string.rep("x", 10 * 1000 * 1000)
local r, err, code = box:exec(huge)
tap.is(r, nil, "a 10 MB command gives no result")
tap.is(code, "exec_failed", "but exec_failed (" .. tostring(err):sub(1, 120) .. ")")
tap.like(err, "131071 bytes", "the message names the limit it broke")
r, err, code = box:exec({ "/etc/passwd" })
tap.is(code, "exec_failed", "an argv whose program is not executable: the daemon said so")
tap.like(err, "^the daemon could not start the command: .*permission denied", "with the daemon's words")
r, err, code = box:exec({ "/no/such/program" })
tap.is(code, "exec_failed", "a program that does not exist")
r, err, code = box:exec("id", { user = "nosuchuser" })
tap.is(code, "exec_failed", "an unknown user")
tap.like(err, "unable to find user nosuchuser", "with the daemon's reason")
r, err, code = box:exec("pwd", { cwd = "/does/not/exist" })
tap.is(code, "exec_failed", "a cwd that does not exist")
-- An argument the kernel cannot take, caught before the daemon sees it.
local used = box.usage.commands
r, err, code = box:exec({ "echo", string.rep("y", 200 * 1000) })
tap.is(code, "exec_failed", "a 200 kB argument is refused before it starts")
tap.like(err, "argument 2 is 200000 bytes", "saying which argument and its size")
tap.is(box.usage.commands, used, "and counts against no budget")

-- Without sbx's own check, Docker's refusal of the 10 MB command (Podman
-- hands it to the kernel, whose refusal is the exit 1 that check avoids).
if not box.handle.daemon.podman then
  local nbox = H.box { policy = { exec = { max_arg_bytes = 2 ^ 30 } } }
  r, err, code = nbox:exec(huge)
  tap.is(code, "exec_failed", "the daemon's own refusal of a 10 MB command is exec_failed, not exit 126")
  tap.like(err, "^the daemon could not start the command: .*message", "in the daemon's words (" .. tostring(err):sub(1, 100) .. ")")
  nbox:close()
end

-- A command's own 126 stays a result.
r = assert(box:exec("/etc/passwd"))
tap.is(r.exit_code, 126, "a shell running a non-executable file: exit 126, a result")
tap.like(r.stderr, "Permission denied", "with the shell's message")
r = assert(box:exec("exit 126"))
tap.is(r.exit_code, 126, "exit 126 is a result")
r = assert(box:exec({ "sh", "-c", "exit 126" }))
tap.is(r.exit_code, 126, "also from an argv")

-- A background process the daemon refuses: failed, with the reason.
local name = assert(box:spawn({ "/no/such/program" }))
local view = assert(box:wait(name, 30))
tap.is(view.status, "failed", "a refused background process is failed, not exited 126")
tap.like(view.error, "could not start the command", "with the reason")

-- The model reads the refusal as an error text.
local text, is_error = sbx.tools.call(box:tools(), "bash", { command = huge })
tap.like(text, "^Error: ", "bash tool: a 10 MB command is a tool error")
tap.is(is_error, true, "flagged as one")
box:close()

-- The harness grades a refused command "error", a command's 126 "failed".
local s = sbx.harness.run { progress = "none", box = { image = H.busybox }, tasks = {
  { id = "refused", run = huge },
  { id = "refused-argv", run = { "/no/such/program" } },
  { id = "own126", run = "exit 126" },
} }
local by = {}
for _, res in ipairs(s.results) do by[res.id] = res end
tap.is(by.refused.status, "error", "harness: a 10 MB run is an error")
tap.is(by.refused.code, "exec_failed", "with code exec_failed")
tap.is(by["refused-argv"].status, "error", "harness: a program the daemon cannot start is an error")
tap.is(by.own126.status, "failed", "harness: a command's own exit 126 fails the task")

-- The daemon's socket vanishes under a box: daemon_unavailable, not
-- ECONNREFUSED, ENOENT, closed or exec_failed.
local sock = string.format("/tmp/sbx-faults-%d.sock", sbx.core.pid())
os.remove(sock)
local pgid = H.sh(string.format("setsid socat UNIX-LISTEN:%s,fork UNIX-CONNECT:%s >/dev/null 2>&1 & echo $!", sock, H.daemon_socket())):match("%d+")
for _ = 1, 100 do
  if sbx.core.path_type(sock) then break end
  sbx.sleep(0.05)
end
local pbox = assert(sbx.box { image = H.busybox, docker_host = "unix://" .. sock })
tap.is(assert(pbox:exec("echo via-proxy")).stdout, "via-proxy\n", "a box through a proxy socket")
local bg = assert(pbox:spawn("sleep 300"))
-- The socket file goes; the client's kept-alive API connection still works.
os.remove(sock)
r, err, code = pbox:exec("echo hi")
tap.is(code, "daemon_unavailable", "socket removed: exec says daemon_unavailable (" .. tostring(err) .. ")")
tap.like(err, "unix://" .. sock:gsub("%p", "%%%0"), "naming the daemon's address")
local data
data, err, code = pbox:read_file("/etc/hostname")
tap.is(code, "daemon_unavailable", "read_file too")
local ok
ok, err, code = pbox:kill(bg)
tap.is(code, "daemon_unavailable", "kill too (" .. tostring(err) .. ")")
-- A spawn then is refused at once, or starts and fails saying why.
local late, lerr, lcode = pbox:spawn("echo late")
if late then
  view = pbox:wait(late, 30)
  tap.like(view and view.error, "not answering", "a background process started then: failed, daemon not answering")
else
  tap.is(lcode, "daemon_unavailable", "a spawn then is refused at once: daemon_unavailable (" .. tostring(lerr) .. ")")
end
-- The daemon gone altogether: no process behind the address.
H.sh("kill -- -" .. pgid)
sbx.sleep(0.2)
r, err, code = pbox:exec("echo hi")
tap.is(code, "daemon_unavailable", "proxy gone: daemon_unavailable (" .. tostring(err) .. ")")
-- The box itself still exists on the real daemon: remove it there.
H.api("DELETE", "/containers/" .. pbox.id .. "?force=true&v=true")
pbox.closed = true
tap.done()

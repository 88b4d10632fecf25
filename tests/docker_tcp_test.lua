-- needs: docker, socat
-- DOCKER_HOST=tcp://: the daemon reached over TCP (through socat on
-- loopback, forwarding to the daemon's unix socket), for API calls and for
-- hijacked exec streams with stdin.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local port = 23750 + (sbx.core.pid() % 200)
local pid = H.sh(string.format("socat TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork UNIX-CONNECT:%s >/dev/null 2>&1 & echo $!", port, H.daemon_socket())):match("%d+")
for _ = 1, 50 do
  if sbx.http.request { url = "http://127.0.0.1:" .. port .. "/_ping", timeout = 1 } then break end
  sbx.sleep(0.1)
end
local host = "tcp://127.0.0.1:" .. port
local box, err = sbx.box { image = H.busybox, docker_host = host }
tap.ok(box, "a box over tcp:// (" .. tostring(err) .. ")")
if box then
  tap.is(box.handle.daemon.endpoint, host, "the daemon is the TCP one")
  local r = box:exec("echo over-tcp; echo e >&2; exit 2")
  tap.is(r and r.stdout, "over-tcp\n", "exec streams over TCP")
  tap.is(r and r.exit_code, 2, "with the exit code")
  r = box:exec("wc -c", { stdin = string.rep("y", 50000) })
  tap.like(r and r.stdout, "50000", "stdin with a half-close over TCP")
  r = box:exec("sleep 30", { timeout = 1 })
  tap.is(r and r.timed_out, true, "timeouts kill over TCP too")
  box:close()
  -- A remote daemon on the exec transport: sbx cannot reach the box's
  -- processes from here, so a fork bomb that leaves the box no pid for the
  -- in-box kill makes sbx restart the box, and the result names the
  -- background processes that ended with it. (The agent transport kills the
  -- bomb from its supervisor, which needs no new process.)
  local bomb = assert(sbx.box { image = H.image, docker_host = host, pids = 64, transport = "exec" })
  assert(bomb:spawn("sleep 1000", { name = "server" }))
  r = bomb:exec("bomb(){ bomb | bomb & }; bomb; sleep 100", { timeout = 3 })
  tap.is(r and r.box_restarted, true, "over TCP an unkillable command restarts the box as the last resort")
  tap.is(r and r.ended_processes and table.concat(r.ended_processes, ","), "server", "and lists the background processes it ended")
  tap.is(bomb:processes()[1].status, "killed", "which are marked killed")
  tap.is(bomb:exec("echo alive").stdout, "alive\n", "and the box works afterwards")
  bomb:close()
  tap.is(H.container(box.id), nil, "and the box is removed")
end
H.sh("kill " .. pid)
tap.done()

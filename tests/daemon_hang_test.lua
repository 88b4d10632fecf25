-- needs: docker, root, dockerd
-- A hung daemon never hangs sbx: against a dockerd of the test's own,
-- frozen with SIGSTOP, a timed-out command returns by its timeout +
-- exec.kill_grace + 1 s with its partial output and says the kill could not
-- be confirmed; exec and create on a frozen daemon give up by their
-- deadlines; close and exit are bounded by box.destroy_timeout; and what
-- was created during the hang is removed once the daemon answers again.
-- (These bounds are the guarantees under test, with generous margins.)
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"

local d, why = H.second_daemon()
if not d then
  tap.skip("a frozen daemon", "no second dockerd: " .. tostring(why))
  tap.done()
end

local ok, err = pcall(function()
  -- The exec transport first: every command is a call to the frozen daemon.
  sbx.use_policy { box = { create_timeout = 3, destroy_timeout = 2, reap_on_start = false, transport = "exec" },
    exec = { kill_grace = 2 } }
  local grace = sbx.policy.exec.kill_grace
  local me = tostring(sbx.core.pid())

  -- Frozen during a command.
  local box = assert(sbx.box { image = H.busybox, docker_host = d.host })
  local freezer = sbx.spawn(function() sbx.sleep(0.5) d:freeze() end)
  local t0 = sbx.now()
  local r, e, code = box:exec("echo start; sleep 30", { timeout = 3 })
  local took = sbx.now() - t0
  sbx.wait(freezer)
  tap.ok(r ~= nil, "a command the daemon froze under still gets a result", e)
  r = r or {}
  tap.ok(took <= 3 + grace + 1, string.format("it returns by timeout + kill_grace + 1 s (%.2f s)", took))
  tap.is(r.timed_out, true, "timed_out = true")
  tap.is(r.stdout, "start\n", "with its partial output")
  tap.is(r.kill_confirmed, false, "kill_confirmed = false")
  tap.is(r.error_code, "daemon_unresponsive", "error_code = daemon_unresponsive")

  -- Frozen before the call.
  t0 = sbx.now()
  r, e, code = box:exec("echo x", { timeout = 2 })
  took = sbx.now() - t0
  tap.ok(r == nil and code == "daemon_unresponsive", "exec on a frozen daemon: daemon_unresponsive", e)
  tap.ok(took <= 2 + 1, string.format("by its timeout (%.2f s)", took))
  t0 = sbx.now()
  local b2, cerr, ccode = sbx.box { image = H.busybox, docker_host = d.host }
  took = sbx.now() - t0
  tap.ok(b2 == nil and ccode == "daemon_unresponsive", "create on a frozen daemon: daemon_unresponsive", cerr)
  tap.ok(took <= 3 + 1, string.format("by box.create_timeout (%.2f s)", took))
  t0 = sbx.now()
  local cok, clerr, clcode = box:close()
  took = sbx.now() - t0
  tap.ok(cok == nil and clcode == "daemon_unresponsive", "close on a frozen daemon: daemon_unresponsive", clerr)
  tap.ok(took <= 2 + 1, string.format("by box.destroy_timeout (%.2f s)", took))

  -- The daemon answers again: nothing made during the hang is left.
  d:thaw()
  local left
  for _ = 1, 100 do
    left = d:boxes(me)
    if #left == 0 then break end
    sbx.sleep(0.2)
  end
  tap.is(#left, 0, "once the daemon answers, the box it could not remove and the one it made late are gone (" ..
    table.concat(left, " ") .. ")")
  local fresh = assert(sbx.box { image = H.busybox, docker_host = d.host })
  tap.is(fresh:exec("echo back").stdout, "back\n", "and the daemon serves new boxes")
  fresh:close()

  -- The agent transport: its channel runs through the frozen daemon too. A
  -- command still returns by timeout + kill_grace + 1 s, the kill
  -- unconfirmed; the next command does not hang either.
  local abox = assert(sbx.box { image = H.busybox, docker_host = d.host, transport = "agent" })
  tap.is(abox.transport, "agent", "agent: the box runs on the agent")
  freezer = sbx.spawn(function() sbx.sleep(0.5) d:freeze() end)
  t0 = sbx.now()
  r, e = abox:exec("echo start; sleep 30", { timeout = 3 })
  took = sbx.now() - t0
  sbx.wait(freezer)
  tap.ok(took <= 3 + grace + 1, string.format("agent: a command under a frozen daemon returns by timeout + kill_grace + 1 s (%.2f s)", took), e)
  tap.ok(r and r.timed_out and r.kill_confirmed == false, "agent: timed out, the kill unconfirmed", r and r.error_code)
  t0 = sbx.now()
  r, e, code = abox:exec("echo x", { timeout = 2 })
  took = sbx.now() - t0
  tap.ok(took <= 2 + grace + 1, string.format("agent: the next command is bounded too (%.2f s)", took), e)
  d:thaw()
  abox:close()

  -- Exit never hangs: a script ends while the daemon is frozen.
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local f = assert(io.open(dir .. "/s.lua", "w"))
  f:write(string.format([[
local sbx = require "sbx"
sbx.use_policy { box = { destroy_timeout = 2 } }
local box = assert(sbx.box { image = %q, docker_host = %q })
print(sbx.core.pid())
io.stdout:flush()
os.execute("kill -STOP %d")
]], H.busybox, d.host, d.pid))
  f:close()
  t0 = sbx.now()
  local out = H.sh(string.format("timeout 60 %s run %s/s.lua", H.sbx_bin, dir))
  took = sbx.now() - t0
  local child = out:match("^(%d+)")
  tap.ok(took <= 2 + 2 + 3, string.format("a script that ends on a frozen daemon exits by destroy_timeout (%.2f s)", took), out)
  d:thaw()
  local rout = H.sh("DOCKER_HOST=" .. d.host .. " " .. H.sbx_bin .. " reap")
  tap.like(rout, "owner process " .. tostring(child) .. " is gone", "its box is left to sbx reap, which removes it")
  -- The frozen daemon may still hold the child's own DELETE (409, removal
  -- in progress): wait for it to finish.
  local rest
  for _ = 1, 50 do
    rest = d:boxes(child)
    if #rest == 0 then break end
    sbx.sleep(0.2)
  end
  tap.is(#rest, 0, "and none of it remains")
  os.execute("rm -rf " .. dir)
end)
if not ok then tap.ok(false, "the hang test ran to its end", err) end
d:stop()
tap.done()

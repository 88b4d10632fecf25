-- needs: docker
-- Hostile commands: a fork bomb, a memory hog, a gigabyte of output. The
-- host stays fine and sbx stays in bounded memory.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

-- Under ASan the allocator's quarantine and shadow memory add tens of MiB
-- of resident churn; the bound then only proves nothing accumulates.
local growth_limit = os.getenv("SBX_SANITIZED") and 64 * 1024 or 16 * 1024

local box = H.box { pids = 64, memory = 64 * 1024 * 1024 }

local server = assert(box:spawn("sleep 1000", { name = "server" }))
local r = assert(box:exec("bomb(){ bomb | bomb & }; bomb; sleep 100", { timeout = 3 }))
tap.is(r.timed_out, true, "a fork bomb runs into the timeout")
tap.ok(not r.box_restarted, "the kill cannot fork in the box, yet the box is not restarted")
if box.transport == "agent" then
  tap.is(r.kill_method, nil, "the agent's supervisor kills the bomb's tree without forking")
else
  tap.is(r.kill_method, "host", "the bomb's tree is killed from the daemon's host instead")
end
tap.is(r.kill_confirmed, true, "and the kill is confirmed")
local after = assert(box:exec("echo alive; ls /proc | grep -c '^[0-9]'"))
tap.like(after.stdout, "^alive\n", "the same box works afterwards")
tap.ok(tonumber(after.stdout:match("\n(%d+)")) < 10, "and the bomb's processes are gone")
tap.is(box:processes()[1].status, "running", "an unrelated background server survives the targeted kill")
box:kill(server)
local host = H.sh("echo host-ok")
tap.is(host, "host-ok\n", "the host can still fork")

r = assert(box:exec("head -c 300m /dev/zero | tail > /dev/null; echo exit=$?"))
tap.like(r.output, "Killed", "a memory hog is killed by the box's memory limit")
tap.like(r.stdout, "exit=137", "with SIGKILL's status")
tap.like(assert(box:exec("echo still-here")).stdout, "still%-here", "and the box lives on")

-- A gigabyte through bounded capture: sbx's peak memory does not grow with it.
local _, peak0 = H.rss()
r = assert(box:exec("head -c 1073741824 /dev/zero; echo done >&2"))
local rss, peak1 = H.rss()
tap.is(r.stdout_bytes, 1073741824, "1 GiB of output is counted to the byte")
tap.is(r.truncated, true, "and truncated")
tap.is(#r.parts.stdout.head + #r.parts.stdout.tail <= 256 * 1024, true, "only head and tail are kept")
tap.is(r.stderr, "done\n", "stderr still arrives whole")
tap.ok(peak1 - peak0 < growth_limit, string.format("peak RSS grew by %d KiB for 1 GiB (%d KiB now)", peak1 - peak0, rss))

-- The same with a streaming callback: back-pressure, not buffering.
local seen = 0
_, peak0 = H.rss()
r = assert(box:exec("head -c 268435456 /dev/zero", { on_output = function(_, text) seen = seen + #text end }))
_, peak1 = H.rss()
tap.is(seen, 268435456, "the callback saw every byte of 256 MiB")
tap.ok(peak1 - peak0 < growth_limit, string.format("streaming keeps memory flat (+%d KiB)", peak1 - peak0))

box:close()
tap.done()

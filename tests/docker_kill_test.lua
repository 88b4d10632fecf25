-- needs: docker
-- Timeouts and kills take the whole process tree, inside the box, without
-- host pids; background processes keep bounded output and can be read,
-- waited for and killed.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local box = H.box()

-- A tree with a grandchild, a subshell and a setsid escapee.
local r = assert(box:exec("sleep 101 & sleep 102 & (sleep 103 & sleep 104; wait) & setsid sleep 105 & echo started; wait", { timeout = 1 }))
tap.is(r.timed_out, true, "the command timed out")
tap.is(r.exit_code, nil, "a killed command has no exit code")
tap.is(r.stdout, "started\n", "partial output is kept")
tap.ok(r.duration >= 1, "it ran until the timeout")
local left = H.procs_matching(box, "sleep 10[1-5]")
tap.is(#left, 0, "no process of the tree survives (" .. table.concat(left, "; ") .. ")")

-- The same on busybox (no bash, busybox grep/kill).
local bb = H.box { image = H.busybox }
r = assert(bb:exec("sleep 201 & sleep 202 & echo go; wait", { timeout = 1 }))
tap.is(r.timed_out, true, "busybox: timed out")
tap.is(#H.procs_matching(bb, "sleep 20[12]"), 0, "busybox: the tree is gone")

-- A command that never ends and prints forever is cut at the timeout too.
r = assert(box:exec("yes", { timeout = 1 }))
tap.is(r.timed_out, true, "an endless printer times out")
tap.ok(r.stdout_bytes > 0 and r.truncated, "its output was counted and bounded (" .. r.stdout_bytes .. " bytes)")
tap.is(#H.procs_matching(box, "^%d+ yes"), 0, "and it is gone")

-- Other commands in the same box are unaffected by a timeout.
local slow = sbx.spawn(function() return box:exec("sleep 0.5; echo slow-ok", { timeout = 10 }) end)
local fast = assert(box:exec("sleep 30", { timeout = 0.2 }))
tap.is(fast.timed_out, true, "one command times out")
tap.is(sbx.wait(slow).stdout, "slow-ok\n", "while another in the same box finishes normally")

-- Background processes.
local name = assert(box:spawn("echo first; sleep 0.3; echo second >&2; exit 5"))
tap.is(name, "p1", "first name is p1")
local p = box:processes()[1]
tap.is(p.status, "running", "listed as running")
local done = assert(box:wait(name, 10))
tap.is(done.status, "exited", "wait returns once it exits")
tap.is(done.exit_code, 5, "with its exit code")
local e1 = box:processes()[1].elapsed
sbx.sleep(0.3)
tap.is(box:processes()[1].elapsed, e1, "elapsed stops at exit")
local o = assert(box:output(name))
tap.is(o.text, "first\nsecond\n", "background output is kept (both streams)")
tap.is(o.next_offset, 13, "next offset")
o = assert(box:output(name, { offset = 6 }))
tap.is(o.text, "second\n", "read from an offset")
o = assert(box:output(name, { offset = 0, max_bytes = 3 }))
tap.is(o.text .. "|" .. o.next_offset, "fir|3", "read a window")

local tree = assert(box:spawn("sleep 301 & (sleep 302 &) ; setsid sleep 303 & for i in $(seq 1 1000); do echo tick $i; sleep 0.05; done", { name = "srv" }))
tap.is(tree, "srv", "a chosen name")
local n2, err, code = box:spawn("true", { name = "srv" })
tap.is(code, "name_in_use", "a running name cannot be reused (" .. tostring(err) .. ")")
n2, err, code = box:spawn("true", { name = "../etc" })
tap.is(code, "invalid_name", "names are validated")
n2, err, code = box:wait("srv", 0.2)
tap.is(code, "timeout", "wait with a timeout returns timeout for a running process")
sbx.sleep(0.3)
tap.like(box:output("srv").text, "tick 1\n", "output of a running process")
local killed = assert(box:kill("srv"))
tap.is(killed.status, "killed", "kill reports killed")
tap.is(#H.procs_matching(box, "sleep 30[123]"), 0, "kill takes the whole tree, setsid included")
tap.is(box:processes()[2].status, "killed", "the list says killed")
local again = assert(box:spawn("echo reused", { name = "srv" }))
tap.is(again, "srv", "a finished name can be reused")
box:wait("srv", 5)
tap.is(box:output("srv").text, "reused\n", "and the new process has its own log")

-- TERM reaches a process that handles it.
local trap = assert(box:spawn("trap 'echo got-term; exit 0' TERM; while :; do sleep 0.1; done", { name = "trap" }))
sbx.sleep(0.3)
box:kill(trap, "TERM")
local t = box:wait(trap, 5)
tap.is(t and t.exit_code, 0, "a TERM handler runs and exits cleanly")
tap.like(box:output(trap).text, "got%-term", "and its output shows it")

-- A bounded log: a chatty process keeps the head and the newest bytes.
sbx.use_policy { background = { log = { head = 1000, tail = 4000 } } }
local chatty = assert(box:spawn("seq 1 100000", { name = "chatty" }))
box:wait(chatty, 20)
o = assert(box:output(chatty, { offset = 0, max_bytes = 100000 }))
tap.ok(#o.text <= 1000, "a read stops at the gap after the head")
o = assert(box:output(chatty, { offset = o.next_offset }))
tap.ok(o.skipped > 0, "the next read reports the skipped bytes (" .. o.skipped .. ")")
tap.like(o.text, "100000\n$", "and continues with the newest output")
tap.is(o.total, 588895, "the total counts every byte")

-- Unknown names.
local x
x, err, code = box:output("nope")
tap.is(code, "not_found", "output of an unknown process")
x, err, code = box:kill("nope")
tap.is(code, "not_found", "kill of an unknown process")

-- A timed-out script never runs its next step: the kill stops the whole
-- tree before it kills it (a parent shell killed after its child would go
-- on). Six fresh boxes each, bash and busybox.
local function next_step_never_runs(image, label)
  local ran = 0
  for i = 1, 6 do
    local b = H.box { image = image }
    local rr = assert(b:exec("sleep 3; echo AFTER > /tmp/after.txt; echo done", { timeout = 1 }))
    sbx.sleep(2.5)
    local seen = b:exec("test -e /tmp/after.txt && echo yes || echo no").stdout
    if rr.stdout:find("done") or seen ~= "no\n" or not rr.timed_out then ran = ran + 1 end
    b:close()
  end
  tap.is(ran, 0, label .. ": a timed-out script's next step never runs (6 of 6 boxes)")
end
next_step_never_runs(H.image, "bash")
next_step_never_runs(H.busybox, "busybox")

-- The kill cannot be escaped by clearing the job marker (env -i) and
-- daemonizing (setsid, double fork), even when the job's first process is
-- already gone and an escapee holds its output open.
local esc = H.box { image = H.busybox }
r = assert(esc:exec([[env -i setsid sh -c '(sleep 401 &) ; sleep 402' & env -i sh -c 'sleep 403 > /dev/null 2>&1 &'; sleep 404]], { timeout = 1 }))
tap.is(r.timed_out, true, "escape: the command timed out")
sbx.sleep(0.2)
left = H.procs_matching(esc, "sleep 40[1-4]")
tap.is(#left, 0, "escape: env -i + setsid + double fork are killed too (" .. table.concat(left, "; ") .. ")")
r = assert(esc:exec([[env -i setsid sh -c 'sleep 405' & echo bye]], { timeout = 1 }))
tap.is(r.timed_out, true, "an escapee that holds the output keeps the command open until the timeout")
sbx.sleep(0.2)
tap.is(#H.procs_matching(esc, "sleep 405"), 0, "and it is killed although the job's first process had exited")
local keeper = assert(esc:spawn("sleep 406", { name = "keeper" }))
r = assert(esc:exec("sleep 30", { timeout = 0.5 }))
tap.is(esc:processes()[1].status, "running", "another job's background process survives the timeout kill")
tap.is(#H.procs_matching(esc, "sleep 406"), 1, "(its process is still there)")
tap.is(esc:exec("echo alive").stdout, "alive\n", "and the box lives on")
esc:kill(keeper)
esc:close()

box:close()
bb:close()
tap.done()

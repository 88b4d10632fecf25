-- needs: docker
-- The logs of finished background processes share a per-box budget
-- (policy.background.retain_bytes): the oldest finished logs are freed
-- for real, their records stay, and reading one says "evicted".
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
package.loaded["sbx.backends.fake"] = require "fake_backend"

-- The C side: release frees the buffers now and keeps the counts.
local s = sbx.core.stream.sink { capture = { stdout = { head = 1000, tail = 100000 },
  stderr = { head = 0, tail = 0 }, output = { head = 1000, tail = 100000 } } }
s:push("stdout", string.rep("y", 5000))
tap.ok(s:info().held_bytes >= 200000, "a running capture holds its ring (" .. s:info().held_bytes .. " bytes)")
s:finish()
tap.is(s:info().held_bytes, 10000, "an ended stream shrinks to the bytes it keeps")
s:release()
tap.is(s:info().held_bytes, 0, "release frees every buffer")
tap.is(s:info().stdout_bytes, 5000, "and keeps the count")
local head, tail, total = s:captured("output")
tap.ok(head == "" and tail == "" and total == 5000, "captured reads empty with the total")
tap.is(s:read("output", 0, 2 ^ 40), "", "a huge read of a freed capture allocates nothing")

-- Accounting, daemon-free: "print N" prints N bytes; "hang" runs until killed.
local function respond(_, cmd)
  if cmd == "hang" then return { stdout = string.rep("h", 1000), hang = true } end
  return { stdout = string.rep("x", tonumber(cmd:match("%d+"))) }
end
local box = assert(sbx.box { backend = "fake", respond = respond,
  policy = { background = { retain_bytes = 250000 } } })
local function run(cmd, name)
  local n = assert(box:spawn(cmd, { name = name }))
  assert(box:wait(n, 5))
  return n
end
tap.is(box.retained_bytes, 0, "nothing retained at first")
run("print 100000")
run("print 100000")
tap.is(box.retained_bytes, 200000, "two finished logs: 200000 bytes retained")
local hang = assert(box:spawn("hang"))
tap.is(box.retained_bytes, 200000, "a running process's log is not counted")
run("print 100000")
tap.is(box.retained_bytes, 200000, "the third log pushes the oldest out")
local o, err, code = box:output("p1")
tap.is(o, nil, "the oldest log is gone")
tap.is(code, "evicted", "with the code evicted")
tap.like(err, "no longer kept", "a message that says so")
tap.like(err, "retain_bytes", "names the knob")
tap.like(err, "redirect it to a file", "and says what to do")
local view = box:processes()[1]
tap.ok(view.name == "p1" and view.status == "exited" and view.exit_code == 0 and view.output_bytes == 100000 and view.evicted,
  "its record stays: status, exit code, byte count, evicted")
tap.is(box:output("p2").total, 100000, "the newer logs are still there")
tap.is(#box:output(hang).text, 1000, "so is the running one's")
tap.is(box:wait("p1").output_bytes, 100000, "wait on an evicted process gives its view")
tap.is(box:kill("p1").status, "exited", "so does kill")

-- A reused name frees the old log at once.
run("print 50000", "p2")
tap.is(box.retained_bytes, 150000, "reusing a name frees the old log (100000 + 50000)")
tap.is(box:output("p2").total, 50000, "the name reads the new log")

-- One log larger than the whole budget does not stay.
run("print 300000", "big")
tap.is(box.retained_bytes, 0, "a log over the budget frees itself and the older ones")
tap.is(select(3, box:output("big")), "evicted", "and reads as evicted")

-- Through the tools: the model reads the message, not an exception.
local tools = box:tools()
tap.like(sbx.tools.call(tools, "process_output", { name = "p1" }), "^Error: the output of process 'p1' %(exited 0, 100000 bytes%) is no longer kept",
  "process_output explains an evicted log")
tap.like(sbx.tools.call(tools, "list_processes", {}), "p1%s+exited 0%s+%d+%.%ds%s+100000B", "list_processes still lists it")

-- retain_bytes = 0: every log is freed when its process ends.
sbx.use_policy { background = { retain_bytes = 0 } }
local zero = assert(sbx.box { backend = "fake", respond = respond })
local n = assert(zero:spawn("print 10"))
assert(zero:wait(n, 5))
tap.is(select(3, zero:output(n)), "evicted", "retain_bytes = 0 frees at once")
zero:close()
sbx.use_policy { background = { retain_bytes = 16 * 1024 * 1024 } }
box:kill(hang)
box:close()

-- Checked when loaded.
tap.checkerr("background.retain_bytes must be", function() sbx.use_policy { background = { retain_bytes = -1 } } end)

-- The real daemon: 30 jobs printing 1.1 MB each under a 4 MiB budget.
local dbox = H.box { policy = { background = { retain_bytes = 4 * 1024 * 1024 } } }
assert(dbox:exec("true"))
collectgarbage()
local rss0 = H.rss()
for _ = 1, 3 do
  local names = {}
  for i = 1, 10 do names[i] = assert(dbox:spawn("head -c 1100000 /dev/zero | tr '\\0' x")) end
  for _, name in ipairs(names) do assert(dbox:wait(name, 60)) end
end
collectgarbage()
local rss1 = H.rss()
tap.is(dbox.retained_bytes, 3 * 1100000, "three 1.1 MB logs fit in 4 MiB, compacted to their bytes")
local kept, freed = 0, 0
for _, p in ipairs(dbox:processes()) do
  if p.evicted then freed = freed + 1 else kept = kept + 1 end
  assert(p.output_bytes == 1100000 and p.exit_code == 0)
end
tap.is(kept .. "/" .. freed, "3/27", "27 logs freed, 3 kept; every record keeps its count and exit code")
local last   -- the latest to finish are kept, whatever order they started in
for _, p in ipairs(dbox:processes()) do if not p.evicted then last = p.name end end
local o2 = assert(dbox:output(last, { offset = 1100000 - 5, max_bytes = 100 }))
tap.is(o2.text, "xxxxx", "a kept log reads to its end")
tap.diag(string.format("RSS %d KiB before, %d KiB after 30 x 1.1 MB (+%d KiB)", rss0, rss1, rss1 - rss0))
dbox:close()
tap.done()

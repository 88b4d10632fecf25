-- needs: nothing
-- The host without Docker: tasks, waits, events, semaphores, JSON, text,
-- HTTP errors.
local tap = require "tap"
local sbx = require "sbx"
local json = sbx.json

local order = {}
local a = sbx.spawn(function() sbx.sleep(0.05) order[#order + 1] = "a" return 1, 2 end)
local b = sbx.spawn(function() order[#order + 1] = "b" return "b" end)
tap.is(select("#", sbx.wait(a)), 2, "wait returns every result")
tap.is(sbx.wait(b), "b", "wait on a finished task")
tap.is(table.concat(order), "ba", "tasks interleave on the loop")
local t0 = sbx.now()
local ts = {}
for i = 1, 50 do ts[i] = sbx.spawn(function() sbx.sleep(0.2) return i end) end
local res = sbx.gather(ts)
tap.is(#res, 50, "gather returns all results")
tap.ok(sbx.now() - t0 < 2, "50 sleeps of 0.2 s run concurrently")

local bad = sbx.spawn(function() error("boom") end)
tap.checkerr("boom", sbx.wait, bad)
tap.checkerr("boom", sbx.gather, { sbx.spawn(function() return 1 end), bad })
local slow = sbx.spawn(function() sbx.sleep(5) end)
tap.is(select(3, sbx.wait(slow, 0.05)), "timeout", "wait with a timeout")
tap.ok(slow:cancel(), "a waiting task can be cancelled")
tap.checkerr("cancelled", sbx.wait, slow)
-- A task cancelled before it ran gets the cancel at its first wait.
do
  local after = false
  local queued = sbx.spawn(function() sbx.sleep(0) after = true end)
  tap.ok(queued:cancel(), "a task not started yet can be cancelled")
  tap.checkerr("cancelled", sbx.wait, queued)
  tap.is(after, false, "its first wait ended it: the code after never ran")
end

local sem = sbx.semaphore(2)
local running, peak = 0, 0
local ws = {}
for i = 1, 6 do
  ws[i] = sbx.spawn(function()
    sem:with(function()
      running = running + 1
      peak = math.max(peak, running)
      sbx.sleep(0.02)
      running = running - 1
    end)
  end)
end
sbx.gather(ws)
tap.is(peak, 2, "a semaphore bounds concurrency")

local ev = sbx.event()
local waiter = sbx.spawn(function() return ev:wait() end)
sbx.sleep(0.01)
tap.is(waiter:status(), "waiting", "a task waits on an event")
ev:set()
tap.is(sbx.wait(waiter), true, "set wakes it")
tap.is(sbx.event():wait(0.01), false, "an event wait times out")

-- Blocking calls inside plain coroutines still work (they drive the loop).
local co = coroutine.wrap(function() sbx.sleep(0.01) return "co-ok" end)
tap.is(co(), "co-ok", "a plain coroutine may call blocking primitives")
tap.checkerr("deadlock", function() sbx.event():wait() end)

-- JSON
tap.is(json.encode({ b = 1, a = { 1, 2, json.null }, c = json.array(), d = json.object() }),
  '{"a":[1,2,null],"b":1,"c":[],"d":{}}', "encode: sorted keys, null, empty array and object")
tap.is(json.encode("a\0\255"), '"a\u{FFFD}\u{FFFD}"', "invalid UTF-8 and NUL encode as U+FFFD")
tap.is(json.decode(json.encode({ f = 0.1 + 0.2 })).f, 0.1 + 0.2, "floats round-trip exactly")
tap.is(json.encode(0.5), "0.5", "and print short when they can")
local v = json.decode('{"x":[1,2.5,"s",true,null],"y":{}}')
tap.is(v.x[2] + v.x[1], 3.5, "decode numbers")
tap.is(v.x[5], json.null, "decode null")
tap.is(json.encode(v.y), "{}", "an empty object stays an object")
-- \u0000 decodes to a NUL byte, not to the end of the string.
tap.is(json.decode('"a\\u0000b"'), "a\0b", "\\u0000 decodes to a NUL byte, nothing is cut")
local kn = json.decode('{"k\\u0000":["\\u0000\\u0000"]}')
tap.is(kn["k\0"] and kn["k\0"][1], "\0\0", "in keys and arrays too")
tap.is(json.decode('"a\\\\u0000"'), "a\\u0000", "an escaped backslash before u0000 is text")
tap.is(select(3, json.decode('"\\u0000\\uffff"')), "json", "NUL with U+FFFF in one text is refused, not guessed")
local nv, nerr, ncode = json.decode("{bad")
tap.is(ncode, "json", "malformed JSON returns an error code")
tap.like(nerr, "invalid JSON", "and a message")
local deep = string.rep("[", 500) .. string.rep("]", 500)
tap.is(select(3, json.decode(deep)), "json", "too deep is refused, not a crash")
local cyc = {}
cyc.self = cyc
tap.checkerr("nested too deeply", json.encode, cyc)
tap.checkerr("cannot encode a function", json.encode, { f = print })

-- Text
tap.is(sbx.text.sanitize("a\255b"), "a\u{FFFD}b", "sanitize replaces invalid bytes")
tap.is(sbx.text.valid("é"), true, "valid UTF-8")
tap.is(sbx.text.head_cut("ab\xE2\x82"), "ab", "head_cut drops a split character")
tap.is(sbx.text.tail_cut("\x82\xACab"), "ab", "tail_cut drops leading continuation bytes")

-- HTTP failures are values.
local r, err, code = sbx.http.request { url = "http://127.0.0.1:1/" }
tap.is(r, nil, "a refused connection returns nil")
tap.is(code, "ECONNREFUSED", "with a stable code (" .. tostring(err) .. ")")
r, err, code = sbx.http.request { url = "http://x/", unix_socket = "/tmp/sbx-none.sock" }
tap.is(r, nil, "a missing unix socket too (" .. tostring(code) .. ")")
tap.checkerr("url", sbx.http.request, {})

-- A failed task nobody kept is collected before the end: drain says nothing
-- about it (its finalizer ran, its weak entry goes one cycle later), and
-- still reports a failed task that is kept.
do
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write([[
local sbx = require "sbx"
local kept = sbx.spawn(function() error("boom-kept", 0) end)
sbx.spawn(function() error("boom-dropped", 0) end)
sbx.sleep(0)
collectgarbage()
]])
  f:close()
  local p = io.popen((os.getenv("SBX_BIN") or "build/sbx") .. " run " .. path .. " 2>&1")
  local out = p:read("a")
  p:close()
  os.remove(path)
  local reports = select(2, out:gsub("a task failed and nobody waited for it", ""))
  tap.is(reports, 1, "one report, for the kept task", out)
  tap.like(out, "nobody waited for it: boom%-kept", "with its error")
end

-- A signal reaches every task once: those queued to run (not started yet)
-- at their first wait, so they do not begin work the script is being
-- stopped from doing (a box created after SIGINT), and sbx run ends. The
-- script spawns its tasks and runs without waiting until the signal came.
do
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local path = dir .. "/queued.lua"
  local f = assert(io.open(path, "w"))
  f:write((([[
local sbx = require "sbx"
for i = 1, 3 do
  sbx.spawn(function()
    sbx.sleep(0.01)
    io.open("DIR/started-" .. i, "w"):close()
    sbx.sleep(30)
  end)
end
io.open("DIR/spawned", "w"):close()
while sbx.core.signals() == 0 do end
sbx.sleep(30)
]]):gsub("DIR", dir)))
  f:close()
  local p = io.popen(string.format([[
timeout -s KILL 25 %s run %s 2>&1 & pid=$!
while [ ! -e %s/spawned ]; do sleep 0.01; done
kill -INT $pid; wait $pid; echo rc=$?]], os.getenv("SBX_BIN") or "build/sbx", path, dir))
  local out = p:read("a")
  p:close()
  tap.like(out, "rc=130", "sbx run ends with 130 after SIGINT, not held by the queued tasks", out)
  local started = io.popen("ls " .. dir .. " | grep -c started"):read("a")
  tap.is(tonumber(started), 0, "no queued task got past its first wait", out)
  os.execute("rm -rf " .. dir)
end
-- core.shield: an interrupt waits for the shielded code (up to its grace),
-- then reaches the thread's next wait; past the grace it ends the wait in
-- progress. In a task and in the main thread.
do
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local path = dir .. "/shield.lua"
  local f = assert(io.open(path, "w"))
  f:write((([[
local sbx = require "sbx"
local mode, grace, inner = arg[1], tonumber(arg[2]), tonumber(arg[3])
local function body()
  sbx.core.shield(grace, function()
    io.open("DIR/" .. mode .. ".in", "w"):close()
    sbx.sleep(inner)
    io.open("DIR/" .. mode .. ".inner-done", "w"):close()
  end)
  sbx.sleep(20)
  io.open("DIR/" .. mode .. ".after", "w"):close()
end
if mode == "task" then sbx.spawn(body) sbx.sleep(30) else body() end
]]):gsub("DIR", dir)))
  f:close()
  local function run(mode, grace, inner)
    local p = io.popen(string.format([[
timeout -s KILL 25 %s run %s %s %s %s 2>&1 & pid=$!
while [ ! -e %s/%s.in ]; do sleep 0.01; done
kill -INT $pid; wait $pid; echo rc=$?]], os.getenv("SBX_BIN") or "build/sbx", path, mode, grace, inner, dir, mode))
    local out = p:read("a")
    p:close()
    local function exists(what)
      local g = io.open(dir .. "/" .. mode .. "." .. what)
      if g then g:close() end
      return g ~= nil
    end
    return out, exists("inner-done"), exists("after")
  end
  for _, mode in ipairs { "task", "main" } do
    local out, done, after = run(mode, 10, 0.5)
    tap.like(out, "rc=130", mode .. ": SIGINT during a shield still ends sbx run with 130", out)
    tap.is(done, true, mode .. ": the shielded wait ran to its end")
    tap.is(after, false, mode .. ": the next wait after the shield got the interrupt")
    os.execute("rm -f " .. dir .. "/" .. mode .. ".*")
    out, done, after = run(mode, 0.2, 20)
    tap.like(out, "rc=130", mode .. ": past the grace the shielded wait is interrupted, and sbx run ends", out)
    tap.is(done, false, mode .. ": the shielded code did not get past its wait")
    tap.is(after, false, mode .. ": nor did the code after it")
    os.execute("rm -f " .. dir .. "/" .. mode .. ".*")
  end
  tap.is(select(2, pcall(sbx.core.shield, -1, print)):match("seconds, 0 or more") ~= nil, true,
    "a negative grace raises")
  tap.is(sbx.core.shield(1, function(a, b) return a + b, "x" end, 2, 3), 5, "shield returns fn's results")
  tap.checkerr("inner boom", sbx.core.shield, 1, function() error("inner boom") end)
  os.execute("rm -rf " .. dir)
end
tap.done()

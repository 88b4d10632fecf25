-- needs: nothing
-- sbx.deadline (docs/lua-deadlines.md), tried the way a hostile task
-- function would: loops that never wait, pcall around the loop, a pcall in a
-- tail call, xpcall with a looping handler, waits that never end, nested
-- deadlines, tasks on the loop. No daemon. Bounds that prove "it ended" are
-- generous (a loaded machine); nothing here asserts a speed.
local tap = require "tap"
local sbx = require "sbx"
local core = sbx.core

local function ends(name, fn, want_code)
  local ok, msg, code = sbx.deadline(0.2, fn)
  tap.ok(ok == false and code == (want_code or "timeout"), name, tostring(msg) .. " " .. tostring(code))
end

ends("a loop that never waits is stopped", function() while true do end end)
ends("a pcall around the loop does not keep it going",
  function() while true do pcall(function() while true do end end) end end)
ends("nor a pcall in a tail call that swallows the error",
  function() return pcall(function() while true do end end) end)
-- A task file's xpcall (its environment's): the handler of an error the
-- hook raised would run with hooks off, so it does not run after the
-- deadline. (The stock xpcall is sbx's own code's and the policy's.)
local txpcall = sbx.harness.task_env().xpcall
ends("nor xpcall with a handler that loops",
  function() while true do txpcall(function() while true do end end, function() while true do end end) end end)
ends("nor an error handler that calls the loop again",
  function()
    local function spin() while true do end end
    while true do txpcall(spin, spin) end
  end)
local hok, hmsg = txpcall(function() error("mine", 0) end, function(e) return "handled " .. e end)
tap.ok(hok == false and hmsg == "handled mine", "a task's xpcall handler still handles its own errors", hmsg)
local yr = table.pack(txpcall(function(a) return a, 2 end, print, 1))
tap.ok(yr.n == 3 and yr[1] == true and yr[2] == 1 and yr[3] == 2, "and returns what the function returned")
local ytask = sbx.spawn(function() return txpcall(function() sbx.sleep(0.01) return "woke" end, print) end)
local yok, yv = sbx.wait(ytask)
tap.ok(yok == true and yv == "woke", "a wait inside it still yields", yv)
ends("a wait that never ends is cancelled", function() sbx.sleep(3600) end)
ends("a pcall around a wait does not let a new wait start",
  function() while true do pcall(sbx.sleep, 3600) end end)
ends("an event nobody sets", function() sbx.event():wait() end)
ends("string.gsub with a looping callback",
  function() return (string.gsub("abc", ".", function() while true do end end)) end)
ends("table.sort with a looping comparator",
  function() table.sort({ 3, 2, 1 }, function() while true do end end) end)

-- A pattern that backtracks for hours runs in C, where the count hook
-- never runs: a task file's pattern functions (and every string's methods)
-- look at the deadline as they match.
local penv = sbx.harness.task_env()
local bomb = load([[
  local s = string.rep("a", 60)
  local P = ".-.-.-.-.-.-.-.-.-.-b"
  return function() return string.find(s, P) end, function() return s:match(P) end,
    function() return (string.gsub(s, P, "x")) end, function() for _ in s:gmatch(P) do end end
]], "=bomb", "t", penv)
for i, f in ipairs { bomb() } do
  ends("a pattern that backtracks for hours (" .. ({ "find", "s:match", "gsub", "s:gmatch" })[i] .. ")", f)
end
-- Outside a deadline they are the stock functions.
local stock = { find = string.find, match = string.match, gsub = string.gsub }
local same = true
for _, c in ipairs {
  { "hello world", "o w" }, { "hello world", "(o)(.)" }, { "x=1, y=2", "(%w+)=(%w+)" }, { " trim me ", "^%s*(.-)%s*$" },
  { "THE (quick) fox", "%((%a+)%)" }, { "abc", "()b()" }, { "f(a(b)c)", "%b()" }, { "THE", "%f[%a]%a+" }, { "a.b", "." },
} do
  for _, fn in ipairs { "find", "match" } do
    local a, b = table.pack(stock[fn](c[1], c[2])), table.pack(penv.string[fn](c[1], c[2]))
    if a.n ~= b.n then same = false end
    for j = 1, a.n do if a[j] ~= b[j] then same = false end end
  end
  if stock.gsub(c[1], c[2], "<%0>") ~= penv.string.gsub(c[1], c[2], "<%0>") then same = false end
end
tap.ok(same, "a task's find, match and gsub return what the stock ones do")
tap.checkerr("malformed pattern", penv.string.find, "x", "[a")

-- Results and errors.
local r = table.pack(sbx.deadline(5, function(a, b) return a + b, nil, "x" end, 1, 2))
tap.is(r.n, 4, "every result comes back, nils too")
tap.ok(r[1] == true and r[2] == 3 and r[3] == nil and r[4] == "x", "as they were")
local ok, msg, code = sbx.deadline(5, function() error("boom", 0) end)
tap.ok(ok == false and msg == "boom" and code == "error", "an error is returned, code 'error'")
ok, msg, code = sbx.deadline(5, function() error(setmetatable({}, { __tostring = function() while true do end end })) end)
tap.ok(ok == false and code == "error" and msg:find("table value"), "an error object is not converted by its own metamethods", msg)
tap.checkerr("positive", sbx.deadline, 0, function() end)
tap.checkerr("positive", sbx.deadline, 0 / 0, function() end)
tap.checkerr("function expected", sbx.deadline, 1, "not a function")

-- Waits inside a deadline that ends in time are untouched.
ok = sbx.deadline(5, function() sbx.sleep(0.05) return true end)
tap.ok(ok, "a wait shorter than the deadline finishes")

-- Nesting: the inner ends first and the outer goes on; an outer that ends
-- stops the inner too, and code between them cannot catch it.
local inner_code, after
ok, msg, code = sbx.deadline(5, function()
  local _, _, c = sbx.deadline(0.1, function() while true do end end)
  inner_code = c
  after = true
  return "outer done"
end)
tap.ok(ok and msg == "outer done" and inner_code == "timeout" and after, "an inner deadline ends, the outer goes on")
local between = 0
ok, msg, code = sbx.deadline(0.2, function()
  while true do
    local _, _, c = sbx.deadline(3600, function() while true do end end)
    between = between + 1
    if c then sbx.sleep(0) end
  end
end)
tap.is(code, "timeout", "an outer deadline stops code under an inner one")
tap.ok(between <= 1, "and the code between them does not go on looping", between)

-- After a deadline, the thread runs normally again.
local n = 0
for _ = 1, 100000 do n = n + 1 end
tap.is(n, 100000, "code after an ended deadline runs (the hook is back to normal)")
ok = sbx.deadline(5, function() sbx.sleep(0.01) return true end)
tap.ok(ok, "and may wait again")

-- Tasks on the loop: one task's deadline is its own.
local spinner = sbx.spawn(function() return sbx.deadline(0.2, function() while true do end end) end)
local sleeper = sbx.spawn(function() return sbx.deadline(30, function() sbx.sleep(0.3) return "slept" end) end)
local a = table.pack(sbx.wait(spinner))
local b = table.pack(sbx.wait(sleeper))
tap.ok(a[1] == false and a[3] == "timeout", "a spinning task's deadline ends it")
tap.ok(b[1] == true and b[2] == "slept", "another task's deadline is not touched by it")

-- Many tasks with deadlines at once: each ends by its own.
local ts = {}
for i = 1, 20 do
  ts[i] = sbx.spawn(function()
    return sbx.deadline(0.1 + i * 0.01, function()
      if i % 2 == 0 then while true do end else sbx.sleep(3600) end
    end)
  end)
end
local timeouts = 0
for i = 1, 20 do
  local _, _, c = sbx.wait(ts[i])
  if c == "timeout" then timeouts = timeouts + 1 end
end
tap.is(timeouts, 20, "20 tasks, spinning or waiting, each end at their deadline")

-- A task file's environment cannot set a finalizer (it would run with the
-- hook off) nor reach the real string table.
local env = sbx.harness.task_env()
local chunk = load([[
  local ok1 = pcall(setmetatable, {}, { __gc = function() while true do end end })
  local ok2 = pcall(setmetatable, {}, { __gc = true })
  local smt = getmetatable("")
  smt.__index.upper = function() return "pwned" end
  local ok3 = pcall(function() return ("x").dump(function() end) end)
  return ok1, ok2, collectgarbage, coroutine, load, string.dump, ok3
]], "=task", "t", env)
local ok1, ok2, cg, co, ld, dump, ok3 = chunk()
tap.ok(not ok1 and not ok2, "__gc is refused in a task environment")
tap.ok(cg == nil and co == nil and ld == nil and dump == nil, "no collectgarbage, coroutine, load or string.dump")
tap.ok(not ok3, "(''):dump does not reach string.dump")
tap.is(("abc"):upper(), "ABC", "the stand-in string metatable changed nothing of sbx's strings")
tap.is(string.upper("abc"), "ABC", "nor the real string table")
tap.isnt(getmetatable("").__index, env.string, "the real metatable is not the task's")

tap.done()

-- needs: nothing
-- One tested home each for what sbx's secrets and shell words are made of
-- (issue 18, item 4): core.random (OpenSSL's CSPRNG), sbx.util's hex,
-- unhex, shell_quote and random_id; and no module of lua/sbx makes its own.
local tap = require "tap"
local sbx = require "sbx"
local core = sbx.core
local util = require "sbx.util"

-- core.random ---------------------------------------------------------------
local b = core.random.bytes(32)
tap.is(#b, 32, "random.bytes(32) is 32 bytes")
tap.is(core.random.bytes(0), "", "random.bytes(0) is empty")
tap.ok(core.random.bytes(32) ~= b, "two draws differ")
local h = core.random.hex(16)
tap.ok(#h == 32 and not h:find("[^0-9a-f]"), "random.hex(16) is 32 lowercase hex digits: " .. h)
-- Every byte value turns up in 64 KiB (a stuck or biased source would not).
local seen, big = {}, core.random.bytes(65536)
for i = 1, #big do seen[big:byte(i)] = true end
local n = 0
for _ in pairs(seen) do n = n + 1 end
tap.is(n, 256, "64 KiB of random bytes hold all 256 values")
for _, bad in ipairs { -1, 65537, 1.5 } do
  tap.ok(not pcall(core.random.bytes, bad), "random.bytes(" .. tostring(bad) .. ") raises")
  tap.ok(not pcall(core.random.hex, bad), "random.hex(" .. tostring(bad) .. ") raises")
end

-- random_id ------------------------------------------------------------------
local ids = {}
local dup = false
for _ = 1, 1000 do
  local id = util.random_id()
  if ids[id] or #id ~= 16 or id:find("[^0-9a-f]") then dup = true end
  ids[id] = true
end
tap.ok(not dup, "1000 random ids: 16 hex digits each, no repeat")
tap.is(require("sbx.job").random_id, util.random_id, "sbx.job's random_id is util's")
tap.is(require("sbx.box").random_id, util.random_id, "and so is sbx.box's")
-- Not Lua's generator: seeding math.random the same way twice changes nothing.
math.randomseed(42)
local a1 = util.random_id()
math.randomseed(42)
tap.ok(util.random_id() ~= a1, "random_id does not follow math.randomseed")

-- core.is_cancel: the host's own stops, read back in one place --------------
local cases = {
  { "cancelled", "cancelled" },
  { "interrupted (signal 2)", "interrupted" },
  { "interrupted (signal 15)\nstack traceback:\n\t[C]: in ?", "interrupted" },
  { "deadline exceeded", "deadline" },
  { "task.lua:12: cancelled", "cancelled" },
  { "interrupted (signal )", nil },
  { "interrupted", nil },
  { "cancelled by the user", nil },
  { "the command printed: interrupted (signal 2)", nil },
  { "output: cancelled", nil },
  { "", nil },
}
for _, c in ipairs(cases) do
  tap.is(core.is_cancel(c[1]), c[2], string.format("is_cancel(%q)", c[1]))
end
tap.is(core.is_cancel(nil), nil, "is_cancel(nil)")
tap.is(core.is_cancel({}), nil, "is_cancel of a table")
-- The real ones: a task cancelled while it waits, a wait under a deadline.
local t = sbx.spawn(function() sbx.sleep(10) end)
sbx.sleep(0.01)
t:cancel()
local ok, e = pcall(sbx.wait, t)
tap.is(core.is_cancel(ok and "" or e), "cancelled", "a cancelled task's error is a cancel (" .. tostring(e) .. ")")
local dok, derr = sbx.deadline(0.05, function() sbx.sleep(5) end)
tap.is(core.is_cancel(dok and "" or derr), "deadline", "a wait past its deadline is one (" .. tostring(derr) .. ")")

-- hex, unhex -------------------------------------------------------------------
local all = {}
for i = 0, 255 do all[#all + 1] = string.char(i) end
all = table.concat(all)
tap.is(util.unhex(util.hex(all)), all, "hex then unhex gives every byte value back")
tap.is(util.hex("\0\1\254\255"), "0001feff", "hex is lowercase, two digits a byte")
tap.is(util.unhex("abc"), nil, "unhex of an odd length is nil")
tap.is(util.unhex("zz"), nil, "unhex of a non-hex digit is nil")
tap.is(util.unhex("AB"), nil, "unhex takes lowercase only (what hex makes)")

-- shell_quote, through a real sh --------------------------------------------
local words = { "", "'", "''", "a b", "$(touch /nonexistent/x)", "`id`", "\\", "\"", "*", "-n", "\n", "it's", all:sub(2) }
for i, w in ipairs(words) do
  local p = io.popen("printf %s " .. util.shell_quote(w) .. " | od -An -v -tx1 | tr -d ' \\n'")
  local out = p:read("a")
  p:close()
  tap.is(out, util.hex(w), "sh reads shell_quote's word " .. i .. " back byte for byte")
end

-- backoff: exponential, capped, full jitter; the bound without jitter.
tap.is(util.backoff(1, 0.2, 5, false), 0.2, "backoff: the first retry's bound is base")
tap.is(util.backoff(3, 0.2, 5, false), 0.8, "backoff: doubling per attempt")
tap.is(util.backoff(10, 0.2, 5, false), 5, "backoff: capped")
tap.is(util.backoff(3, 0.2, 5, function() return 0.5 end), 0.4, "backoff: full jitter scales the bound by random()")
local lo, hi = math.huge, -1
for _ = 1, 2000 do
  local d = util.backoff(4, 0.1, 5)
  lo, hi = math.min(lo, d), math.max(hi, d)
end
tap.ok(lo >= 0 and hi < 0.8 and hi > 0.6 and lo < 0.2, "backoff: math.random by default, spread over [0, bound)")

-- One home: no module of lua/sbx reads /dev/urandom, draws names from
-- math.random, quotes for sh or computes an exponential backoff by itself.
local offenders = {}
local p = io.popen("find lua/sbx -name '*.lua' | sort")
for path in p:lines() do
  if path ~= "lua/sbx/util.lua" then
    local f = assert(io.open(path, "rb"))
    local src = f:read("a")
    f:close()
    local ln = 0
    for line in (src .. "\n"):gmatch("(.-)\n") do
      ln = ln + 1
      local code = line:gsub("%-%-.*$", "")
      if code:find('io.open%("/dev/urandom"') or code:find("math%.random%(0%)")
        or code:find([[gsub%("'", "'\\''"%)]]) or code:find("%* 2 %^ %(") then
        offenders[#offenders + 1] = path .. ":" .. ln
      end
    end
  end
end
p:close()
tap.is(table.concat(offenders, ", "), "", "no copy of the random source, the sh quoting or the backoff outside sbx.util")

tap.done()

--[[
sbx.util: pure helpers every layer shares, one home each. A leaf: it
requires only sbx.core (C), so any module may require it
(tests/require_graph_test.lua keeps the require graph acyclic).

  util.deep_copy(t)       -- a copy of t, nested tables copied, metatables kept
  util.merge(dst, src)    -- src over dst in place: tables merge, lists replace
  util.model_text(s)      -- s as valid UTF-8 for a model, and how many bytes were not
  util.size(n)            -- "512 B", "1.5 MiB"
  util.shell_quote(s)     -- one word for sh: single-quoted, ' written as '\''
  util.hex(b)             -- bytes as lowercase hex digits
  util.unhex(h)           -- lowercase hex digits as bytes | nil
  util.random_id()        -- 16 hex digits from the CSPRNG (core.random): a marker or a name
]]
local core = require "sbx.core"

local M = {}

local function is_list(t)
  return type(t) == "table" and (#t > 0 or next(t) == nil)
end
M.is_list = is_list

-- Merges src over dst in place: tables merge recursively, lists and every
-- other value replace.
local function merge(dst, src)
  for k, v in pairs(src) do
    if type(v) == "table" and type(dst[k]) == "table" and not is_list(v) and not is_list(dst[k]) then
      merge(dst[k], v)
    else
      dst[k] = v
    end
  end
  return dst
end
M.merge = merge

local function deep_copy(t)
  if type(t) ~= "table" then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = deep_copy(v) end
  return setmetatable(c, getmetatable(t))
end
M.deep_copy = deep_copy

-- model_text(s) -> text, replaced: s as valid UTF-8 for a model or a JSON
-- document, and how many of its bytes were not UTF-8 (each maximal invalid
-- run became one U+FFFD).
function M.model_text(s)
  local text, runs = core.text.sanitize(s)
  if runs == 0 then return text, 0 end
  return text, #s - (#text - 3 * runs)
end

-- size(n) -> n bytes for a person: "512 B", "1.5 MiB".
function M.size(n)
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local i = 1
  n = n or 0
  while n >= 1024 and i < #units do n, i = n / 1024, i + 1 end
  return i == 1 and string.format("%d B", n) or string.format("%.1f %s", n, units[i])
end

-- shell_quote(s) -> s as one word for sh, whatever bytes it holds:
-- single-quoted, each ' written as '\''.
function M.shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- hex(b) -> the bytes of b as lowercase hex digits.
function M.hex(b)
  return (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- unhex(h) -> the bytes h spells in lowercase hex digits | nil (odd length,
-- another character).
function M.unhex(h)
  if #h % 2 ~= 0 or h:find("[^0-9a-f]") then return nil end
  return (h:gsub("..", function(x) return string.char(tonumber(x, 16)) end))
end

-- backoff(attempt, base, cap [, random]) -> seconds: the delay before
-- retry number attempt (1, 2, ...): exponential, capped, with full jitter,
-- random(0, min(cap, base * 2^(attempt - 1))) (AWS Architecture Blog,
-- "Exponential Backoff And Jitter"). random() -> [0, 1) is math.random
-- unless given (a test's stub); random = false gives the bound itself
-- (no jitter: a pool's pause after failed creations). The one home of
-- every retry loop's delay.
function M.backoff(attempt, base, cap, random)
  local bound = math.min(cap, base * 2 ^ (attempt - 1))
  if random == false then return bound end
  return (random or math.random)() * bound
end

-- random_id() -> 16 hex digits (64 bits) from OpenSSL's CSPRNG: a job's
-- marker, a box's or a session's name. Never math.random: a command that
-- sees markers could work out xoshiro's state and predict the next ones.
-- Raises when OpenSSL has no random bytes (nothing sbx names is safe then).
function M.random_id()
  return assert(core.random.hex(8))
end

return M

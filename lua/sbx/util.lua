--[[
sbx.util: pure helpers every layer shares, one home each. A leaf: it
requires only sbx.core (C), so any module may require it
(tests/require_graph_test.lua keeps the require graph acyclic).

  util.deep_copy(t)       -- a copy of t, nested tables copied, metatables kept
  util.merge(dst, src)    -- src over dst in place: tables merge, lists replace
  util.model_text(s)      -- s as valid UTF-8 for a model, and how many bytes were not
  util.size(n)            -- "512 B", "1.5 MiB"
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

return M

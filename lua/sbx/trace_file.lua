--[[
sbx.trace_file: the format of a call trace (sbx.trace writes it,
sbx.backends.replay answers box calls from it): the ops recorded, bytes
as a string or { base64 = ... }, and reading a file back. A leaf: it knows
neither sbx.box nor the recorder, so replay needs neither.
]]
local core = require "sbx.core"
local json = core.json

local M = {}

M.ops = { "exec", "spawn", "output", "kill", "wait", "write_file", "read_file", "close", "processes" }

local b64 = require "sbx.base64"
local base64, unbase64 = b64.encode, b64.decode

-- Bytes in a trace: a string when it is UTF-8, else { base64 = ... }.
function M.bytes_out(s)
  if s == nil or utf8.len(s) then return s end
  return { base64 = base64(s) }
end

function M.bytes_in(v)
  if type(v) == "table" and v.base64 then return unbase64(v.base64) end
  return v
end

-- A decoded JSON value as plain Lua: no JSON marks, null becomes nil.
function M.plain(v)
  if v == json.null then return nil end
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = M.plain(x) end
  return c
end

-- Reading a trace: the records in seq order, plain Lua values.
function M.load(path)
  local f, err = io.open(path, "r")
  if not f then return nil, err end
  local list, n = {}, 0
  for line in f:lines() do
    n = n + 1
    if line:find("%S") then
      local rec, derr = json.decode(line)
      if rec == nil then f:close(); return nil, string.format("%s:%d: %s", path, n, tostring(derr)) end
      list[#list + 1] = M.plain(rec)
    end
  end
  f:close()
  table.sort(list, function(a, b) return (a.seq or 0) < (b.seq or 0) end)
  return list
end

return M

-- sbx.taskenv: what a Lua task file runs with. A task file may come from a
-- stranger: it is data that happens to hold functions. Its chunk and its
-- functions see a fresh environment of pure functions, share no metatable
-- with sbx (getmetatable("") is a stand-in, not the string table sbx's own
-- code uses), cannot set a finalizer (__gc runs with the count hook off, so
-- a finalizer could outlive any deadline), and have no io, os, require,
-- load, debug, collectgarbage, coroutine or string.dump; its xpcall's
-- handler does not run once its deadline has passed, and its pattern
-- matching (string.find/match/gmatch/gsub, s:find...) stops at the
-- deadline however long a pattern would backtrack (pattern.c). Everything it
-- hands back is copied into plain data (copy) before sbx reads it, so no
-- metamethod of the file's runs outside a deadline.
--
--   taskenv.new() -> env          a fresh environment for one task file
--   taskenv.copy(v, what) -> v'   plain data: tables copied raw (no
--                                 metatables), functions kept; raises on
--                                 a cycle, depth > 64 or a userdata/thread
local M = {}

local SAFE_GLOBALS = { "assert", "error", "ipairs", "next", "pairs", "pcall", "select", "tonumber",
  "tostring", "type", "rawequal", "rawlen" }
local SAFE_LIBS = { "string", "table", "math", "utf8" }

-- The real string metatable's __index becomes a table without dump, for
-- every string in the process: ("").dump reached string.dump even where the
-- string library a chunk sees had none. sbx's own code uses string.dump
-- through the string table, which keeps it.
local function string_methods_without_dump()
  local mt = getmetatable("")
  if type(mt) ~= "table" or rawget(mt, "__sbx_nodump") then return end
  local methods = setmetatable({
    dump = function() error("string.dump is not available on strings", 2) end,
  }, { __index = string })
  -- Pattern matching that a deadline stops (pattern.c): s:find(p) as
  -- well as string.find(s, p).
  for k, f in pairs(require("sbx.core").pattern) do methods[k] = f end
  mt.__index = methods
  mt.__sbx_nodump = true
end

function M.new()
  string_methods_without_dump()
  local env = {}
  for _, n in ipairs(SAFE_GLOBALS) do env[n] = _G[n] end
  for _, n in ipairs(SAFE_LIBS) do
    local t = {}
    for k, v in pairs(_G[n]) do t[k] = v end
    env[n] = t
  end
  env.string.dump = nil
  for k, f in pairs(require("sbx.core").pattern) do env.string[k] = f end
  -- xpcall whose handler does not run once the deadline has ended: an
  -- error from the count hook calls the handler with hooks off, where a
  -- loop could never be stopped (deadline.c).
  env.xpcall = require("sbx.core").xpcall
  -- Metatables: only those the file set itself are its to see or change.
  local own = setmetatable({}, { __mode = "k" })      -- object -> true
  local string_mt = { __index = env.string }          -- what getmetatable("") gives
  env.setmetatable = function(t, mt)
    if type(t) ~= "table" then error("bad argument #1 to 'setmetatable' (table expected)", 2) end
    if mt ~= nil and type(mt) ~= "table" then error("bad argument #2 to 'setmetatable' (nil or table expected)", 2) end
    if getmetatable(t) ~= nil and not own[t] then
      error("cannot change a metatable this task file did not set", 2)
    end
    if mt ~= nil and rawget(mt, "__gc") ~= nil then
      error("a task file may not set __gc (finalizers run outside its deadline)", 2)
    end
    setmetatable(t, mt)
    own[t] = mt ~= nil or nil
    return t
  end
  env.getmetatable = function(v)
    if type(v) == "string" then return string_mt end
    if own[v] then return getmetatable(v) end
    return nil
  end
  env._G = env
  return env
end

-- Plain data from a task file's values (see the top of this file).
function M.copy(v, what)
  local seen = {}
  local function copy(x, depth, path)
    local t = type(x)
    if t == "table" then
      if depth > 64 then error(string.format("%s: nested deeper than 64 tables", path), 0) end
      if seen[x] then error(string.format("%s: a table that contains itself", path), 0) end
      seen[x] = true
      local out = {}
      local k, val = next(x)
      while k ~= nil do
        local kt = type(k)
        if kt ~= "string" and kt ~= "number" and kt ~= "boolean" then
          error(string.format("%s: a key of type %s", path, kt), 0)
        end
        out[k] = copy(val, depth + 1, path .. "." .. tostring(k))
        k, val = next(x, k)
      end
      seen[x] = nil
      return out
    elseif t == "userdata" or t == "thread" then
      error(string.format("%s: a %s is not task data", path, t), 0)
    end
    return x
  end
  return copy(v, 0, what or "value")
end

return M

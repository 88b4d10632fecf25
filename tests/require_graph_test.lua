-- needs: nothing
-- The require graph of lua/sbx has no cycle (issue 18, item 2): a module is
-- understood, tested and changed from the modules it requires, and a
-- module that needs the ones above it is a module nobody can read alone.
--
-- The graph is read from the source, not from a run: every require of a
-- literal "sbx..." name in lua/sbx/**/*.lua, comments and the text of other
-- strings left out. A require inside a function (a lazy one) counts like one
-- at the top of the file: it loads the same module, only later, and a cycle
-- through it is a cycle all the same. A require of a computed name
-- (require("sbx.backends." .. name), a bundled policy) picks one module
-- among many that share a contract: DYNAMIC lists the files that do it and
-- the prefix of the names they can reach, and each counts as a (lazy)
-- require of every module under that prefix.
--
-- ALLOWED lists the edges still permitted to close a cycle, each with its
-- reason. The list only shrinks: an allowed edge that is gone, or that no
-- longer lies on a cycle, fails the test until it is struck out.
local tap = require "tap"

local ROOT = "lua/sbx"

-- "from -> to" = why it is still there.
local ALLOWED = {
}

-- Files with a require of a computed name: the prefix it reaches, and why.
local DYNAMIC = {
  ["sbx.backend"] = { "sbx.backends.", "the backend a box or a pool names, checked against the contract" },
  ["sbx.config"] = { "sbx.policies.", "a bundled policy by name (sbx.load_policy)" },
}

-- Lexer ---------------------------------------------------------------------

-- tokens(src) -> list of { kind = "name" | "string" | "op", v = text }:
-- comments dropped, strings decoded enough to read a module name.
local function tokens(src)
  local out, i, n = {}, 1, #src
  local function long_bracket(at)
    local eq = src:match("^%[(=*)%[", at)
    if not eq then return nil end
    local close = "]" .. eq .. "]"
    local s = at + #eq + 2
    local e = src:find(close, s, true)
    if not e then error("unfinished long bracket at byte " .. at) end
    return src:sub(s, e - 1), e + #close
  end
  while i <= n do
    local c = src:sub(i, i)
    if c:match("%s") then
      i = i + 1
    elseif src:sub(i, i + 1) == "--" then
      local _, after = long_bracket(i + 2)
      if after then i = after else
        local e = src:find("\n", i, true)
        i = e and e + 1 or n + 1
      end
    elseif c == "[" and src:match("^%[=*%[", i) then
      local text, after = long_bracket(i)
      out[#out + 1] = { kind = "string", v = text }
      i = after
    elseif c == '"' or c == "'" then
      local j, buf = i + 1, {}
      while true do
        local d = src:sub(j, j)
        if d == "" then error("unfinished string at byte " .. i) end
        if d == c then break end
        if d == "\\" then
          buf[#buf + 1] = src:sub(j, j + 1)
          j = j + 2
        else
          buf[#buf + 1] = d
          j = j + 1
        end
      end
      out[#out + 1] = { kind = "string", v = table.concat(buf) }
      i = j + 1
    elseif c:match("[%a_]") then
      local w = src:match("^[%w_]+", i)
      out[#out + 1] = { kind = "name", v = w }
      i = i + #w
    elseif c:match("%d") then
      local w = src:match("^[%w_%.]+", i)
      i = i + #w
    else
      out[#out + 1] = { kind = "op", v = c }
      i = i + 1
    end
  end
  return out
end

-- requires(src) -> { { name =, lazy = bool } }: each require of a literal
-- name; lazy when inside a function body. computed: a require of anything else.
local function requires(src)
  local toks, found, computed = tokens(src), {}, false
  local stack = {} -- open blocks: "function", "block", "repeat"
  local functions = 0
  for k, t in ipairs(toks) do
    if t.kind == "name" then
      local v = t.v
      local prev = toks[k - 1]
      -- a.b and a:b are fields ("x .. end" and "::label:: end" are not)
      local before = toks[k - 2]
      local field = prev and prev.kind == "op" and (prev.v == "." or prev.v == ":")
        and not (before and before.kind == "op" and before.v == prev.v)
      if field then
        -- a.end is not Lua; a.require(...) is not the global require
      elseif v == "function" then
        stack[#stack + 1] = "function"
        functions = functions + 1
      elseif v == "if" or v == "do" then
        stack[#stack + 1] = "block"
      elseif v == "repeat" then
        stack[#stack + 1] = "repeat"
      elseif v == "end" or v == "until" then
        local top = table.remove(stack)
        if top == "function" then functions = functions - 1 end
      elseif v == "require" then
        local a, b = toks[k + 1], toks[k + 2]
        local name
        if a and a.kind == "string" then
          name = a.v
        elseif a and a.kind == "op" and a.v == "(" and b and b.kind == "string"
          and toks[k + 3] and toks[k + 3].kind == "op" and toks[k + 3].v == ")" then
          name = b.v
        elseif a and a.kind == "op" and a.v == "," and b and b.kind == "string"
          and toks[k + 3] and toks[k + 3].kind == "op" and toks[k + 3].v == ")" then
          name = b.v -- pcall(require, "sbx.x")
        else
          computed = true -- require(name .. x), pcall(require, x)
        end
        if name then found[#found + 1] = { name = name, lazy = functions > 0 } end
      end
    end
  end
  if #stack ~= 0 then error("blocks do not balance (" .. #stack .. " left open)") end
  return found, computed
end

-- The graph -------------------------------------------------------------------

local function lua_files(dir)
  local p = assert(io.popen("find " .. dir .. " -name '*.lua' | sort"))
  local files = {}
  for line in p:lines() do files[#files + 1] = line end
  p:close()
  return files
end

local function module_name(path)
  local rel = path:sub(#ROOT + 2):gsub("%.lua$", "")
  rel = rel:gsub("/init$", ""):gsub("^init$", "")
  return rel == "" and "sbx" or "sbx." .. rel:gsub("/", ".")
end

local modules, edges, lazy_of, computed_in = {}, {}, {}, {}
local files = lua_files(ROOT)
local parsed = true
for _, f in ipairs(files) do
  modules[module_name(f)] = f
end
for _, f in ipairs(files) do
  local from = module_name(f)
  local fh = assert(io.open(f, "rb"))
  local src = fh:read("a")
  fh:close()
  local ok, found, computed = pcall(requires, src)
  if not ok then
    parsed = false
    tap.ok(false, "reads " .. f, found)
  else
    edges[from] = edges[from] or {}
    if computed then computed_in[from] = true end
    for _, r in ipairs(found) do
      if modules[r.name] and r.name ~= from then
        local key = from .. " -> " .. r.name
        if edges[from][r.name] == nil then edges[from][r.name] = true end
        -- lazy only when every require of it in the file is
        if lazy_of[key] == nil then lazy_of[key] = r.lazy else lazy_of[key] = lazy_of[key] and r.lazy end
      elseif r.name == from then
        edges[from][from] = true
        lazy_of[from .. " -> " .. from] = r.lazy
      end
    end
  end
end

local names = {}
for m in pairs(modules) do names[#names + 1] = m end
table.sort(names)

-- A computed require reaches every module under its prefix.
for from, d in pairs(DYNAMIC) do
  if edges[from] then
    for _, to in ipairs(names) do
      if to:sub(1, #d[1]) == d[1] and to ~= from then
        local key = from .. " -> " .. to
        if not edges[from][to] then edges[from][to] = true; lazy_of[key] = true end
      end
    end
  end
end

tap.ok(parsed and #names > 30, "reads every module of " .. ROOT .. " (" .. #names .. ")")

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- sccs(skip) -> list of strongly connected components with a cycle, each a
-- sorted list of names (Tarjan). skip(from, to) leaves an edge out.
local function sccs(skip)
  local index, low, on, stack, out, counter = {}, {}, {}, {}, {}, 0
  local function visit(v)
    counter = counter + 1
    index[v], low[v] = counter, counter
    stack[#stack + 1] = v
    on[v] = true
    for _, w in ipairs(sorted_keys(edges[v] or {})) do
      if not (skip and skip(v, w)) then
        if not index[w] then
          visit(w)
          low[v] = math.min(low[v], low[w])
        elseif on[w] then
          low[v] = math.min(low[v], index[w])
        end
      end
    end
    if low[v] == index[v] then
      local comp = {}
      repeat
        local w = table.remove(stack)
        on[w] = false
        comp[#comp + 1] = w
      until w == v
      local self_loop = edges[v] and edges[v][v] and not (skip and skip(v, v))
      if #comp > 1 or self_loop then
        table.sort(comp)
        out[#out + 1] = comp
      end
    end
  end
  for _, v in ipairs(names) do if not index[v] then visit(v) end end
  return out
end

-- One cycle through a component, for the message: a path back to its start.
local function one_cycle(comp, skip)
  local inside = {}
  for _, v in ipairs(comp) do inside[v] = true end
  local start = comp[1]
  local prev, queue, seen = {}, { start }, { [start] = true }
  while #queue > 0 do
    local v = table.remove(queue, 1)
    for _, w in ipairs(sorted_keys(edges[v] or {})) do
      if inside[w] and not (skip and skip(v, w)) then
        if w == start then
          local path, x = { start }, v
          while x ~= start do table.insert(path, 2, x); x = prev[x] end
          path[#path + 1] = start
          return table.concat(path, " -> ")
        end
        if not seen[w] then seen[w], prev[w] = true, v; queue[#queue + 1] = w end
      end
    end
  end
  return "?"
end

local function describe(list, skip)
  local lines = {}
  for _, comp in ipairs(list) do
    lines[#lines + 1] = string.format("%d modules: %s\n  e.g. %s", #comp, table.concat(comp, " "), one_cycle(comp, skip))
  end
  return table.concat(lines, "\n")
end

-- The whole graph, allowed edges included: what is left to do.
local all = sccs()
local in_cycles = 0
for _, c in ipairs(all) do in_cycles = in_cycles + #c end
io.write(string.format("# %d modules, %d in a require cycle (%d cycles), %d allowed edges\n",
  #names, in_cycles, #all, #sorted_keys(ALLOWED)))
if #all > 0 then io.write("# ", (describe(all):gsub("\n", "\n# ")), "\n") end

-- 1. Without the allowed edges there is no cycle at all.
local function allowed(from, to) return ALLOWED[from .. " -> " .. to] ~= nil end
local left = sccs(allowed)
tap.ok(#left == 0, "no require cycle outside the allowed edges", describe(left, allowed))

-- 2. No lazy require hides a cycle of top-level ones: the top-level graph
-- alone is acyclic (a cycle there fails at load time, in the wrong order).
local top = sccs(function(from, to) return lazy_of[from .. " -> " .. to] end)
tap.ok(#top == 0, "no cycle of top-level requires", describe(top))

-- 3. The allow-list only shrinks: each entry still exists, has a reason, and
-- still closes a cycle.
for _, key in ipairs(sorted_keys(ALLOWED)) do
  local from, to = key:match("^(%S+) %-> (%S+)$")
  local exists = from and edges[from] and edges[from][to]
  local closes = false
  if exists then
    for _, comp in ipairs(all) do
      local a, b = false, false
      for _, v in ipairs(comp) do a = a or v == from; b = b or v == to end
      closes = closes or (a and b)
    end
  end
  tap.ok(exists and closes and type(ALLOWED[key]) == "string" and #ALLOWED[key] > 0,
    "allowed edge " .. key .. " still exists and still closes a cycle",
    exists and "it is on no cycle any more: strike it from ALLOWED" or "it is gone: strike it from ALLOWED")
end

-- 4. A require of a computed name only where DYNAMIC says why.
for _, m in ipairs(sorted_keys(computed_in)) do
  tap.ok(DYNAMIC[m] ~= nil, m .. " requires a computed name only as DYNAMIC lists",
    "add it to DYNAMIC with the reason, or require a literal name")
end
for _, m in ipairs(sorted_keys(DYNAMIC)) do
  tap.ok(computed_in[m] or not modules[m], "DYNAMIC entry " .. m .. " still requires a computed name")
end

-- 5. The facade is for programs: inside lua/sbx only what stands above it
-- (the CLI and the MCP server it runs) requires "sbx"; the rest reads the
-- live policy from sbx.config.
do
  local ABOVE = { ["sbx.cli"] = true, ["sbx.mcp"] = true }
  local users = {}
  for _, m in ipairs(names) do
    if edges[m] and edges[m]["sbx"] and not ABOVE[m] then users[#users + 1] = m end
  end
  tap.is(table.concat(users, " "), "", "no module below the facade requires sbx")
end

-- 6. The lexer itself: what counts, what does not.
do
  local found = requires([==[
local a = require "sbx.a"            -- require "sbx.in_comment"
local s = 'require "sbx.in_string"'
--[[ require("sbx.in_long_comment") ]]
local function f()
  if x then return require("sbx.b") end
  for i = 1, 2 do require "sbx.c" end
end
local t = { x = [[require "sbx.in_long_string"]] }
repeat local d = require "sbx.d" until true
local e = require("sbx.e")
]==])
  local got = {}
  for _, r in ipairs(found) do got[#got + 1] = r.name .. (r.lazy and "(lazy)" or "") end
  tap.is(table.concat(got, " "), "sbx.a sbx.b(lazy) sbx.c(lazy) sbx.d sbx.e",
    "the scan counts code, not comments or strings, and tells lazy from top-level")
end

tap.done()

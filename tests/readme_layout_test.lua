-- needs: nothing
-- README's Layout section stays true: every file of src/, lua/sbx/ and
-- agent/ has an entry, every entry names a file that exists, every file of
-- docs/, fuzz/ and the top of scripts/ is named somewhere in the block, and
-- the section links to docs/architecture.md. The checker is also shown to
-- catch a file left out and an entry for a file that is gone.
local tap = require "tap"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- The files under dir (relative to it), sorted; every depth or the top only.
local function files(dir, top_only)
  local p = assert(io.popen(string.format("find %s %s -type f | sort", dir, top_only and "-maxdepth 1" or "")))
  local out = {}
  for line in p:lines() do
    local rel = line:sub(#dir + 2)
    if not rel:find("__pycache__", 1, true) then out[#out + 1] = rel end
  end
  p:close()
  return out
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- "fuzz_*.c" as an anchored Lua pattern.
local function glob(g)
  return "^" .. g:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", ".*") .. "$"
end

-- The Layout section's text and its code block, or nil and why.
local function layout(readme)
  local sec = readme:match("\n## Layout\n(.-)\n## ") or readme:match("\n## Layout\n(.*)$")
  if not sec then return nil, "README has no ## Layout section" end
  local block = sec:match("\n```\n(.-)\n```")
  if not block then return nil, "the Layout section has no code block" end
  return sec, block
end

-- Every way README (text) and the tree disagree, as a list of strings.
local function problems(readme)
  local out = {}
  local sec, block = layout(readme)
  if not sec then return { block } end
  if not sec:find("(docs/architecture.md)", 1, true) then out[#out + 1] = "no link to docs/architecture.md" end
  local entries, named, dir = {}, {}, nil
  for line in block:gmatch("[^\n]+") do
    local d, rest = line:match("^(%S+/)%s*(.*)$")
    local names
    if d then
      dir = d
      if not exists(d) then out[#out + 1] = "no directory " .. d end
      entries[dir] = entries[dir] or {}
    elseif line:match("^  %S") then
      names = line:match("^  (.-)%s%s+%S") or line:match("^  (.-)%s*$")
    end
    if names and dir then
      for name in (names .. ","):gmatch("%s*([^,]+),") do
        entries[dir][name] = true
        if not exists(dir .. name) then out[#out + 1] = "the Layout names " .. dir .. name .. ", which does not exist" end
      end
    end
    for word in line:gmatch("[%w_%-%.%*/]+") do named[word] = true end
  end
  -- Every file of the three source trees has an entry of its own.
  for _, d in ipairs { "src/", "lua/sbx/", "agent/" } do
    for _, f in ipairs(files(d:sub(1, -2))) do
      if not (entries[d] and entries[d][f]) then out[#out + 1] = d .. f .. " is missing from the Layout" end
    end
  end
  -- The rest is named somewhere in the block, by name or by a glob.
  for _, d in ipairs { "docs", "fuzz", "scripts" } do
    for _, f in ipairs(files(d, true)) do
      local found = named[f]
      for word in pairs(named) do
        if not found and word:find("*", 1, true) and f:match(glob(word)) then found = true end
      end
      if not found then out[#out + 1] = d .. "/" .. f .. " is not named in the Layout" end
    end
  end
  return out
end

local readme = read("README.md")
local found = problems(readme)
tap.ok(#found == 0, "README's Layout matches the tree", table.concat(found, "\n"))
tap.diag(#files("src") .. " files in src/, " .. #files("lua/sbx") .. " in lua/sbx/, " .. #files("agent") .. " in agent/")

-- The checker catches each kind of drift.
local function has(list, text)
  for _, p in ipairs(list) do
    if p:find(text, 1, true) then return true end
  end
  return false
end
local at = assert(readme:find("\n## Layout\n", 1, true))
local function edited(old, new)
  local i, j = readme:find(old, at, true)
  assert(i, "the Layout has no " .. old)
  return readme:sub(1, i - 1) .. new .. readme:sub(j + 1)
end
local dropped = problems(edited("\n  ws.c ", "\n  xx.c "))
tap.ok(has(dropped, "src/ws.c is missing from the Layout"), "a C file left out is caught", table.concat(dropped, "\n"))
tap.ok(has(dropped, "names src/xx.c, which does not exist"), "an entry for a file that is gone is caught")
local lua_dropped = problems(edited("\n  backends/replay.lua ", "\n  backends/replay.txt "))
tap.ok(has(lua_dropped, "lua/sbx/backends/replay.lua is missing"), "a Lua module left out is caught")
local listed = problems(edited("\n  init.c, init.h ", "\n  init.c, init.h, gone.h "))
tap.ok(has(listed, "names src/gone.h, which does not exist"), "a second name on an entry is checked too")
local unlinked = problems(edited("(docs/architecture.md)", "(docs/elsewhere.md)"))
tap.ok(has(unlinked, "no link to docs/architecture.md"), "the link to the architecture document is required")
local nodoc = problems(edited("kubernetes.md; grading.md,", "kubernetes.md; grading-whatever.md,"))
tap.ok(has(nodoc, "docs/grading.md is not named"), "a document left out is caught")
tap.ok(#problems("# sbx\n") == 1, "a README without the section fails")
tap.done()

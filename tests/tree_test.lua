-- needs: git
-- The top of the repository holds only what a newcomer expects: every
-- tracked top-level name is on the list below (a new one is a decision:
-- add it here with the reason). The check is shown to catch a stray file.
-- Outside a git checkout (a release tarball) there is nothing to check.
local tap = require "tap"

-- name (or Lua pattern) -> why it is at the top
local ALLOWED = {
  [".ci"] = "the CI entry point (.ci/run)",
  [".gitignore"] = "what builds and runs leave",
  [".clang-format"] = "the C style (tests/style_test.lua)",
  [".luacheckrc"] = "the Lua lint configuration (tests/style_test.lua)",
  ["LICENSE"] = "the license",
  ["Makefile"] = "the build",
  ["README.md"] = "the front door",
  ["agent"] = "sbx-agent, the in-box program",
  ["docs"] = "documents beyond the README",
  ["fuzz"] = "fuzz targets and corpora",
  ["lua"] = "the Lua side: policy and everything that decides",
  ["scripts"] = "setup, stand-ins, benchmarks",
  ["src"] = "the C side: mechanism",
  ["tests"] = "the test suite",
  ["sbx.pc.in"] = "the pkg-config template for embedders",
  ["^sbx%-[%d.]+%-%d+%.rockspec$"] = "the LuaRocks spec",
}

local function allowed(name)
  if ALLOWED[name] and not name:find("^%^") then return true end
  for k in pairs(ALLOWED) do
    if k:find("^%^") and name:find(k) then return true end
  end
  return false
end

-- strays(names) -> the names not on the list, sorted
local function strays(names)
  local out = {}
  for _, n in ipairs(names) do
    if not allowed(n) then out[#out + 1] = n end
  end
  table.sort(out)
  return out
end

local p = io.popen("git ls-files 2>/dev/null")
local tops, seen = {}, {}
for path in p:lines() do
  local top = path:match("^([^/]+)")
  if top and not seen[top] then seen[top] = true; tops[#tops + 1] = top end
end
local ok = p:close()
if not ok or #tops == 0 then
  tap.skip("not a git checkout")
  tap.done()
  return
end

tap.is(table.concat(strays(tops), ", "), "", "every top-level name is on the allowed list")
tap.ok(seen["README.md"] and seen["Makefile"] and seen["LICENSE"], "the front door, the build and the license are there")
-- The checker catches what it should.
tap.is(table.concat(strays { "README.md", "notes.txt", "sbx-0.2.0-1.rockspec", "tmp" }, ", "), "notes.txt, tmp",
  "the check names a stray file and a stray directory, and accepts a rockspec of any version")
tap.done()

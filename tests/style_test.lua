-- needs: clang-format, luacheck, git
-- The C code passes its formatter: every tracked .c and .h file is as
-- clang-format makes it under the repository's .clang-format; the Lua code
-- passes its lint: luacheck over lua/, tests/ and scripts/ under
-- .luacheckrc (scripts/setup.sh installs both, so CI runs this). Each
-- check is shown to catch what it is for.
local tap = require "tap"
local H = require "helper"

local files = {}
local p = io.popen("git ls-files '*.c' '*.h' 2>/dev/null")
for f in p:lines() do files[#files + 1] = f end
p:close()
if #files == 0 then
  tap.skip("not a git checkout")
  tap.done()
  return
end

local bad = {}
for _, f in ipairs(files) do
  local _, code = H.sh("clang-format --style=file --dry-run -Werror " .. H.q(f) .. " >/dev/null")
  if code ~= 0 then bad[#bad + 1] = f end
end
tap.is(table.concat(bad, " "), "", #files .. " C files as clang-format makes them (fix: clang-format -i FILE)")

-- The same check on a misformatted copy of a real file fails.
local dir = H.tmpdir()
local src = assert(H.slurp("src/fail.c"))
H.write(dir .. "/x.c", (src:gsub("\n  ", "\n      ", 3)))
local _, code = H.sh("clang-format --style=file:" .. H.q(os.getenv("PWD") .. "/.clang-format") ..
  " --dry-run -Werror " .. H.q(dir .. "/x.c") .. " >/dev/null")
tap.ok(code ~= 0, "a misformatted file fails the check")

-- Lua: no warning anywhere, and a global set by mistake is one.
local out
out, code = H.sh("luacheck --formatter plain --codes lua tests scripts")
tap.is(code, 0, "luacheck finds nothing in lua/, tests/ and scripts/", out)
H.write(dir .. "/leak.lua", "local function f()\n  result = 1\nend\nreturn f\n")
out, code = H.sh("luacheck --formatter plain --codes --config .luacheckrc " .. H.q(dir .. "/leak.lua"))
tap.ok(code ~= 0 and out:find("W111", 1, true), "a global set by mistake fails the lint", out)
os.execute("rm -rf " .. H.q(dir))
tap.done()

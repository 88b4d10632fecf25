-- needs: nothing
-- Every test file says what it needs ("needs:" near its top, read by
-- tests/run.sh), and run.sh acts on it: a file whose need is missing is
-- skipped with the reason and counted as skipped, a file with its needs
-- met runs, and SBX_TEST_UNIT=1 leaves out the files that need docker,
-- local, root or network. The runner is tried in a scratch tree of its own
-- (a copy of run.sh and tap.lua, the real build) on files made here.
local tap = require "tap"
local H = require "helper"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The test files: what run.sh runs, by the names it runs them under.
-- (Paths from the top of the tree; fuzz/fuzz_*.c run over their corpora.)
local p = assert(io.popen([[ls tests/*_test.lua tests/*_test.py tests/*_test.sh tests/unit_*.c tests/embed_test.c \
  tests/stock_lua.lua tests/sdk/*_test.mjs tests/sdk/*_test.sh fuzz/fuzz_*.c 2>/dev/null | sort]]))
local list = {}
for f in p:lines() do list[#list + 1] = f end
p:close()
tap.ok(#list > 100, "the test files are found (" .. #list .. ")")

-- The words of a file's needs line, or nil when it has none in its first 30 lines.
local function needs(path)
  local f = assert(io.open(path))
  local n, words = 0, nil
  for line in f:lines() do
    n = n + 1
    if n > 30 then break end
    local w = line:match("^%s*%-%-%s*needs:%s*(.-)%s*$") or line:match("^%s*#%s*needs:%s*(.-)%s*$")
      or line:match("^%s*//%s*needs:%s*(.-)%s*$") or line:match("^%s*/%*%s*needs:%s*(.-)%s*%*/%s*$")
    if w then words = w break end
  end
  f:close()
  return words
end

local untagged, malformed = {}, {}
for _, f in ipairs(list) do
  local w = needs(f)
  if not w then
    untagged[#untagged + 1] = f
  elseif w ~= "nothing" then
    for word in (w .. ","):gmatch("%s*([^,]*),") do
      if not word:match("^[%w_%.%-]+$") and not word:match("^python3:[%w_%.]+$") then
        malformed[#malformed + 1] = f .. ": '" .. word .. "'"
      end
    end
  end
end
tap.ok(#untagged == 0, "every test file has a needs: line", "without one: " .. table.concat(untagged, ", "))
tap.ok(#malformed == 0, "every need is a word (or python3:MODULE)", table.concat(malformed, "\n"))

-- The runner on files made here ------------------------------------------------------
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. q(dir .. "/tests/data") .. " " .. q(dir .. "/tests/lib")))
-- build/ in the copy is the build under test (make check's is build-asan/)
local bin = os.getenv("SBX_BIN") or "build/sbx"
if bin:sub(1, 1) ~= "/" then bin = os.getenv("PWD") .. "/" .. bin end
assert(os.execute(string.format("cp tests/run.sh %s/tests/ && cp tests/lib/tap.lua %s/tests/lib/ && ln -s %s %s/build",
  q(dir), q(dir), q(bin:match("^(.*)/[^/]+$")), q(dir))))
local function write(name, text)
  local f = assert(io.open(dir .. "/tests/" .. name, "w"))
  f:write(text)
  f:close()
end
local body = 'local tap = require "tap"\ntap.ok(true, "ran")\ntap.done()\n'
write("zzneeds_none_test.lua", "-- needs: nothing\n" .. body)
write("zzneeds_prog_test.lua", "-- needs: sh, no-such-program-for-sbx\n" .. body)
write("zzneeds_docker_test.lua", "-- the needs line may follow a comment\n-- needs: docker\n" .. body)
write("zzneeds_py_test.lua", "-- needs: python3:no_such_module_for_sbx\n" .. body)
write("zzneeds_root_test.lua", "-- needs: root\n" .. body)

local function run(env)
  return H.sh(string.format("cd %s && env -u SBX_TEST_UNIT %s SBX_POLICY=%s tests/run.sh build zzneeds", q(dir), env, q(os.getenv("PWD") .. "/tests/data/suite_policy.lua")))
end
-- A daemon nobody answers for: DOCKER_HOST at a socket that does not exist.
local out, code = run("DOCKER_HOST=unix://" .. dir .. "/no.sock")
tap.like(out, "# zzneeds_prog_test skipped: needs no%-such%-program%-for%-sbx: no no%-such%-program%-for%-sbx on PATH",
  "a missing program: skipped with the reason")
tap.like(out, "# zzneeds_docker_test skipped: needs docker: no Docker daemon answers", "no daemon: skipped with the reason")
tap.like(out, "# zzneeds_py_test skipped: needs python3:no_such_module_for_sbx: python3 cannot import",
  "a missing Python module: skipped with the reason")
tap.like(out, "# %-%-%- zzneeds_none_test\nok 1 %- ran", "a file that needs nothing runs")
local root = H.sh("id -u"):match("^0") ~= nil
tap.ok(out:find("# zzneeds_root_test skipped: needs root: not root", 1, true) ~= nil == not root,
  root and "as root, a file that needs root runs" or "not root: a file that needs root is skipped")
tap.like(out, string.format("\n%d passed, 0 failed, %d skipped\n$", root and 2 or 1, root and 3 or 4),
  "skipped files count as skipped, nothing failed", out)
tap.is(code, 0, "the run succeeds")

-- The same daemon when it answers: the docker file runs (skip without one).
write("probe.lua", 'os.exit(require("sbx.backends.docker").connect() and 0 or 1)\n')
local _, has_docker = H.sh(string.format("%s run %s", q(os.getenv("SBX_BIN") or "build/sbx"), q(dir .. "/tests/probe.lua")))
if has_docker == 0 then
  out = run("")
  tap.like(out, "# %-%-%- zzneeds_docker_test\nok 1 %- ran", "a daemon that answers: the docker file runs")
else
  tap.skip("a daemon that answers: the docker file runs", "no Docker daemon here")
end

-- The unit run leaves out docker and root files without counting them.
out, code = run("SBX_TEST_UNIT=1")
tap.ok(not out:find("# --- zzneeds_docker_test", 1, true) and not out:find("# --- zzneeds_root_test", 1, true),
  "SBX_TEST_UNIT=1 does not run the files that need docker or root", out)
tap.like(out, "# not in the unit run %(they need docker, local, root or network%): zzneeds_docker_test zzneeds_root_test",
  "and names them once")
tap.like(out, "\n1 passed, 0 failed, 2 skipped\n$", "the unit run: what needs nothing, and the missing programs skipped", out)
tap.is(code, 0, "the unit run succeeds")

-- Needs are read only from the top: a needs line past line 30 is not one.
write("zzneeds_late_test.lua", ("-- filler\n"):rep(30) .. "-- needs: no-such-program-for-sbx\n" .. body)
out = run("SBX_TEST_UNIT=1")
tap.like(out, "# %-%-%- zzneeds_late_test\nok 1 %- ran", "a needs line below line 30 is not read")

os.execute("rm -rf " .. q(dir))
tap.done()

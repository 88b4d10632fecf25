-- needs: python3
-- The Fargate command wrapper and its marker filter, without AWS: the
-- wrapper runs under real shells on a real PTY (tests/pty_run.py), byte
-- splits are exhaustive, CR-LF handling is checked both ways, and the exit
-- marker's secret is shown to be nowhere a command can read it.
local tap = require "tap"
local sbx = require "sbx"
local F = require "sbx.backends.fargate"

local ID = "0123456789abcdef"                          -- public: in the wrapper's argv
local SECRET = "fedcba98765432100123456789abcdef"      -- sent as the first input line

-- Returns the output, the exit status and how often the ready and the
-- stdin markers fired.
-- The wrapper's output through its filters: the markers, then (after the
-- ready marker) the start check's (ID is also the check's id here).
local start_check = require "sbx.transports.start_check"
local function run_filter(chunks)
  local out, ready, stdin = {}, 0, 0
  local check = start_check.filter(ID, function(b) out[#out + 1] = b end)
  local fl = F.marker_filter(ID, SECRET, function(b)
    if ready > 0 then check.feed(b) else out[#out + 1] = b end
  end, function() ready = ready + 1 end, function() stdin = stdin + 1 end)
  for _, c in ipairs(chunks) do fl.feed(c) end
  fl.flush()
  check.flush()
  return table.concat(out), fl.exit_code, ready, stdin, check.failed
end

local function every_split(stream, want_text, want_code)
  for i = 1, #stream - 1 do
    for j = i + 1, #stream do
      local t, c = run_filter { stream:sub(1, i), stream:sub(i + 1, j), stream:sub(j + 1) }
      if t ~= want_text or c ~= want_code then tap.diag(i, j, string.format("%q", t), c) return false end
    end
  end
  return true
end

local stream = "motd\n__SBX_" .. ID .. "_R0__hello\nworld__SBX_" .. SECRET .. "_E42__"
local text, code, ready = run_filter { stream }
tap.is(text, "motd\nhello\nworld", "markers are cut out")
tap.is(code, 42, "the exit status is read from the exit marker")
tap.is(ready, 1, "the ready marker fires once")
tap.ok(every_split(stream, "motd\nhello\nworld", 42), "every 3-way split of the byte stream gives the same output and status")

-- One byte at a time.
local bytes = {}
for i = 1, #stream do bytes[i] = stream:sub(i, i) end
text, code = run_filter(bytes)
tap.is(text, "motd\nhello\nworld", "byte by byte")
tap.is(code, 42, "byte by byte: status")

-- Only a marker with the secret counts: not one with the public id, another
-- nonce or a cut-off secret; and only the first: later ones are not output.
text, code = run_filter { "__SBX_" .. ID .. "_R0__a __SBX_" .. ID .. "_E0__ __SBX_ffffffffffffffff_E0__ b __SBX_"
  .. SECRET .. "_E" }
tap.is(text, "a __SBX_" .. ID .. "_E0__ __SBX_ffffffffffffffff_E0__ b __SBX_" .. SECRET .. "_E",
  "markers with the public id, another nonce, and a cut-off marker are output")
tap.is(code, nil, "no status without a whole exit marker with the secret")
text, code = run_filter { "__SBX_" .. ID .. "_R0__x__SBX_" .. SECRET .. "_E1__y__SBX_" .. SECRET .. "_E0__" }
tap.is(code, 1, "the first marker with the secret wins, a later one is ignored")
tap.is(text, "x", "and nothing after it is output")

-- The stdin marker (the secret line is read, stdin may follow) fires once
-- and is cut, however split; a second one is output.
stream = "__SBX_" .. ID .. "_R0____SBX_" .. ID .. "_S__in__SBX_" .. ID .. "_S__\n__SBX_" .. SECRET .. "_E0__"
local stdin
text, code, ready, stdin = run_filter { stream }
tap.is(stdin, 1, "the stdin marker fires once")
tap.ok(every_split(stream, "in__SBX_" .. ID .. "_S__\n", 0), "it is cut at every 3-way split, a second one is output")

-- stty missing: CR-LF normalised, also across chunk ends; lone CRs kept.
text = run_filter { "__SBX_" .. ID .. "_R1__one\r", "\ntwo\r\nbar\rbaz\r", "", "\n__SBX_" .. SECRET .. "_E0__" }
tap.is(text, "one\ntwo\nbar\rbaz\n", "CR-LF normalised when the PTY could not go raw")
text = run_filter { "__SBX_" .. ID .. "_R0__a\r\nb" }
tap.is(text, "a\r\nb", "raw PTY output is left alone")

-- The PTY's echo of the secret line (stty missing) is cut, however split,
-- also behind bytes another process wrote to the PTY first.
stream = "__SBX_" .. ID .. "_R1__" .. SECRET .. "\r\nout\r\n__SBX_" .. SECRET .. "_E3__"
tap.ok(every_split(stream, "out\n", 3), "the echoed secret line is cut, at every 3-way split")
text, code = run_filter { "__SBX_" .. ID .. "_R1__junk" .. SECRET .. "\r\nout\r\n__SBX_" .. SECRET .. "_E3__" }
tap.is(text, "junkout\n", "an echo behind other bytes is cut too")
text = run_filter { "__SBX_" .. ID .. "_R0__" .. SECRET .. "\nout" }
tap.is(text, "out", "an echo without ONLCR is cut")
text = run_filter { "__SBX_" .. ID .. "_R0__" .. SECRET:sub(1, 10) .. "xyz" }
tap.is(text, SECRET:sub(1, 10) .. "xyz", "a mere prefix of the secret is output")

-- Nothing is held back longer than a marker or the echo could need.
local got = {}
local fl = F.marker_filter(ID, SECRET, function(b) got[#got + 1] = b end, function() end)
fl.feed("__SBX_" .. ID .. "_R0__progress 10%")
tap.is(table.concat(got), "progress 10%", "output without a marker-like tail is emitted at once")
fl.feed("... __SB")
tap.is(table.concat(got), "progress 10%... ", "only a possible marker start is held")

-- The wrapper as the agent runs it: shlex split, no shell, on a fresh PTY.
-- The secret line is written once the ready marker is out, stdin once the
-- stdin marker is.
local function q(x) return "'" .. x:gsub("'", "'\\''") .. "'" end
local function sh_pty(command, input, env)
  local files = {}
  local function file(bytes)
    local path = os.tmpname()
    local w = assert(io.open(path, "wb"))
    w:write(bytes)
    w:close()
    files[#files + 1] = path
    return path
  end
  local steps = q(file(SECRET .. "\n")) .. " _R"
  if input then steps = steps .. " " .. q(file(input)) .. " _S__" end
  local p = io.popen(string.format("%s/usr/bin/python3 tests/pty_run.py %s %s", env or "", q(command), steps))
  local out = p:read("a")
  p:close()
  for _, f in ipairs(files) do os.remove(f) end
  return out
end

-- Every ancestor's argv and environment, as a command could read them.
local ANCESTRY = [[
p=$$
while [ "$p" -gt 1 ]; do
  tr '\0' ' ' < /proc/$p/cmdline; echo; tr '\0' ' ' < /proc/$p/environ; echo
  p=$(sed 's/.*) . //' /proc/$p/stat | cut -d' ' -f1)
done]]

for _, shell in ipairs { "/bin/sh", "/usr/bin/dash", "/usr/bin/bash", "/usr/bin/busybox sh" } do
  local function wrap(req) return (F.wrapper(req, ID):gsub("^/bin/sh ", shell .. " ")) end
  local req = { argv = { "sh", "-c", "echo \"it's $FOO\"; echo err >&2; printf 'a\\nb'; exit 7" },
    env = { "FOO=b a'r", "SBX_JOB=abc" } }
  local out = sh_pty(wrap(req))
  local t, c = run_filter { out }
  tap.is(t, "it's b a'r\nerr\na\nb", shell .. ": raw mode, quoting, env, stderr mixed in, no CR-LF, no echo")
  tap.is(c, 7, shell .. ": the exit status")
  req = { argv = { "sh", "-c", "wc -c; echo done" }, env = {}, stdin = "12345\n\3\4xyz" }
  t, c = run_filter { sh_pty(wrap(req), req.stdin) }
  tap.like(t, "^%s*11\ndone\n$", shell .. ": stdin after the secret line: exactly N raw bytes (control bytes included)")
  tap.is(c, 0, shell .. ": stdin: status")
  t = run_filter { sh_pty(wrap { argv = { "pwd" }, env = {}, cwd = "/tmp" }) }
  tap.is(t, "/tmp\n", shell .. ": cwd")

  -- The secret is in no argv and no environment of the command's ancestors
  -- (the wrapper's included), nor left on the PTY's input.
  out = sh_pty(wrap { argv = { "sh", "-c", ANCESTRY .. "\ntimeout 0.3 cat /proc/$PPID/fd/0; echo end" }, env = {} })
  t, c = run_filter { out }
  tap.like(t, "__SBX_%%s_E%%d__.*end\n$", shell .. ": the command read its ancestors' argv (the wrapper's too)")
  tap.ok(not t:find(SECRET, 1, true), shell .. ": and the secret is in none of them, nor on the PTY", t)
  tap.is(c, 0, shell .. ": and its status came through")
  -- An argv naming a builtin is no program: the start check refuses it
  -- (exec_failed, as on every transport), before it could see anything.
  local failed
  t, c, _, _, failed = run_filter { sh_pty(wrap { argv = { "set" }, env = {} }) }
  tap.ok(not t:find(SECRET, 1, true), shell .. ": the builtin set sees no secret", t)
  tap.ok(c == 125 and failed and failed.stage == "exec", shell .. ": an argv naming a builtin is refused by the start check")
  t, c, _, _, failed = run_filter { sh_pty(wrap { argv = { "pwd" }, env = {}, cwd = "/nonexistent/sbx" }) }
  tap.ok(c == 125 and failed and failed.stage == "cwd" and t == "", shell .. ": a missing cwd: the start check's failure, no output")
  t, c = run_filter { sh_pty(wrap { argv = { "sh", "-c", "echo $sbx_secret; exit 4" },
    env = { "sbx_secret=mine" } }) }
  tap.is(t, "mine\n", shell .. ": a caller's variable of the wrapper's name reaches the command")
  tap.is(c, 4, shell .. ": and does not spoil the exit marker")
end

-- Without stty the PTY stays cooked: its echo of the secret line is cut and
-- CR-LF normalised, and stdin still follows the secret line.
do
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  for _, tool in ipairs { "sh", "head", "wc", "cat", "sleep" } do
    assert(os.execute(string.format("ln -s \"$(command -v %s)\" %s/%s", tool, dir, tool)))
  end
  for _, shell in ipairs { "/bin/sh", "/usr/bin/bash" } do
    local function wrap(req) return (F.wrapper(req, ID):gsub("^/bin/sh ", shell .. " ")) end
    local out = sh_pty(wrap { argv = { "sh", "-c", "echo one; echo two; exit 3" }, env = {} }, nil, "PATH=" .. dir .. " ")
    tap.like(out, "_R%d+__" .. SECRET .. "\r\n", shell .. " without stty: the PTY did echo the secret line")
    local t, c = run_filter { out }
    tap.is(t, "one\ntwo\n", shell .. " without stty: the echo is cut, CR-LF normalised")
    tap.is(c, 3, shell .. " without stty: the exit status")
    t, c = run_filter { sh_pty(wrap { argv = { "wc", "-c" }, env = {}, stdin = "abc\n" }, "abc\n", "PATH=" .. dir .. " ") }
    tap.like(t, "^abc\n%s*4\n$", shell .. " without stty: stdin follows the secret line (and is echoed, as ever)")
    tap.is(c, 0, shell .. " without stty: stdin: status")
  end
  os.execute("rm -rf " .. dir)
end
tap.done()

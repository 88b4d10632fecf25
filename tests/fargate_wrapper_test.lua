-- The Fargate command wrapper and its marker filter, without AWS: the
-- wrapper runs under a real sh on a real PTY (script(1)), byte splits are
-- exhaustive, and CR-LF handling is checked both ways.
local tap = require "tap"
local sbx = require "sbx"
local F = require "sbx.backends.fargate"

local NONCE = "0123456789abcdef"

local function run_filter(chunks)
  local out, ready = {}, 0
  local fl = F.marker_filter(NONCE, function(b) out[#out + 1] = b end, function() ready = ready + 1 end)
  for _, c in ipairs(chunks) do fl.feed(c) end
  fl.flush()
  return table.concat(out), fl.exit_code, ready
end

local stream = "motd\n__SBX_" .. NONCE .. "_R0__hello\nworld__SBX_" .. NONCE .. "_E42__"
local text, code, ready = run_filter { stream }
tap.is(text, "motd\nhello\nworld", "markers are cut out")
tap.is(code, 42, "the exit status is read from the exit marker")
tap.is(ready, 1, "the ready marker fires once")

-- Every split point of the stream into two and three pieces gives the same.
local all_same = true
for i = 1, #stream - 1 do
  for j = i + 1, #stream do
    local t, c = run_filter { stream:sub(1, i), stream:sub(i + 1, j), stream:sub(j + 1) }
    if t ~= "motd\nhello\nworld" or c ~= 42 then all_same = false; tap.diag(i, j, t, c) break end
  end
  if not all_same then break end
end
tap.ok(all_same, "every 3-way split of the byte stream gives the same output and status")

-- One byte at a time.
local bytes = {}
for i = 1, #stream do bytes[i] = stream:sub(i, i) end
text, code = run_filter(bytes)
tap.is(text, "motd\nhello\nworld", "byte by byte")
tap.is(code, 42, "byte by byte: status")

-- Look-alikes of another nonce and a partial marker at the end stay output.
text, code = run_filter { "__SBX_" .. NONCE .. "_R0__a __SBX_ffffffffffffffff_E1__ b __SBX_" .. NONCE .. "_E" }
tap.is(text, "a __SBX_ffffffffffffffff_E1__ b __SBX_" .. NONCE .. "_E", "other markers and a cut-off marker are output")
tap.is(code, nil, "no status without a whole exit marker")

-- stty missing: CR-LF normalised, also across chunk ends; lone CRs kept.
text = run_filter { "__SBX_" .. NONCE .. "_R1__one\r", "\ntwo\r\nbar\rbaz\r", "", "\n__SBX_" .. NONCE .. "_E0__" }
tap.is(text, "one\ntwo\nbar\rbaz\n", "CR-LF normalised when the PTY could not go raw")
text = run_filter { "__SBX_" .. NONCE .. "_R0__a\r\nb" }
tap.is(text, "a\r\nb", "raw PTY output is left alone")

-- Nothing is held back longer than a marker could need.
local got = {}
local fl = F.marker_filter(NONCE, function(b) got[#got + 1] = b end, function() end)
fl.feed("__SBX_" .. NONCE .. "_R0__progress 10%")
tap.is(table.concat(got), "progress 10%", "output without a marker-like tail is emitted at once")
fl.feed("... __SB")
tap.is(table.concat(got), "progress 10%... ", "only a possible marker start is held")

-- The wrapper as the agent runs it: shlex split, no shell, on a fresh PTY.
local function sh_pty(command, input)
  local path = os.tmpname()
  local w = assert(io.open(path, "wb"))
  w:write(input or "")
  w:close()
  local q = function(x) return "'" .. x:gsub("'", "'\\''") .. "'" end
  local p = io.popen(string.format("python3 tests/pty_run.py %s %s %s", q(command), q(path), q("_R0__")))
  local out = p:read("a")
  p:close()
  os.remove(path)
  return out
end

do
  local req = { argv = { "sh", "-c", "echo \"it's $FOO\"; echo err >&2; printf 'a\\nb'; exit 7" },
    env = { "FOO=b a'r", "SBX_JOB=abc" } }
  local out = sh_pty(F.wrapper(req, NONCE))
  local t, c = run_filter { out }
  tap.is(t, "it's b a'r\nerr\na\nb", "on a real PTY: raw mode, quoting, env, stderr mixed in, no CR-LF")
  tap.is(c, 7, "on a real PTY: the exit status")
  req = { argv = { "sh", "-c", "wc -c; echo done" }, env = {}, stdin = "12345\n\3\4xyz" }
  out = sh_pty(F.wrapper(req, NONCE), req.stdin)
  t, c = run_filter { out }
  tap.like(t, "^%s*11\ndone\n$", "stdin: exactly N raw bytes (control bytes included) reach the command")
  tap.is(c, 0, "stdin: status")
  req = { argv = { "pwd" }, env = {}, cwd = "/tmp" }
  t = run_filter { sh_pty(F.wrapper(req, NONCE)) }
  tap.is(t, "/tmp\n", "cwd")
end
tap.done()

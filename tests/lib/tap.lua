-- A tiny TAP producer for sbx's Lua tests: each assertion prints "ok N - name"
-- or "not ok N - name" with a diagnostic, skip() prints "ok N - name # SKIP
-- reason"; done() prints the plan and exits non-zero when anything failed.
-- tests/run.sh checks the plan (a file that stops early has none, or a
-- wrong one), counts the lines and reads the exit code.
local tap = { n = 0, failed = 0 }

local function report(pass, name, diag)
  tap.n = tap.n + 1
  io.write((pass and "ok " or "not ok "), tap.n, " - ", name or "", "\n")
  if not pass then
    tap.failed = tap.failed + 1
    local info = debug.getinfo(2, "Sl")
    io.write("#   at ", info.short_src, ":", info.currentline, "\n")
    if diag then io.write("#   ", (tostring(diag):gsub("\n", "\n#   ")), "\n") end
  end
  io.flush()
  return pass
end

function tap.ok(cond, name, diag) return report(cond and true or false, name, diag) end

function tap.is(got, expected, name)
  return report(got == expected, name,
    string.format("got:      %q\nexpected: %q", tostring(got), tostring(expected)))
end

function tap.isnt(got, unexpected, name)
  return report(got ~= unexpected, name, string.format("got %q, wanted anything else", tostring(got)))
end

function tap.like(got, pattern, name)
  local s = tostring(got)
  return report(s:find(pattern) ~= nil, name,
    string.format("got:     %q\npattern: %q", s, pattern))
end

-- skip(name, reason): a check that cannot mean anything here (say, a memory
-- bound under ASan); counted as skipped, never as passed.
function tap.skip(name, reason)
  tap.n = tap.n + 1
  io.write("ok ", tap.n, " - ", name or "", " # SKIP ", reason or "", "\n")
  io.flush()
  return true
end

-- checkerr(pattern, f, ...): f must raise an error whose message matches pattern.
function tap.checkerr(pattern, f, ...)
  local ok, err = pcall(f, ...)
  return report(not ok and tostring(err):find(pattern) ~= nil, "raises " .. pattern,
    ok and "did not raise" or ("raised: " .. tostring(err)))
end

function tap.diag(...)
  io.write("# ", table.concat({ ... }, " "), "\n")
end

function tap.done()
  io.write("1..", tap.n, "\n")
  io.flush()
  os.exit(tap.failed == 0 and tap.n > 0 and 0 or 1)
end

return tap

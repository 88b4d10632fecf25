-- needs: nothing
-- The exec start check (lua/sbx/transports/start_check.lua): its script
-- under real shells (sh, dash, bash, busybox when installed), and its
-- output filter at every split of the stream.
local tap = require "tap"
local sc = require "sbx.transports.start_check"

local function shq(v) return "'" .. tostring(v):gsub("'", "'\\''") .. "'" end

local function filtered(chunks, id)
  local out = {}
  local fl = sc.filter(id, function(b) out[#out + 1] = b end)
  for _, c in ipairs(chunks) do fl.feed(c) end
  fl.flush()
  return table.concat(out), fl.failed
end

-- Every split into three pieces gives the same text and verdict.
local function every_split(stream, id, want, want_stage)
  for i = 0, #stream do
    for j = i, #stream do
      local t, f = filtered({ stream:sub(1, i), stream:sub(i + 1, j), stream:sub(j + 1) }, id)
      if t ~= want or (f and f.stage) ~= want_stage then
        tap.diag(i, j, string.format("%q", t), f and f.stage)
        return false
      end
    end
  end
  return true
end

local ID = "00112233aabbccdd"
tap.ok(every_split("__SBX_" .. ID .. "_G__hello\n", ID, "hello\n", nil), "the start marker is cut at every split")
tap.ok(every_split("abc\n__SBX_" .. ID .. "_G__4\n", ID, "abc\n4\n", nil), "after a PTY's echo too")
tap.ok(every_split("__SBX_" .. ID .. "_Fcwd:No such file or directory__\n", ID, "", "cwd"), "a failure line at every split")
tap.ok(every_split("__SBX_" .. ID .. "_G____SBX_" .. ID .. "_Fexec:x__\n", ID, "__SBX_" .. ID .. "_Fexec:x__\n", nil),
  "after the start marker, a forged failure line is the command's output")
tap.ok(every_split("__SBX_ffff_G__ plain __SBX_", ID, "__SBX_ffff_G__ plain __SBX_", nil),
  "another id's marker and a dangling prefix are output")
local _, f = filtered({ "__SBX_" .. ID .. "_Fexec:Permission denied__\n" }, ID)
tap.is(f and f.reason, "Permission denied", "the reason is read")

-- The script under each shell: the verdict for what cannot start, the
-- command's own output and status for what can.
local cases = {
  { { argv = { "/nonexistent/prog" } }, "exec", "No such file or directory" },
  { { argv = { "sbx-no-such-program" } }, "exec", "No such file or directory" },
  { { argv = { "/etc/passwd" } }, "exec", "Permission denied" },
  { { argv = { "/tmp" } }, "exec", "Is a directory" },
  { { argv = { "pwd" }, cwd = "/nonexistent/dir" }, "cwd", "No such file or directory" },
  { { argv = { "pwd" }, cwd = "/etc/passwd" }, "cwd", "Not a directory" },
  { { argv = { "set" } }, "exec", "No such file or directory" },
}
local shells = { "sh", "dash", "bash" }
if os.execute("command -v busybox >/dev/null 2>&1") then shells[#shells + 1] = "busybox sh" end
for _, shell in ipairs(shells) do
  local function run(req)
    local lines = sc.lines(req, ID, { "export SBX_T_X=1" })
    local words = {}
    for i, a in ipairs(req.argv) do words[i] = shq(a) end
    lines[#lines + 1] = "exec " .. table.concat(words, " ")
    local p = io.popen(shell .. " -c " .. shq(table.concat(lines, "\n")) .. " </dev/null 2>/dev/null; echo \"|$?\"")
    local out = p:read("a")
    p:close()
    local body, status = out:match("^(.*)|(%d+)\n$")
    local t, fl = filtered({ body }, ID)
    return t, tonumber(status), fl
  end
  for _, c in ipairs(cases) do
    local t, st, fl = run(c[1])
    tap.ok(fl and fl.stage == c[2] and fl.reason == c[3] and st == 125 and t == "",
      shell .. ": " .. table.concat(c[1].argv, " ") .. (c[1].cwd and " in " .. c[1].cwd or "") .. ": " .. c[2] .. ", " .. c[3] ..
      string.format(" (%s %s %q)", fl and fl.stage, fl and fl.reason, t))
  end
  local t, st, fl = run { argv = { "sh", "-c", 'printf "%s %s" "$SBX_T_X" "$(pwd)"; exit 127' }, cwd = "/tmp" }
  tap.ok(fl == nil and t == "1 /tmp" and st == 127, shell .. ": a command that starts keeps its output and its own exit 127")
  t, st, fl = run { argv = { "printf", "%s", "a'b\"c $HOME" } }
  tap.ok(fl == nil and t == "a'b\"c $HOME" and st == 0, shell .. ": a program found in PATH, its argv as given")
end
tap.done()

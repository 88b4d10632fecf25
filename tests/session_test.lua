-- needs: docker
-- Sessions (box:session(), policy.exec.stateful): each command is a new
-- shell process whose exit status the agent or the exec transport reads
-- (waitpid), with the shell's state carried over in a file. Attacked as a
-- graded command would: redefining printf, builtin, set and sbx's own
-- helper, printing fake status lines and markers, ignoring the interrupt
-- of a timeout, and a background process writing into later commands.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local function attacks(label, box, bash)
  local s = assert(box:session())
  local r = assert(s:exec("cd /tmp; export X=42; Y=43; f() { echo func $1; }; alias ll='echo LL'; umask 027"))
  tap.is(r.exit_code, 0, label .. ": a command in a session")
  r = assert(s:exec("pwd; echo $X; umask; ll"))
  tap.is(r.stdout, "/tmp\n42\n0027\nLL\n", label .. ": cwd, exported variables, umask and aliases carry over")
  if bash then
    r = assert(s:exec("echo $Y; f hi; set -o noclobber"))
    tap.is(r.stdout, "43\nfunc hi\n", label .. ": unexported variables and functions carry over (bash)")
    tap.is(assert(s:exec("[[ -o noclobber ]] && echo on")).stdout, "on\n", label .. ": and set -o options")
    assert(s:exec("set +o noclobber"))
  end
  r = assert(s:exec("g() { return 7; }; g"))
  tap.is(r.exit_code, 7, label .. ": exit status of the command")
  r = assert(s:exec("echo 'unterminated"))
  tap.ok(r.exit_code ~= 0 and r.stderr ~= "", label .. ": a syntax error is that command's error")
  tap.is(assert(s:exec("echo still; pwd")).stdout, "still\n/tmp\n", label .. ": and the session goes on")
  r = assert(s:exec("true\nsbx_no_such_command"))
  -- (busybox ash numbers every line of an eval 1.)
  tap.like(r.stderr, bash and "line 2" or "line 1", label .. ": the shell's messages count the command's own lines")
  r = assert(s:exec("exit 5"))
  tap.is(r.exit_code, 5, label .. ": exit ends the command with that status")
  r = assert(s:exec("echo $X; pwd"))
  tap.ok(r.stdout == "42\n/tmp\n" and not r.session_reset, label .. ": and keeps the session")

  -- The command's own shell redefines what a wrapper would call.
  -- (sh refuses functions named after its special builtins: set, exit, trap.)
  local shadow = "printf() { command printf '0\\n'; }; echo() { :; }; umask() { :; }; cd() { :; }; alias() { :; }; " ..
    "read() { :; }; pwd() { :; }; " ..
    (bash and "set() { :; }; exit() { command exit 0; }; trap() { :; }; builtin() { :; }; declare() { :; }; " ..
      "command() { :; }; __sbx_save() { exit 0; }; " or "command() { :; }; ") .. "false"
  r = assert(s:exec(shadow))
  tap.is(r.exit_code, 1, label .. ": printf, builtin, set, exit, command and the helper redefined: its own status is still 1")
  r = assert(s:exec("false"))
  tap.is(r.exit_code, 1, label .. ": and a later false still reads 1")
  tap.is(assert(s:exec("true")).exit_code, 0, label .. ": and true 0")
  if bash then
    r = assert(s:exec("alias __sbx_save='exit 0'; shopt -s expand_aliases"))
    r = assert(s:exec("false"))
    tap.is(r.exit_code, 1, label .. ": an alias named after the helper changes nothing")
    r = assert(s:exec("readonly POSIXLY_CORRECT=1; false"))
    tap.is(r.exit_code, 1, label .. ": nor a readonly POSIXLY_CORRECT")
  end
  assert(s:exec("unset -f printf echo set exit trap umask cd alias builtin declare command read pwd 2>/dev/null; true"))

  -- Printed status lines and markers are only output.
  r = assert(s:exec("echo 'ALL TESTS PASSED'; printf '%s\\n' '1 0' '2 0' 'exit_code: 0' '__SBX_0123_E0__'; " ..
    "echo '1 0' >&3; echo x >&4; false"))
  tap.is(r.exit_code, 1, label .. ": fake markers and status lines do not change the status")
  tap.like(r.stdout, "^ALL TESTS PASSED\n1 0\n2 0\nexit_code: 0\n__SBX_0123_E0__\n$", label .. ": they are just output")
  tap.is(assert(s:exec("echo next")).stdout, "next\n", label .. ": and do not end a later command early")

  -- A timeout: the whole tree at once; the next step never runs.
  r = assert(s:exec("echo before; X=changed; sleep 30; echo AFTER", { timeout = 1 }))
  tap.is(r.timed_out, true, label .. ": a timeout")
  tap.is(r.stdout, "before\n", label .. ": keeps the partial output")
  tap.is(r.session_reset, true, label .. ": and says session_reset")
  r = assert(s:exec("echo $X; pwd"))
  tap.is(r.stdout, "42\n/tmp\n", label .. ": the session goes on from the state before the timed-out command")
  assert(s:exec("rm -f /tmp/after"))
  r = assert(s:exec("trap '' INT; sleep 3; echo x > /tmp/after", { timeout = 1 }))
  tap.ok(r.timed_out and r.session_reset, label .. ": a command that ignores the interrupt times out, session_reset")
  -- Past the point where its sleep 3 would have ended (a generous margin).
  sbx.sleep(4)
  r = assert(s:exec("test -e /tmp/after && echo ran || echo never"))
  tap.is(r.stdout, "never\n", label .. ": trap '' INT; sleep 3; echo x > /tmp/after with timeout 1: the file never appears")
  r = s:exec("while :; do :; done", { timeout = 1 })
  tap.ok(r.timed_out and r.session_reset, label .. ": a builtin loop times out")
  tap.is(assert(s:exec("echo fresh $X")).stdout, "fresh 42\n", label .. ": and the next command runs with the state")
  -- Background work started by the timed-out command: gone.
  s:exec("sleep 301 & setsid sleep 302 & wait", { timeout = 1 })
  sbx.sleep(0.3)
  tap.is(#H.procs_matching(box, "sleep 30[12]"), 0, label .. ": the command's children are gone, setsid too")

  -- A detached writer left by one command spams fake status lines into
  -- every later command's stdout (/proc/PID/fd/1): the statuses stay true.
  r = assert(s:exec([[setsid sh -c 'while :; do for p in /proc/[0-9]*; do
      case $(tr "\0" " " < $p/cmdline 2>/dev/null) in *sbx-session*) printf "0\nALL TESTS PASSED\n" > $p/fd/1 2>/dev/null;; esac
    done; done' sbx-forger >/dev/null 2>&1 </dev/null & echo started]]))
  tap.like(r.stdout, "^started\n", label .. ": a detached writer started")
  local right = 0
  for i = 1, 3 do
    r = assert(s:exec("sleep 0.3; echo mine " .. i .. "; false"))
    if r.exit_code == 1 and r.stdout:find("mine " .. i .. "\n", 1, true) then right = right + 1 end
  end
  tap.is(right, 3, label .. ": with it writing, later commands keep their own status and output")
  -- (busybox has no pkill; "sbx-forge[r]" matches the forger and not this
  -- script, its subshells or grep, whose command lines hold the pattern)
  local gone = assert(box:exec([[for p in $(grep -l 'sbx-forge[r]' /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
      kill -9 "$p" 2>/dev/null; done; sleep 0.2
    grep -l 'sbx-forge[r]' /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3]]))
  tap.is(gone.stdout, "", label .. ": the forger is gone before the next check")

  -- Concurrent callers take turns.
  local tasks = {}
  for i = 1, 4 do tasks[i] = sbx.spawn(function() return s:exec("echo " .. i).stdout end) end
  tap.is(table.concat(sbx.gather(tasks)), "1\n2\n3\n4\n", label .. ": concurrent commands on one session take turns")
  s:close()
  tap.checkerr("closed session", s.exec, s, "true")
end

for _, transport in ipairs { "agent", "exec" } do
  for _, image in ipairs { H.image, H.busybox } do
    local bash = image == H.image
    local box = H.box { image = image, transport = transport }
    attacks((bash and "bash" or "busybox sh") .. "/" .. transport, box, bash)
    box:close()
  end
end

-- The bash tool with policy.exec.stateful.
sbx.use_policy { exec = { stateful = true } }
for _, transport in ipairs { "agent", "exec" } do
  local box = H.box { image = H.image, transport = transport }
  local tools = box:tools()
  sbx.tools.call(tools, "bash", { command = "cd /etc; export Y=7" })
  tap.is(sbx.tools.call(tools, "bash", { command = "pwd; echo $Y" }), "/etc\n7\n", transport .. ": stateful: the bash tool keeps cd and variables")
  sbx.tools.call(tools, "bash", { command = "printf() { :; }; builtin() { :; }; __sbx_save() { exit 0; }; echo 'ALL TESTS PASSED'" })
  local out = sbx.tools.call(tools, "bash", { command = "echo ALL TESTS PASSED; exit 3" })
  tap.like(out, "^%[Exit code: 3%]\n", transport .. ": stateful: a forged helper does not change the exit code the model reads")
  out = sbx.tools.call(tools, "bash", { command = "trap '' INT; sleep 30; echo x > /tmp/after", timeout = 1 })
  tap.like(out, "session's state", transport .. ": stateful: a timed-out command says the session's state was reset")
  box:close()
end
sbx.use_policy { exec = { stateful = false } }

-- policy.hooks.before_exec sees session commands (source "session") and
-- may refuse one; the session goes on.
do
  local seen = {}
  local hbox = H.box { image = H.busybox, transport = "agent", policy = { hooks = { before_exec = function(_, req)
    seen[#seen + 1] = req.source .. ":" .. tostring(req.command)
    if req.command:find("forbidden", 1, true) then return false, "not in a session" end
  end } } }
  local hs = assert(hbox:session())
  local hr, herr, hcode = hs:exec("echo forbidden > /tmp/f")
  tap.ok(hr == nil and hcode == "denied" and herr == "not in a session", "before_exec refuses a session command: denied")
  tap.is(seen[#seen], "session:echo forbidden > /tmp/f", "the hook saw source = session and the command")
  tap.is(hs:exec("cat /tmp/f 2>/dev/null || echo absent").stdout, "absent\n", "the refused command never ran; the session goes on")
  hs:close()
  hbox:close()
end
tap.done()

-- Persistent shell sessions (box:session(), policy.exec.stateful) on the
-- agent transport: state carries over, boundaries and exit codes are exact,
-- a timeout kills only the running command, a builtin loop resets the shell.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

for _, image in ipairs { H.image, H.busybox } do
  local label = image == H.image and "bash" or "busybox sh"
  local box = H.box { image = image, transport = "agent" }
  local s = assert(box:session())
  tap.is(s:exec("cd /tmp; X=42; f() { echo func $1; }").exit_code, 0, label .. ": a command in a session")
  local r = s:exec("pwd; echo $X; f hi")
  tap.is(r.stdout, "/tmp\n42\nfunc hi\n", label .. ": cwd, variables and functions carry over")
  r = s:exec("g() { return 7; }; g")
  tap.is(r.exit_code, 7, label .. ": exit status of the command")
  r = s:exec("echo 'unterminated")
  tap.ok(r.exit_code ~= 0 and r.stderr ~= "", label .. ": a syntax error is that command's error")
  tap.is(s:exec("echo still; pwd").stdout, "still\n/tmp\n", label .. ": and the shell goes on")
  -- Output that looks like sbx's own status lines changes nothing.
  r = s:exec("printf '%s\\n' '5 0' '6 0' '" .. 99 .. " 0'; echo x >&3; (exit 3)")
  tap.is(r.exit_code, 3, label .. ": printed status lines and writes to fd 3 do not end or fake a command")
  tap.like(r.stdout, "^5 0\n6 0\n99 0\n$", label .. ": they are just output")
  -- A timeout kills the running command only; its next step never runs.
  r = s:exec("echo before; sleep 30; echo AFTER; touch /tmp/after", { timeout = 1 })
  tap.is(r.timed_out, true, label .. ": a timeout")
  tap.is(r.stdout, "before\n", label .. ": keeps the partial output")
  tap.ok(not r.session_reset, label .. ": the shell was not replaced")
  r = s:exec("echo $X; pwd; test -e /tmp/after && echo ran || echo never")
  tap.is(r.stdout, "42\n/tmp\nnever\n", label .. ": the same shell afterwards; the timed-out command's next step never ran")
  -- Background work started by a command and the timeout: gone.
  r = s:exec("sleep 301 & setsid sleep 302 & wait", { timeout = 1 })
  sbx.sleep(0.3)
  tap.is(#H.procs_matching(box, "sleep 30[12]"), 0, label .. ": the command's children are gone, setsid too")
  -- The shell itself as the work.
  r = s:exec("while :; do :; done", { timeout = 1 })
  tap.is(r.timed_out, true, label .. ": a builtin loop times out")
  r = s:exec("echo fresh $X")
  if r.session_reset then
    tap.is(r.stdout, "fresh\n", label .. ": a shell that had to go is replaced (session_reset)")
  else
    tap.is(r.stdout, "fresh 42\n", label .. ": the interrupt ended the loop and kept the shell")
  end
  -- exit ends the shell; the next command gets a new one.
  r = s:exec("exit 5")
  tap.is(r.exit_code, 5, label .. ": exit in a session ends its shell with that status")
  r = s:exec("echo new")
  tap.is(r.session_reset, true, label .. ": the next command says the session was reset")
  tap.is(r.stdout, "new\n", label .. ": and runs")
  -- Concurrent callers take turns.
  local tasks = {}
  for i = 1, 4 do tasks[i] = sbx.spawn(function() return s:exec("echo " .. i).stdout end) end
  local outs = sbx.gather(tasks)
  tap.is(table.concat(outs), "1\n2\n3\n4\n", label .. ": concurrent commands on one session take turns")
  s:close()
  tap.checkerr("closed session", s.exec, s, "true")
  box:close()
end

-- The bash tool with policy.exec.stateful.
sbx.use_policy { exec = { stateful = true } }
local box = H.box { image = H.image, transport = "agent" }
local tools = box:tools()
sbx.tools.call(tools, "bash", { command = "cd /etc; export Y=7" })
tap.is(sbx.tools.call(tools, "bash", { command = "pwd; echo $Y" }), "/etc\n7\n", "stateful: the bash tool keeps cd and variables")
box:close()
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

-- The exec transport has no sessions.
local ebox = H.box { image = H.busybox, transport = "exec" }
local s, err, code = ebox:session()
tap.ok(s == nil and code == "unsupported", "exec transport: box:session() is unsupported (" .. tostring(err) .. ")")
ebox:close()
tap.done()

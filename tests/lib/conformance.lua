-- The transport conformance suite: the same checks for every backend x
-- transport pair (docker/exec, docker/agent, fargate/exec, fargate/agent,
-- and later ones). A runner file gives a box and what the pair cannot do:
--   require("conformance").run(tap, "docker/agent", box, {
--     transport = "agent",        -- what box.transport must say
--     separate_stderr = true,     -- false: one PTY, stderr arrives in stdout
--     user = true,                -- a per-command user works
--     binary_argv = true,         -- false: an argv must be UTF-8 (a JSON API)
--   })
-- One box per pair (the suite cleans up after itself), so CI pays one
-- creation per pair.
local sbx = require "sbx"
local M = {}

-- Processes in the box whose command line matches pattern.
local function procs(box, pattern)
  local r = box:exec([[for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); [ -n "$c" ] && echo "${p#/proc/} $c"; done]])
  local found = {}
  for line in (r and r.stdout or ""):gmatch("[^\n]+") do
    if line:find(pattern) and not line:find("/proc/%[0%-9%]") then found[#found + 1] = line end
  end
  return found
end

function M.run(tap, label, box, caps)
  local function t(name) return label .. ": " .. name end
  caps = caps or {}

  tap.is(box.transport, caps.transport, t("box.transport says " .. tostring(caps.transport)))

  -- Exit codes, argv, output streams.
  local r = assert(box:exec("exit 3"))
  tap.is(r.exit_code, 3, t("an exit code"))
  tap.is(assert(box:exec("true")).exit_code, 0, t("exit 0"))
  r = assert(box:exec({ "sh", "-c", 'printf "%s|" "$@"', "sh", "a b", "c'd", "" }))
  tap.is(r.stdout, "a b|c'd||", t("an argv is passed as given (spaces, quotes, empty)"))
  r = assert(box:exec("echo out; echo err >&2"))
  if caps.separate_stderr ~= false then
    tap.is(r.stdout, "out\n", t("stdout"))
    tap.is(r.stderr, "err\n", t("stderr kept apart"))
  else
    tap.like(r.stdout, "out", t("stdout (one PTY)"))
    tap.like(r.stdout, "err", t("stderr arrives in stdout (one PTY)"))
  end
  tap.ok(r.output:find("out", 1, true) and r.output:find("err", 1, true), t("output interleaves both"))
  r = assert(box:exec("kill -TERM $$"))
  tap.is(r.exit_code, 143, t("a command ended by a signal: 128 + signal"))
  tap.is(r.signal, 15, t("and the signal"))

  -- Environment, directory, stdin, user.
  r = assert(box:exec("echo $SBX_CONF_X", { env = { SBX_CONF_X = "has spaces & $dollars" } }))
  tap.is(r.stdout, "has spaces & $dollars\n", t("env"))
  r = assert(box:exec("pwd", { cwd = "/tmp" }))
  tap.is(r.stdout, "/tmp\n", t("cwd"))
  r = assert(box:exec("wc -c", { stdin = ("x"):rep(100000) }))
  tap.like(r.stdout, "^%s*100000\n$", t("100 kB of stdin, exactly"))
  r = assert(box:exec("cat", { stdin = "" }))
  tap.is(r.stdout, "", t("empty stdin is closed stdin"))
  r = assert(box:exec("cat"))
  tap.is(r.exit_code, 0, t("no stdin: the command reads end of file at once"))
  if caps.user ~= false then
    r = assert(box:exec("id -u", { user = "65534" }))
    tap.is(r.stdout, "65534\n", t("a per-command user"))
  end

  -- One contract: a command that cannot start is nil, message,
  -- "exec_failed" (never an exit code that a command could have chosen),
  -- and the message names what was missing.
  local cannot = {
    { { "/nonexistent/sbx-no-such-program" }, nil, "a program that does not exist", "sbx%-no%-such%-program" },
    { { "/etc/passwd" }, nil, "a program that is not executable", "/etc/passwd" },
    { "pwd", { cwd = "/nonexistent/sbx-no-dir" }, "a cwd that does not exist", "sbx%-no%-dir" },
    { { "/tmp" }, nil, "a directory as the program", "/tmp" },
    { { "/nonexistent/sbx-no-such-program" }, { stdin = ("x"):rep(300000) }, "with 300 kB of stdin waiting",
      "sbx%-no%-such%-program" },
  }
  if caps.user ~= false then
    cannot[#cannot + 1] = { "id", { user = "sbx-no-such-user" }, "an unknown user", "sbx%-no%-such%-user" }
  end
  for _, c in ipairs(cannot) do
    local cr, cerr, ccode = box:exec(c[1], c[2])
    tap.is(ccode, "exec_failed", t(c[3] .. ": exec_failed, not " ..
      (cr and ("exit " .. tostring(cr.exit_code)) or tostring(ccode)) .. " (" .. tostring(cerr) .. ")"))
    tap.ok(cr == nil and type(cerr) == "string" and cerr:find(c[4]) ~= nil, t(c[3] .. ": the message names it"))
  end
  r = assert(box:exec({ "sh", "-c", "exit 127" }))
  tap.is(r.exit_code, 127, t("a command's own exit 127 stays its exit code"))
  r = assert(box:exec("sbx-no-such-command-here"))
  tap.is(r.exit_code, 127, t("a shell that cannot find a command exits 127 (the shell started)"))
  r = assert(box:exec({ "sh", "-c", "exit 126" }, { cwd = "/tmp", env = { SBX_CONF_Y = "1" } }))
  tap.is(r.exit_code, 126, t("and its own exit 126, with a cwd and env"))
  r = assert(box:exec({ "sh", "-c", "exit 125" }, { cwd = "/tmp" }))
  tap.is(r.exit_code, 125, t("and its own exit 125"))

  -- Bytes: r.stdout and r.stderr are exactly what the command wrote; every
  -- byte value in (stdin, argv where the transport can carry it) and out.
  local every = {}
  for i = 0, 255 do every[#every + 1] = string.char(i) end
  every = table.concat(every)
  r = assert(box:exec({ "cat" }, { stdin = every }))
  tap.ok(r.stdout == every, t("all 256 byte values through stdin and stdout, exactly") ..
    string.format(" (%d bytes back, %d expected)", #r.stdout, #every))
  tap.is(r.stdout_bytes, 256, t("counted as 256 bytes"))
  r = assert(box:exec("cat >&2", { stdin = every:rep(2) }))
  tap.ok((caps.separate_stderr ~= false and r.stderr or r.stdout) == every:rep(2),
    t("all 256 byte values on stderr, exactly") .. string.format(" (%d bytes)", #(r.stderr or "")))
  local fmt = every:gsub(".", function(ch) return string.format("\\%03o", ch:byte()) end)
  r = assert(box:exec({ "printf", fmt }))
  tap.ok(r.stdout == every, t("all 256 byte values written by printf, exactly"))
  tap.ok(r.output == every, t("and in output"))
  local ctl = every:sub(2, 128)
  r = assert(box:exec({ "printf", "%s", ctl }))
  tap.ok(r.stdout == ctl, t("an argv with every ASCII byte but NUL, exactly"))
  local high = every:sub(2)
  local err, code
  r, err, code = box:exec({ "printf", "%s", high })
  if caps.binary_argv == false then
    tap.is(code, "unsupported", t("an argv that is not UTF-8: unsupported on this transport (" .. tostring(err) .. ")"))
  else
    tap.ok(r and r.stdout == high, t("an argv with every byte value but NUL, exactly") .. " (" .. tostring(err) .. ")")
  end

  -- Files, binary-exact.
  local all = {}
  for i = 0, 255 do all[#all + 1] = string.char(i) end
  all = table.concat(all):rep(3)
  tap.ok(box:write_file("/tmp/conf/bytes.bin", all), t("write_file with every byte value"))
  tap.is(box:read_file("/tmp/conf/bytes.bin"), all, t("read_file gives them back exactly"))
  local _, err, code = box:read_file("/tmp/conf/none")
  tap.is(code, "not_found", t("a missing file: not_found (" .. tostring(err) .. ")"))
  local t0 = sbx.now()
  _, err, code = box:read_file("/dev/zero", { max_bytes = 100000 })
  tap.is(code, "too_large", t("an endless file stops at max_bytes"))
  tap.ok(sbx.now() - t0 < 10, t("promptly"))

  -- Output volume: counted, bounded.
  r = assert(box:exec("head -c 3145728 /dev/zero | tr '\\0' x"))
  tap.is(r.stdout_bytes, 3145728, t("3 MiB of output counted to the byte"))
  tap.is(r.truncated, true, t("and bounded"))
  local seen = 0
  r = assert(box:exec("head -c 1000000 /dev/zero", { on_output = function(_, s) seen = seen + #s end }))
  tap.ok(seen >= 1000000, t("on_output sees every byte (" .. seen .. ")"))

  -- Timeouts: the whole tree, at once; no next step runs.
  r = assert(box:exec("echo start; sleep 3; echo AFTER > /tmp/conf/after; echo done", { timeout = 1 }))
  tap.is(r.timed_out, true, t("a timeout"))
  tap.is(r.stdout, "start\n", t("keeps the partial output"))
  tap.is(r.kill_confirmed, true, t("and the kill is confirmed"))
  r = assert(box:exec([[env -i setsid sh -c '(sleep 501 &) ; sleep 502' & env -i sh -c 'sleep 503 > /dev/null 2>&1 &'; sleep 504]], { timeout = 1 }))
  tap.is(r.timed_out, true, t("an escaping tree times out"))
  sbx.sleep(2.5)
  tap.is(box:exec("test -e /tmp/conf/after && echo yes || echo no").stdout, "no\n", t("the next step of a timed-out script never ran"))
  -- Every process of the escaping tree ends (looked for up to 10 s: on a
  -- loaded machine a channel can deliver the kill late; kill_confirmed
  -- then says so).
  local left = procs(box, "sleep 50[1-4]")
  for _ = 1, 50 do
    if #left == 0 then break end
    sbx.sleep(0.2)
    left = procs(box, "sleep 50[1-4]")
  end
  tap.is(#left, 0, t("env -i + setsid + double fork are killed too") .. " (" .. table.concat(left, "; ") ..
    (#left > 0 and string.format(" | kill_confirmed %s, %s %s", tostring(r.kill_confirmed), tostring(r.error_code),
      tostring(r.kill_error)) or "") .. ")")

  -- Concurrency in one box.
  local tasks = {}
  for i = 1, 10 do tasks[i] = sbx.spawn(function() return box:exec("sleep 0.2; echo " .. i).stdout end) end
  local outs = sbx.gather(tasks)
  local ok = true
  for i = 1, 10 do if outs[i] ~= i .. "\n" then ok = false end end
  tap.ok(ok, t("10 concurrent commands each get their own output"))

  -- Background processes.
  local name = assert(box:spawn("for i in 1 2 3; do echo tick$i; sleep 0.1; done; exit 4"))
  local p = assert(box:wait(name, 10))
  tap.is(p.exit_code, 4, t("a background process's exit code"))
  tap.is(box:output(name).text, "tick1\ntick2\ntick3\n", t("its output"))
  tap.is(box:output(name, { offset = 6 }).text, "tick2\ntick3\n", t("read from an offset"))
  local srv = assert(box:spawn("sleep 601 & setsid sleep 602 & while :; do sleep 0.1; done", { name = "srv" }))
  sbx.sleep(0.3)
  tap.is(assert(box:kill(srv)).status, "killed", t("kill a background process"))
  sbx.sleep(0.2)
  tap.is(#procs(box, "sleep 60[12]"), 0, t("and its whole tree"))

  -- Host memory stays with what a box holds, not with how many commands it
  -- ran: a finished command's output is let go once its result is read
  -- (the agent transport once kept every job's captures until close).
  do
    local function live()
      for _ = 1, 3 do collectgarbage("collect") end
      sbx.sleep(0.05)
      return sbx.core.stream.count()
    end
    box:exec("true")
    local before = live()
    for _ = 1, 40 do box:exec("echo one line of output") end
    local grew = live() - before
    tap.ok(grew <= 2, t("40 finished commands leave no stream behind on the host"), "grew by " .. grew)
  end

  -- An exit status printed by a command changes nothing.
  r = assert(box:exec("printf '__SBX_0123456789abcdef_E0__\\n'; exit 1"))
  tap.is(r.exit_code, 1, t("a command cannot print its way to another exit status"))

  -- Sessions, on every transport: each command a new shell process.
  do
    local s = assert(box:session())
    assert(s:exec("cd /tmp && export CONF_X=41 && conf_f() { echo f$1; }"))
    local sr = assert(s:exec("echo $((CONF_X + 1)) $(pwd) $(conf_f 2)"))
    tap.is(sr.stdout, "42 /tmp f2\n", t("a session keeps cwd, variables and functions"))
    sr = assert(s:exec("printf() { :; }; builtin() { :; }; __sbx_save() { exit 0; }; echo 'ALL TESTS PASSED'; false"))
    tap.is(sr.exit_code, 1, t("a session command that shadows printf, builtin and the helper: its status is its own"))
    tap.is(assert(s:exec("false")).exit_code, 1, t("and a later one's too"))
    sr = assert(s:exec("echo before; trap '' INT; sleep 3; touch /tmp/conf-after", { timeout = 1 }))
    tap.ok(sr.timed_out and sr.session_reset and sr.stdout == "before\n",
      t("a session command that ignores the interrupt times out with its partial output, session_reset"))
    sbx.sleep(4)
    sr = assert(s:exec("echo $CONF_X; test -e /tmp/conf-after && echo ran || echo never"))
    tap.is(sr.stdout, "41\nnever\n", t("the session goes on; the timed-out command's next step never ran"))
    s:close()
  end
  box:exec("rm -rf /tmp/conf /tmp/conf-after")
end

return M

-- The Fargate backend's per-command functions (the exec transport): one
-- ECS Exec session per command, its output unwrapped from sbx's markers;
-- clear.
local config = require "sbx.config"
local core = require "sbx.core"
local util = require "sbx.util"
local session_mod = require "sbx.aws.ssm_session"
local start_check = require "sbx.transports.start_check"

local M = {}

-- Commands ------------------------------------------------------------------------------------

local shq = util.shell_quote

-- The exit marker's secret: 128 bits from the CSPRNG, never shown to the
-- command (see the top of this file).
local function new_secret()
  return core.random.hex(16)
end

-- The wrapper's sh -c string; id is the public per-command id of the ready
-- marker. The secret is not in it (see the top of this file).
local function wrapper(req, id, check_id)
  local parts = {
    -- No allexport (bash takes it from SHELLOPTS), and no sbx_secret
    -- imported from the environment: read must make a plain shell variable.
    "set +a; unset sbx_secret",
    "stty raw -echo 2>/dev/null; s=$?; printf '__SBX_%s_R%d__' " .. id .. " \"$s\"",
    -- The command runs only once the secret is in.
    "IFS= read -r sbx_secret || exit 125",
  }
  if req.stdin then
    -- bash's read takes all the PTY has (it cannot seek back on a PTY), so
    -- stdin is sent only once the secret line is read: after this marker.
    parts[#parts + 1] = "printf '__SBX_%s_S__' " .. id
  end
  local inner = { "unset sbx_secret" }
  local setup = {}
  if not req.cwd and req.workdir then
    -- The box's directory, as Docker boxes start there; never fatal.
    setup[#setup + 1] = "{ cd " .. shq(req.workdir) .. " 2>/dev/null || true; }"
  end
  local exports = {}
  for _, kv in ipairs(req.env or {}) do
    local k, v = kv:match("^([%a_][%w_]*)=(.*)$")
    if k then exports[#exports + 1] = k .. "=" .. shq(v) end
  end
  if #exports > 0 then setup[#setup + 1] = "export " .. table.concat(exports, " ") end
  -- The start check (transports/start_check.lua): a missing cwd or program
  -- is exec_failed, not an exit status the command could have chosen.
  for _, l in ipairs(start_check.lines(req, check_id or id, setup)) do inner[#inner + 1] = l end
  local argv = {}
  for i, a in ipairs(req.argv) do argv[i] = shq(a) end
  local cmd = table.concat(argv, " ")
  if req.stdin then
    cmd = "head -c " .. #req.stdin .. " | " .. cmd
  else
    cmd = cmd .. " </dev/null"
  end
  inner[#inner + 1] = cmd
  -- A subshell without the secret: an argv that names a builtin (set, eval)
  -- runs in it and finds nothing; the environment given by the caller cannot
  -- overwrite the secret either.
  -- The wrapper's own stderr goes nowhere while the command runs, so the
  -- shell's job report ("Killed" when a timeout killed the command) is not
  -- mistaken for the command's output; the subshell keeps the PTY (fd 3).
  table.insert(inner, 1, "exec 2>&3 3>&-")
  parts[#parts + 1] = "exec 3>&2 2>/dev/null; ( " .. table.concat(inner, "; ") .. " ); s=$?; exec 2>&3 3>&-"
  -- printf must be the shell's builtin (dash, bash, busybox ash): an empty
  -- PATH makes a shell without one fail here instead of putting the secret
  -- in an external printf's argv.
  parts[#parts + 1] = "PATH=/dev/null printf '__SBX_%s_E%d__' \"$sbx_secret\" \"$s\""
  -- The agent splits the command like a POSIX shell and execs it directly.
  return "/bin/sh -c " .. shq(table.concat(parts, "; "))
end
M.wrapper = wrapper

-- Cuts the markers out of the output: the ready marker and the stdin
-- marker (public id), the exit marker (secret), and the PTY's echo of the
-- secret line where the PTY still echoed (no stty). Holds back only the
-- bytes that could still be the start of one of them. Only a marker with
-- the secret counts, and only the first: nothing after it is output.
-- on_stdin, when given, fires at the stdin marker.
local function marker_filter(id, secret, emit, on_ready, on_stdin)
  local ready_pat = "__SBX_" .. id .. "_R(%d+)__"
  local ready_fixed = "__SBX_" .. id .. "_R"
  local stdin_marker = on_stdin and "__SBX_" .. id .. "_S__"
  local exit_fixed = "__SBX_" .. secret .. "_E"
  local exit_pat = "__SBX_" .. secret .. "_E(%d+)__"
  local echo_line = secret .. "\r\n"
  local buf, state, crlf, held_cr = "", "pre", false, false
  local echo_cut = false
  local fl = {}

  local function out(x)
    if x == "" then return end
    if crlf then
      if held_cr then x = "\r" .. x; held_cr = false end
      if x:sub(-1) == "\r" then x = x:sub(1, -2); held_cr = true end
      x = x:gsub("\r\n", "\n")
    end
    if x ~= "" then emit(x) end
  end

  -- Length of the longest suffix of buf that may begin a marker.
  local function partial(fixed)
    local n = #buf
    for k = math.min(n, #fixed + 12), 1, -1 do
      local suf = buf:sub(n - k + 1)
      if k <= #fixed then
        if fixed:sub(1, k) == suf then return k end
      elseif suf:sub(1, #fixed) == fixed and suf:sub(#fixed + 1):match("^%d*_?$") then
        return k
      end
    end
    return 0
  end

  -- Length of the longest suffix of buf that may begin the echoed line.
  local function partial_echo()
    local n = #buf
    for k = math.min(n, #echo_line - 1), 1, -1 do
      if buf:sub(n - k + 1) == echo_line:sub(1, k) then return k end
    end
    return 0
  end

  function fl.feed(bytes)
    if state == "done" then return end
    buf = buf .. bytes
    if state == "pre" then
      local i, j, st = buf:find(ready_pat)
      if not i then
        local keep = partial(ready_fixed)
        out(buf:sub(1, #buf - keep))
        buf = buf:sub(#buf - keep + 1)
        return
      end
      out(buf:sub(1, i - 1))
      buf = buf:sub(j + 1)
      state = "body"
      crlf = st ~= "0"
      on_ready(crlf)
    end
    if stdin_marker then
      local si, sj = buf:find(stdin_marker, 1, true)
      if si then
        buf = buf:sub(1, si - 1) .. buf:sub(sj + 1)
        stdin_marker = nil
        on_stdin()
      end
    end
    local i, _, code = buf:find(exit_pat)
    if not echo_cut then
      -- The echo comes before the command's output (the wrapper reads the
      -- line first), but a process writing to this PTY could put bytes in
      -- front of it; so it is looked for anywhere before the exit marker.
      local ei, ej = buf:find(secret, 1, true)
      if ei and (not i or ei < i) then
        local after = buf:sub(ej + 1, ej + 2)
        local len = (after == "\r\n" and 2) or (after:sub(1, 1) == "\n" and 1) or nil
        if len then
          buf = buf:sub(1, ei - 1) .. buf:sub(ej + len + 1)
          echo_cut = true
          i, _, code = buf:find(exit_pat)
        end
      end
    end
    if i then
      out(buf:sub(1, i - 1))
      fl.exit_code = tonumber(code)
      buf, state = "", "done"
      return
    end
    local keep = partial(exit_fixed)
    if stdin_marker then keep = math.max(keep, partial(stdin_marker)) end
    if not echo_cut then keep = math.max(keep, partial_echo()) end
    out(buf:sub(1, #buf - keep))
    buf = buf:sub(#buf - keep + 1)
  end

  function fl.flush()
    if state ~= "done" then out(buf) end
    if held_cr then held_cr = false; emit("\r") end
    buf, state = "", "done"
  end
  return fl
end
M.marker_filter = marker_filter

-- ExecuteCommand, retried while the agent is not connected yet.
local function execute(h, command)
  local c, f = h.clients, h.f
  local deadline = core.now() + f.exec_connect_timeout
  local delay = f.exec_connect_backoff.base
  while true do
    local out, err, code = c.ecs:call("ExecuteCommand", {
      cluster = h.cluster, task = h.arn, container = h.container, command = command, interactive = true,
    })
    if out then return out end
    if code ~= "TargetNotConnectedException" or core.now() + delay > deadline then
      return nil, "ExecuteCommand failed: " .. tostring(err), code
    end
    core.sleep(delay)
    delay = math.min(delay * 2, f.exec_connect_backoff.max)
  end
end

-- start(handle, req) -> job | nil, message, code
function M.start(h, req)
  if req.user then
    return nil, "ECS Exec runs every command as root whatever the image's USER (the SSM agent runs as root in the "
      .. "container and starts sessions as itself); a per-command user needs the agent transport on Fargate", "unsupported"
  end
  local id = require("sbx.job").random_id()
  local secret, serr0 = new_secret()
  if not secret then return nil, serr0, "no_random" end
  if not req.cwd and h.f.workdir then
    local r2 = {}
    for k, v in pairs(req) do r2[k] = v end
    r2.workdir = h.f.workdir
    req = r2
  end
  local check_id = require("sbx.job").random_id()
  local out, err, code = execute(h, wrapper(req, id, check_id))
  if not out then return nil, err, code end
  local pol = h.f.ssm
  local sink = core.stream.sink { capture = req.capture, chunks = req.chunks, chunk_limit = req.chunk_limit }
  -- The timeout counts from the ready marker (run_request in box.lua):
  -- start_timeout bounds the wait for it, ready_at is when it came.
  local job = { stream = sink, marker = req.marker, session_id = out.session and out.session.sessionId,
    start_timeout = h.f.command_start_timeout, ready_poll = h.f.ready_poll }
  local s
  local secret_sent = core.event()
  local check = start_check.filter(check_id, function(bytes) sink:push("stdout", bytes) end)
  -- Output before the ready marker (a login banner) is not the command's
  -- stdout start, where the start check's marker is looked for.
  local ready = false
  local filter = marker_filter(id, secret, function(bytes)
    if ready then check.feed(bytes) else sink:push("stdout", bytes) end
  end, function()
    ready = true
    job.ready_at = job.ready_at or core.now()
    -- Echo is off now (where stty exists).
    core.spawn(function()
      s:send(secret .. "\n")
      secret_sent:set()
    end)
  end, req.stdin and function()
    -- Never ahead of the secret line, even when the marker was forged.
    if #req.stdin > 0 then core.spawn(function() secret_sent:wait() s:send(req.stdin) end) end
  end)
  local limit = req.chunk_limit or 1 << 20
  local serr, scode
  s, serr, scode = session_mod.open {
    url = out.session.streamUrl, token = out.session.tokenValue, pol = pol,
    on_output = function(bytes)
      filter.feed(bytes)
      -- The SSM agent ends a session when the last holder of its PTY closes
      -- it, not when the command exits (docs/aws-protocol.md 1.9): a
      -- process left in the background would hold the result. The exit
      -- marker is the end: nothing after it is output.
      if filter.exit_code and not job.ended_at_marker then
        job.ended_at_marker = true
        core.spawn(function() s:close() end)
      end
    end,
    room = req.chunks and function(timeout)
      return sink:wait_room(limit, timeout) ~= "timeout"
    end or nil,
  }
  if not s then return nil, serr, scode end
  job.session = s
  -- a helper past its deadline (sbx.job.run_helper) ends its session
  job.abandon = function() sink:close() s:close() end
  h.sessions[s] = true
  core.spawn(function()
    local r = s:wait()
    h.sessions[s] = nil
    filter.flush()
    check.flush()
    job.exit_code = filter.exit_code
    if check.failed then
      job.exit_code = nil
      sink:finish("exec_failed", start_check.message(check.failed, req, config.policy))
    elseif r.reason == "closed" then
      if r.exit_code and not job.exit_code then job.exit_code = r.exit_code end
      sink:finish()
    elseif r.reason == "cancelled" then
      sink:finish()
    else
      -- The channel is gone but the command may still run: kill it there.
      if r.reason == "disconnected" and not h.destroyed and job.exit_code == nil and not req.is_kill then
        local kok, kerr
        for attempt = 1, h.f.drop_kill_attempts do
          kok, kerr = require("sbx.job").kill_by_exec(M, h, job, "KILL", core.now() + h.f.ssm.connect_timeout)
          if kok or h.destroyed then break end
          if attempt < h.f.drop_kill_attempts then core.sleep(h.f.drop_kill_delay) end
        end
        if kok then r.message = r.message .. "; the command was killed"
        else r.message = r.message .. "; killing the command failed: " .. tostring(kerr) end
      end
      sink:finish(r.code or r.reason, r.message)
    end
  end)
  return job
end


-- finish(handle, job) -> exit_code | nil, message, code
function M.finish(_, job)
  if job.exit_code then return job.exit_code end
  return nil, "the command ended without reporting its exit status (killed, or the shell wrapper could not run)", "no_exit_code"
end

-- clear(handle, deadline) -> true | nil, message, code: ends every process
-- of the task's container but its lifetime process and ECS Exec's own
-- (fargate.exec_agent_paths; the session's shell is the script's ancestor
-- and spared too): a lost agent's box before a fresh agent is placed, a
-- box past its budget. ExecuteCommand runs as root, so every process of
-- the box can be reached. A task cannot restart in place: processes that
-- did not end (a box at its pids limit) are an error.
function M.clear(h, deadline)
  local job_mod = require "sbx.job"
  local req = job_mod.clear_request(h.f.exec_agent_paths)
  req.user = nil
  local exit_code, kjob, code = job_mod.run_helper(M, h, req, deadline or core.now() + h.f.ssm.connect_timeout,
    "ending the box's processes")
  if exit_code == nil then return nil, kjob, code end
  local n = tostring((kjob.stream:captured("stdout"))):match("(%d+)%s*$")
  if exit_code == 0 and n == "0" then return true end
  return nil, string.format("%s of the box's processes did not end (exit %s): %s", tostring(n or "some"),
    tostring(exit_code), (kjob.stream:captured("output"))), "kill_failed"
end

M.execute = execute
M.shq = shq

return M

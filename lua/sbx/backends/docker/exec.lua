-- The Docker backend's per-command functions (the exec transport): an
-- exec per command on an attached stream, its exit code, the OOM check,
-- CPU time and the host-side kill.
local core = require "sbx.core"
local json = core.json
local client = require "sbx.backends.docker.client"
local isolation = require "sbx.backends.docker.isolation"
local call, urlq, pol = client.call, client.urlq, client.pol

local M = {}

local function exec_create(h, req, deadline)
  local body = {
    AttachStdin = req.stdin ~= nil, AttachStdout = true, AttachStderr = true, Tty = false,
    Env = json.array(req.env), Cmd = json.array(req.argv),
  }
  if req.cwd then body.WorkingDir = req.cwd end
  if req.user then body.User = tostring(req.user) end
  local st, r, code = call(h.daemon, "POST", "/containers/" .. h.id .. "/exec", body, { deadline = deadline })
  if not st then
    if code == "conflict" or code == "not_found" then
      return nil, "the box is not running (" .. r .. ")", "box_gone"
    end
    return nil, r, code
  end
  return r.Id
end

local function open_stream(h, exec_id, req)
  local d = h.daemon
  local body = '{"Detach":false,"Tty":false}'
  local request = table.concat {
    "POST /v", d.api, "/exec/", exec_id, "/start HTTP/1.1\r\n",
    "Host: docker\r\n",
    "Content-Type: application/json\r\n",
    "Content-Length: ", #body, "\r\n",
    "Connection: close\r\n\r\n", body,
  }
  return core.stream.open {
    unix_socket = d.unix_socket, host = d.host, port = d.port,
    request = request, stdin = req.stdin,
    capture = req.capture, chunks = req.chunks, chunk_limit = req.chunk_limit,
  }
end

-- start(handle, req) -> job: creates the exec and opens its attached stream.
function M.start(h, req)
  if h.frozen then return nil, h.frozen.message, h.frozen.code end
  if h.disk_limit then isolation.ensure_poller(h.daemon) end
  local id, err, code = exec_create(h, req, req.deadline)
  if not id then return nil, err, code end
  local job = { id = id, marker = req.marker, stream = open_stream(h, id, req), program = req.argv[1] }
  if h.jobs then h.jobs[job] = true end       -- a frozen box fails them
  return job
end

-- ping(handle) -> true | nil, message, code: does the box's daemon answer?
-- ("daemon_unavailable" when its socket refuses.)
function M.ping(h)
  local st, err, code = call(h.daemon, "GET", "/_ping", nil, { timeout = 2 })
  if not st then return nil, err, code end
  return true
end

-- stream_error(handle, info) -> message, code: an exec stream's transport
-- failure. A socket that is gone or refuses means the daemon is not there.
function M.stream_error(h, info)
  if info.error_code == "ECONNREFUSED" then
    return string.format("the Docker daemon at %s is not answering (%s)", h.daemon.endpoint, info.error),
      "daemon_unavailable"
  end
  -- A stream broken under a command: the daemon died, if it no longer answers.
  if info.error_code == "closed" then
    local st, err, code = M.ping(h)
    if not st and code == "daemon_unavailable" then
      return string.format("the Docker daemon at %s went away under the command (%s)", h.daemon.endpoint, err),
        "daemon_unavailable"
    end
  end
  return info.error, info.error_code
end

-- The OOM killer's count in the box's memory cgroup (v2 memory.events, v1
-- memory.oom_control) and the box's memory limit, read inside the box.
local OOM_SCRIPT = [[
for f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
  [ -r "$f" ] && grep '^oom_kill ' "$f" && break
done
cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null
]]

local function oom_state(h)
  local req = { argv = { "sh", "-c", OOM_SCRIPT }, env = {},
    capture = { stdout = { head = 1024, tail = 0 }, stderr = { head = 0, tail = 0 }, output = { head = 0, tail = 0 } } }
  local id = exec_create(h, req)
  if not id then return nil end
  local s = open_stream(h, id, req)
  if s:wait(pol().kill_timeout) ~= "eof" then s:close() return nil end
  local out = s:captured("stdout")
  local n = tonumber(out:match("oom_kill (%d+)"))
  local limit = tonumber(out:match("\n(%d+)\n"))
  if limit and limit >= 2 ^ 62 then limit = nil end   -- cgroup v1's "no limit"
  return n, limit
end

-- Whether a command that ended with SIGKILL's status was ended by the
-- OOM killer: the box's count went up since sbx last looked (the count is
-- per box, so it is read after each such exit; a box restart resets it).
function M.oom_check(h, job)
  local n, limit = oom_state(h)
  if not n then return end
  local seen = h.oom_kills or 0
  if n < seen then seen = 0 end
  h.oom_kills = n
  if n > seen then job.oom_killed, job.memory_limit = true, limit end
end

-- What the daemon said when it could not start a finished exec's process,
-- or nil when the process ran (and its exit code is its own, 126 too).
-- Docker: exit 126 with no process (Pid 0), its reason in the stream.
-- Podman forgets the Pid of every finished exec: its runtime's failure is
-- exit 126 or 127 with the runtime's "Error: ...: OCI ..." on stderr.
local function never_started(h, r, job)
  local said = job.stream:captured("output")
  if said == "" then said = job.stream:captured("stderr") .. job.stream:captured("stdout") end
  said = said:gsub("%s+$", "")
  if not h.daemon.podman then
    if r.ExitCode == 126 and r.Pid == 0 then return said end
  elseif (r.ExitCode == 126 or r.ExitCode == 127) and said:match("^Error: [%w%-]+: ") and said:find(": OCI ", 1, true) then
    return said
  end
end

-- The message of a command the daemon could not start, from its words.
local function refusal(said)
  return "the daemon could not start the command: " .. (said ~= "" and said or "exit 126 without a process")
end

-- A stream that broke under a command whose process never started: the
-- daemon closed it while stdin was still going in (Podman resets the
-- connection before its runtime's words arrive). The daemon's record of
-- the exec decides: the message, or nil when the command did run.
local function start_refused(h, job, deadline)
  local st, r = call(h.daemon, "GET", "/exec/" .. job.id .. "/json", nil, { deadline = deadline, timeout = 5 })
  if not st or r.Running or r.ExitCode == nil or r.ExitCode == json.null then return nil end
  local said = never_started(h, r, job)
  if said then return refusal(said) end
  if h.daemon.podman and (r.ExitCode == 126 or r.ExitCode == 127) and job.stream:captured("output") == "" then
    return string.format("the daemon could not start %s (exit %d, and the connection broke before it said why)",
      tostring(job.program), r.ExitCode)
  end
end

-- finish(handle, job) -> exit code, read once the stream has ended. The
-- daemon forgets finished execs after minutes, so callers keep the value.
-- A command the daemon could not start (it says exit 126 but never had a
-- process) is nil, the daemon's words, "exec_failed"; a command the OOM
-- killer ended gets job.oom_killed and job.memory_limit.
function M.finish(h, job, deadline)
  if job.exit_code then return job.exit_code end
  local info = job.stream:info()
  if info.error_code then
    local msg, code = M.stream_error(h, info)
    if code == "closed" then
      local refused = start_refused(h, job, deadline)
      if refused then return nil, refused, "exec_failed" end
    end
    return nil, msg, code
  end
  if info.status ~= 200 and info.status ~= 101 then
    local j = info.body and json.decode(info.body)
    local msg = type(j) == "table" and j.message or info.body or "no answer"
    return nil, "the daemon refused to start the command: " .. tostring(msg), "exec_failed"
  end
  local poll = pol().exit_poll
  for attempt = 1, poll.attempts do
    if deadline and core.now() >= deadline then break end
    local st, r, code = call(h.daemon, "GET", "/exec/" .. job.id .. "/json", nil, { deadline = deadline })
    if not st then
      if code == "not_found" then return nil, "the box went away while the command ran", "box_gone" end
      return nil, r, code
    end
    -- Podman reports ExitCode 0 while running: trust Running first.
    if not r.Running and r.ExitCode ~= json.null and r.ExitCode ~= nil then
      local refused = never_started(h, r, job)
      if refused then return nil, refusal(refused), "exec_failed" end
      if r.ExitCode == 137 then M.oom_check(h, job) end
      job.exit_code = r.ExitCode
      return r.ExitCode
    end
    core.sleep(attempt < poll.fast and poll.fast_interval or poll.interval)
  end
  return nil, "the daemon did not report an exit code", "no_exit_code"
end

-- cpu_seconds(handle, deadline) -> seconds | nil: the CPU time of every
-- process the box ever ran (its cgroup's, as the daemon's stats report it;
-- a restart starts it again at 0, so the highest seen is kept).
function M.cpu_seconds(h, deadline)
  local st, stats = call(h.daemon, "GET", "/containers/" .. h.id .. "/stats?stream=false&one-shot=true", nil,
    { deadline = deadline })
  local ns = st and type(stats) == "table" and type(stats.cpu_stats) == "table"
    and type(stats.cpu_stats.cpu_usage) == "table" and tonumber(stats.cpu_stats.cpu_usage.total_usage)
  if not ns then return nil end
  h.cpu_base = h.cpu_base or 0
  if h.cpu_last and ns / 1e9 < h.cpu_last - h.cpu_base then h.cpu_base = h.cpu_last end
  h.cpu_last = h.cpu_base + ns / 1e9
  return h.cpu_last
end
-- host_kill(handle, job, deadline) -> count | nil, message, code. The
-- targeted kill for a box that cannot fork the in-box kill (its pids limit
-- is full: a fork bomb): the daemon lists the box's processes by host pid
-- (GET /containers/{id}/top runs ps on the daemon's host, not in the box),
-- and sbx, on that same host, stops every process of the job (its marker
-- in the environment, or a parent in the job), looks again until no new one
-- appears, then kills them all. Other processes in the box live on. Only
-- where the daemon listens on a local socket and sbx may read and signal
-- its processes (root, or the rootless daemon's user); else "unsupported".
function M.host_kill(h, job, deadline)
  local d = h.daemon
  if not d.unix_socket then return nil, "the daemon is not on this host", "unsupported" end
  local marker = "SBX_JOB=" .. job.marker
  local members, list, readable = {}, {}, false
  for _ = 1, 8 do
    local st, top, code = call(d, "GET", "/containers/" .. h.id .. "/top?ps_args=" .. urlq("-eo pid,ppid"), nil,
      { deadline = deadline })
    if not st then return nil, top, code end
    local rows = {}
    for _, row in ipairs(top.Processes or {}) do
      rows[#rows + 1] = { pid = math.tointeger(tonumber(row[1])), ppid = math.tointeger(tonumber(row[2])) }
    end
    local grew = true
    local new = 0
    while grew do
      grew = false
      for _, r in ipairs(rows) do
        if r.pid and r.pid > 1 and not members[r.pid] then
          local hit = members[r.ppid] ~= nil
          if not hit then
            local f = io.open("/proc/" .. r.pid .. "/environ", "rb")
            if f then
              readable = true
              hit = (f:read("a") or ""):find(marker, 1, true) ~= nil
              f:close()
            end
          end
          if hit then
            members[r.pid] = true
            list[#list + 1] = r.pid
            core.proc.signal(r.pid, "STOP")
            grew, new = true, new + 1
          end
        end
      end
    end
    if not readable then return nil, "cannot read the box's processes from this host", "unsupported" end
    if new == 0 then break end
  end
  local n = 0
  for _, pid in ipairs(list) do
    if core.proc.signal(pid, "KILL") then n = n + 1 end
  end
  for _, pid in ipairs(list) do core.proc.signal(pid, "CONT") end
  return n
end
M.exec_create, M.open_stream = exec_create, open_stream

return M

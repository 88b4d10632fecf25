-- The Docker backend: box lifecycle and command transport over the Engine
-- API (libcurl for requests, a raw hijacked socket for exec streams).
-- Works against Docker and Podman's Docker-compatible service; see
-- docs/docker-api.md for the measured behaviour this follows.
local core = require "sbx.core"
local json, http = core.json, require "sbx.http"

local M = {}
local CLIENT_API = "1.47"   -- the newest API this code is written against

-- Box options only this backend takes (sbx.policy_check rules).
function M.options(check)
  -- Raw HostConfig fields merged over what sbx sets: trusted code only
  -- (a task file may never set it).
  return { host_config = check.map(check.ANY) }
end

local function pol() return require("sbx").policy.docker end

local daemons = {}          -- endpoint string -> daemon (one ping per process)

local function version_less(a, b)
  local a1, a2 = a:match("^(%d+)%.(%d+)")
  local b1, b2 = b:match("^(%d+)%.(%d+)")
  a1, a2, b1, b2 = tonumber(a1), tonumber(a2), tonumber(b1), tonumber(b2)
  return a1 < b1 or (a1 == b1 and a2 < b2)
end

local function home() return os.getenv("HOME") or "/root" end

-- Where a daemon may listen, in the order the docker CLI's users expect.
function M.candidates(explicit)
  if explicit then return { explicit } end
  local env = os.getenv("DOCKER_HOST")
  if env and env ~= "" then return { env } end
  local list = {
    home() .. "/.colima/default/docker.sock",
    home() .. "/.colima/docker.sock",
    "/var/run/docker.sock",
    home() .. "/.docker/run/docker.sock",
    home() .. "/.local/share/containers/podman/machine/podman.sock",
  }
  local xdg = os.getenv("XDG_RUNTIME_DIR")
  if xdg then
    list[#list + 1] = xdg .. "/docker.sock"
    list[#list + 1] = xdg .. "/podman/podman.sock"
  end
  list[#list + 1] = "/run/podman/podman.sock"
  for i, p in ipairs(list) do list[i] = "unix://" .. p end
  return list
end

local function parse_endpoint(ep)
  local path = ep:match("^unix://(.+)$")
  if path then return { unix_socket = path, base = "http://localhost" } end
  local host, port = ep:match("^tcp://%[?([^%]/]+)%]?:(%d+)/?$")
  if not host then host = ep:match("^tcp://([^:/]+)/?$"); port = host and "2375" end
  if host then return { host = host, port = tonumber(port), base = "http://" .. host .. ":" .. port } end
  return nil
end

local function exists(path)
  return core.path_type(path) ~= nil
end

-- Finds the daemon: explicit option, DOCKER_HOST, then the usual sockets.
-- Returns daemon | nil, message, "daemon_unavailable".
function M.connect(explicit)
  local cands = M.candidates(explicit)
  local tried = {}
  for _, ep in ipairs(cands) do
    if daemons[ep] then return daemons[ep] end
    local d = parse_endpoint(ep)
    if not d then
      tried[#tried + 1] = ep .. " (not a unix:// or tcp:// address)"
    elseif d.unix_socket and #cands > 1 and not exists(d.unix_socket) then
      tried[#tried + 1] = ep .. " (no such socket)"
    else
      local r, err = http.request { url = d.base .. "/_ping", unix_socket = d.unix_socket,
        timeout = pol().ping_timeout, connect_timeout = pol().ping_connect_timeout }
      if r and r.status == 200 then
        local server = r.headers["api-version"] or "1.24"
        d.endpoint = ep
        d.api = version_less(server, CLIENT_API) and server or CLIENT_API
        d.podman = r.headers["libpod-api-version"] ~= nil
        d.prefix = d.base .. "/v" .. d.api
        d.images = {}
        daemons[ep] = d
        return d
      end
      tried[#tried + 1] = string.format("%s (%s)", ep, r and ("HTTP " .. r.status) or err)
    end
  end
  return nil, "no Docker daemon answered; tried: " .. table.concat(tried, "; ") ..
    ". Start dockerd (scripts/setup.sh does) or set DOCKER_HOST.", "daemon_unavailable"
end

local codes = { [400] = "bad_request", [404] = "not_found", [409] = "conflict", [500] = "daemon_error" }

-- One API call. Returns status, decoded body | nil, message, code.
local function call(d, method, path, body, opts)
  opts = opts or {}
  local r, err, code = http.request {
    url = d.prefix .. path, method = method, unix_socket = d.unix_socket,
    headers = body and { ["Content-Type"] = "application/json" } or nil,
    body = body and json.encode(body) or nil,
    timeout = opts.timeout or pol().api_timeout, detached = opts.detached,
  }
  if opts.detached then return r end
  if not r then
    return nil, string.format("Docker daemon at %s: %s", d.endpoint, err), code == "ECONNREFUSED" and "daemon_unavailable" or code
  end
  local decoded = r.body ~= "" and json.decode(r.body) or nil
  if r.status >= 300 and not (opts.ok and opts.ok[r.status]) then
    local msg = type(decoded) == "table" and decoded.message or r.body
    return nil, tostring(msg):gsub("%s+$", ""), codes[r.status] or ("http_" .. r.status)
  end
  return r.status, decoded, r
end
M.call = call

local function urlq(s) return http.escape(s) end

-- Images ------------------------------------------------------------------

local function ensure_image(d, image, pull)
  if d.images[image] and pull ~= "always" then return true end
  if pull ~= "always" then
    local st, _, code = call(d, "GET", "/images/" .. urlq(image) .. "/json")
    if st then d.images[image] = true return true end
    if code ~= "not_found" then return nil, _, code end
    if pull == "never" then
      return nil, string.format("image '%s' is not on the daemon and policy says pull = \"never\"", image), "image_unavailable"
    end
  end
  local name, tag = image:match("^(.-):([%w][%w_.%-]*)$")
  if not name then name, tag = image, "latest" end
  local r, err = http.request {
    url = d.prefix .. "/images/create?fromImage=" .. urlq(name) .. "&tag=" .. urlq(tag),
    method = "POST", unix_socket = d.unix_socket, timeout = pol().pull_timeout, body = "",
  }
  local failure
  if not r then failure = err
  elseif r.status >= 300 then
    local j = json.decode(r.body)
    failure = type(j) == "table" and j.message or r.body
  else
    -- A started pull reports later failures as a line with "error".
    for line in r.body:gmatch("[^\r\n]+") do
      local j = json.decode(line)
      if type(j) == "table" and j.error then failure = j.error end
    end
  end
  if failure then
    return nil, string.format("image '%s' is not available locally and could not be pulled: %s", image, tostring(failure):gsub("%s+$", "")), "image_unavailable"
  end
  d.images[image] = true
  return true
end

-- Owner identity for labels and the reaper ---------------------------------------

local owner = require "sbx.owner"
M.proc_start = owner.proc_start

-- Lifecycle -------------------------------------------------------------------

local function to_list(t)
  local l = {}
  for i, v in ipairs(t or {}) do l[i] = v end
  return json.array(l)
end

local function env_pairs(t)
  local l = {}
  for k, v in pairs(t or {}) do l[#l + 1] = k .. "=" .. tostring(v) end
  table.sort(l)
  return json.array(l)
end

local function create_body(spec, pol, d)
  local labels = owner.labels(spec.lifetime, spec.labels)
  local host = {
    Init = spec.init and true or false,
    NetworkMode = spec.network,
    SecurityOpt = json.array(spec.no_new_privileges and { "no-new-privileges" } or {}),
    CapDrop = to_list(spec.cap_drop),
    CapAdd = to_list(spec.cap_add),
    ReadonlyRootfs = spec.read_only and true or false,
  }
  if spec.memory then host.Memory = math.floor(spec.memory); host.MemorySwap = math.floor(spec.memory) end
  if spec.cpus then host.NanoCpus = math.floor(spec.cpus * 1e9) end
  if spec.pids then host.PidsLimit = math.floor(spec.pids) end
  if spec.tmpfs and next(spec.tmpfs) then host.Tmpfs = spec.tmpfs end
  -- Podman asks runc for nofile/nproc limits above what its service may
  -- grant once capabilities are dropped; it needs explicit ones.
  local ulimits = spec.ulimits or (d.podman and spec.podman_ulimits)
  if ulimits then
    local l = {}
    for name, v in pairs(ulimits) do
      l[#l + 1] = { Name = name, Soft = math.floor(v), Hard = math.floor(v) }
    end
    table.sort(l, function(a, b) return a.Name < b.Name end)
    host.Ulimits = json.array(l)
  end
  if spec.host_config then for k, v in pairs(spec.host_config) do host[k] = v end end
  return {
    Image = spec.image,
    -- The box's own lifetime cap: an orphan stops by itself.
    Entrypoint = json.array { "sleep" },
    Cmd = json.array { tostring(math.floor(spec.lifetime)) },
    WorkingDir = spec.workdir,
    Env = env_pairs(spec.env),
    Labels = labels,
    Tty = false,
    OpenStdin = false,
    StopSignal = "SIGKILL",
    HostConfig = host,
  }
end

local reaped_once = false

-- create(spec, policy) -> handle | nil, message, code
function M.create(spec, pol)
  local d, err, code = M.connect(spec.docker_host)
  if not d then return nil, err, code end
  if spec.reap_on_start and not reaped_once then
    reaped_once = true
    core.spawn(function() pcall(M.reap, { quiet = true }, pol) end)
  end
  local ok, ierr, icode = ensure_image(d, spec.image, spec.pull)
  if not ok then return nil, ierr, icode end
  local name = spec.name or (spec.name_prefix .. string.format("%016x", math.random(0)):sub(1, 12))
  local function remove(racing)
    -- After an aborted create the daemon may still be making the container:
    -- a 404 then means "not yet", so look again for a moment.
    for _ = 1, racing and pol().remove_retries or 1 do
      local st = call(d, "DELETE", "/containers/" .. urlq(name) .. "?force=true&v=true", nil, { ok = { [404] = true, [409] = true } })
      if st ~= 404 then return end
      core.sleep(pol().remove_interval)
    end
  end
  -- The name is known before the daemon answers: whatever stops us half way
  -- (an interrupt, a cancel) removes what may already exist, then goes on.
  local ok, st, body, ccode, sst, serr, scode = pcall(function()
    local st_, body_, ccode_ = call(d, "POST", "/containers/create?name=" .. urlq(name), create_body(spec, pol, d))
    if not st_ then return st_, body_, ccode_ end
    return st_, body_, ccode_, call(d, "POST", "/containers/" .. body_.Id .. "/start", nil, { ok = { [304] = true } })
  end)
  if not ok then
    pcall(remove, true)
    error(st, 0)
  end
  if not st then return nil, "cannot create the box: " .. body, ccode end
  if not sst then
    remove()
    return nil, "cannot start the box: " .. serr, scode
  end
  return { id = body.Id, name = name, daemon = d }
end

-- destroy(handle, detached): force-removes the container (kill + delete in
-- one call). detached: fire and forget, for finalizers.
function M.destroy(h, detached)
  if h.destroyed then return true end
  h.destroyed = true
  local st, err, code = call(h.daemon, "DELETE", "/containers/" .. h.id .. "?force=true&v=true", nil,
    { ok = { [404] = true, [409] = true }, detached = detached })
  if detached then return true end
  if not st then return nil, err, code end
  return true
end

function M.restart(h)
  local st, err, code = call(h.daemon, "POST", "/containers/" .. h.id .. "/restart?t=0")
  if not st then return nil, err, code end
  return true
end

-- Transport ---------------------------------------------------------------------

local function exec_create(h, req)
  local body = {
    AttachStdin = req.stdin ~= nil, AttachStdout = true, AttachStderr = true, Tty = false,
    Env = json.array(req.env), Cmd = json.array(req.argv),
  }
  if req.cwd then body.WorkingDir = req.cwd end
  if req.user then body.User = tostring(req.user) end
  local st, r, code = call(h.daemon, "POST", "/containers/" .. h.id .. "/exec", body)
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
  local id, err, code = exec_create(h, req)
  if not id then return nil, err, code end
  return { id = id, marker = req.marker, stream = open_stream(h, id, req) }
end

-- stream_error(handle, info) -> message, code: an exec stream's transport
-- failure. A socket that is gone or refuses means the daemon is not there.
function M.stream_error(h, info)
  if info.error_code == "ECONNREFUSED" then
    return string.format("the Docker daemon at %s is not answering (%s)", h.daemon.endpoint, info.error),
      "daemon_unavailable"
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
local function oom_check(h, job)
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

-- finish(handle, job) -> exit code, read once the stream has ended. The
-- daemon forgets finished execs after minutes, so callers keep the value.
-- A command the daemon could not start (it says exit 126 but never had a
-- process) is nil, the daemon's words, "exec_failed"; a command the OOM
-- killer ended gets job.oom_killed and job.memory_limit.
function M.finish(h, job)
  if job.exit_code then return job.exit_code end
  local info = job.stream:info()
  if info.error_code then return nil, M.stream_error(h, info) end
  if info.status ~= 200 and info.status ~= 101 then
    local j = info.body and json.decode(info.body)
    local msg = type(j) == "table" and j.message or info.body or "no answer"
    return nil, "the daemon refused to start the command: " .. tostring(msg), "exec_failed"
  end
  local poll = pol().exit_poll
  for attempt = 1, poll.attempts do
    local st, r, code = call(h.daemon, "GET", "/exec/" .. job.id .. "/json")
    if not st then
      if code == "not_found" then return nil, "the box went away while the command ran", "box_gone" end
      return nil, r, code
    end
    -- Podman reports ExitCode 0 while running: trust Running first.
    if not r.Running and r.ExitCode ~= json.null and r.ExitCode ~= nil then
      local refused = never_started(h, r, job)
      if refused then
        return nil, "the daemon could not start the command: " .. (refused ~= "" and refused or "exit 126 without a process"),
          "exec_failed"
      end
      if r.ExitCode == 137 then oom_check(h, job) end
      job.exit_code = r.ExitCode
      return r.ExitCode
    end
    core.sleep(attempt < poll.fast and poll.fast_interval or poll.interval)
  end
  return nil, "the daemon did not report an exit code", "no_exit_code"
end

-- kill(handle, job, signal) -> true | nil, message, code
function M.kill(h, job, signal)
  local req = require("sbx.box").kill_request(signal, job.marker)
  local id, err, code = exec_create(h, req)
  if not id then return nil, err, code end
  local s = open_stream(h, id, req)
  if s:wait(pol().kill_timeout) ~= "eof" then s:close() return nil, "the kill command did not finish", "timeout" end
  local exit_code, ferr, fcode = M.finish(h, { id = id, stream = s })
  if exit_code ~= 0 then
    local msg = s:captured("stderr")
    if exit_code == nil then return nil, ferr, fcode end
    return nil, string.format("the kill command failed (exit %d): %s", exit_code, msg), "kill_failed"
  end
  return true
end

-- Reaper ----------------------------------------------------------------------------

-- reap(opts) -> { removed = {...}, kept = n }: removes boxes whose owner
-- process is gone (same host: pid and start time no longer match) or whose
-- deadline has passed (any host). opts.all removes every sbx box; opts.dry_run
-- only reports what would go.
function M.reap(opts)
  opts = opts or {}
  local d, err, code = M.connect(opts.docker_host)
  if not d then return nil, err, code end
  local filters = json.encode { label = json.array { "sbx.owner.pid" } }
  local st, list, lcode = call(d, "GET", "/containers/json?all=true&filters=" .. urlq(filters))
  if not st then return nil, list, lcode end
  local now = os.time()
  local report = { removed = {}, kept = 0 }
  local tasks = {}
  for _, c in ipairs(list) do
    local l = c.Labels or {}
    local dead = owner.reap_reason(l, opts, now)
    if dead then
      local name = (c.Names and c.Names[1] or c.Id):gsub("^/", "")
      report.removed[#report.removed + 1] = { id = c.Id, name = name, reason = dead }
      if not opts.dry_run then
        tasks[#tasks + 1] = core.spawn(call, d, "DELETE", "/containers/" .. c.Id .. "?force=true&v=true", nil,
          { ok = { [404] = true, [409] = true } })
      end
    else
      report.kept = report.kept + 1
    end
  end
  for _, t in ipairs(tasks) do t:join() end
  return report
end

return M

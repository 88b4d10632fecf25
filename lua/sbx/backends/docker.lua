-- The Docker backend: box lifecycle and command transport over the Engine
-- API (libcurl for requests, a raw hijacked socket for exec streams).
-- Works against Docker and Podman's Docker-compatible service; see
-- docs/docker-api.md for the measured behaviour this follows.
local core = require "sbx.core"
local json, http = core.json, require "sbx.http"

local M = {}
-- Exec create takes its argv, env, cwd and user in JSON: UTF-8 text only.
M.text_argv = "Docker's exec API is JSON"
local CLIENT_API = "1.47"   -- the newest API this code is written against

-- Box options only this backend takes (sbx.policy_check rules).
function M.options(check)
  -- Raw HostConfig fields merged over what sbx sets: trusted code only
  -- (a task file may never set it).
  return { host_config = check.map(check.ANY) }
end

local function pol() return require("sbx.config").policy.docker end

local daemons = {}          -- endpoint string -> daemon (one ping per process)
local disk_quota, disk_entry, ensure_poller, watch, unwatch   -- the disk section, below
local agent_mount           -- the agent's channel section, below

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
function M.connect(explicit, deadline)
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
        timeout = M.seconds_left(deadline, pol().ping_timeout),
        connect_timeout = M.seconds_left(deadline, pol().ping_connect_timeout) }
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

-- Seconds a call may take: cap, or less when a deadline (an absolute
-- core.now() time) comes first. Never zero: libcurl reads 0 as "no limit".
function M.seconds_left(deadline, cap)
  if not deadline then return cap end
  return math.max(0.001, math.min(cap, deadline - core.now()))
end

-- One API call. Returns status, decoded body | nil, message, code.
-- opts.deadline bounds it (a frozen daemon answers nothing: the call then
-- fails with "daemon_unresponsive"); opts.timeout caps it (api_timeout).
local function call(d, method, path, body, opts)
  opts = opts or {}
  local limit = M.seconds_left(opts.deadline, opts.timeout or pol().api_timeout)
  local r, err, code = http.request {
    url = d.prefix .. path, method = method, unix_socket = d.unix_socket,
    headers = body and { ["Content-Type"] = "application/json" } or nil,
    body = body and json.encode(body) or nil,
    timeout = limit, detached = opts.detached,
  }
  if opts.detached then return r end
  if not r then
    if code == "timeout" then
      return nil, string.format("the Docker daemon at %s did not answer %s %s within %.1f s",
        d.endpoint, method, path:match("^[^?]*"), limit), "daemon_unresponsive"
    end
    -- A GET whose connection broke before any answer (a daemon dying
    -- under it, a cut proxy connection) is asked once more: a daemon that
    -- is gone then refuses.
    if code == "closed" and method == "GET" and not opts.retried then
      local again = {}
      for k, v in pairs(opts) do again[k] = v end
      again.retried = true
      return call(d, method, path, body, again)
    end
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

-- What sbx keeps of an image: its architecture (for the agent) and its
-- default user (the agent runs commands as that user).
local function image_facts(inspect)
  local cfg = type(inspect) == "table" and type(inspect.Config) == "table" and inspect.Config or {}
  return {
    arch = type(inspect) == "table" and inspect.Architecture or nil,
    user = type(cfg.User) == "string" and cfg.User ~= "" and cfg.User or nil,
  }
end

local function ensure_image(d, image, pull, deadline)
  if d.images[image] and pull ~= "always" then return true end
  if pull ~= "always" then
    local st, body, code = call(d, "GET", "/images/" .. urlq(image) .. "/json", nil, { deadline = deadline })
    if st then d.images[image] = image_facts(body) return true end
    local _ = body
    if code ~= "not_found" then return nil, body, code end
    if pull == "never" then
      return nil, string.format("image '%s' is not on the daemon and policy says pull = \"never\"", image), "image_unavailable"
    end
  end
  local name, tag = image:match("^(.-):([%w][%w_.%-]*)$")
  if not name then name, tag = image, "latest" end
  local timeout = M.seconds_left(deadline, pol().pull_timeout)
  local r, err = http.request {
    url = d.prefix .. "/images/create?fromImage=" .. urlq(name) .. "&tag=" .. urlq(tag),
    method = "POST", unix_socket = d.unix_socket, timeout = timeout, body = "", stream = true,
  }
  local failure
  if not r then failure = err
  else
    -- The daemon streams one JSON object a line: per layer, "Downloading"
    -- with progressDetail { current, total } (sbx.progress shows their
    -- sum); a started pull reports later failures as a line with "error".
    local body <close> = r.body_stream
    local meter = r.status < 300 and require("sbx.progress").start("pulling " .. image .. " (Docker daemon)")
    local got, sizes, buf, all = {}, {}, "", {}
    local function show()
      local sum, total = 0, 0
      for id, v in pairs(got) do sum, total = sum + v, total + (sizes[id] or v) end
      meter:set(sum, total)
    end
    local function line_of(l)
      local j = json.decode(l)
      if type(j) ~= "table" then return end
      if j.error then failure = j.error end
      local pd = type(j.progressDetail) == "table" and j.progressDetail or {}
      if j.status == "Downloading" and j.id and math.type(pd.current) then
        got[j.id], sizes[j.id] = pd.current, math.type(pd.total) and pd.total or sizes[j.id]
        show()
      elseif j.status == "Download complete" and j.id and sizes[j.id] then
        -- The last "Downloading" line may fall short of the layer's size.
        got[j.id] = sizes[j.id]
        show()
      end
    end
    while true do
      local chunk, rerr = body:read(timeout)
      if not chunk then
        if rerr ~= "eof" then failure = failure or rerr end
        break
      end
      if meter then
        buf = buf .. chunk
        for l in buf:gmatch("([^\r\n]*)\r?\n") do line_of(l) end
        buf = buf:match("[^\n]*$")
      else
        all[#all + 1] = chunk
      end
    end
    if meter then
      if buf ~= "" then line_of(buf) end
      if not failure then meter:finish() end
    else
      local text = table.concat(all)
      local j = json.decode(text)
      failure = type(j) == "table" and j.message or text
    end
  end
  if failure then
    return nil, string.format("image '%s' is not available locally and could not be pulled: %s", image, tostring(failure):gsub("%s+$", "")), "image_unavailable"
  end
  local st, body = call(d, "GET", "/images/" .. urlq(image) .. "/json", nil, { deadline = deadline })
  d.images[image] = image_facts(st and body)
  return true
end

-- Owner identity for labels and the reaper ---------------------------------------

local owner = require "sbx.owner"
M.proc_start = owner.proc_start

-- Isolation --------------------------------------------------------------------

-- How the daemon holds each isolation option (sbx.limits). Everything but
-- disk is a container setting the daemon applies at create.
local DAEMON_NOTES = {
  memory = "cgroup memory limit, no swap (Memory = MemorySwap)",
  cpus = "CFS quota (NanoCpus)",
  pids = "cgroup pids limit (PidsLimit)",
  network = "NetworkMode",
  read_only = "read-only root filesystem (ReadonlyRootfs)",
  cap_drop = "CapDrop", cap_add = "CapAdd",
  no_new_privileges = "SecurityOpt no-new-privileges",
  init = "docker-init as PID 1 (Init)",
  ulimits = "Ulimits",
  tmpfs = "Tmpfs mounts (their contents count against memory)",
}
-- The HostConfig fields behind each option: a host_config box option that
-- sets one of them replaces what sbx set, and the note says so.
local HOST_FIELDS = {
  memory = { "Memory", "MemorySwap" }, cpus = { "NanoCpus", "CpuQuota", "CpuPeriod" },
  pids = { "PidsLimit" }, disk = { "StorageOpt" }, network = { "NetworkMode" },
  read_only = { "ReadonlyRootfs" }, cap_drop = { "CapDrop", "Privileged" },
  cap_add = { "CapAdd", "Privileged" }, no_new_privileges = { "SecurityOpt", "Privileged" },
  init = { "Init" }, ulimits = { "Ulimits" }, tmpfs = { "Tmpfs" },
}

-- disk_quota_of(info) -> supported, why: whether the daemon's storage
-- driver (GET /info: Driver, DriverStatus "Backing Filesystem") can cap a
-- container's writable layer with HostConfig.StorageOpt.size. overlay2
-- (Podman: overlay) does it on xfs mounted with pquota only, which /info
-- does not show: a refusal at create then turns the daemon to watching.
-- devicemapper's size grows a thin device and cannot go below its base size,
-- so it is not used.
function M.disk_quota_of(info)
  if type(info) ~= "table" then return false, "the daemon's /info did not answer" end
  local driver, backing = tostring(info.Driver), nil
  for _, kv in ipairs(type(info.DriverStatus) == "table" and info.DriverStatus or {}) do
    if type(kv) == "table" and kv[1] == "Backing Filesystem" then backing = kv[2] end
  end
  if driver == "overlay2" or driver == "overlay" then
    if backing == "xfs" then return true, driver .. " on xfs: a project quota (StorageOpt size)" end
    return false, string.format("%s on %s has no size quota", driver, tostring(backing or "an unknown filesystem"))
  elseif driver == "btrfs" then
    return true, "btrfs: a qgroup limit on the box's subvolume (StorageOpt size)"
  elseif driver == "zfs" then
    return true, "zfs: a quota on the box's dataset (StorageOpt size)"
  end
  return false, string.format("the %s storage driver has no size quota sbx uses", driver)
end

-- Did the daemon refuse a create because of StorageOpt? (overlay2 without
-- pquota: "--storage-opt is supported only for overlay over xfs with
-- 'pquota' mount option".)
function M.quota_refused(message)
  local m = tostring(message):lower()
  return m:find("storage%-opt") ~= nil or m:find("storage opt") ~= nil or m:find("quota") ~= nil
end

-- The daemon's answer, once per daemon: d.disk_quota, d.disk_note.
function disk_quota(d)
  if d.disk_quota == nil then
    local st, info = call(d, "GET", "/info")
    d.disk_quota, d.disk_note = M.disk_quota_of(st and info)
  end
  return d.disk_quota
end

function disk_entry(d)
  if d.disk_quota then return { enforced = "daemon", note = d.disk_note } end
  return { enforced = "watched", note = string.format("%s: sbx measures the writable layer every %gs " ..
    "(policy.docker.disk_poll) and freezes the box past the limit; a fast writer gets further before that",
    d.disk_note, pol().disk_poll) }
end

-- limits(spec, pol): what this daemon enforces for spec (sbx.limits).
function M.limits(spec)
  local out = {}
  for name, note in pairs(DAEMON_NOTES) do out[name] = { enforced = "daemon", note = note } end
  if spec.disk then
    local d = M.connect(spec.docker_host)
    if d then disk_quota(d) end
    out.disk = d and disk_entry(d) or { enforced = "watched", note = "the daemon did not answer" }
  end
  for name, fields in pairs(HOST_FIELDS) do
    for _, f in ipairs(fields) do
      if type(spec.host_config) == "table" and spec.host_config[f] ~= nil and out[name] then
        out[name].note = out[name].note .. "; host_config." .. f .. " replaces what sbx set"
      end
    end
  end
  return out
end

-- The disk watcher --------------------------------------------------------------
-- One poller per daemon for all its boxes with a disk limit and no quota:
-- GET /containers/json?size=true for their ids, one call per 100 boxes.
-- (Measured on dockerd 20.10: 0.4 ms for one small box, 8 ms for 48, 0.5 s
-- for 30 boxes of 4400 files each, about 4 us per file: the daemon walks
-- each writable layer, so polls back off to policy.docker.disk_poll_load.) Past
-- its limit a box is frozen (POST /pause), its running commands end with
-- "disk_exceeded", and start() refuses every later one.

local watchers = {}         -- endpoint -> { boxes = id -> handle, task = poller }

local function freeze(h, used)
  if h.frozen or h.destroyed then return end
  local live = h.policy and h.policy() or require("sbx.config").policy   -- the box's own (overlay included)
  local msg = live.format_disk_exceeded(used, h.disk_limit, live)
  h.frozen = { message = msg, code = "disk_exceeded", used = used }
  unwatch(h)
  call(h.daemon, "POST", "/containers/" .. h.id .. "/pause", nil, { ok = { [409] = true } })
  for job in pairs(h.jobs) do job.stream:close("disk_exceeded", msg) end
end

local function poll_disk(d, w)
  local last = 0
  while next(w.boxes) do
    core.sleep(math.max(pol().disk_poll, last / pol().disk_poll_load - last))
    local ids = {}
    for id in pairs(w.boxes) do ids[#ids + 1] = id end
    local t0 = core.now()
    for i = 1, #ids, 100 do
      local filters = json.encode { id = json.array(table.move(ids, i, math.min(i + 99, #ids), 1, {})) }
      local st, list = call(d, "GET", "/containers/json?all=true&size=true&filters=" .. urlq(filters))
      for _, c in ipairs(st and list or {}) do
        local h, used = w.boxes[c.Id], tonumber(c.SizeRw)
        if h and used and used > h.disk_limit then freeze(h, used) end
      end
    end
    last = core.now() - t0
  end
end

-- Starts the daemon's poller when it has boxes to watch and none runs (the
-- first watched box, or after an interrupt ended the last one). The poller
-- does not hold `sbx run` open: boxes left open are removed after the drain.
function ensure_poller(d)
  local w = watchers[d.endpoint]
  if not w or w.task or not next(w.boxes) then return end
  w.task = core.spawn(function()
    pcall(poll_disk, d, w)
    w.task = nil
  end)
  w.task:unref()
end

function watch(h, limit)
  h.disk_limit = limit
  local w = watchers[h.daemon.endpoint]
  if not w then w = { boxes = {} }; watchers[h.daemon.endpoint] = w end
  w.boxes[h.id] = h
  ensure_poller(h.daemon)
end

function unwatch(h)
  local w = h.daemon and watchers[h.daemon.endpoint]
  if w then w.boxes[h.id] = nil end
end

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

local function create_body(spec, pol, d, bind)
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
  if spec.disk and d.disk_quota then host.StorageOpt = { size = string.format("%d", math.floor(spec.disk)) } end
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
  if bind then
    host.Mounts = json.array { { Type = "bind", Source = bind.source, Target = bind.target, ReadOnly = true } }
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

-- Containers to remove once their daemon answers again: a create or a
-- destroy that ran into a frozen daemon may leave one behind, or the daemon
-- may still make it after our request gave up. One sweeper task per daemon
-- deletes them by name or id; a container counts as gone after the daemon
-- answered 404 for it `confirmations` times in a row, `interval` apart (a
-- late create would have shown up). The sweeper stops destroy_timeout
-- seconds after the script ended (sbx.drain), leaving the rest to `sbx reap`
-- (every box carries its owner's labels).
local sweeps = {}          -- endpoint -> { refs = { name_or_id -> 404s seen }, running = bool }

local function sweep(d, ref)
  local sw = sweeps[d.endpoint]
  if not sw then sw = { refs = {} }; sweeps[d.endpoint] = sw end
  sw.refs[ref] = sw.refs[ref] or 0
  if sw.running then return end
  sw.running = true
  core.spawn(function()
    local config = require "sbx.config"
    local p = pol().orphan_sweep
    while next(sw.refs) do
      local ended = config.draining_since
      local deadline = core.now() + p.call_timeout
      if ended then
        local stop = ended + config.policy.box.destroy_timeout
        if core.now() >= stop then break end
        deadline = math.min(deadline, stop)
      end
      local tasks = {}
      for r in pairs(sw.refs) do
        tasks[#tasks + 1] = core.spawn(function()
          local st = call(d, "DELETE", "/containers/" .. urlq(r) .. "?force=true&v=true", nil,
            { ok = { [404] = true, [409] = true }, deadline = deadline })
          if st == 404 then
            sw.refs[r] = sw.refs[r] + 1
            if sw.refs[r] >= p.confirmations then sw.refs[r] = nil end
          elseif st then
            sw.refs[r] = 0
          end
        end)
      end
      for _, t in ipairs(tasks) do t:join() end
      if next(sw.refs) then core.sleep(p.interval) end
    end
    sw.running = false
  end)
end
M.pending_removals = function(endpoint)
  local sw = sweeps[endpoint]
  local list = {}
  for r in pairs(sw and sw.refs or {}) do list[#list + 1] = r end
  return list
end

-- create(spec, policy) -> handle | nil, message, code. Bounded by
-- spec.create_timeout (the daemon's answers, the pull included): past it the
-- call fails with "daemon_unresponsive" and whatever the daemon may still
-- make is swept away once it answers.
function M.create(spec, pol_)
  local deadline = core.now() + spec.create_timeout
  local d, err, code = M.connect(spec.docker_host, deadline)
  if not d then return nil, err, code end
  if spec.reap_on_start and not reaped_once then
    reaped_once = true
    core.spawn(function() pcall(M.reap, { quiet = true, deadline = core.now() + pol().background_timeout }, pol_) end)
  end
  local ok, ierr, icode = ensure_image(d, spec.image, spec.pull, deadline)
  if not ok then return nil, ierr, icode end
  if spec.disk then disk_quota(d) end
  local name = spec.name or (spec.name_prefix .. assert(core.random.hex(6)))
  local function remove(racing)
    -- After an aborted create the daemon may still be making the container:
    -- a 404 then means "not yet", so look again for a moment, and then
    -- leave the name to the sweeper (a loaded daemon may make it later).
    for _ = 1, racing and pol().remove_retries or 1 do
      local st, _, rcode = call(d, "DELETE", "/containers/" .. urlq(name) .. "?force=true&v=true", nil,
        { ok = { [404] = true, [409] = true }, deadline = core.now() + pol().remove_interval * 10 })
      if rcode == "daemon_unresponsive" then sweep(d, name) return end
      if st ~= 404 then return end
      core.sleep(pol().remove_interval)
    end
    if racing then sweep(d, name) end
  end
  -- The name is known before the daemon answers: whatever stops us half way
  -- (an interrupt, a cancel) removes what may already exist, then goes on.
  local bind = agent_mount(d, spec, pol_)
  local ok, st, body, ccode, sst, serr, scode = pcall(function()
    local st_, body_, ccode_ = call(d, "POST", "/containers/create?name=" .. urlq(name), create_body(spec, pol_, d, bind),
      { deadline = deadline })
    if not st_ and bind and ccode_ == "bad_request" and tostring(body_):lower():find("mount", 1, true) then
      -- The daemon cannot bind the host's file (it runs in a VM, or the
      -- path is not its host's): the upload, for this box and the daemon's
      -- later ones.
      d.agent_bind, bind = false, nil
      st_, body_, ccode_ = call(d, "POST", "/containers/create?name=" .. urlq(name), create_body(spec, pol_, d),
        { deadline = deadline })
    end
    if not st_ and spec.disk and d.disk_quota and M.quota_refused(body_) then
      -- /info cannot show xfs's pquota mount option: the daemon's answer
      -- decides, for this box and the daemon's later ones.
      d.disk_quota, d.disk_note = false, "the daemon refused a size quota (" .. tostring(body_) .. ")"
      st_, body_, ccode_ = call(d, "POST", "/containers/create?name=" .. urlq(name), create_body(spec, pol_, d, bind),
        { deadline = deadline })
    end
    if not st_ then return st_, body_, ccode_ end
    return st_, body_, ccode_, call(d, "POST", "/containers/" .. body_.Id .. "/start", nil,
      { ok = { [304] = true }, deadline = deadline })
  end)
  if not ok then
    pcall(remove, true)
    error(st, 0)
  end
  if not st then
    if ccode == "daemon_unresponsive" then sweep(d, name) end
    return nil, "cannot create the box: " .. body, ccode
  end
  if not sst then
    if scode == "daemon_unresponsive" then sweep(d, name) else remove() end
    return nil, "cannot start the box: " .. serr, scode
  end
  local h = { id = body.Id, name = name, daemon = d, jobs = setmetatable({}, { __mode = "k" }),
    image = spec.image, read_only = spec.read_only and true or false, agent_bound = bind and bind.target }
  -- Where the agent may go on a read-only root: the tmpfs mounts the box
  -- asked to be executable (Docker mounts a tmpfs noexec unless told
  -- "exec"), then the temporary directory.
  if h.read_only then
    local dirs = {}
    for path, o in pairs(spec.tmpfs or {}) do
      if type(path) == "string" and path:match("^/[%w/._-]*$") and ("," .. tostring(o) .. ","):find(",exec,", 1, true) then
        dirs[#dirs + 1] = path
      end
    end
    table.sort(dirs)
    dirs[#dirs + 1] = "/tmp"
    h.agent_dirs = dirs
  end
  if spec.disk then
    h.limits = { disk = disk_entry(d) }
    if not d.disk_quota then watch(h, spec.disk) end
  end
  return h
end

-- destroy(handle, detached, deadline): force-removes the container (kill +
-- delete in one call). detached: fire and forget, for finalizers. Past the
-- deadline the container is left to the sweeper (and to `sbx reap`).
function M.destroy(h, detached, deadline)
  if h.destroyed then return true end
  h.destroyed = true
  deadline = deadline or core.now() + require("sbx.config").policy.box.destroy_timeout
  unwatch(h)
  local st, err, code = call(h.daemon, "DELETE", "/containers/" .. h.id .. "?force=true&v=true", nil,
    { ok = { [404] = true, [409] = true }, detached = detached, deadline = deadline })
  if detached then return true end
  if not st then
    if code == "daemon_unresponsive" then sweep(h.daemon, h.id) end
    return nil, err, code
  end
  return true
end

function M.restart(h, deadline)
  local st, err, code = call(h.daemon, "POST", "/containers/" .. h.id .. "/restart?t=0", nil, { deadline = deadline })
  if not st then return nil, err, code end
  return true
end

-- Transport ---------------------------------------------------------------------

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
  if h.disk_limit then ensure_poller(h.daemon) end
  local id, err, code = exec_create(h, req, req.deadline)
  if not id then return nil, err, code end
  local job = { id = id, marker = req.marker, stream = open_stream(h, id, req) }
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

-- finish(handle, job) -> exit code, read once the stream has ended. The
-- daemon forgets finished execs after minutes, so callers keep the value.
-- A command the daemon could not start (it says exit 126 but never had a
-- process) is nil, the daemon's words, "exec_failed"; a command the OOM
-- killer ended gets job.oom_killed and job.memory_limit.
function M.finish(h, job, deadline)
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
    if deadline and core.now() >= deadline then break end
    local st, r, code = call(h.daemon, "GET", "/exec/" .. job.id .. "/json", nil, { deadline = deadline })
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

-- clear(handle, deadline) -> true | nil, message, code: ends every process
-- of the box but its lifetime process (a lost agent's box, before a fresh
-- agent is placed): an in-box exec as root (box.clear_request); where that
-- cannot run or leaves processes (a box at its pids limit), the box is
-- restarted (every process dies, its files stay).
function M.clear(h, deadline)
  if h.frozen then return nil, h.frozen.message, h.frozen.code end
  local job_mod = require "sbx.job"
  deadline = deadline or core.now() + pol().kill_timeout
  local exit_code, kjob, code = job_mod.run_helper(M, h, job_mod.clear_request(), deadline,
    "ending the box's processes")
  if exit_code == nil and (code == "daemon_unavailable" or code == "daemon_unresponsive" or code == "box_gone") then
    return nil, kjob, code
  end
  if exit_code == 0 and (kjob.stream:captured("stdout")):match("^0%s*$") then return true end
  return M.restart(h, deadline)
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

-- The agent's channel ------------------------------------------------------------------

local ARCH = { amd64 = "x86_64", x86_64 = "x86_64", arm64 = "aarch64", aarch64 = "aarch64" }
local LOADER_GO = "__SBXAGENT_go__\n"

-- A one-file ustar archive (PUT /containers/{id}/archive takes a tar).
local function tar_one(name, data, mode)
  local function octal(n, width) return string.format("%0" .. (width - 1) .. "o", n) .. "\0" end
  local header = name .. string.rep("\0", 100 - #name) .. octal(mode, 8) .. octal(0, 8) .. octal(0, 8)
    .. octal(#data, 12) .. octal(os.time(), 12) .. "        " .. "0" .. string.rep("\0", 100)
    .. "ustar\0" .. "00" .. string.rep("\0", 32) .. string.rep("\0", 32) .. octal(0, 8) .. octal(0, 8)
    .. string.rep("\0", 155)
  header = header .. string.rep("\0", 512 - #header)
  local sum = 0
  for i = 1, 512 do sum = sum + header:byte(i) end
  header = header:sub(1, 148) .. string.format("%06o\0 ", sum) .. header:sub(157)
  local pad = (512 - #data % 512) % 512
  return header .. data .. string.rep("\0", pad) .. string.rep("\0", 1024)
end
M.tar_one = tar_one

-- The agent per architecture, copied out of the library once.
local agents = {}
local function agent_binary(arch)
  agents[arch] = agents[arch] or core.agent.binary(arch)
  return agents[arch]
end

-- The agent from the host: where the daemon runs on this host, each box
-- gets one host file, made once from the copy inside libsbx, as a
-- read-only bind (policy.docker.agent_bind): no upload per box, and a file
-- the box cannot replace, so a lost agent's successor is the host's copy
-- again. The file is sbx-agent-<arch>-<sha256 prefix> (mode 0555) in
-- policy.docker.agent_dir, a directory of this user's made 0700; its
-- content is checked against libsbx's once per process.
local function host_arch()
  local f = io.open("/proc/sys/kernel/arch", "r")
  local m = f and f:read("l")
  if f then f:close() end
  return m and ARCH[m]
end

local function agent_dir(dp)
  local dir = dp.agent_dir
  if dir then return dir end
  if core.sandbox.ids() == 0 then return "/var/cache/sbx/agent" end
  local xdg = os.getenv("XDG_CACHE_HOME")
  return ((xdg and xdg ~= "") and xdg or (home() .. "/.cache")) .. "/sbx/agent"
end

local host_files = {}       -- dir .. "\0" .. arch -> { path, hash }: written or checked by this process
-- agent_host_file(arch, docker policy) -> path, hash | nil, message
local function agent_host_file(arch, dp)
  local S = core.sandbox
  local dir = agent_dir(dp)
  local known = host_files[dir .. "\0" .. arch]
  if known then return known[1], known[2] end
  local bin = agent_binary(arch)
  if not bin then return nil, "this build of sbx carries no agent for " .. arch end
  local hash = core.sigv4.sha256(bin):sub(1, 16)
  local path = string.format("%s/sbx-agent-%s-%s", dir, arch, hash)
  local cur = ""
  for part in dir:gmatch("[^/]+") do
    cur = cur .. "/" .. part
    if not exists(cur) then
      local ok, err, code = S.mkdir(cur, tonumber("700", 8))
      if not ok and code ~= "EEXIST" then return nil, err end
    end
  end
  local uid, st = S.ids(), S.stat(dir)
  if not st or st.type ~= "dir" or st.uid ~= uid or st.mode & tonumber("022", 8) ~= 0 then
    return nil, dir .. " is not a directory of this user's that only it may write"
  end
  local f = io.open(path, "rb")
  local have = f and f:read("a")
  if f then f:close() end
  local fst = have == bin and S.stat(path)
  if not (fst and fst.type == "file" and fst.uid == uid and fst.mode == tonumber("555", 8)) then
    local ok, err = S.install(path, bin, tonumber("555", 8))
    if not ok then return nil, err end
  end
  host_files[dir .. "\0" .. arch] = { path, hash }
  return path, hash
end

-- agent_mount(d, spec) -> { source, target } | nil: the bind a new box gets,
-- or none (the upload then): a daemon not on this host (a tcp address; a
-- socket a user owns: a rootless daemon, a VM's), another architecture, a
-- box whose own capabilities or mounts could undo a read-only bind.
function agent_mount(d, spec, pol_)
  local dp = type(pol_) == "table" and pol_.docker or pol()
  if not dp.agent_bind or d.agent_bind == false or not d.unix_socket then return nil end
  if d.agent_bind == nil then
    local st = core.sandbox.stat(d.unix_socket)
    d.agent_bind = (st and st.type == "socket" and st.uid == 0) and true or false
    if not d.agent_bind then return nil end
  end
  local hc = spec.host_config or {}
  if hc.Privileged or hc.Mounts ~= nil or hc.Binds ~= nil then return nil end
  for _, list in ipairs { spec.cap_add or {}, type(hc.CapAdd) == "table" and hc.CapAdd or {} } do
    for _, c in ipairs(list) do
      local name = tostring(c):upper():gsub("^CAP_", "")
      if name == "SYS_ADMIN" or name == "ALL" then return nil end
    end
  end
  local facts = type(d.images[spec.image]) == "table" and d.images[spec.image] or {}
  local arch = ARCH[facts.arch or "amd64"]
  if not arch or arch ~= host_arch() then return nil end
  local path, hash = agent_host_file(arch, dp)
  if not path then return nil end
  return { source = path, target = "/.sbx-agent-" .. hash }
end

-- Places a fresh sbx-agent for the image's architecture and runs it with
-- args as root on an attached exec whose pipes are the channel: the
-- host's read-only copy where the box has one (agent_mount), else a copy
-- at a new random path each time (a copy left in the box is never
-- trusted) through the archive API where the root is writable, else
-- through a shell into a fresh temporary directory.
-- -> channel, facts | nil, reason, code
local function run_agent(h, opts, args)
  local d, deadline = h.daemon, opts.deadline
  if h.frozen then return nil, h.frozen.message, h.frozen.code end
  local facts = type(d.images[h.image]) == "table" and d.images[h.image] or {}
  local arch = ARCH[facts.arch or "amd64"]
  if not arch then
    return nil, string.format("the image is for %s, and sbx carries no agent for it", tostring(facts.arch)), "unsupported"
  end
  local bin = agent_binary(arch)
  if not bin then return nil, "this build of sbx carries no agent for " .. arch, "unsupported" end
  local argv, preface
  local path = "/.sbx-agent-" .. assert(core.random.hex(8))
  if h.agent_bound then
    argv = { h.agent_bound, table.unpack(args) }
  elseif not h.read_only then
    local r, err, ecode = http.request {
      url = d.prefix .. "/containers/" .. h.id .. "/archive?path=/", method = "PUT",
      unix_socket = d.unix_socket, headers = { ["Content-Type"] = "application/x-tar" },
      body = tar_one(path:sub(2), bin, tonumber("700", 8)),
      timeout = M.seconds_left(deadline, pol().api_timeout),
    }
    if r and r.status < 300 then argv = { path, table.unpack(args) } end
    if not r and err then
      return nil, string.format("cannot place the agent: the Docker daemon at %s: %s", d.endpoint, tostring(err)),
        ecode == "timeout" and "daemon_unresponsive" or "daemon_unavailable"
    end
  end
  if not argv then
    -- A read-only root: a fresh private directory where the box may write.
    local dirs = table.concat(h.agent_dirs or { "/tmp" }, " ")
    argv = { "sh", "-c", 'umask 077; d=; for p in ' .. dirs .. '; do d=$(mktemp -d -p "$p" 2>/dev/null) && break; done; ' ..
      '[ -n "$d" ] || { echo "no writable directory to place it in (tried ' .. dirs ..
      '; a read-only root needs a tmpfs with exec)" >&2; exit 125; }; head -c ' .. #bin ..
      ' > "$d/a" && chmod 700 "$d/a" && printf "' .. LOADER_GO .. '" && exec "$d/a"' ..
      (#args > 0 and (" " .. table.concat(args, " ")) or "") }
    preface = bin
  end
  local req = { argv = argv, env = { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" },
    user = "0", stdin = "" }
  local id, err, code = exec_create(h, req, deadline)
  if not id then return nil, err, code end
  local body = '{"Detach":false,"Tty":false}'
  local ch = core.stream.open {
    unix_socket = d.unix_socket, host = d.host, port = d.port, keep_open = true,
    request = table.concat {
      "POST /v", d.api, "/exec/", id, "/start HTTP/1.1\r\n", "Host: docker\r\n",
      "Content-Type: application/json\r\n", "Content-Length: ", #body, "\r\n",
      "Connection: close\r\n\r\n", body,
    },
    chunks = true, chunk_limit = opts.pol.agent.channel_buffer,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } },
  }
  -- A frozen box (disk past its limit) ends the channel with its code.
  if h.jobs and h.channel_job then h.jobs[h.channel_job] = nil end
  h.channel_job = { stream = ch }
  if h.jobs then h.jobs[h.channel_job] = true end
  h.channel = ch
  if preface then
    ch:write(preface)
    -- Nothing more goes in until the loader has read exactly the agent's
    -- bytes (busybox head reads ahead through stdio and would eat the key);
    -- what follows its line is the agent's.
    local said = ""
    while not said:find(LOADER_GO, 1, true) do
      local ev = ch:wait(math.max(0.001, deadline - core.now()))
      if ev == "timeout" then
        local why = (ch:captured("stderr") or ""):gsub("%s+$", "")
        ch:close()
        return nil, "the agent's loader did not finish" .. (why ~= "" and (": " .. why) or ""), "agent_unavailable"
      end
      said = said .. (ch:take(true) or "")
      if ev == "eof" and not said:find(LOADER_GO, 1, true) then
        local why = (ch:captured("stderr") or ""):gsub("%s+$", "")
        return nil, "the agent's loader failed" .. (why ~= "" and (": " .. why) or ""), "agent_unavailable"
      end
    end
    local rest = said:sub(said:find(LOADER_GO, 1, true) + #LOADER_GO)
    if rest ~= "" then
      local proxy = setmetatable({}, { __index = function(_, k)
        return function(_, ...) return ch[k](ch, ...) end
      end })
      function proxy.take(_, raw)
        local out, err = ch:take(raw)
        if rest then out, rest = rest .. (out or ""), nil end
        return out, err
      end
      return proxy, facts
    end
  end
  return ch, facts
end

-- agent_channel(handle, { key, deadline, pol }) -> channel, mac, extra |
-- nil, reason, code. The agent runs as root (so it can start commands as
-- any user) as the exec's process: a dropped connection to the daemon
-- closes its stdin and leaves it running. The channel's pipes belong to the
-- agent alone: no frame authentication.
function M.agent_channel(h, opts)
  local ch, facts, code = run_agent(h, opts, {})
  if not ch then return nil, facts, code end
  local extra = { default_user = facts.user }
  if h.agent_bound then
    -- The bound file would not run (a noexec mount, SELinux's labels): the
    -- upload, for this box and the daemon's later ones.
    extra.retry = function()
      if not h.agent_bound then return false end
      h.agent_bound, h.daemon.agent_bind = nil, false
      return true
    end
  end
  return ch, false, extra
end

-- agent_attach(handle, { name, deadline, pol }) -> channel | nil, reason,
-- code: the way back to a running agent after a dropped channel, through a
-- relay placed anew ("sbx-agent attach NAME"; the name is hex).
function M.agent_attach(h, opts)
  if not tostring(opts.name):match("^[%w%-]+$") then error("agent_attach: a bad socket name", 2) end
  local ch, err, code = run_agent(h, opts, { "attach", opts.name })
  if not ch then return nil, err, code end
  return ch
end

-- Reaper ----------------------------------------------------------------------------

-- reap(opts) -> { removed = {...}, kept = n }: removes boxes whose owner
-- process is gone (same host: pid and start time no longer match) or whose
-- deadline has passed (any host). opts.all removes every sbx box; opts.dry_run
-- only reports what would go.
function M.reap(opts)
  opts = opts or {}
  local d, err, code = M.connect(opts.docker_host, opts.deadline)
  if not d then return nil, err, code end
  local filters = json.encode { label = json.array { "sbx.owner.pid" } }
  local st, list, lcode = call(d, "GET", "/containers/json?all=true&filters=" .. urlq(filters), nil, { deadline = opts.deadline })
  if not st then return nil, list, lcode end
  local now = os.time()
  return owner.reap_each(list, opts, {
    reason = function(c) return owner.reap_reason(c.Labels or {}, opts, now) end,
    name = function(c) return c.Id, ((c.Names and c.Names[1] or c.Id):gsub("^/", "")) end,
    remove = function(c)
      call(d, "DELETE", "/containers/" .. c.Id .. "?force=true&v=true", nil,
        { ok = { [404] = true, [409] = true }, deadline = opts.deadline })
    end,
  })
end

return M

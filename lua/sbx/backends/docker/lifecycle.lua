-- The Docker backend's lifecycle: create (the container, its image, the
-- agent's bind), destroy, restart and clear, and the sweeper for what a
-- frozen daemon left behind.
local core = require "sbx.core"
local json = core.json
local owner = require "sbx.owner"
local client = require "sbx.backends.docker.client"
local images = require "sbx.backends.docker.images"
local isolation = require "sbx.backends.docker.isolation"
local exec = require "sbx.backends.docker.exec"
local channel = require "sbx.backends.docker.channel"
local reap = require "sbx.backends.docker.reap"
local call, urlq, pol = client.call, client.urlq, client.pol
local disk_quota, disk_entry, watch, unwatch = isolation.disk_quota, isolation.disk_entry, isolation.watch, isolation.unwatch

local M = {}

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
  local d, err, code = client.connect(spec.docker_host, deadline)
  if not d then return nil, err, code end
  if spec.reap_on_start and not reaped_once then
    reaped_once = true
    core.spawn(function() pcall(reap.reap, { quiet = true, deadline = core.now() + pol().background_timeout }, pol_) end)
  end
  local ok, ierr, icode = images.ensure_image(d, spec.image, spec.pull, deadline)
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
  local bind = channel.agent_mount(d, spec, pol_)
  -- An interrupt waits a moment for the daemon's answer to a create (the
  -- id it names is what remove() then finds) instead of cutting it off.
  local function create_call(b)
    return core.shield(pol().create_grace, call, d, "POST", "/containers/create?name=" .. urlq(name), b,
      { deadline = deadline })
  end
  local ok, st, body, ccode, sst, serr, scode = pcall(function()
    local st_, body_, ccode_ = create_call(create_body(spec, pol_, d, bind))
    if not st_ and bind and ccode_ == "bad_request" and tostring(body_):lower():find("mount", 1, true) then
      -- The daemon cannot bind the host's file (it runs in a VM, or the
      -- path is not its host's): the upload, for this box and the daemon's
      -- later ones.
      d.agent_bind, bind = false, nil
      st_, body_, ccode_ = create_call(create_body(spec, pol_, d))
    end
    if not st_ and spec.disk and d.disk_quota and isolation.quota_refused(body_) then
      -- /info cannot show xfs's pquota mount option: the daemon's answer
      -- decides, for this box and the daemon's later ones.
      d.disk_quota, d.disk_note = false, "the daemon refused a size quota (" .. tostring(body_) .. ")"
      st_, body_, ccode_ = create_call(create_body(spec, pol_, d, bind))
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

-- clear(handle, deadline) -> true | nil, message, code: ends every process
-- of the box but its lifetime process (a lost agent's box, before a fresh
-- agent is placed): an in-box exec as root (box.clear_request); where that
-- cannot run or leaves processes (a box at its pids limit), the box is
-- restarted (every process dies, its files stay).
function M.clear(h, deadline)
  if h.frozen then return nil, h.frozen.message, h.frozen.code end
  local job_mod = require "sbx.job"
  deadline = deadline or core.now() + pol().kill_timeout
  local exit_code, kjob, code = job_mod.run_helper(exec, h, job_mod.clear_request(), deadline,
    "ending the box's processes")
  if exit_code == nil and (code == "daemon_unavailable" or code == "daemon_unresponsive" or code == "box_gone") then
    return nil, kjob, code
  end
  if exit_code == 0 and (kjob.stream:captured("stdout")):match("^0%s*$") then return true end
  return M.restart(h, deadline)
end

return M

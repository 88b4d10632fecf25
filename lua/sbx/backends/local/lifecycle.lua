-- The local backend's lifecycle: create, destroy, restart, the lifetime
-- watcher and the agent's channel (the launcher's pipes).
local core = require "sbx.core"
local sbx_config = require "sbx.config"
local function lpol(pol) return (pol or sbx_config.policy)["local"] end
local cgroups = require "sbx.backends.local.cgroups"
local disk = require "sbx.backends.local.disk"
local host = require "sbx.backends.local.host"
local images = require "sbx.backends.local.images"
local launch = require "sbx.backends.local.launch"
local reap = require "sbx.backends.local.reap"
local state = require "sbx.backends.local.state"
local remove_cgroups = cgroups.remove_cgroups
local disk_boxes = disk.disk_boxes
local remove_disk = disk.remove_disk
local watch_disk = disk.watch_disk
local get_facts = host.get_facts
local proc_mode = host.proc_mode
local image_source = images.image_source
local box_env = launch.box_env
local new_launcher = launch.new_launcher
local refill = launch.refill
local remove_dir = launch.remove_dir
local launch_box = launch.launch
local stderr_of = launch.stderr_of
local take_launcher = launch.take_launcher
local ensure_programs = state.ensure_programs
local state_root = state.state_root

local M = {}

-- Lifetimes: one task for every box of the process, which destroys a box
-- past its lifetime (Docker's boxes stop their sleep; these have none).
local lifetimes = setmetatable({}, { __mode = "k" })   -- handle -> deadline
local lifetime_wake, lifetime_task

local function lifetime_watch()
  while next(lifetimes) do
    local now, nearest = core.now(), math.huge
    for h, t in pairs(lifetimes) do
      if h.destroyed then lifetimes[h] = nil
      elseif t <= now then
        lifetimes[h] = nil
        h.gone_reason = string.format("the box reached its lifetime (%g s) and was removed", h.spec.lifetime)
        M.destroy(h, true)
      else nearest = math.min(nearest, t - now) end
    end
    if next(lifetimes) then lifetime_wake:clear(); lifetime_wake:wait(math.min(nearest, 3600)) end
  end
  lifetime_task = nil
end

local function watch_lifetime(h, seconds)
  lifetimes[h] = core.now() + seconds
  lifetime_wake = lifetime_wake or core.event()
  if not lifetime_task then
    lifetime_task = core.spawn(lifetime_watch)
    lifetime_task:unref()
  else
    lifetime_wake:set()
  end
end

-- Lifecycle ----------------------------------------------------------------------------

local reaped_once = false

-- create(spec, pol) -> handle | nil, message, code
function M.create(spec, pol)
  pol = pol or sbx_config.policy
  local f = get_facts(pol)
  if not f.bwrap then
    return nil, string.format("bubblewrap (%s) is not installed: apt-get install bubblewrap", lpol(pol).bwrap), "unsupported"
  end
  local mode, merr = proc_mode(pol)
  if not mode then return nil, merr, "unsupported" end
  local src, ierr, icode = image_source(spec, pol)
  if not src then return nil, ierr, icode end
  -- The start deadline begins once the image is ready: fetching and
  -- unpacking it (shared by every box that needs it, however long it
  -- takes) is not the box's start.
  local deadline = core.now() + math.min(spec.create_timeout, pol.agent.start_timeout)
  -- Every way out below without a box lets go of the image.
  local function unlease()
    if src.lease then src.lease:close() src.lease = nil end
  end
  local root, rerr, rcode = state_root(pol)
  if not root then unlease() return nil, rerr, rcode end
  if spec.reap_on_start and not reaped_once then
    reaped_once = true
    local t = core.spawn(function() pcall(reap.reap, { quiet = true }, pol) end)
    t:unref()
  end
  local progs, perr, pcode = ensure_programs(root)
  if not progs then unlease() return nil, perr, pcode end
  local h, err, code = take_launcher(root, progs, pol)
  if not h then unlease() return nil, err, code end
  h.src, h.spec, h.pol = src, spec, pol
  local lok, launched, lmsg, lcode = pcall(launch_box, h, spec, pol, deadline)
  if lok and not launched and lcode == "idmap" and f.ids.kind == "subid" then
    -- newuidmap is there but may not write the map (in a container without
    -- the capabilities it needs, or an /etc/subuid range outside the
    -- container's own): every box from now on has the single id instead,
    -- and box.limits.ids says why.
    f.ids = { kind = "single", uid = f.ids.uid, gid = f.ids.gid, count = 1,
      why = "newuidmap failed here (" .. tostring(lmsg):gsub("^cannot map the box's ids: ", "") .. ")" }
    h.src = nil   -- the image's lease stays with the box
    M.destroy(h, false, core.now() + lpol(pol).destroy_wait)
    h, err, code = take_launcher(root, progs, pol)
    if not h then unlease() return nil, err, code end
    h.src, h.spec, h.pol = src, spec, pol
    lok, launched, lmsg, lcode = pcall(launch_box, h, spec, pol, deadline)
  end
  refill(root, progs, pol)
  if not lok or not launched then
    -- Cut short (an interrupt) or failed: nothing may stay.
    M.destroy(h, false, core.now() + lpol(pol).destroy_wait)
    if not lok then error(launched, 0) end
    return nil, lmsg, lcode or "launch_failed"
  end
  -- What this box got where the kernel decided (box.limits.proc, .ids).
  local ids = f.ids
  h.limits = {
    proc = h.proc_mode == "copy" and { enforced = "kernel", note = "copies: this container masks its /proc, " ..
      "so the box's /proc is read-only copies of policy.local.proc_files, without /proc/self or any " ..
      "process (docs/local-in-containers.md)" } or { enforced = "kernel", note = "a proc of the box's own PID namespace" },
    ids = { enforced = "kernel", note = ids.kind == "range" and string.format("%d ids, the same host ids", ids.count)
      or ids.kind == "subid" and string.format("%d ids: the user's own and its /etc/subuid range (newuidmap)", ids.count)
      or "a single id, the user's own: " .. tostring(ids.why) },
  }
  h.env = box_env(spec, pol, src)
  h.default_user = src.config.user ~= "" and src.config.user or nil
  watch_lifetime(h, spec.lifetime)
  if h.disk and spec.disk then watch_disk(h, spec.disk) end
  return h
end

-- destroy(handle, detached, deadline): the box's processes end at once
-- (bubblewrap's monitor is killed; the agent dies with it, and the box's
-- PID namespace with the agent); the host's leftovers (cgroups, the box's
-- directory) go as soon as the kernel lets go of them. detached: without
-- waiting (a collected box).
function M.destroy(h, detached, deadline)
  if h.destroyed then return true end
  h.destroyed = true
  lifetimes[h] = nil
  disk_boxes[h] = nil
  if h.src and h.src.lease then h.src.lease:close() h.src.lease = nil end
  if h.proc then h.proc:kill("KILL") end
  local pol = h.pol or sbx_config.policy
  local function cleanup(dl)
    local p = h.proc
    if p then
      h.proc = nil
      p:wait(math.max(0.001, dl - core.now()))
      p:close()
    end
    if h.chan then h.chan:close() end
    local ok, err, code = true, nil, nil
    if h.cgroups then ok, err, code = remove_cgroups(h.cgroups, dl) end
    if ok and h.disk then ok, err, code = remove_disk(h.disk, h.progs, pol, dl) end
    if ok then remove_dir(h.dir) end
    if not ok then return nil, err .. " (left to sbx reap --backend local)", code end
    return true
  end
  deadline = math.min(deadline or math.huge, core.now() + lpol(pol).destroy_wait)
  if detached then
    local t = core.spawn(cleanup, deadline)
    t:unref()
    return true
  end
  return cleanup(deadline)
end

-- restart(handle, deadline): the box again from its image (its processes
-- and the files written since are gone: the writable layer lived in the
-- box's mount namespace). The agent transport finds the new agent.
function M.restart(h, deadline)
  if h.destroyed then return nil, "the box is closed", "box_gone" end
  deadline = deadline or core.now() + 10
  local p = h.proc
  if p then
    h.proc = nil
    p:kill("KILL")
    p:wait(math.max(0.001, deadline - core.now()))
    p:close()
  end
  if h.chan then h.chan:close() end
  if h.cgroups then
    local ok, err, code = remove_cgroups(h.cgroups, deadline)
    if not ok then return nil, err, code end
  end
  if h.disk then
    local ok, err, code = remove_disk(h.disk, h.progs, h.pol, deadline)
    if not ok then return nil, err, code end
  end
  remove_dir(h.dir)
  -- A new launcher for the same box.
  local fresh, err, code = new_launcher(h.root, h.progs, h.pol, h.id)
  if not fresh then return nil, err, code end
  for _, k in ipairs { "cgroups", "cgroup_of", "proc", "chan", "sync", "pid" } do h[k] = fresh[k] end
  h.ready = nil
  local ok
  ok, err, code = launch_box(h, h.spec, h.pol, deadline)
  if not ok then return nil, err, code end
  return true
end

-- agent_channel(handle, { key, deadline, pol }) -> channel, mac, extra |
-- nil, message, code. The channel is the agent's stdin and stdout, opened
-- when the box started: only the agent holds them (no authentication).
-- Asked again after the agent was lost, the box is gone with it.
function M.agent_channel(h, opts)
  if h.frozen then return nil, h.frozen.message, h.frozen.code end
  if h.destroyed then return nil, h.gone_reason or "the box is closed", "box_gone" end
  if not h.fresh then
    local said = stderr_of(h)
    return nil, "the box's agent (its first process) is gone, and the box with it" ..
      (said and (": " .. said) or ""), "box_gone"
  end
  h.fresh = false
  local _ = opts
  return h.chan, false, { default_user = h.default_user, env = h.env }
end

return M

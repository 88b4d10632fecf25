-- The local backend's disk layers and the disk watcher.
local core = require "sbx.core"
local sbx_config = require "sbx.config"
local function lpol(pol) return (pol or sbx_config.policy)["local"] end
local host = require "sbx.backends.local.host"
local launch = require "sbx.backends.local.launch"
local exists = host.exists
local get_facts = host.get_facts
local write_maps = launch.write_maps

local M = {}

-- Disk layers ---------------------------------------------------------------------------
-- policy.local.layer: a box's writable layer (the overlay's upper and work
-- directories) on the host's disk, under disk_root()/boxes/<id>, instead of
-- a tmpfs. Its files belong to the ids of the box (a user's subordinate
-- ids among them), so sbx measures and removes it from inside a user
-- namespace: sbx-launch --usage enters the box's own; sbx-launch --remove
-- makes one with the box's id map.

local LAUNCH_ENV = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin" }

-- Removes a disk layer (after its box's processes are gone): true | nil,
-- message, code.
local function remove_disk(dir, progs, pol, deadline)
  if not dir or not exists(dir) then return true end
  local f = get_facts(pol)
  local p, chan, sync = core.proc.spawn {
    argv = { progs.launch, tostring(core.pid()) }, env = LAUNCH_ENV,
    stdin = true, stdout = true, stderr = true, sync = true,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } },
  }
  if not p then return nil, "cannot remove the box's disk layer: " .. tostring(chan), sync or "launch_failed" end
  local function step(want)
    local ev = sync:wait(math.max(0.001, deadline - core.now()))
    return ev == "data" and sync:take(true) == want
  end
  local ok, err = step("r"), nil
  if ok then
    local args = { "--remove", dir, "--", "/" }
    if f.ids.kind == "single" then table.insert(args, 1, "--map-self") end
    sync:write(string.format("%d 0\n", #args) .. table.concat(args, "\0") .. "\0")
    ok = step("u")
  end
  if ok then
    ok, err = write_maps(f.ids, p:pid(), deadline)
    if ok then sync:write("g") ok = step("x") end
  end
  sync:close()
  local info = p:wait(math.max(0.001, deadline - core.now()))
  if not info then p:kill("KILL") p:wait(1) end
  chan:wait(0.2)
  local said = (chan:captured("stderr") or ""):gsub("%s+$", "")
  p:close()
  chan:close()
  if ok and info and info.status == 0 then return true end
  return nil, string.format("cannot remove the box's disk layer %s: %s", dir,
    err or (said ~= "" and said) or "sbx-launch did not finish"), "disk_layer"
end

-- The bytes a box's disk layer takes now, or nil.
local function disk_usage(h)
  if not (h.pid and h.disk) then return nil end
  local p, s = core.proc.spawn {
    argv = { h.progs.launch, "--usage", "/proc/" .. h.pid .. "/ns/user", h.disk .. "/upper" }, env = LAUNCH_ENV,
    capture = { stdout = { head = 64, tail = 0 }, stderr = { head = 1024, tail = 0 }, output = { head = 0, tail = 0 } },
  }
  if not p then return nil end
  local info = p:wait(30)
  if not info then p:kill("KILL") p:wait(1) end
  s:wait(1)
  local out = s:captured("stdout") or ""
  p:close()
  return info and info.status == 0 and tonumber(out:match("^(%d+)")) or nil
end

-- Past its limit a box stops: its processes are killed, its channel ends
-- with "disk_exceeded" (the running commands fail with it), and every later
-- command is refused with it (as a Docker box past its limit is frozen).
local function freeze(h, used)
  if h.frozen or h.destroyed then return end
  local live = h.policy and h.policy() or sbx_config.policy
  local msg = live.format_disk_exceeded(used, h.disk_limit, live)
  h.frozen = { message = msg, code = "disk_exceeded", used = used }
  if h.chan then h.chan:close("disk_exceeded", msg) end
  if h.proc then h.proc:kill("KILL") end
end

-- One watcher task for every disk-layer box with a limit in the process.
local disk_boxes = setmetatable({}, { __mode = "k" })   -- handle -> true
local disk_task

local function disk_watch()
  local last = 0
  while next(disk_boxes) do
    local lp = lpol(sbx_config.policy)
    core.sleep(math.max(lp.disk_poll, last / lp.disk_poll_load - last))
    local t0 = core.now()
    local list = {}
    for h in pairs(disk_boxes) do list[#list + 1] = h end
    for _, h in ipairs(list) do
      if h.destroyed or h.frozen then
        disk_boxes[h] = nil
      else
        local used = disk_usage(h)
        if used and used > h.disk_limit and not h.destroyed then freeze(h, used) disk_boxes[h] = nil end
      end
    end
    last = core.now() - t0
  end
  disk_task = nil
end

local function watch_disk(h, limit)
  h.disk_limit = limit
  disk_boxes[h] = true
  if not disk_task then
    disk_task = core.spawn(function() pcall(disk_watch) disk_task = nil end)
    disk_task:unref()
  end
end

-- Prepares a launcher for a box: its directory, its cgroups (without
-- limits yet), a record, and sbx-launch started, which joins the cgroups

M.disk_boxes = disk_boxes
M.remove_disk = remove_disk
M.watch_disk = watch_disk

return M

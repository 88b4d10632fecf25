-- The local backend's reaper: the boxes of owners that are gone.
local core = require "sbx.core"
local owner = require "sbx.owner"
local S = core.sandbox
local sbx_config = require "sbx.config"
local function lpol(pol) return (pol or sbx_config.policy)["local"] end
local cgroups = require "sbx.backends.local.cgroups"
local disk = require "sbx.backends.local.disk"
local host = require "sbx.backends.local.host"
local launch = require "sbx.backends.local.launch"
local state = require "sbx.backends.local.state"
local remove_cgroups = cgroups.remove_cgroups
local remove_disk = disk.remove_disk
local disk_root_path = host.disk_root_path
local exists = host.exists
local remove_dir = launch.remove_dir
local ensure_programs = state.ensure_programs
local read_record = state.read_record
local state_root = state.state_root

local M = {}

-- Reaper --------------------------------------------------------------------------------

-- reap(opts, pol) -> { removed = { { id, name, reason } }, kept = n }:
-- removes the boxes of this host's state directory whose owner process is
-- gone or whose deadline passed (opts.all: every box; opts.dry_run: only
-- say which): their processes, cgroups and directories.
function M.reap(opts, pol)
  opts = opts or {}
  pol = pol or sbx_config.policy
  local root, err, code = state_root(pol)
  if not root then return nil, err, code end
  local me = owner.identity()
  local now = os.time()
  local records = {}         -- id -> the box's record, read once
  local report = owner.reap_each(S.list(root .. "/boxes") or {}, opts, {
    reason = function(id)
      local dir = root .. "/boxes/" .. id
      local r = read_record(dir)
      records[id] = r
      if not r then
        local st = S.stat(dir)
        if st and now - st.mtime > lpol(pol).stale_after then return "no owner record" end
      elseif not (r["owner.pid"] == me.pid and r["owner.start"] == me.start) or opts.all then
        return owner.reap_reason({ ["sbx.owner.host"] = r["owner.host"], ["sbx.owner.pid"] = r["owner.pid"],
          ["sbx.owner.start"] = r["owner.start"], ["sbx.deadline"] = r.deadline }, opts, now) or nil
      end
    end,
    name = function(id) return id, id end,
    serial = true,           -- the state directory's programs are written once, by one remover
    remove = function(id)
      local r = records[id]
      local pid = r and math.tointeger(tonumber(r.pid or ""))
      if pid and pid > 1 and r["pid.start"] ~= "" and owner.proc_start(pid) == r["pid.start"] then
        pcall(core.proc.signal, pid, "KILL")
      end
      if r and #r.cgroups > 0 then remove_cgroups(r.cgroups, core.now() + lpol(pol).destroy_wait) end
      local progs = r and r.disk and ensure_programs(root)
      if progs then remove_disk(r.disk, progs, pol, core.now() + lpol(pol).destroy_wait) end
      remove_dir(root .. "/boxes/" .. id)
    end,
  })
  -- Disk layers whose box has no record any more (a reaper that knew no
  -- disk layers removed it), once stale.
  local droot = disk_root_path(pol)
  for _, id in ipairs(S.list(droot .. "/boxes") or {}) do
    local ddir = droot .. "/boxes/" .. id
    local st = S.stat(ddir)
    if not exists(root .. "/boxes/" .. id) and st and now - st.mtime > lpol(pol).stale_after then
      report.removed[#report.removed + 1] = { id = id, name = id, reason = "a disk layer without a box" }
      local progs = not opts.dry_run and ensure_programs(root)
      if progs then remove_disk(ddir, progs, pol, core.now() + lpol(pol).destroy_wait) end
    end
  end
  -- The image cache's half-done downloads and unpackings of processes
  -- that died (an sbx killed while it made a box from a new image).
  local ok, cache = pcall(require("sbx.images.cache").open, pol.images)
  if ok and cache then
    local _, left = cache:clean_tmp(opts.dry_run)
    for _, name in ipairs(left) do
      report.removed[#report.removed + 1] = { id = name, name = "image cache tmp/" .. name,
        reason = "an unpacking left by a process that is gone" }
    end
  end
  return report
end

return M

-- The local backend's cgroups: made, limited and removed per box; OOM and
-- CPU readings.
local core = require "sbx.core"
local read_file = require("sbx.fs").read
local S = core.sandbox
local host = require "sbx.backends.local.host"
local exists = host.exists

local M = {}

-- cgroups ------------------------------------------------------------------------------

-- Makes the box's groups (one per hierarchy that has a controller sbx
-- uses): the list of directories made, and parent -> directory | nil,
-- message, code (what was made is removed).
local function make_cgroups(cg, id)
  local made, dirs = {}, {}
  for _, ctrl in ipairs { "memory", "pids", "cpu", "cpuacct" } do
    local parent = cg[ctrl]
    if parent and not dirs[parent] then
      local dir = parent .. "/sbx-" .. id
      local ok, err, code = S.mkdir(dir, tonumber("755", 8))
      if not ok then
        for k = #made, 1, -1 do S.rmdir(made[k]) end
        return nil, "cannot make the box's cgroup: " .. tostring(err), code or "cgroup"
      end
      made[#made + 1] = dir
      dirs[parent] = dir
    end
  end
  return made, dirs
end

-- Writes spec's limits into the box's groups: true | nil, message, code.
local function write_limits(cg, dirs, spec)
  local function put(ctrl, file, value)
    local ok, err, code = S.write(dirs[cg[ctrl]] .. "/" .. file, value)
    if not ok then return nil, "cannot set the box's cgroup limit: " .. tostring(err), code or "cgroup" end
    return true
  end
  local ok, err, code = true, nil, nil
  local cpu = spec.cpus and string.format("%d", math.max(1000, math.floor(spec.cpus * 100000)))
  if cg.version == 2 then
    if spec.memory and cg.memory then
      ok, err, code = put("memory", "memory.max", string.format("%d", spec.memory))
      if ok then put("memory", "memory.swap.max", "0") end
    end
    if ok and spec.pids and cg.pids then ok, err, code = put("pids", "pids.max", tostring(spec.pids)) end
    if ok and cpu and cg.cpu then ok, err, code = put("cpu", "cpu.max", cpu .. " 100000") end
  else
    if spec.memory and cg.memory then
      ok, err, code = put("memory", "memory.limit_in_bytes", string.format("%d", spec.memory))
      -- No swap, where swap is counted.
      if ok and exists(dirs[cg.memory] .. "/memory.memsw.limit_in_bytes") then
        put("memory", "memory.memsw.limit_in_bytes", string.format("%d", spec.memory))
      end
    end
    if ok and spec.pids and cg.pids then ok, err, code = put("pids", "pids.max", tostring(spec.pids)) end
    if ok and cpu and cg.cpu then
      ok, err, code = put("cpu", "cpu.cfs_period_us", "100000")
      if ok then ok, err, code = put("cpu", "cpu.cfs_quota_us", cpu) end
    end
  end
  return ok, err, code
end

-- Removes the groups, retrying every millisecond while the kernel still
-- tears the box's processes down (the agent dies a moment after
-- bubblewrap); what is still in them after 20 ms (a reaped box's) is
-- killed. Until deadline: true | nil, message, code.
local function remove_cgroups(dirs, deadline)
  local left = {}
  for _, d in ipairs(dirs) do left[#left + 1] = d end
  local killed = false
  local kill_at = core.now() + 0.02
  while true do
    local still = {}
    for _, d in ipairs(left) do
      local ok, err, code = S.rmdir(d)
      if not ok and code ~= "ENOENT" then still[#still + 1] = d; left.err = err; left.code = code end
    end
    if #still == 0 then return true end
    left = still
    if (not killed and core.now() >= kill_at) or core.now() > (deadline - 0.5) then
      for _, d in ipairs(left) do
        for pid in (read_file(d .. "/cgroup.procs") or ""):gmatch("%d+") do
          pcall(core.proc.signal, math.tointeger(tonumber(pid)), "KILL")
        end
      end
      killed = true
    end
    if core.now() >= deadline then
      return nil, "the box's cgroups are still in use: " .. tostring(left.err), left.code or "EBUSY"
    end
    core.sleep(0.001)
  end
end

-- oom_killed(handle) -> killed, memory_limit: the box's OOM-kill count went
-- up since sbx last looked.
function M.oom_killed(h)
  local dir = h.memory_dir
  if not dir then return false end
  local text = read_file(dir .. (h.cgv == 2 and "/memory.events" or "/memory.oom_control")) or ""
  local n = tonumber(text:match("oom_kill (%d+)")) or 0
  local seen = h.oom_kills or 0
  h.oom_kills = n
  if n > seen then return true, h.memory_limit end
  return false
end

-- cpu_seconds(handle) -> seconds | nil: the CPU time of every process of
-- the box (its cpu cgroup: v2 cpu.stat usage_usec, v1 cpuacct.usage where
-- cpuacct shares the cpu hierarchy), for the budgets.
function M.cpu_seconds(h)
  local dir = h.cpu_dir
  if not dir then return nil end
  if h.cgv == 2 then
    local us = tonumber(((read_file(dir .. "/cpu.stat") or ""):match("usage_usec (%d+)")))
    return us and us / 1e6
  end
  local ns = tonumber(((read_file(dir .. "/cpuacct.usage") or ""):match("%d+")))
  return ns and ns / 1e9
end

-- oom_check(handle, job): the agent transport asks after a command ended
-- with SIGKILL's status.
function M.oom_check(h, job)
  job.oom_killed, job.memory_limit = M.oom_killed(h)
end

M.make_cgroups = make_cgroups
M.remove_cgroups = remove_cgroups
M.write_limits = write_limits

return M

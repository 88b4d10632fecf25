-- The local backend's isolation: how each option of sbx.limits is held
-- here (capabilities, sizes, tmpfs mounts).
local core = require "sbx.core"
local S = core.sandbox
local sbx_config = require "sbx.config"
local function lpol(pol) return (pol or sbx_config.policy)["local"] end
local host = require "sbx.backends.local.host"
local RLIMITS = host.RLIMITS
local disk_layer = host.disk_layer
local get_facts = host.get_facts

local M = {}

-- Isolation ---------------------------------------------------------------------------

local function cap_name(c) return (tostring(c):upper():gsub("^CAP_", "")) end

-- The capabilities root in the box holds: the policy's set - cap_drop + cap_add.
local function capabilities(spec, pol)
  local set, order = {}, {}
  local function add(c) c = cap_name(c) if not set[c] then set[c] = true order[#order + 1] = c end end
  for _, c in ipairs(lpol(pol).capabilities) do add(c) end
  for _, c in ipairs(spec.cap_drop or {}) do
    c = cap_name(c)
    if c == "ALL" then set = {} else set[c] = nil end
  end
  for _, c in ipairs(spec.cap_add or {}) do add(c) end
  local out = {}
  for _, c in ipairs(order) do if set[c] then out[#out + 1] = c end end
  return out
end

-- A size with an optional k, m or g suffix (as Docker's tmpfs options), or nil.
local function parse_size(v)
  local n, unit = tostring(v):lower():match("^(%d+)([kmg]?)b?$")
  if not n then return nil end
  return math.tointeger(tonumber(n) * ({ [""] = 1, k = 1024, m = 1024 ^ 2, g = 1024 ^ 3 })[unit])
end

-- A tmpfs option string ("rw,size=64m,mode=1777") as { size, mode, ro } or nil, why.
local function parse_tmpfs(opts)
  local out = {}
  for o in tostring(opts):gmatch("[^,]+") do
    local k, v = o:match("^([%w_]+)=?(.*)$")
    if k == "size" then
      out.size = parse_size(v)
      if not out.size then return nil, "size " .. v .. " is not bytes (k, m, g suffixes)" end
    elseif k == "mode" then
      out.mode = v:match("^[0-7]+$") and v
      if not out.mode then return nil, "mode " .. v .. " is not octal" end
    elseif k == "ro" then out.ro = true
    elseif k ~= "rw" and k ~= "nosuid" and k ~= "nodev" then
      return nil, "bubblewrap's tmpfs takes size, mode, rw and ro (always nosuid, nodev), not " .. o
    end
  end
  return out
end

-- limits(spec, pol): what this backend enforces for spec, and how (sbx.limits).
function M.limits(spec, pol)
  local f = get_facts(pol)
  local cg = f.cgroups
  local out = {}
  local cgnote = cg.version and string.format("cgroup v%d", cg.version)
  if cg.memory then
    out.memory = { enforced = "cgroup", note = cgnote .. (cg.version == 2 and " memory.max, memory.swap.max = 0"
      or " memory.limit_in_bytes (and memsw where swap is counted); the OOM killer ends the box's largest process") }
  else
    out.memory = { enforced = "rlimit", note = "RLIMIT_DATA on every process of the box: each process's private " ..
      "writable memory, not the box's total (" .. tostring(cg.why) .. ")" }
  end
  if cg.pids then
    out.pids = { enforced = "cgroup", note = cgnote .. " pids.max" }
  else
    out.pids = { enforced = "rlimit", note = "RLIMIT_NPROC, counted per user in the box's own user namespace: the box's " ..
      "processes of one user at most (" .. tostring(cg.why) .. ")" }
  end
  if cg.cpu then
    out.cpus = { enforced = "cgroup", note = cgnote .. (cg.version == 2 and " cpu.max" or " cpu.cfs_quota_us") }
  else
    out.cpus = { enforced = false, note = "no cgroup with the cpu controller that sbx may write; no rlimit caps a rate " ..
      "(" .. tostring(cg.why or "cpu controller missing") .. ")" }
  end
  local on_disk, why_not = disk_layer(pol, { host = spec.image == "host" })
  if on_disk then
    out.disk = { enforced = "watched", note = string.format("the box's writable layer is a directory on the host's " ..
      "disk; sbx measures it every %g s (policy.local.disk_poll) and stops the box past the limit " ..
      "(disk_exceeded); a fast writer gets further before that", lpol(pol).disk_poll) }
  else
    out.disk = { enforced = "kernel", note = "the box's writable layer is a tmpfs of this size (its pages are host memory" ..
      (cg.memory and ", counted against the box's memory limit)" or "; no memory cgroup counts them" ..
      (why_not and (": not on disk because " .. why_not) or "") .. ")") }
  end
  -- disk = false asks nothing: the tmpfs then has the kernel's default
  -- size, half the host's memory.
  if spec.network == "none" then
    out.network = { enforced = "kernel", note = "a network namespace of its own, only loopback" }
  elseif spec.network == "host" then
    out.network = { enforced = "kernel", note = "the host's network namespace, shared" }
  else
    out.network = { enforced = false, note = string.format("the local backend offers network \"none\" and \"host\", not %q",
      tostring(spec.network)) }
  end
  out.read_only = { enforced = "kernel", note = "the root is remounted read-only (bubblewrap --remount-ro)" }
  out.cap_drop = { enforced = "kernel", note = "the capability sets of the box's processes; capabilities count in the " ..
    "box's user namespace only" }
  out.cap_add = { enforced = "kernel", note = "added to policy.local.capabilities, in the box's user namespace only" }
  out.no_new_privileges = { enforced = "kernel", note = "bubblewrap always sets no_new_privs" }
  out.init = { enforced = "kernel", note = "sbx-agent is PID 1 of the box's PID namespace and reaps every orphan" }
  out.ulimits = { enforced = "rlimit", note = "set by sbx-launch before bubblewrap" }
  -- A limit above sbx's own hard limit cannot be set without
  -- CAP_SYS_RESOURCE in the host's user namespace (even root may lack it).
  for name, v in pairs(spec.ulimits or {}) do
    local res, hard = RLIMITS[name], nil
    if res then hard = select(2, S.rlimit(res)) end
    if not res then
      out.ulimits = { enforced = false, note = "no rlimit is named " .. tostring(name) }
    elseif hard and v > hard then
      out.ulimits = { enforced = false, note = string.format("%s = %d is above sbx's own hard limit (%s)", name, v,
        tostring(hard)) }
    end
  end
  local bad
  for path, o in pairs(spec.tmpfs or {}) do
    local _, why = parse_tmpfs(o)
    if why then bad = path .. ": " .. why end
  end
  out.tmpfs = bad and { enforced = false, note = bad }
    or { enforced = "kernel", note = "bubblewrap's tmpfs mounts (their pages count against memory)" }
  return out
end

M.capabilities = capabilities
M.parse_tmpfs = parse_tmpfs

return M

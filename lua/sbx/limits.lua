-- Isolation limits: what a box asked for, and what its backend enforces.
--
-- The rule, the same for every backend:
--   * an isolation option set explicitly that the backend cannot enforce is
--     refused: sbx.box returns nil, message, "unsupported";
--   * a built-in default that the backend cannot enforce is applied as
--     closely as the platform allows, and box.limits says so;
--   * policy.box.strict_limits = true (or the box option) refuses such
--     defaults too.
-- "Explicit" means given in the sbx.box{} options, or set by a policy
-- overlay (sbx.use_policy, --policy, SBX_POLICY, a box's policy = overlay)
-- to a value other than the built-in default: require "sbx.policy" is the
-- pristine default table, sbx.policy and box:policy() the merged ones. A
-- policy that repeats a default has not asked for anything new.
--
-- Every box reports what it got in box.limits, one entry per option of
-- OPTIONS:
--   { requested = value, enforced = kind | false, note = text }
-- kind says who holds the limit:
--   "daemon"    the container engine sets it up (cgroups, capabilities,
--               mounts, a storage quota);
--   "cgroup", "rlimit"  sbx itself, for daemon-free backends;
--   "kernel"    sbx sets it up itself and the kernel holds it: a
--               namespace, a mount (a sized tmpfs), the capability sets,
--               a seccomp filter (daemon-free backends: local);
--   "platform"  the cloud service (Fargate's task definition and size);
--   "cluster"   an orchestrator (admission, quotas, network policy);
--   "watched"   sbx measures and stops the box past the limit: a soft
--               limit, which a fast writer overshoots (the note says how);
--   false       not enforced.
--
-- Backends declare what they support: backend.limits(spec, pol) returns
-- option -> { enforced = kind | false, note = text } for this spec (it may
-- ask its daemon); an option left out is not enforced. create() may add
-- handle.limits, entries that replace the declared ones once the daemon has
-- answered (Docker: a storage quota the daemon refused becomes "watched").
-- A backend without limits() (replay) is never refused: its box reports
-- handle.limits, or false.
local M = {}

-- The isolation options, in the order they are reported and refused.
M.OPTIONS = {
  "memory", "cpus", "pids", "disk", "network", "read_only",
  "cap_drop", "cap_add", "no_new_privileges", "init", "ulimits", "tmpfs",
}

M.KINDS = { daemon = true, cgroup = true, rlimit = true, kernel = true, platform = true, cluster = true, watched = true }

-- Does value v ask anything of the backend? A limit of false, a flag left
-- off, an empty list or map asks nothing and is never refused; a network
-- always asks (for none, or for a network).
local function asks(name, v)
  if v == nil or v == false then return false end
  if type(v) == "table" then return next(v) ~= nil end
  if name == "read_only" or name == "no_new_privileges" or name == "init" then return v == true end
  return true
end
M.asks = asks

local function same(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

local function copy(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = copy(x) end
  return c
end

-- Where an option's value came from: "box options", "policy" (an overlay
-- changed the built-in default), or nil (the built-in default).
function M.source(name, opts, pol)
  if opts[name] ~= nil then return "box options" end
  if not same(pol.box[name], require("sbx.policy").box[name]) then return "policy" end
  return nil
end

-- A value as Lua source, short.
local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) ~= "table" then return tostring(v) end
  local parts = {}
  if #v > 0 then
    for _, x in ipairs(v) do parts[#parts + 1] = show(x) end
  else
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    for _, k in ipairs(keys) do parts[#parts + 1] = string.format("[%q] = %s", k, show(v[k])) end
  end
  return "{ " .. table.concat(parts, ", ") .. " }"
end
M.show = show

-- resolve(backend, spec, opts, pol) -> limits | false | nil, message,
-- "unsupported". spec is the merged box spec, opts what sbx.box{} was
-- given, pol the box's policy. false: the backend declares nothing (replay).
function M.resolve(backend, spec, opts, pol)
  if not backend.limits then return false end
  local declared = backend.limits(spec, pol) or {}
  local strict = spec.strict_limits
  local out, refused = {}, {}
  for _, name in ipairs(M.OPTIONS) do
    local v = spec[name]
    local d = declared[name] or {}
    if d.enforced and not M.KINDS[d.enforced] then
      error(string.format("backend %s declares %s enforced by %q, which is not a kind of enforcement",
        tostring(spec.backend), name, tostring(d.enforced)), 0)
    end
    local e = { requested = copy(v), enforced = d.enforced or false, note = d.note }
    if not asks(name, v) then
      e.enforced, e.note = false, "nothing requested"
    elseif not e.enforced then
      local from = M.source(name, opts, pol)
      if from or strict then
        refused[#refused + 1] = string.format("%s = %s (%s): %s", name, show(v),
          from or "a default, refused by policy.box.strict_limits", d.note or "not supported")
      else
        e.note = (d.note and d.note .. "; " or "") .. "a default, applied as closely as the backend allows"
      end
    end
    out[name] = e
  end
  if #refused > 0 then
    return nil, string.format("the %s backend cannot enforce %s", tostring(spec.backend),
      table.concat(refused, "; ")), "unsupported"
  end
  return out
end

-- The declared limits with what create learned (handle.limits) over them.
function M.merge(limits, learned)
  if not learned then return limits end
  if not limits then return learned end
  for name, e in pairs(learned) do
    local cur = limits[name] or {}
    limits[name] = { requested = cur.requested, enforced = e.enforced or false, note = e.note or cur.note,
      check = e.check or cur.check }
  end
  return limits
end

return M

-- The Kubernetes backend's reaper: the pods of owners that are gone.
local core = require "sbx.core"
local owner = require "sbx.owner"
local clients = require "sbx.backends.kubernetes.clients"
local delete = clients.delete
local get_client = clients.get_client
local kspec = clients.kspec
local ns_path = clients.ns_path

local M = {}

-- Reaper ------------------------------------------------------------------------------------------

-- reap(opts) -> { removed = {...}, kept = n } | nil, message, code: removes
-- sbx pods (label sbx=1) of the namespace whose owner process is gone (same
-- host), whose deadline has passed, or that ended (activeDeadlineSeconds),
-- and every sbx NetworkPolicy whose pod is gone. opts: context, namespace,
-- kubeconfig, all, dry_run.
function M.reap(opts)
  opts = opts or {}
  local k = kspec { context = opts.context, namespace = opts.namespace, kubeconfig = opts.kubeconfig }
  local c, err, code = get_client(k)
  if not c then return nil, err, code end
  local st, list, lcode = c:call("GET", ns_path(c, "pods"), { query = { labelSelector = "sbx=1" } })
  if not st then return nil, list, lcode end
  local live, tasks = {}, {}
  local now = os.time()
  -- What sbx wrote on a pod or a policy: its annotations, then its labels.
  local function tags_of(meta)
    local tags = {}
    for key, v in pairs(meta.annotations or {}) do tags[key] = v end
    for key, v in pairs(meta.labels or {}) do tags[key] = tags[key] or v end
    return tags
  end
  local report = owner.reap_each(type(list) == "table" and list.items or {}, opts, {
    reason = function(p)
      local meta = p.metadata or {}
      local phase = p.status and p.status.phase
      local dead = owner.reap_reason(tags_of(meta), opts, now)
      if not dead and (phase == "Failed" or phase == "Succeeded") then
        dead = "ended (" .. tostring(p.status.reason or phase) .. ")"
      end
      if not dead then live[meta.name] = true end
      return dead or nil
    end,
    name = function(p) return (p.metadata or {}).uid, (p.metadata or {}).name end,
    remove = function(p)
      delete(c, "pods", p.metadata.name)
      delete(c, "networkpolicies", p.metadata.name)
    end,
  })
  local pst, pols = c:call("GET", ns_path(c, "networkpolicies"), { query = { labelSelector = "sbx=1" } })
  for _, np in ipairs(pst and type(pols) == "table" and pols.items or {}) do
    local meta = np.metadata or {}
    local name = meta.name
    local listed = false
    for _, r in ipairs(report.removed) do if r.name == name then listed = true end end
    -- A policy is made before its pod: only its own owner's end frees it.
    local dead = name and not live[name] and not listed and owner.reap_reason(tags_of(meta), opts, now)
    if dead then
      report.removed[#report.removed + 1] = { id = meta.uid, name = name, reason = "NetworkPolicy: " .. dead }
      if not opts.dry_run then tasks[#tasks + 1] = core.spawn(delete, c, "networkpolicies", name) end
    end
  end
  for _, t in ipairs(tasks) do t:join() end
  return report
end

return M

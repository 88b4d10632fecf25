-- The Kubernetes backend's lifecycle: create, destroy, restart.
local sbx_config = require "sbx.config"
local core = require "sbx.core"
local clients = require "sbx.backends.kubernetes.clients"
local isolation = require "sbx.backends.kubernetes.isolation"
local netcheck = require "sbx.backends.kubernetes.netcheck"
local readiness = require "sbx.backends.kubernetes.readiness"
local reap = require "sbx.backends.kubernetes.reap"
local delete = clients.delete
local get_client = clients.get_client
local kspec = clients.kspec
local ns_path = clients.ns_path
local netpol_body = isolation.netpol_body
local pod_body = isolation.pod_body
local join_watch = readiness.join_watch
local leave_watch = readiness.leave_watch
local wait_ready = readiness.wait_ready

local M = {}

-- Lifecycle ------------------------------------------------------------------------------------

local reaped_once = false

local function random_name(prefix)
  return prefix .. assert(core.random.hex(6))
end

-- create(spec, policy) -> handle | nil, message, code
function M.create(spec, pol)
  local k = kspec(spec, pol)
  local c, err, code = get_client(k)
  if not c then return nil, err, code end
  if spec.reap_on_start and not reaped_once then
    reaped_once = true
    core.spawn(function() pcall(reap.reap, { quiet = true, context = k.context, namespace = k.namespace,
      kubeconfig = k.kubeconfig }, pol) end)
  end
  local name = random_name(k.name_prefix)
  local h = { id = name, name = name, client = c, k = k, streams = {}, namespace = c.namespace }
  local deadline = core.now() + k.start_timeout
  local w
  local ok, res, rerr, rcode = pcall(function()
    if k.network == "none" then
      local st, perr, pcode = c:call("POST", ns_path(c, "networkpolicies"), { body = netpol_body(k, name) })
      -- (already_exists: a retried create whose first attempt went through)
      if not st and pcode ~= "already_exists" then
        return nil, "cannot create the NetworkPolicy that keeps the box off the network: " .. tostring(perr), pcode
      end
      h.netpol = true
    end
    w = join_watch(c, name, k)
    local st, pod, pcode = c:call("POST", ns_path(c, "pods"), { body = pod_body(k, name) })
    if not st then
      if pcode == "already_exists" then
        -- A retried create whose first attempt went through.
        st, pod, pcode = c:call("GET", ns_path(c, "pods", name))
      end
      if not st then return nil, "cannot create the pod: " .. tostring(pod), pcode end
    end
    h.created = true
    local s, m, cd = readiness.pod_state(pod, k)
    if s == false then return nil, m, cd end
    if s ~= "ready" then
      local rok, rerr2, rcode2 = wait_ready(c, w, k, deadline)
      if not rok then return nil, rerr2, rcode2 end
    end
    if k.network == "none" and k.network_check then return netcheck.network_check(h, w and w.last or pod) end
    return true
  end)
  if w and not w.result then leave_watch(c, w) end
  if not ok or not res then
    -- Interrupted, cancelled or failed: nothing of the box stays.
    pcall(M.destroy, h, false, core.now() + (sbx_config.policy.box.destroy_timeout or 10))
    if not ok then error(res, 0) end
    return nil, rerr, rcode
  end
  return h
end

-- destroy(handle, detached, deadline): deletes the pod (gracePeriodSeconds
-- 0) and its NetworkPolicy; nothing waits for the container to go.
function M.destroy(h, detached, deadline)
  if h.destroyed then return true end
  h.destroyed = true
  for s in pairs(h.streams) do pcall(s.close, s) end
  local c = h.client
  local function go()
    local timeout = deadline and math.max(0.5, deadline - core.now()) or nil
    local st, err, code = true, nil, nil
    if h.created ~= false then st, err, code = delete(c, "pods", h.name, timeout) end
    if h.netpol then delete(c, "networkpolicies", h.name, timeout) end
    if not st then return nil, err, code end
    return true
  end
  if detached then core.spawn(go) return true end
  return go()
end

function M.restart()
  return nil, "a pod cannot be restarted in place (restartPolicy Never); close the box and create a new one", "unsupported"
end

return M

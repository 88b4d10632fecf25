-- The Kubernetes backend: a box is a pod whose one container sleeps for the
-- box's lifetime; commands run through the pods/exec subresource on a
-- websocket (one stream per command on the exec transport, one stream for
-- sbx-agent on the agent transport). The box contract is box.lua's;
-- protocol notes with their sources are in docs/kubernetes.md.
--
-- The pod: restartPolicy Never; activeDeadlineSeconds = the box's lifetime
-- (an orphan ends by itself, and so does its sleep); the owner labels and
-- annotations Docker boxes carry; resources from the box's memory, cpus
-- and disk (limits, and requests as policy.kubernetes.requests says);
-- automountServiceAccountToken false (a box never holds cluster
-- credentials); a hardened securityContext (allowPrivilegeEscalation
-- false, the box's capabilities dropped and added, RuntimeDefault
-- seccomp); runtimeClassName, nodeSelector, tolerations and
-- imagePullSecrets from policy; terminationGracePeriodSeconds 0 and a
-- delete with gracePeriodSeconds=0, so a close is immediate.
--
-- network = "none" is a NetworkPolicy that selects the pod and allows
-- nothing in and nothing out, made before the pod; the cluster's network
-- plugin enforces it (box.limits.network says so).
local M = {}

local sbx_config = require "sbx.config"
local core = require "sbx.core"
local util = require "sbx.util"
local json = core.json
local http = require "sbx.http"
local owner = require "sbx.owner"
local config = require "sbx.kubernetes.config"
local client_mod = require "sbx.kubernetes.client"
local start_check = require "sbx.transports.start_check"

local function pol_k() return sbx_config.policy.kubernetes end

-- Box options only this backend takes: every policy.kubernetes knob.
function M.options(check) return check.section_rules("kubernetes") end

-- policy.kubernetes of pol (the box's policy, its overlay included;
-- default the live one) with the box's options over it, key by key.
local function kspec(spec, pol)
  local base = pol and pol.kubernetes or pol_k()
  local k = {}
  for key, v in pairs(base) do k[key] = v end
  for key, v in pairs(spec or {}) do if base[key] ~= nil or k[key] == nil then k[key] = v end end
  return k
end

-- Clients, one per configuration ---------------------------------------------------------

local clients = {}

local function get_client(k)
  local key = table.concat({ tostring(k.kubeconfig), tostring(k.context), tostring(k.namespace),
    tostring(k.in_cluster), os.getenv("KUBECONFIG") or "" }, "|")
  local c = clients[key]
  if c then return c end
  local conn, err, code = config.resolve(k)
  if not conn then return nil, err, code end
  c = client_mod.new(conn, k)
  c.namespace = conn.namespace
  clients[key] = c
  return c
end
M.client = get_client

local function ns_path(c, kind, name)
  local base = kind == "networkpolicies"
    and "/apis/networking.k8s.io/v1/namespaces/" .. http.escape(c.namespace) .. "/networkpolicies"
    or "/api/v1/namespaces/" .. http.escape(c.namespace) .. "/pods"
  return name and (base .. "/" .. http.escape(name)) or base
end

-- Isolation -------------------------------------------------------------------------------
-- What a pod spec can hold (sbx.limits has the rule for the rest):
-- memory, cpu and ephemeral-storage limits, the container's
-- securityContext (readOnlyRootFilesystem, capabilities,
-- allowPrivilegeEscalation), tmpfs as emptyDir volumes in memory, and a
-- NetworkPolicy. Not there: a pids limit (the kubelet's podPidsLimit is
-- node configuration), ulimits, an init process.


local function quantity_bytes(n) return string.format("%d", math.floor(n)) end
local function quantity_cpu(n) return string.format("%dm", math.max(1, math.floor(n * 1000 + 0.5))) end

function M.limits(spec)
  local out = {
    memory = { enforced = "cluster", note = "the container's memory limit (resources.limits.memory): the kubelet's cgroup, OOM-killed past it" },
    cpus = { enforced = "cluster", note = "the container's CPU limit (resources.limits.cpu): a CFS quota" },
    pids = { enforced = false, note = "a pod spec has no pids limit; only the kubelet's podPidsLimit (node configuration) caps a fork bomb" },
    disk = { enforced = "cluster", note = "resources.limits.ephemeral-storage: the kubelet evicts the pod past it (it measures periodically, so a fast writer gets further first)" },
    read_only = { enforced = "cluster", note = "securityContext.readOnlyRootFilesystem" },
    cap_drop = { enforced = "cluster", note = "securityContext.capabilities.drop" },
    cap_add = { enforced = "cluster", note = "securityContext.capabilities.add (admission, such as Pod Security, may refuse the pod)" },
    no_new_privileges = { enforced = "cluster", note = "securityContext.allowPrivilegeEscalation = false" },
    init = { enforced = false, note = "a pod has no init option: PID 1 is the box's sleep, which reaps no zombies (the agent transport reaps its commands' own)" },
    ulimits = { enforced = false, note = "a pod spec has no ulimits; the container runtime's defaults apply" },
    tmpfs = { enforced = "cluster", note = "emptyDir volumes with medium Memory (they count against the memory limit)" },
  }
  local net = spec.network
  if net == "none" then
    out.network = { enforced = "cluster", note = "a NetworkPolicy that selects the pod and allows no ingress and no egress; " ..
      "the cluster's network plugin enforces it (a plugin without NetworkPolicy support, such as plain flannel, does not)" }
  elseif net == "bridge" then
    out.network = { enforced = "cluster", note = "the pod network, as the cluster's policies allow" }
  else
    out.network = { enforced = false, note = string.format("pods use the cluster's pod network; there is no Docker network %q", tostring(net)) }
  end
  return out
end

local function cap_name(c) return (tostring(c):upper():gsub("^CAP_", "")) end

-- tmpfs { ["/tmp"] = "rw,size=64m" } -> volumes, volumeMounts.
local function tmpfs_volumes(tmpfs)
  local vols, mounts = {}, {}
  local paths = {}
  for p in pairs(tmpfs or {}) do paths[#paths + 1] = p end
  table.sort(paths)
  for i, p in ipairs(paths) do
    local opts = tostring(tmpfs[p])
    local size = opts:match("size=(%w+)")
    local ed = { medium = "Memory" }
    if size then
      local n, unit = size:match("^(%d+)([kmgKMG]?)$")
      if n then ed.sizeLimit = n .. ({ k = "Ki", m = "Mi", g = "Gi", K = "Ki", M = "Mi", G = "Gi" })[unit] or n end
    end
    vols[#vols + 1] = { name = "tmpfs-" .. i, emptyDir = ed }
    mounts[#mounts + 1] = { name = "tmpfs-" .. i, mountPath = p, readOnly = opts:find("ro", 1, true) == 1 or nil }
  end
  return vols, mounts
end

-- Labels must be valid label values (63 characters of [A-Za-z0-9_.-]); the
-- same fields always go into annotations too.
local function label_value(v)
  v = tostring(v)
  if v == "" or (#v <= 63 and v:match("^%w[%w_.%-]*$") and v:match("%w$")) then return v end
  return nil
end

local PULL = { missing = "IfNotPresent", always = "Always", never = "Never" }

local function pod_body(k, name)
  local tags = owner.labels(k.lifetime, k.labels)
  local labels, annotations = { ["sbx.box"] = name }, {}
  for key, v in pairs(tags) do
    annotations[key] = tostring(v)
    labels[key] = label_value(v)
  end
  for key, v in pairs(k.annotations or {}) do annotations[key] = tostring(v) end
  local limits = {}
  if k.memory then limits.memory = quantity_bytes(k.memory) end
  if k.cpus then limits.cpu = quantity_cpu(k.cpus) end
  if k.disk then limits["ephemeral-storage"] = quantity_bytes(k.disk) end
  local requests = {}
  if k.requests then
    for key, v in pairs(k.requests) do requests[key] = tostring(v) end
  else
    -- A fraction of each limit (policy.kubernetes.request_fraction).
    local f = k.request_fraction or 1
    if k.memory then requests.memory = quantity_bytes(k.memory * f) end
    if k.cpus then requests.cpu = quantity_cpu(k.cpus * f) end
    if k.disk then requests["ephemeral-storage"] = quantity_bytes(k.disk * f) end
  end
  local env = {}
  for key, v in pairs(k.env or {}) do env[#env + 1] = { name = tostring(key), value = tostring(v) } end
  table.sort(env, function(a, b) return a.name < b.name end)
  local drop, add = {}, {}
  for _, c in ipairs(k.cap_drop or {}) do drop[#drop + 1] = cap_name(c) end
  for _, c in ipairs(k.cap_add or {}) do add[#add + 1] = cap_name(c) end
  local vols, mounts = tmpfs_volumes(k.tmpfs)
  local container = {
    name = k.container, image = k.image,
    command = json.array { "sleep", tostring(math.floor(k.lifetime)) },
    workingDir = k.workdir, env = json.array(env),
    resources = { limits = json.object(limits), requests = json.object(requests) },
    securityContext = {
      allowPrivilegeEscalation = not k.no_new_privileges and true or false,
      privileged = false,
      readOnlyRootFilesystem = k.read_only and true or false,
      capabilities = { drop = json.array(drop), add = json.array(add) },
      runAsUser = k.run_as_user,
    },
    imagePullPolicy = k.image_pull_policy or PULL[k.pull] or "IfNotPresent",
    volumeMounts = #mounts > 0 and json.array(mounts) or nil,
    stdin = false, tty = false,
  }
  local pull_secrets
  if k.image_pull_secrets then
    pull_secrets = {}
    for _, s in ipairs(k.image_pull_secrets) do pull_secrets[#pull_secrets + 1] = { name = s } end
    pull_secrets = json.array(pull_secrets)
  end
  return {
    apiVersion = "v1", kind = "Pod",
    metadata = { name = name, namespace = nil, labels = labels, annotations = annotations },
    spec = {
      restartPolicy = "Never",
      activeDeadlineSeconds = math.max(1, math.floor(k.lifetime)),
      terminationGracePeriodSeconds = 0,
      automountServiceAccountToken = false,
      enableServiceLinks = false,
      serviceAccountName = k.service_account,
      runtimeClassName = k.runtime_class,
      nodeSelector = k.node_selector,
      tolerations = k.tolerations and json.array(k.tolerations) or nil,
      imagePullSecrets = pull_secrets,
      securityContext = { seccompProfile = { type = "RuntimeDefault" } },
      volumes = #vols > 0 and json.array(vols) or nil,
      containers = json.array { container },
    },
  }
end
M.pod_body = pod_body

local function netpol_body(k, name)
  local labels, annotations = { ["sbx.box"] = name }, {}
  for key, v in pairs(owner.labels(k.lifetime)) do
    annotations[key] = tostring(v)
    labels[key] = label_value(v)
  end
  return {
    apiVersion = "networking.k8s.io/v1", kind = "NetworkPolicy",
    metadata = { name = name, labels = labels, annotations = annotations },
    spec = {
      podSelector = { matchLabels = { ["sbx.box"] = name } },
      policyTypes = json.array { "Ingress", "Egress" },
      ingress = json.array {}, egress = json.array {},
    },
  }
end

-- Readiness ------------------------------------------------------------------------------------

local PULL_REASONS = { ErrImagePull = true, ImagePullBackOff = true, InvalidImageName = true, ErrImageNeverPull = true }
local FATAL_REASONS = { CreateContainerConfigError = true, CreateContainerError = true, RunContainerError = true,
  CrashLoopBackOff = true }

-- Whether a scheduler message says "full for now" (policy.kubernetes.wait_unschedulable).
local function transient_unschedulable(msg, k)
  for _, pat in ipairs(k.wait_unschedulable or {}) do
    if tostring(msg):find(pat, 1, true) then return true end
  end
  return false
end

-- What a pod's state means for a waiting box: "ready" | nil, what it waits
-- for (or nil) | false, message, code.
function M.pod_state(pod, k)
  local st = type(pod) == "table" and pod.status or {}
  st = type(st) == "table" and st or {}
  if st.phase == "Failed" or st.phase == "Succeeded" then
    return false, string.format("the pod %s: %s%s", st.phase == "Failed" and "failed" or "ended",
      tostring(st.reason or "no reason given"), st.message and (": " .. st.message) or ""), "pod_failed"
  end
  for _, cs in ipairs(type(st.containerStatuses) == "table" and st.containerStatuses or {}) do
    local w = type(cs.state) == "table" and cs.state.waiting
    if type(w) == "table" and w.reason then
      if PULL_REASONS[w.reason] then
        return false, string.format("the pod cannot pull its image: %s%s", w.reason,
          w.message and (": " .. w.message) or ""), "image_unavailable"
      elseif FATAL_REASONS[w.reason] then
        return false, string.format("the pod's container cannot start: %s%s", w.reason,
          w.message and (": " .. w.message) or ""), "pod_failed"
      end
    end
    local t = type(cs.state) == "table" and cs.state.terminated
    if type(t) == "table" then
      return false, string.format("the pod's container ended: %s (exit %s)", tostring(t.reason), tostring(t.exitCode)), "pod_failed"
    end
  end
  local waiting_for
  for _, c in ipairs(type(st.conditions) == "table" and st.conditions or {}) do
    if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" then
      if k.fail_unschedulable and not transient_unschedulable(c.message, k) then
        return false, "the pod cannot be scheduled: Unschedulable: " .. tostring(c.message), "unschedulable"
      end
      waiting_for = "a node with room (the scheduler: " .. tostring(c.message) .. ")"
    end
  end
  if st.phase == "Running" then
    for _, cs in ipairs(type(st.containerStatuses) == "table" and st.containerStatuses or {}) do
      if type(cs.state) == "table" and cs.state.running then return "ready" end
    end
  end
  return nil, waiting_for
end

-- Waiting for pods: one watch per client (cluster and namespace) for every
-- box of this process that waits, as the Fargate backend has one poller:
-- a hundred boxes starting at once cost the API server one watch, not a
-- hundred. The watch selects this process's pods (label sbx.owner.pid) and
-- starts without a resourceVersion (the current state as ADDED events,
-- then every change); a watch that ends or breaks goes on from the last
-- resourceVersion seen, one that expired (410) starts over. A box joins
-- before its pod is posted, so no event of its pod can be missed.

local watchers = {}              -- client -> { waiting = name -> waiter, task }

local function settle(wt, w, ok, msg, code)
  if w.result then return end
  w.result = { ok, msg, code }
  wt.waiting[w.name] = nil
  w.done:set()
end

-- Why a running box's pod is gone (deleted, being deleted, ended: the
-- lifetime, an eviction), or nil while it runs.
function M.gone_reason(pod)
  if type(pod) ~= "table" then return nil end
  local meta = type(pod.metadata) == "table" and pod.metadata or {}
  local st = type(pod.status) == "table" and pod.status or {}
  if meta.deletionTimestamp then return "the box's pod is being deleted (since " .. tostring(meta.deletionTimestamp) .. ")" end
  if st.phase == "Failed" or st.phase == "Succeeded" then
    local why = st.reason == "DeadlineExceeded" and "it reached its lifetime (activeDeadlineSeconds)"
      or st.reason == "Evicted" and "it was evicted" or tostring(st.reason or st.phase)
    return string.format("the box's pod ended: %s%s", why, st.message and (": " .. st.message) or "")
  end
  for _, cs in ipairs(type(st.containerStatuses) == "table" and st.containerStatuses or {}) do
    local t = type(cs.state) == "table" and cs.state.terminated
    if type(t) == "table" then
      return string.format("the box's container ended: %s (exit %s)", tostring(t.reason), tostring(t.exitCode))
    end
  end
  return nil
end

-- A box whose pod is gone: every command after this is box_gone, and its
-- open exec streams (running commands, the agent's channel) are cut.
local function mark_gone(h, why)
  if h.gone or h.destroyed then return end
  h.gone = why
  for ex in pairs(h.streams) do pcall(ex.close, ex) end
end
M.mark_gone = mark_gone

local function watch_loop(c, wt)
  local rv
  local selector = "sbx.owner.pid=" .. owner.identity().pid
  while next(wt.waiting) do
    local res, _, code = c:watch(ns_path(c, "pods"), {
      labelSelector = selector, resourceVersion = rv, allowWatchBookmarks = "true",
      timeoutSeconds = c.pol.watch_timeout,
    }, function(etype, obj)
      local meta = type(obj) == "table" and type(obj.metadata) == "table" and obj.metadata or {}
      rv = meta.resourceVersion or rv
      local w = meta.name and wt.waiting[meta.name]
      if w and etype == "DELETED" then
        settle(wt, w, false, "the pod was deleted before it ran", "pod_failed")
      elseif w and etype ~= "BOOKMARK" then
        w.last = obj
        local s, m, cd = M.pod_state(obj, w.k)
        if s ~= nil then
          settle(wt, w, s == "ready", m, cd)
        elseif m ~= w.waiting_for then
          w.waiting_for = m
          if m and w.k.on_wait then pcall(w.k.on_wait, meta.name, m) end
        end
      end
      if not next(wt.waiting) then return false end
    end)
    if not res then
      if code == "expired" then rv = nil end
      if next(wt.waiting) then core.sleep(0.1) end
    end
  end
end

local function watcher_of(c)
  local wt = watchers[c]
  if not wt then
    wt = { waiting = {} }
    watchers[c] = wt
  end
  return wt
end

local function ensure_task(c, wt)
  if wt.task then return end
  wt.task = core.spawn(function()
    pcall(watch_loop, c, wt)
    wt.task = nil
    -- Boxes that joined while the loop was ending get a new loop.
    if next(wt.waiting) then ensure_task(c, wt) end
  end)
end

local function join_watch(c, name, k)
  local wt = watcher_of(c)
  local w = { name = name, k = k, done = core.event() }
  wt.waiting[name] = w
  ensure_task(c, wt)
  return w
end

local function stop_if_idle(wt)
  if not next(wt.waiting) and wt.task then
    local t = wt.task
    wt.task = nil
    t:cancel()
  end
end

local function leave_watch(c, w)
  local wt = watchers[c]
  if not wt then return end
  wt.waiting[w.name] = nil
  stop_if_idle(wt)
end

-- Looks at a box's pod after an exec stream failed or ended oddly: the
-- reason it is gone (h.gone is set), or nil (it runs, or it could not be
-- seen).
local function check_gone(h)
  if h.gone then return h.gone end
  if h.destroyed then return nil end
  local c = h.client
  local st, pod, code = c:call("GET", ns_path(c, "pods", h.name), { timeout = h.k.gone_check_timeout, retries = 1 })
  if not st then
    if code == "not_found" then mark_gone(h, "the box's pod was deleted") end
    return h.gone
  end
  local why = M.gone_reason(pod)
  if why then mark_gone(h, why) end
  return h.gone
end
M.check_gone = check_gone

-- A stream that ended oddly (cut, without an exit code, or with a
-- SIGKILL nobody sent) may be the pod's end seen before its status says so
-- (the kubelet kills the containers and posts the status about together):
-- look at the pod, and again every gone_poll seconds for gone_grace. No
-- task watches an idle box (one would keep `sbx run` from ending).
-- -> why it is gone | nil
local function gone_after_stream(h, expected)
  if h.destroyed then return nil end
  if check_gone(h) then return h.gone end
  if expected then return nil end
  local until_t = core.now() + h.k.gone_grace
  while not h.gone and not h.destroyed and core.now() < until_t do
    core.sleep(h.k.gone_poll)
    check_gone(h)
  end
  return h.gone
end

-- Waits for a joined pod until it runs, fails or the deadline: true | nil,
-- message, code.
local function wait_ready(c, w, k, deadline)
  if not w.done:wait(math.max(0.001, deadline - core.now())) then
    leave_watch(c, w)
    local st = type(w.last) == "table" and type(w.last.status) == "table" and w.last.status or {}
    local why = st.phase or "not seen yet"
    for _, cond in ipairs(type(st.conditions) == "table" and st.conditions or {}) do
      if cond.status == "False" and cond.reason then
        why = why .. ", " .. cond.type .. ": " .. cond.reason .. (cond.message and (" (" .. cond.message .. ")") or "")
      end
    end
    for _, cs in ipairs(type(st.containerStatuses) == "table" and st.containerStatuses or {}) do
      local wt = type(cs.state) == "table" and cs.state.waiting
      if type(wt) == "table" and wt.reason then why = why .. ", " .. wt.reason end
    end
    if w.waiting_for then
      return nil, string.format("the pod did not run within %gs (policy.kubernetes.start_timeout): it waited for %s",
        k.start_timeout, w.waiting_for), "unschedulable"
    end
    return nil, string.format("the pod did not run within %gs (policy.kubernetes.start_timeout; last: %s)",
      k.start_timeout, why), "timeout"
  end
  local ok, msg, code = table.unpack(w.result, 1, 3)
  if ok then return true end
  return nil, msg, code
end

-- The network check ------------------------------------------------------------------------------
-- network = "none" is a NetworkPolicy, and only a network plugin that
-- enforces policies makes it real (a plain CNI bridge or flannel ignores
-- it). So after the pod runs, the box itself tries to connect to the API
-- server's address (when the kubeconfig's is not a loopback one) and to
-- its node's kubelet port (status.hostIP); box.limits.network then says
-- "verified" or "not enforced by this cluster".

-- Tries every address at once; exits 0 and says which when a connection is
-- made, 1 when none is, 2 when the image has neither bash (/dev/tcp) nor nc
-- to try with.
local NET_PROBE = [[
t=$1; shift; how=
if command -v bash >/dev/null 2>&1 && command -v timeout >/dev/null 2>&1; then how=bash
elif command -v nc >/dev/null 2>&1 && command -v timeout >/dev/null 2>&1; then how=nc
else echo "no bash or nc in the box"; exit 2; fi
try() {
  if [ $how = bash ]; then
    timeout "$t" bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
  else
    case $(timeout "$t" nc -w "$t" "$1" "$2" -e sh -c 'echo SBX_NET_CONNECTED >&2' </dev/null 2>&1) in
      *SBX_NET_CONNECTED*) return 0;; esac
    return 1
  fi
}
pids=
for hp; do ( try "${hp%:*}" "${hp##*:}" ) & pids="$pids $!:$hp"; done
rc=1
for x in $pids; do wait "${x%%:*}" && { echo "connected to ${x#*:}"; rc=0; }; done
exit $rc]]

local function loopback(host)
  return host == "localhost" or host:match("^127%.") ~= nil or host == "::1" or host == "[::1]"
end

-- The addresses a box off the network must not reach: "host:port" list.
local function net_targets(h, pod)
  local out = {}
  local host, port = tostring(h.client.conn.server):match("^https?://([^/:]+):?(%d*)")
  if host and not loopback(host) then
    out[#out + 1] = host .. ":" .. (port ~= "" and port or "443")
  end
  local st = type(pod) == "table" and type(pod.status) == "table" and pod.status or {}
  local spec = type(pod) == "table" and type(pod.spec) == "table" and pod.spec or {}
  if type(st.hostIP) == "string" and not loopback(st.hostIP) and not st.hostIP:find(":", 1, true) then
    local kport = 10250
    if spec.nodeName then
      local ok, node = h.client:call("GET", "/api/v1/nodes/" .. http.escape(spec.nodeName), { retries = 1 })
      local ep = ok and type(node) == "table" and type(node.status) == "table" and node.status.daemonEndpoints
      if type(ep) == "table" and type(ep.kubeletEndpoint) == "table" and tonumber(ep.kubeletEndpoint.Port) then
        kport = math.tointeger(tonumber(ep.kubeletEndpoint.Port))
      end
    end
    out[#out + 1] = st.hostIP .. ":" .. kport
  end
  return out
end

-- Runs argv in the box's container over exec, no stdin: exit code, stdout | nil, message, code.
local function exec_simple(h, argv, timeout)
  local ex, err, code = h.client:exec(h.namespace, h.name, h.k.container, argv, { timeout = timeout })
  if not ex then return nil, err, code end
  local out, status = {}, nil
  local deadline = core.now() + timeout
  while true do
    local ch, data, rcode = ex:recv(math.max(0.001, deadline - core.now()))
    if not ch then
      ex:close()
      if rcode == "timeout" then return nil, "the check did not finish in time", "timeout" end
      break
    end
    if ch == 1 then out[#out + 1] = data elseif ch == 3 then status = data end
  end
  if not status then return nil, "the check's exec stream ended without an exit status", "exec_failed" end
  local rc, serr = client_mod.exit_status(status)
  if not rc then return nil, serr, "exec_failed" end
  return rc, table.concat(out)
end

-- M.network_check(h, pod) -> true | nil, message, "network_not_enforced".
-- Sets h.network_check = { state = "verified" | "not enforced by this
-- cluster" | "not checked", note }.
function M.network_check(h, pod)
  local k = h.k
  local targets = net_targets(h, pod)
  if #targets == 0 then
    h.network_check = { state = "not checked", note = "a NetworkPolicy that allows no ingress and no egress; " ..
      "not checked: no address to try (the API server's is a loopback one and the pod has no node address)" }
    h.limits = { network = { enforced = "cluster", check = "not checked", note = h.network_check.note } }
    return true
  end
  local t = k.network_check_timeout
  local argv = { "sh", "-c", NET_PROBE, "sh", tostring(math.max(1, math.ceil(t))) }
  for _, x in ipairs(targets) do argv[#argv + 1] = x end
  local rc, out, code = exec_simple(h, argv, t + 15)
  if rc == 1 then
    h.network_check = { state = "verified", note = "a NetworkPolicy that allows no ingress and no egress, and checked: from inside the box, no connection to " .. table.concat(targets, " or ") }
    h.limits = { network = { enforced = "cluster", check = "verified", note = h.network_check.note } }
  elseif rc == 0 then
    h.network_check = { state = "not enforced by this cluster", note = string.format(
      "the NetworkPolicy is not enforced: from inside the box, %s (the cluster's network plugin ignores NetworkPolicy)",
      tostring(out):gsub("%s+$", "")) }
    h.limits = { network = { enforced = false, check = h.network_check.state, note = h.network_check.note } }
    if k.network_check == "refuse" then
      return nil, "network = \"none\" is not enforced by this cluster: from inside the box, " ..
        tostring(out):gsub("%s+$", "") .. " (policy.kubernetes.network_check = \"refuse\")", "network_not_enforced"
    end
  else
    h.network_check = { state = "not checked", note = "a NetworkPolicy that allows no ingress and no egress; " ..
      "whether the cluster enforces it could not be checked: " .. (rc == 2 and tostring(out):gsub("%s+$", "")
      or (tostring(out) .. " " .. tostring(code))) }
    h.limits = { network = { enforced = "cluster", check = "not checked", note = h.network_check.note } }
  end
  return true
end

-- Lifecycle ------------------------------------------------------------------------------------

local reaped_once = false

local function delete(c, kind, name, timeout)
  return c:call("DELETE", ns_path(c, kind, name), {
    body = { apiVersion = "v1", kind = "DeleteOptions", gracePeriodSeconds = 0, propagationPolicy = "Background" },
    query = kind == "pods" and { gracePeriodSeconds = "0" } or nil,
    ok = { [404] = true }, timeout = timeout,
  })
end

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
    core.spawn(function() pcall(M.reap, { quiet = true, context = k.context, namespace = k.namespace,
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
    local s, m, cd = M.pod_state(pod, k)
    if s == false then return nil, m, cd end
    if s ~= "ready" then
      local rok, rerr2, rcode2 = wait_ready(c, w, k, deadline)
      if not rok then return nil, rerr2, rcode2 end
    end
    if k.network == "none" and k.network_check then return M.network_check(h, w and w.last or pod) end
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

-- Commands over exec ------------------------------------------------------------------------------

-- The command each exec runs. The exec subresource takes argv in its URL
-- and nothing else (no directory, no environment), and a long URL does not
-- pass every proxy (nor this websocket client, past 2 kB): so every exec
-- runs the same short boot line, which reads a script from stdin, line by
-- line (a shell's read takes no byte past its newline), and evals it. The
-- script sets the directory and the environment and execs the command; what
-- follows it on stdin is the command's own stdin. v5 ends stdin with its
-- close signal; v4 has none, so there a command with stdin reads exactly
-- its N bytes through head, and a command without reads /dev/null.
local BOOT = 'IFS= read -r n || exit 125; s=; while [ "$n" -gt 0 ]; do IFS= read -r l || exit 125; ' ..
  's="$s$l\n"; n=$((n-1)); done; eval "$s"'

local shq = util.shell_quote

local function command_script(h, req, v5, check_id)
  local setup = {}
  if not req.cwd and h.k.workdir then
    setup[#setup + 1] = "cd -- " .. shq(h.k.workdir) .. " 2>/dev/null"
  end
  for _, kv in ipairs(req.env or {}) do setup[#setup + 1] = "export " .. shq(kv) end
  -- The start check (transports/start_check.lua): a missing cwd or program
  -- is exec_failed, not an exit status the command could have chosen.
  local lines = start_check.lines(req, check_id, setup)
  local words = {}
  for i, a in ipairs(req.argv) do words[i] = shq(a) end
  local cmd = table.concat(words, " ")
  if not req.stdin then
    cmd = "exec " .. cmd .. " </dev/null"
  elseif v5 then
    cmd = "exec " .. cmd
  else
    cmd = "head -c " .. #req.stdin .. " | " .. cmd
  end
  lines[#lines + 1] = cmd
  local script = table.concat(lines, "\n")
  local _, newlines = script:gsub("\n", "")
  return (newlines + 1) .. "\n" .. script .. "\n"
end

-- Reads an exec stream into a sink until it ends; sets job.exit_code or
-- job.error. Holds back (stops reading the websocket) while a slow
-- on_output reader has more than chunk_limit bytes queued.
local function pump(h, job, ex, sink, req)
  local limit = req.chunk_limit or (1 << 20)
  local status, why
  local q
  local check = start_check.filter(job.check_id, function(bytes) q = sink:push("stdout", bytes) end)
  while true do
    local ch, data, code = ex:recv()
    if not ch then why, job.drop_code = data, code break end
    if ch == 1 or ch == 2 then
      if ch == 1 then
        q = false
        check.feed(data)
        -- Held back by the check (a marker's first bytes): the queue as it is.
        if q == false then q = sink:push("stdout", "") end
      else
        q = sink:push("stderr", data)
      end
      if q == nil then ex:close() h.streams[ex] = nil return end
      -- Back-pressure: the reader is behind; stop reading the exec stream
      -- (its TCP window then stops the server) until it caught up.
      if req.chunks and q and q > limit then sink:wait_room(limit) end
    elseif ch == 3 then
      status = data
    end
  end
  h.streams[ex] = nil
  check.flush()
  -- A stream that ended because the pod went (deleted, evicted, its
  -- lifetime) is the box gone, whatever the runtime said on the way out.
  local ecode = status and client_mod.exit_status(status)
  if not req.is_kill and not h.destroyed and (h.gone or not ecode or ecode >= 128)
      and gone_after_stream(h, job.killed or (ecode and ecode ~= 137)) then
    job.error, job.code = h.gone, "box_gone"
    sink:finish("box_gone", h.gone)
    return
  end
  if check.failed then
    job.error = start_check.message(check.failed, req, sbx_config.policy)
    sink:finish("exec_failed", job.error)
    return
  end
  if status then
    local code, err = client_mod.exit_status(status)
    if code then
      job.exit_code = code
      sink:finish()
    else
      job.error = "the command could not run: " .. tostring(err)
      sink:finish("exec_failed", job.error)
    end
    return
  end
  local msg = "the exec stream ended without the command's exit status: " .. tostring(why)
  if not h.destroyed and not req.is_kill then
    local kok, kerr = require("sbx.job").kill_by_exec(M, h, job, "KILL", core.now() + h.k.kill_timeout)
    msg = msg .. (kok and "; the command was killed" or ("; killing the command failed: " .. tostring(kerr)))
  end
  job.error = msg
  sink:finish("disconnected", msg)
end

-- start(handle, req) -> job | nil, message, code
function M.start(h, req)
  if h.destroyed then return nil, "the box is closed", "box_gone" end
  if h.gone then return nil, h.gone, "box_gone" end
  if req.user then
    return nil, "the exec subresource runs commands as the container's user; a per-command user needs the agent transport", "unsupported"
  end
  local c = h.client
  local ex, err, code = c:exec(h.namespace, h.name, h.k.container, { "sh", "-c", BOOT },
    { stdin = true, timeout = req.deadline and math.max(1, req.deadline - core.now()) or nil })
  if not ex then
    if code == "not_found" then mark_gone(h, "the box's pod is gone (" .. tostring(err) .. ")") end
    -- A refused exec (500 "container not found", 400 "not running") of a
    -- pod that ended is the box gone, not a server error.
    if not h.gone and not h.destroyed and code ~= "forbidden" and code ~= "unauthorized" then check_gone(h) end
    if h.gone then return nil, h.gone, "box_gone" end
    return nil, err, code
  end
  h.streams[ex] = true
  local sink = core.stream.sink { capture = req.capture, chunks = req.chunks, chunk_limit = req.chunk_limit }
  local job = { stream = sink, marker = req.marker, ex = ex, check_id = require("sbx.job").random_id() }
  -- a helper past its deadline (sbx.job.run_helper) ends its exec stream
  job.abandon = function() ex:close() end
  local script = command_script(h, req, ex.v5, job.check_id)
  if not req.stdin or #req.stdin <= h.k.stdin_chunk then
    ex:send_stdin(script .. (req.stdin or ""))
    if ex.v5 then ex:close_stdin() end
  else
    ex:send_stdin(script)
    core.spawn(function()
      local chunk = h.k.stdin_chunk
      for pos = 1, #req.stdin, chunk do
        if not ex:send_stdin(req.stdin:sub(pos, pos + chunk - 1)) then return end
        if not ex:wait_drained(4 * chunk) then return end
      end
      -- v5 ends stdin here; on v4 head has read exactly its bytes.
      if ex.v5 then ex:close_stdin() end
    end)
  end
  core.spawn(pump, h, job, ex, sink, req)
  return job
end

-- finish(handle, job) -> exit_code | nil, message, code
function M.finish(_, job)
  if job.exit_code then return job.exit_code end
  return nil, job.error or "the command ended without an exit status", job.code or "no_exit_code"
end

-- clear(handle, deadline) -> true | nil, message, code: ends every process
-- of the pod's container but its lifetime process (a lost agent's box,
-- before a fresh agent is placed; a box past its budget), with
-- box.clear_request over an exec. The exec runs as the container's user,
-- which is every process of the box's user. A pod cannot restart in place,
-- so processes that did not end (a box at its pids limit) are an error
-- and the box is not used again.
function M.clear(h, deadline)
  local job_mod = require "sbx.job"
  local req = job_mod.clear_request()
  req.user = nil
  local exit_code, kjob, code = job_mod.run_helper(M, h, req, deadline or core.now() + h.k.kill_timeout,
    "ending the box's processes")
  if exit_code == nil then return nil, kjob, code end
  local n = tostring((kjob.stream:captured("stdout"))):match("^%s*(%d+)")
  if exit_code == 0 and n == "0" then return true end
  return nil, string.format("%s of the box's processes did not end (exit %s): %s", tostring(n or "some"),
    tostring(exit_code), (kjob.stream:captured("stderr"))), "kill_failed"
end

-- The agent's channel ------------------------------------------------------------------------------

-- One exec stream without a TTY runs a small sh loader: it says the pod's
-- architecture, reads a length line and exactly that many bytes (a fresh
-- sbx-agent, into a new private directory: a copy left in the box is never
-- trusted), and execs it with args. The stream's stdin and stdout are then
-- the channel: 8-bit clean, and its pipes belong to the agent as an
-- attached Docker exec's do, so frames go without tags (mac = false).
-- -> channel | nil, reason, code
local AGENT_READY = "__SBXAGENT_"
local function run_agent(h, opts, args)
  local script = 'printf "' .. AGENT_READY .. '%s__\\n" "$(uname -m)"; IFS= read -r n || exit 125; umask 077; ' ..
    'd=$(mktemp -d 2>/dev/null) || exit 125; head -c "$n" > "$d/a" && chmod 700 "$d/a" && ' ..
    'printf "' .. AGENT_READY .. 'go__\\n" && exec "$d/a"' .. (#args > 0 and (" " .. table.concat(args, " ")) or "")
  local c = h.client
  local ex, err, code = c:exec(h.namespace, h.name, h.k.container, { "sh", "-c", script },
    { stdin = true, timeout = math.max(1, opts.deadline - core.now()) })
  if not ex then return nil, err, code end
  h.streams[ex] = true
  local limit = opts.pol.agent.channel_buffer
  local sink = core.stream.sink { chunks = true, chunk_limit = limit,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 4096, tail = 0 } } }
  local said, placed = "", false
  local ready, go = core.event(), core.event()
  -- The channel's reader lives as long as the box: `sbx run` ends when its
  -- script does, and closes the box after (task:unref).
  local pump = core.spawn(function()
    local why
    while true do
      local ch, data, rcode = ex:recv()
      if not ch then why = data break end
      if ch == 1 then
        if placed then
          local q = sink:push("stdout", data)
          if q == nil then break end
          if q and q > limit then sink:wait_room(limit) end
        else
          said = said .. data
          if said:find(AGENT_READY .. "[%w_]+__\n") then ready:set() end
          local g = said:find(AGENT_READY .. "go__\n", 1, true)
          if g then
            placed = true
            local rest = said:sub(g + #AGENT_READY + 5)
            if #rest > 0 then sink:push("stdout", rest) end
            go:set()
          end
          if #said > 4096 then ready:set() go:set() end
        end
      elseif ch == 2 then
        sink:push("stderr", data)
      elseif ch == 3 then
        why = "the agent ended: " .. data:sub(1, 200)
      end
      local _ = rcode
    end
    h.streams[ex] = nil
    ready:set()
    go:set()
    if not sink:info().eof then
      if gone_after_stream(h, false) then sink:finish("box_gone", h.gone)
      else sink:finish("agent_lost", why or "the exec stream ended") end
    end
  end)
  pump:unref()
  local function fail(msg, fcode) ex:close() return nil, msg, fcode or "agent_unavailable" end
  ready:wait(math.max(0.001, opts.deadline - core.now()))
  local arch = said:match(AGENT_READY .. "([%w_]+)__\n")
  if not arch then return fail("the agent's loader did not start: " .. said:sub(1, 200) .. (sink:captured("stderr") or "")) end
  local bin = core.agent.binary(arch)
  if not bin then return fail("this build of sbx carries no agent for " .. arch, "unsupported") end
  ex:send_stdin(#bin .. "\n")
  local chunk = 256 * 1024
  for pos = 1, #bin, chunk do ex:send_stdin(bin:sub(pos, pos + chunk - 1)) end
  -- Nothing more goes in until the loader has read exactly the agent's
  -- bytes (busybox head reads ahead through stdio and would eat the key).
  go:wait(math.max(0.001, opts.deadline - core.now()))
  if not placed then return fail("the agent's loader did not finish: " .. said:sub(1, 200) .. (sink:captured("stderr") or "")) end
  return require("sbx.channel").over_sink(sink, {
    ended = "the exec stream ended",
    write = function(bytes)
      local ok, werr = ex:send_stdin(bytes)
      if not ok then return nil, werr end
      return ex:buffered()
    end,
    close = function()
      ex:close()
      h.streams[ex] = nil
    end,
  })
end

-- agent_channel(handle, { key, deadline, pol }) -> channel, mac, extra | nil,
-- reason, code. The agent runs beside the exec's process (relay = true):
-- containerd's CRI kills an exec's process with SIGKILL when the exec call's
-- context ends (internal/cri/server/container_execsync.go, execInternal;
-- docs/kubernetes.md), which a dropped stream can bring about; the agent
-- and its commands outlive that, and sbx attaches again.
function M.agent_channel(h, opts)
  if h.gone then return nil, h.gone, "box_gone" end
  local ch, err, code = run_agent(h, opts, {})
  if not ch and not h.destroyed and check_gone(h) then return nil, h.gone, "box_gone" end
  if not ch then return nil, err, code end
  return ch, false, { relay = true }
end

-- agent_attach(handle, { name, deadline, pol }) -> channel | nil, reason,
-- code: a new exec stream whose freshly placed agent relays to the running one.
function M.agent_attach(h, opts)
  if not tostring(opts.name):match("^[%w%-]+$") then error("agent_attach: a bad socket name", 2) end
  if h.gone then return nil, h.gone, "box_gone" end
  local ch, err, code = run_agent(h, opts, { "attach", opts.name })
  if not ch and not h.destroyed and check_gone(h) then return nil, h.gone, "box_gone" end
  return ch, err, code
end

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

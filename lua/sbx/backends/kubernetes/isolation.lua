-- The Kubernetes backend's isolation: the pod spec's resources and
-- securityContext, and how the cluster holds each option (sbx.limits).
local json = require("sbx.core").json
local owner = require "sbx.owner"

local M = {}

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

M.netpol_body = netpol_body

return M

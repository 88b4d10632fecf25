-- needs: docker, python3
-- The Kubernetes backend against the stand-in: the pod a box is (as the API
-- server received it), isolation (NetworkPolicy for network = none, the
-- box's limits, explicit options a pod cannot hold refused), pods that
-- cannot start (image, unschedulable, RuntimeClass, quota) with
-- Kubernetes' own reason and nothing left behind, the lifetime cap, close,
-- and sbx reap --backend kubernetes.
local tap = require "tap"
local H = require "helper"
local K = require "k8s_helper"
local sbx = require "sbx"

local standin = assert(K.standin { "--runtime-class", "standin-rc", "--quota-pods", "6" })
sbx.use_policy { kubernetes = { kubeconfig = standin.kubeconfig } }

local function pods() return assert(standin:state()).pods end
local function pod_named(name)
  for _, p in ipairs(pods()) do if p.metadata.name == name then return p end end
end

-- The pod ------------------------------------------------------------------------------------

local box = assert(sbx.box { backend = "kubernetes", image = H.image, transport = "exec", memory = 256 * 2 ^ 20, cpus = 0.5,
  lifetime = 600, env = { BOX_ENV = "v" }, labels = { team = "eval" }, tmpfs = { ["/scratch"] = "rw,size=8m" } })
local p = assert(pod_named(box.id), "the pod is in the stand-in")
local spec, c = p.spec, p.spec.containers[1]
tap.is(spec.restartPolicy, "Never", "restartPolicy Never")
tap.is(spec.activeDeadlineSeconds, 600, "activeDeadlineSeconds is the box's lifetime")
tap.is(spec.automountServiceAccountToken, false, "no service account token in the box")
tap.is(spec.terminationGracePeriodSeconds, 0, "terminationGracePeriodSeconds 0")
tap.is(spec.securityContext.seccompProfile.type, "RuntimeDefault", "RuntimeDefault seccomp")
tap.is(c.securityContext.allowPrivilegeEscalation, false, "no privilege escalation")
tap.is(c.securityContext.privileged, false, "not privileged")
tap.ok(#c.securityContext.capabilities.drop >= 5, "the box's capabilities dropped")
tap.is(c.resources.limits.memory, "268435456", "memory limit")
tap.is(c.resources.limits.cpu, "500m", "cpu limit")
tap.ok(c.resources.limits["ephemeral-storage"], "disk as an ephemeral-storage limit")
tap.is(c.resources.requests.memory, "67108864", "requests are request_fraction (0.25) of the limits by default")
tap.is(c.resources.requests.cpu, "125m", "cpu too")
tap.is(c.command[1] .. " " .. c.command[2], "sleep 600", "the container sleeps for the lifetime")
tap.is(p.metadata.labels.sbx, "1", "label sbx=1")
tap.is(p.metadata.labels["sbx.owner.pid"], tostring(sbx.core.pid()), "owner labels as on Docker")
tap.ok(p.metadata.annotations["sbx.deadline"] and p.metadata.annotations["sbx.owner.host"], "owner annotations")
tap.is(p.metadata.labels.team, "eval", "extra labels")
tap.is(spec.volumes[1].emptyDir.medium, "Memory", "tmpfs as an emptyDir in memory")
tap.is(assert(box:exec("echo $BOX_ENV; pwd")).stdout, "v\n/work\n", "the box's env and workdir")
tap.is(box.limits.memory.enforced, "cluster", "box.limits: memory held by the cluster")
tap.like(box.limits.network.note, "NetworkPolicy", "box.limits.network names the NetworkPolicy")
tap.is(box.limits.pids.enforced, false, "box.limits: pids cannot be held by a pod spec")

-- Scheduling and pulling knobs from policy.kubernetes reach the pod spec.
do
  local tol = { key = "sbx-only", operator = "Equal", value = "yes", effect = "NoSchedule" }
  local kb = assert(sbx.box { backend = "kubernetes", image = H.busybox, transport = "exec", policy = { kubernetes = {
    tolerations = { tol }, image_pull_secrets = { "regcred", "other" }, requests = { cpu = "100m", memory = "64Mi" } } } })
  local ks = assert(pod_named(kb.id)).spec
  tap.ok(ks.tolerations and #ks.tolerations == 1 and ks.tolerations[1].key == "sbx-only" and ks.tolerations[1].effect == "NoSchedule",
    "policy.kubernetes.tolerations are the pod's tolerations")
  tap.ok(ks.imagePullSecrets and #ks.imagePullSecrets == 2 and ks.imagePullSecrets[1].name == "regcred"
    and ks.imagePullSecrets[2].name == "other", "image_pull_secrets as imagePullSecrets by name")
  tap.is(ks.containers[1].resources.requests.cpu, "100m", "policy.kubernetes.requests set the requests")
  kb:close()
end

-- network = "none": a NetworkPolicy that selects the pod and allows nothing.
local st = assert(standin:state())
local np
for _, x in ipairs(st.networkpolicies) do if x.metadata.name == box.id then np = x end end
tap.ok(np and np.spec.podSelector.matchLabels["sbx.box"] == box.id, "a NetworkPolicy selects the box's pod")
tap.ok(np and #np.spec.policyTypes == 2 and #np.spec.ingress == 0 and #np.spec.egress == 0,
  "policyTypes Ingress and Egress with no rules: deny all")
-- The stand-in, as a plain CNI bridge, does not enforce NetworkPolicy: the
-- box's own check finds it connects to its node, and says so.
local r = assert(box:exec("ls /sys/class/net"))
tap.is(r.stdout, "eth0\nlo\n", "the stand-in ignores the policy: the box is on the pod network")
tap.is(box.limits.network.check, "not enforced by this cluster", "box.limits.network says the cluster does not enforce it")
tap.is(box.limits.network.enforced, false, "and it is not counted as enforced")
tap.like(box.limits.network.note, "connected to", "the note says what the box reached")
local r2, uerr, ucode = box:exec("id -u", { user = "65534" })
tap.ok(r2 == nil and ucode == "unsupported", "a per-command user on the exec transport: unsupported (the agent has one)", uerr)
box:close()
tap.is(pod_named(box.id), nil, "close deletes the pod at once")
st = assert(standin:state())
tap.is(#st.networkpolicies, 0, "and its NetworkPolicy")

local bridge = assert(sbx.box { backend = "kubernetes", image = H.busybox, network = "bridge" })
tap.is(#assert(standin:state()).networkpolicies, 0, "network = bridge: no NetworkPolicy")
tap.isnt(assert(bridge:exec("ls /sys/class/net")).stdout, "lo\n", "and the pod network")
bridge:close()

-- Isolation a pod cannot hold, asked for explicitly: refused before anything exists.
local nbox, err, code = sbx.box { backend = "kubernetes", image = H.busybox, pids = 100 }
tap.ok(nbox == nil and code == "unsupported" and err:find("pids = 100", 1, true), "explicit pids: unsupported", err)
nbox, err, code = sbx.box { backend = "kubernetes", image = H.busybox, ulimits = { nofile = 100 } }
tap.is(code, "unsupported", "explicit ulimits: unsupported")
nbox, err, code = sbx.box { backend = "kubernetes", image = H.busybox, network = "host" }
tap.is(code, "unsupported", "a Docker network name: unsupported")
tap.is(#pods(), 0, "nothing was created for them")

-- Pods that cannot start: Kubernetes' reason, and nothing left.
nbox, err, code = sbx.box { backend = "kubernetes", image = "sbx-no-such-image:1" }
tap.ok(nbox == nil and code == "image_unavailable" and err:find("ErrImagePull", 1, true), "an image that cannot be pulled: ErrImagePull", err)
nbox, err, code = sbx.box { backend = "kubernetes", image = H.busybox, node_selector = { disktype = "ssd" } }
tap.ok(nbox == nil and code == "unschedulable" and err:find("Unschedulable", 1, true) and err:find("node affinity/selector", 1, true),
  "a pod no node takes: Unschedulable, with the scheduler's message", err)
nbox, err, code = sbx.box { backend = "kubernetes", image = H.busybox, runtime_class = "gvisor" }
tap.ok(nbox == nil and code == "forbidden" and err:find('RuntimeClass "gvisor" not found', 1, true), "an unknown RuntimeClass: forbidden at create", err)
st = assert(standin:state())
tap.is(#st.pods + #st.networkpolicies, 0, "failed boxes leave no pod and no NetworkPolicy")
local rc = assert(sbx.box { backend = "kubernetes", image = H.busybox, runtime_class = "standin-rc" })
tap.is(pod_named(rc.id).spec.runtimeClassName, "standin-rc", "runtimeClassName from policy")
rc:close()

local many = {}
for i = 1, 6 do many[i] = assert(sbx.box { backend = "kubernetes", image = H.busybox, network = "bridge" }) end
nbox, err, code = sbx.box { backend = "kubernetes", image = H.busybox, network = "bridge" }
tap.ok(nbox == nil and code == "forbidden" and err:find("exceeded quota", 1, true), "past a ResourceQuota: forbidden, exceeded quota", err)
for _, b in ipairs(many) do b:close() end

-- The lifetime cap: an orphan's pod ends by itself (activeDeadlineSeconds).
local short = assert(sbx.box { backend = "kubernetes", image = H.busybox, lifetime = 1, network = "bridge" })
local phase
for _ = 1, 60 do
  local sp = pod_named(short.id)
  phase = sp and sp.status.phase
  if phase == "Failed" then break end
  sbx.sleep(0.1)
end
tap.is(phase, "Failed", "past activeDeadlineSeconds the pod fails (DeadlineExceeded)")
tap.is(pod_named(short.id).status.reason, "DeadlineExceeded", "with Kubernetes' reason")

-- Reap: a box of a dead owner, and the ended pod above.
local script = standin.base .. "/orphan.lua"
K.write(script, string.format([[
local sbx = require "sbx"
sbx.use_policy { kubernetes = { kubeconfig = %q } }
local b = assert(sbx.box { backend = "kubernetes", image = %q })
print(b.id)
io.stdout:flush()
os.execute("kill -9 " .. sbx.core.pid())
]], standin.kubeconfig, H.busybox))
local orphan = H.sh(H.sbx_bin .. " run " .. script):match("(sbx%-%x+)")
tap.ok(orphan and pod_named(orphan), "a box whose owner was killed -9 is left behind", orphan)
tap.is(pod_named(short.id), nil, "the first box of that process reaped the ended pod (reap_on_start)")
local live = assert(sbx.box { backend = "kubernetes", image = H.busybox })
local env = "KUBECONFIG=" .. standin.kubeconfig .. " "
local out = H.sh(env .. H.sbx_bin .. " reap --backend kubernetes --namespace default --dry-run")
tap.ok(out:find("would remove " .. orphan .. " (owner process", 1, true) and out:find("1 kept", 1, true),
  "reap --dry-run lists the orphan, keeps the live box", out)
tap.ok(pod_named(orphan), "and removes nothing")
out = H.sh(env .. H.sbx_bin .. " reap --backend kubernetes --context standin")
tap.ok(out:find("removed " .. orphan, 1, true), "reap removes them", out)
st = assert(standin:state())
local left = {}
for _, x in ipairs(st.pods) do left[#left + 1] = x.metadata.name end
for _, x in ipairs(st.networkpolicies) do left[#left + 1] = "netpol/" .. x.metadata.name end
table.sort(left)
local want = { live.id, "netpol/" .. live.id }
table.sort(want)
tap.is(table.concat(left, " "), table.concat(want, " "), "only the live box's pod and NetworkPolicy are left")
live:close()
short:close()
standin:stop()
tap.done()

-- needs: docker, python3, kubectl
-- kubectl against the stand-in: discovery (/version, /api, /apis), create,
-- get (as a Table), list by label, delete (with its watch for the end),
-- NotFound from a Status; it also reads the pod and NetworkPolicy of a box
-- sbx made. Every kubectl in SBX_KUBECTL (":"-separated paths; default the
-- kubectl on PATH) runs the same checks: Debian's kubernetes-client is 1.20,
-- whose exec speaks only SPDY, so exec is checked only with a kubectl of
-- 1.30 or later (websocket channels).
local tap = require "tap"
local H = require "helper"
local K = require "k8s_helper"
local sbx = require "sbx"

local kubectls = {}
for p in (os.getenv("SBX_KUBECTL") or "kubectl"):gmatch("[^:]+") do
  if H.sh("command -v " .. p):match("%S") then kubectls[#kubectls + 1] = p end
end
if #kubectls == 0 then
  tap.skip("kubectl drives the stand-in", "no kubectl (scripts/setup.sh installs Debian's kubernetes-client)")
  tap.done()
end

local standin = assert(K.standin())
sbx.use_policy { kubernetes = { kubeconfig = standin.kubeconfig } }
local box = assert(sbx.box { backend = "kubernetes", image = H.busybox, network = "none" })
local podfile = standin.base .. "/pod.json"
K.write(podfile, [[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"kubectl-pod","labels":{"app":"kubectl-test"}},
"spec":{"restartPolicy":"Never","terminationGracePeriodSeconds":0,"containers":[{"name":"main","image":"]] .. H.busybox ..
  [[","command":["sleep","300"]}]}}]])

for _, kc in ipairs(kubectls) do
  local function run(args)
    return H.sh(string.format("KUBECONFIG=%s timeout 60 %s %s", standin.kubeconfig, kc, args))
  end
  local vout = run("version -o json")
  local client_minor = tonumber((vout:match('"clientVersion"%s*:%s*{.-"minor"%s*:%s*"(%d+)')))
  local label = string.format("kubectl 1.%s", tostring(client_minor))
  tap.like(vout, '"gitVersion": "v1.30.0%-standin"', label .. ": version reads the server's /version")
  local out, code = run("create --validate=false -f " .. podfile)
  tap.ok(code == 0 and out:find("pod/kubectl-pod created", 1, true), label .. ": create -f", out)
  local running = false
  for _ = 1, 100 do
    out = run("get pods")
    if out:match("kubectl%-pod%s+1/1%s+Running") then running = true break end
    sbx.sleep(0.1)
  end
  tap.ok(running, label .. ": get pods prints the server's Table (NAME READY STATUS): Running", out)
  out = run("get pods -l app=kubectl-test -o name")
  tap.is(out, "pod/kubectl-pod\n", label .. ": get with a label selector")
  out = run("get pods -l sbx=1 -o json")
  local list = sbx.json.decode(out) or {}
  local item = (list.items or {})[1] or {}
  tap.ok(item.metadata and item.metadata.name == box.id and item.spec.automountServiceAccountToken == false
    and item.spec.activeDeadlineSeconds and item.spec.containers[1].securityContext.allowPrivilegeEscalation == false,
    label .. ": the sbx box is a pod (no service account token, a deadline, no privilege escalation)", out:sub(1, 500))
  out = run("get networkpolicies -o name")
  tap.is(out, "networkpolicy.networking.k8s.io/" .. box.id .. "\n", label .. ": the box's NetworkPolicy (network = none)")
  if client_minor and client_minor >= 30 then
    out, code = run("exec " .. box.id .. " -c box -- sh -c 'echo from-kubectl; exit 3'")
    tap.ok(out:find("from-kubectl", 1, true) and code ~= 0, label .. ": exec over the websocket channels, exit status kept", out)
  else
    tap.skip(label .. ": exec", "kubectl before 1.30 runs exec over SPDY only, which the stand-in does not serve")
  end
  out, code = run("delete pod kubectl-pod")
  tap.ok(code == 0 and out:find('pod "kubectl-pod" deleted', 1, true), label .. ": delete (kubectl waits for the end by watch)", out)
  out, code = run("get pod kubectl-pod")
  tap.ok(code ~= 0 and out:find('Error from server (NotFound): pods "kubectl-pod" not found', 1, true),
    label .. ": a missing pod is NotFound, from the Status", out)
end

box:close()
local st = assert(standin:state())
tap.is(#st.pods + #st.networkpolicies, 0, "closing the box removed its pod and NetworkPolicy")
standin:stop()
tap.done()

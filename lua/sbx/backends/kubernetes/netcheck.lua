-- The Kubernetes backend's network check: from inside a network = "none"
-- box, can it reach the API server?
local core = require "sbx.core"
local http = require "sbx.http"
local client_mod = require "sbx.kubernetes.client"

local M = {}

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

return M

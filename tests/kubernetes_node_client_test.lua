-- needs: docker, python3, node
-- The official Kubernetes JavaScript client (@kubernetes/client-node, in
-- tests/sdk) against the stand-in: it creates, watches, execs (stdin, exit
-- code) and deletes a pod of its own, and reads and execs into a box sbx
-- made. Each of its TAP lines becomes one check here.
local tap = require "tap"
local H = require "helper"
local K = require "k8s_helper"
local sbx = require "sbx"

local script = "tests/sdk/k8s_client_test.mjs"
if not (H.sh("command -v node"):match("node") and K.slurp("tests/sdk/node_modules/@kubernetes/client-node/package.json")) then
  tap.skip("the official JavaScript client drives the stand-in", "node or tests/sdk's @kubernetes/client-node is not installed (scripts/setup.sh)")
  tap.done()
end

local standin = assert(K.standin())
sbx.use_policy { kubernetes = { kubeconfig = standin.kubeconfig } }
local box = assert(sbx.box { backend = "kubernetes", image = H.busybox })
local out, code = H.sh(string.format("timeout 180 node %s %s %s %s", script, standin.kubeconfig, H.busybox, box.id))
local seen = 0
local pending_fail
for line in out:gmatch("[^\n]+") do
  local bad, name = line:match("^(n?o?t? ?)ok %d+ %- (.*)$")
  if name then
    if pending_fail then tap.ok(false, pending_fail.name, pending_fail.diag) pending_fail = nil end
    seen = seen + 1
    if bad == "" then tap.ok(true, "client-node: " .. name)
    else pending_fail = { name = "client-node: " .. name, diag = "" } end
  elseif pending_fail and line:match("^#") then
    pending_fail.diag = pending_fail.diag .. line:gsub("^#%s*", "") .. "\n"
  end
end
if pending_fail then tap.ok(false, pending_fail.name, pending_fail.diag) end
tap.ok(seen >= 13 and code == 0, "the JavaScript client ran every check (" .. seen .. ")", out:sub(-2000))
box:close()
local st = assert(standin:state())
tap.is(#st.pods, 0, "nothing is left in the stand-in")
standin:stop()
tap.done()

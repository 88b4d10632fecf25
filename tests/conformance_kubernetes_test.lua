-- needs: docker, python3
-- The transport conformance suite (tests/lib/conformance.lua) for
-- kubernetes/exec and kubernetes/agent, over the Kubernetes stand-in (real
-- containers, the exec subresource on a TLS websocket, client-certificate
-- login). The exec subresource keeps stdout and stderr apart (no TTY) but
-- has no per-command user; the agent has one.
local tap = require "tap"
local H = require "helper"
local K = require "k8s_helper"
local sbx = require "sbx"
local conformance = require "conformance"
local lifecycle = require "lifecycle"

local standin = assert(K.standin())
sbx.use_policy { kubernetes = { kubeconfig = standin.kubeconfig } }
for _, transport in ipairs { "exec", "agent" } do
  local box = assert(sbx.box { backend = "kubernetes", image = H.image, transport = transport })
  conformance.run(tap, "kubernetes/" .. transport, box, {
    transport = transport, separate_stderr = true, user = transport == "agent",
  })
  box:close()
end
lifecycle.run(tap, "kubernetes", function(opts)
  opts.backend, opts.image = "kubernetes", H.image
  return sbx.box(opts)
end, { backend = "kubernetes" })
standin:stop()
tap.done()

-- needs: docker, python3
-- The transport conformance suite (tests/lib/conformance.lua) for fargate/exec
-- and fargate/agent, over the AWS stand-in (real containers, real PTYs).
-- ECS Exec has one PTY per command: on the exec transport stderr arrives in
-- stdout and there is no per-command user; the agent keeps them apart.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local conformance = require "conformance"
local lifecycle = require "lifecycle"

local standin = assert(H.standin())
sbx.use_policy { fargate = {
  endpoint_url = standin.url, region = "us-east-1", credentials = standin.credentials,
  subnets = { "subnet-standin" }, security_groups = { "sg-standin" },
} }
for _, transport in ipairs { "exec", "agent" } do
  local box = assert(sbx.box { backend = "fargate", image = H.image, transport = transport })
  conformance.run(tap, "fargate/" .. transport, box, {
    transport = transport, separate_stderr = transport == "agent", user = transport == "agent",
    binary_argv = transport == "agent",
  })
  box:close()
end
lifecycle.run(tap, "fargate", function(opts)
  opts.backend, opts.image = "fargate", H.image
  return sbx.box(opts)
end, { backend = "fargate" })
standin:stop()
tap.done()

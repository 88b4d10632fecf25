-- needs: docker
-- The transport conformance suite (tests/conformance.lua) for docker/exec
-- and docker/agent: the same checks, one box per pair.
local tap = require "tap"
local H = require "helper"
local conformance = require "conformance"

for _, transport in ipairs { "exec", "agent" } do
  local box = H.box { image = H.image, transport = transport }
  conformance.run(tap, "docker/" .. transport, box, {
    transport = transport, separate_stderr = true, user = true, binary_argv = transport == "agent",
  })
  box:close()
end
tap.done()

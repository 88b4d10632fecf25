-- needs: docker
-- The transport conformance suite (tests/lib/conformance.lua) for docker/exec
-- and docker/agent: the same checks, one box per pair; then the lifecycle
-- half (tests/lib/lifecycle.lua).
local tap = require "tap"
local H = require "helper"
local conformance = require "conformance"
local lifecycle = require "lifecycle"
local sbx = require "sbx"

for _, transport in ipairs { "exec", "agent" } do
  local box = H.box { image = H.image, transport = transport }
  conformance.run(tap, "docker/" .. transport, box, {
    transport = transport, separate_stderr = true, user = true, binary_argv = transport == "agent",
  })
  box:close()
end

lifecycle.run(tap, "docker", function(opts)
  opts.image = H.image
  return sbx.box(opts)
end, {
  backend = "docker",
  exists = function(b) return H.container(b.id) ~= nil end,
  remove_behind = function(b) H.api("DELETE", "/containers/" .. b.id .. "?force=1") end,
})
tap.done()

-- needs: docker, local, root
-- The transport conformance suite (tests/lib/conformance.lua) for local/agent,
-- as root and as the two unprivileged users (tests/lib/local_helper.lua): a
-- user with an /etc/subuid range (per-command users work), and one
-- without (a box of a single id: per-command users cannot); then the
-- lifecycle half (tests/lib/lifecycle.lua).
local tap = require "tap"
local L = require "local_helper"
local conformance = require "conformance"
local lifecycle = require "lifecycle"

local box = assert(L.box())
conformance.run(tap, "local/agent", box, { transport = "agent", separate_stderr = true, user = L.role ~= "single" })
box:close()

-- The lifecycle half: a box exists while its state directory does.
local function dir_exists(b)
  local f = io.open(b.handle.dir .. "/owner", "rb")
  if f then f:close() end
  return f ~= nil
end
lifecycle.run(tap, "local", L.box, {
  backend = "local",
  refuse = { network = "bridge" },
  exists = dir_exists,
})
L.relay_users(tap, "tests/conformance_local_test.lua", os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12")
tap.done()

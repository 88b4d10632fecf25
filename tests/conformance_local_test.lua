-- needs: docker, local, root
-- The transport conformance suite (tests/conformance.lua) for local/agent,
-- as root and as the two unprivileged users (tests/local_helper.lua): a
-- user with an /etc/subuid range (per-command users work), and one
-- without (a box of a single id: per-command users cannot).
local tap = require "tap"
local L = require "local_helper"
local conformance = require "conformance"

local box = assert(L.box())
conformance.run(tap, "local/agent", box, { transport = "agent", separate_stderr = true, user = L.role ~= "single" })
box:close()
L.relay_users(tap, "tests/conformance_local_test.lua", os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12")
tap.done()

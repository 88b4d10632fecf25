-- needs: nothing
-- The lifecycle half of the conformance suite (tests/lib/lifecycle.lua) on the
-- backends that need no server: the fake one (tests/lib/fake_backend.lua) and
-- replay, over a trace recorded from fake boxes in this file. The real
-- backends run it in their conformance_*_test.lua.
local tap = require "tap"
local sbx = require "sbx"
local lifecycle = require "lifecycle"

local fake = require "fake_backend"
package.loaded["sbx.backends.fake"] = fake

local function live()
  local n = 0
  for _ in pairs(fake.live) do n = n + 1 end
  return n
end

local function fake_box(opts)
  opts.backend = "fake"
  -- the fake cannot hold pids: refused when asked for
  opts.isolation = { pids = false }
  return sbx.box(opts)
end

lifecycle.run(tap, "fake", fake_box, {
  backend = "fake",
  refuse = { pids = 64 },
  count = live,
  exists = function(b) return fake.live[b.id] ~= nil end,
  remove_behind = function(b) fake.live[b.id] = nil end,
})

-- Replay: a trace of three fake boxes, each replayed as one box.
local path = os.tmpname()
assert(sbx.trace.start(path))
for i = 1, 3 do
  local b = assert(fake_box { respond = function(_, cmd) return { stdout = cmd:match("^echo (.*)") .. "\n" } end })
  assert(b:exec("echo " .. i))
  b:close()
end
sbx.trace.stop()
lifecycle.run(tap, "replay", function(opts)
  opts.backend, opts.trace = "replay", path
  return sbx.box(opts)
end, { backend = "replay" })
-- The lifecycle used two recorded boxes: the third answers as recorded,
-- and there is no fourth.
local third = assert(sbx.box { backend = "replay", trace = path })
local r = third:exec("echo 3")
tap.is(r and r.stdout, "3\n", "replay: the third box answers with the third recorded box's output")
tap.is(third.limits and third.limits.pids.enforced, false, "replay: and reports the recorded box's limits")
third:close()
local extra, err, code = sbx.box { backend = "replay", trace = path }
tap.ok(extra == nil and code == "replay_mismatch", "replay: a fourth box has no recorded box left",
  tostring(err))
os.remove(path)

tap.done()

-- needs: docker
-- read_file of a source that never ends: it stops once more than the
-- limit has arrived, or at its timeout, and the reader (cat) does not
-- outlive the call.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local box = H.box()

local function no_cat_left(what)
  local left = H.procs_matching(box, "^%d+ cat %-%- ")
  tap.is(#left, 0, what .. ": no cat left running in the box (" .. table.concat(left, "; ") .. ")")
end

local function endless(path, max, name)
  local t0 = sbx.now()
  local data, err, code = box:read_file(path, { max_bytes = max, timeout = 20 })
  local dt = sbx.now() - t0
  tap.is(data, nil, name .. ": no data")
  tap.is(code, "too_large", name .. ": too_large")
  tap.like(err, "more than the " .. max .. " bytes", name .. ": the message names the limit")
  tap.ok(dt < 10, string.format("%s: returns promptly (%.2fs), not at the timeout", name, dt))
  no_cat_left(name)
end

endless("/dev/zero", 1000, "/dev/zero")
endless("/dev/urandom", 100000, "/dev/urandom")

-- The policy's own limit, not only an explicit one.
sbx.use_policy { files = { max_read = 64 * 1024 } }
local data, err, code = box:read_file("/dev/zero", { timeout = 20 })
tap.is(code, "too_large", "policy files.max_read bounds /dev/zero (" .. tostring(err) .. ")")
sbx.use_policy { files = { max_read = 16 * 1024 * 1024 } }
no_cat_left("the policy's limit")

-- A file that grows faster than cat reads it.
assert(box:spawn("yes 0123456789 > /tmp/grow", { name = "grower" }))
sbx.sleep(0.3)
endless("/tmp/grow", 1024 * 1024, "a growing file")
box:kill("grower")

-- A FIFO nobody writes to: cat blocks in open(); the timeout ends it.
assert(box:exec("mkfifo /tmp/fifo"))
local t0 = sbx.now()
data, err, code = box:read_file("/tmp/fifo", { timeout = 1 })
local dt = sbx.now() - t0
tap.is(code, "timeout", "a silent FIFO times out (" .. tostring(err) .. ")")
tap.ok(dt >= 1 and dt < 8, string.format("at its timeout (%.2fs)", dt))
no_cat_left("a silent FIFO")

-- A FIFO that streams forever: the limit, not the timeout.
assert(box:spawn("yes > /tmp/fifo", { name = "writer" }))
endless("/tmp/fifo", 5000, "an endless FIFO")
box:kill("writer")

-- Exactly the limit is fine; one byte more is not.
assert(box:write_file("/tmp/exact", string.rep("x", 4096)))
tap.is(box:read_file("/tmp/exact", { max_bytes = 4096 }), string.rep("x", 4096), "a file of exactly max_bytes reads")
data, err, code = box:read_file("/tmp/exact", { max_bytes = 4095 })
tap.is(code, "too_large", "one byte over is too_large")
tap.is(box:read_file("/etc/hostname") ~= nil, true, "ordinary reads still work")
tap.checkerr("max_bytes must be a number >= 0", box.read_file, box, "/etc/hostname", { max_bytes = -1 })
tap.checkerr("timeout must be a positive number", box.read_file, box, "/etc/hostname", { timeout = 0 / 0 })
tap.is(box:read_file("/tmp/exact", { max_bytes = 2 ^ 12 }), string.rep("x", 4096), "a float max_bytes (2^12) is fine")
tap.is(box:read_file("/tmp/exact", { max_bytes = math.huge }), string.rep("x", 4096), "so is math.huge")

box:close()
tap.done()

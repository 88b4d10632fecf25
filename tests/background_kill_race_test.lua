-- needs: nothing
-- box:kill of a background process while the daemon is slow to report the
-- exit code (Podman under load): the process stays "killed", the exit
-- code read meanwhile does not turn it into "exited 137".
local tap = require "tap"
local sbx = require "sbx"
local fake = require "fake_backend"
package.loaded["sbx.backends.fake"] = fake

-- The kill ends the stream at once and returns a little later (the kill
-- command's own exec); the exit code takes longer still to be read.
local kill, finish = fake.kill, fake.finish
fake.kill = function(h, job, signal)
  local ok = kill(h, job, signal)
  sbx.sleep(0.05)
  return ok
end
fake.finish = function(h, job)
  sbx.sleep(0.2)
  return finish(h, job)
end

local box = assert(sbx.box { backend = "fake", respond = function() return { hang = true } end })
local name = assert(box:spawn("sleep 300", { name = "srv" }))
local view = assert(box:kill(name))
tap.is(view.status, "killed", "kill reports killed")
local done = assert(box:wait(name, 5))
tap.is(done.status, "killed", "still killed once the exit code arrived")
tap.like(sbx.tools.call(box:tools(), "list_processes", {}), "srv%s+killed", "list_processes says killed")
tap.like(sbx.tools.call(box:tools(), "kill_process", { name = "srv" }), "stopped %(killed%)", "kill_process says killed")
box:close()
tap.done()

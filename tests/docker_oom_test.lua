-- needs: docker
-- A command the kernel's OOM killer ends says so (oom_killed), and only
-- that command: the count is per box and read after each SIGKILL exit.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local MiB = 1024 * 1024
local box = H.box { memory = 64 * MiB }

-- tail of /dev/zero buffers one endless line: the box's limit ends it.
local r = assert(box:exec("tail /dev/zero", { timeout = 60 }))
tap.is(r.exit_code, 137, "a memory hog ends with SIGKILL's status")
tap.is(r.oom_killed, true, "and the result says the OOM killer did it")
tap.is(r.memory_limit, 64 * MiB, "with the box's memory limit")
local text = box:policy().format_result(r, box:policy())
tap.like(text, "^%[Exit code: 137%]\n%[Out of memory:", "the model reads it after the exit code")
tap.like(text, "64 MiB", "with the limit")

-- A SIGKILL that is not the OOM killer's: no flag.
r = assert(box:exec("kill -9 $$"))
tap.is(r.exit_code, 137, "a self-inflicted SIGKILL is also 137")
tap.is(r.oom_killed, nil, "but not oom_killed: the box's count did not move")
tap.ok(not box:policy().format_result(r, box:policy()):find("Out of memory"), "and the text says nothing about memory")
r = assert(box:exec("echo fine"))
tap.is(r.oom_killed, nil, "an ordinary command is not flagged")

-- Sticky daemon state is not used: the next hog is flagged again, the
-- next self-kill again not.
r = assert(box:exec("tail /dev/zero", { timeout = 60 }))
tap.is(r.oom_killed, true, "a second hog is flagged")
r = assert(box:exec("kill -9 $$"))
tap.is(r.oom_killed, nil, "a second self-kill is not")

-- Through the bash tool.
local t = sbx.tools.call(box:tools(), "bash", { command = "tail /dev/zero" })
tap.like(t, "%[Out of memory: the command was killed for using more than the box's memory limit %(64 MiB%)", "bash tool text")

-- A background hog: its process view says so.
local name = assert(box:spawn("tail /dev/zero"))
local view = assert(box:wait(name, 60))
tap.is(view.exit_code, 137, "a background hog exits 137")
tap.is(view.oom_killed, true, "and its view says oom_killed")
tap.like(sbx.tools.call(box:tools(), "list_processes", { name = name }), "exited 137 %(out of memory%)", "list_processes says so")

-- The harness records it in the phase.
local s = sbx.harness.run { progress = "none", box = { image = H.image, memory = 64 * MiB },
  tasks = { { id = "hog", run = "tail /dev/zero", timeout = 60 } } }
local res = s.results[1]
tap.is(res.status, "failed", "harness: a hog fails its task")
tap.is(res.phases.run.oom_killed, true, "and its run phase says oom_killed")
tap.like(res.reason, "out of memory", "the reason says so")
box:close()
tap.done()

-- needs: nothing
-- Task ids and resume: an id is known by one key in the task list and in
-- the results file read back, so a finished task is skipped exactly; ids
-- a results line cannot hold (not UTF-8, not finite) are usage errors.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local harness = sbx.harness
package.loaded["sbx.backends.fake"] = require "fake_backend"

local function tmp(suffix)
  local p = os.tmpname()
  os.remove(p)
  return p .. suffix
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local ran
local function run(tasks, out)
  ran = {}
  for _, t in ipairs(tasks) do
    t.run = function() ran[#ran + 1] = t.id; return true end
  end
  return harness.run { tasks = tasks, out = out, progress = "none", backend = "fake" }
end

-- Ids that do not survive JSON as they are.
local out = tmp(".jsonl")
local s = run({ { id = 1.0 }, { id = 2 ^ 53 }, { id = 0.1 + 0.2 }, { id = "tâche ✓" }, { id = "plain" } }, out)
tap.is(s.passed, 5, "five tasks pass")
s = run({ { id = 1.0 }, { id = 2 ^ 53 }, { id = 0.1 + 0.2 }, { id = "tâche ✓" }, { id = "plain" } }, out)
tap.is(s.skipped, 5, "a rerun skips all five: 1.0, 2^53, 0.1+0.2, UTF-8 and plain ids resume")
tap.is(#ran, 0, "and runs none (ran: " .. table.concat((function() local t = {} for i, v in ipairs(ran) do t[i] = tostring(v) end return t end)(), ", ") .. ")")
tap.checkerr("task #2: duplicate id '0.3'", harness.run, { progress = "none", backend = "fake",
  tasks = { { id = 0.3, run = "true" }, { id = 0.3, run = "true" } } })
s = run({ { id = 0.3 } }, out)
tap.is(#ran, 1, "0.3 is not 0.1 + 0.2: it runs")
os.remove(out)

-- Ids that are not UTF-8: refused, naming the task, before anything runs.
tap.checkerr("task #2: id is not valid UTF%-8 %(byte 2%)", harness.run, { progress = "none", backend = "fake",
  tasks = { { id = "ok", run = "true" }, { id = "a\255", run = "true" } } })
tap.checkerr("task #1: id must be a finite number", harness.run, { progress = "none", backend = "fake",
  tasks = { { id = 1 / 0, run = "true" } } })
tap.checkerr("task #1: id must be a finite number", harness.run, { progress = "none", backend = "fake",
  tasks = { { id = 0 / 0, run = "true" } } })

-- From a JSON Lines file: two ids differing only in invalid bytes.
local file = tmp(".jsonl")
write(file, '{"id": "ok", "run": "true"}\n\n{"id": "a\255", "run": "true"}\n{"id": "a\254", "run": "true"}\n')
local tasks, err = harness.load_tasks(file)
tap.is(tasks, nil, "a task file with an id that is not UTF-8 does not load")
tap.like(err, ":3: task id is not valid UTF%-8 %(byte 2%)", "the message names the line (" .. tostring(err) .. ")")
local cli_out, code = H.sh(string.format("%s eval %s --backend fake", H.sbx_bin, file))
tap.is(code, 2, "sbx eval: a usage error")
tap.like(cli_out, ":3: task id is not valid UTF%-8", "saying where")
os.remove(file)
tap.done()

-- sbx: the public Lua API. Mechanism comes from sbx.core (C); everything
-- that decides (limits, names, texts) comes from the active policy.
local core = require "sbx.core"
local util = require "sbx.util"
local config = require "sbx.config"
local tasks = require "sbx.tasks"

local sbx = {
  core = core,
  version = core.version,
  json = core.json,
  text = core.text,
  http = require "sbx.http",
  ssm = core.ssm,         -- the SSM data-channel frame codec
  sigv4 = core.sigv4,     -- AWS Signature V4
  now = core.now,
  sleep = core.sleep,
  event = core.event,
}

-- sbx.model_text(s) -> text, replaced: s as valid UTF-8 for a model or a
-- JSON document, and how many of its bytes were not UTF-8 (each maximal
-- invalid run became one U+FFFD). Results keep the bytes; only what is
-- made for a model or JSON goes through here.
sbx.model_text = util.model_text

-- Policy ------------------------------------------------------------------

-- The live policy lives in sbx.config (a leaf the other modules read, so
-- none of them needs this facade): sbx.policy, sbx.policy_generation and
-- sbx.draining_since are its fields, read and written through here.
local LIVE = { policy = "policy", policy_generation = "generation", draining_since = "draining_since" }
setmetatable(sbx, {
  __index = function(_, k)
    local f = LIVE[k]
    if f then return config[f] end
  end,
  __newindex = function(t, k, v)
    local f = LIVE[k]
    if f then config[f] = v else rawset(t, k, v) end
  end,
})

sbx.merge_policy = util.merge
sbx.deep_copy = util.deep_copy
sbx.policy_check = require "sbx.policy_check"

-- sbx.load_policy(p [, base]) -> overlay: a table, a bundled name
-- ("lm-deluge") or a file whose chunk returns a table. A file's chunk gets a
-- copy of base (the live policy by default) and may edit it and return
-- nothing, which makes that copy the overlay. The overlay is validated:
-- a mistake raises an error naming the field and what it needs.
sbx.load_policy = config.load

-- sbx.use_policy(file_or_name_or_table) -> the live policy, with the
-- overlay merged in. Every box reads the live policy at each call, so the
-- change reaches the next call of every existing box.
sbx.use_policy = config.use

-- sbx.deadline(seconds, fn, ...) -> true, results... | false, message, code.
-- Runs fn(...) for at most seconds, waits included: code "timeout" when it
-- ran out (a loop that never waits is stopped by the instruction-count
-- hook; a pcall inside fn cannot keep it going), "interrupted" on SIGINT or
-- SIGTERM, "error" when fn raised. docs/lua-deadlines.md.
sbx.deadline = core.deadline

-- Tasks ---------------------------------------------------------------------

-- spawn, wait, gather and semaphore live in sbx.tasks (a leaf the
-- modules below this facade use without it).
local spawned = tasks.spawned
sbx.spawn = tasks.spawn
sbx.wait = tasks.wait
sbx.gather = tasks.gather
sbx.semaphore = tasks.semaphore

-- Runs until every spawned task has finished; reports failures nobody read.
function sbx.drain()
  -- Background chores (removals a frozen daemon held up) give up
  -- destroy_timeout seconds from now: a script's end never waits for more.
  sbx.draining_since = sbx.draining_since or core.now()
  local ok, err = core.drain()
  local interrupted = core.signals() > 0
  for t in pairs(spawned) do
    if t:status() == "failed" and not t:observed() then
      local finished, msg = t:result()
      -- No result (nil): nobody held the task and the collector finalized
      -- it; its weak entry goes at the next cycle. Like a task already gone
      -- from spawned, it is not reported.
      -- After a signal every waiting task fails the same way: say it once.
      if finished ~= nil and not (interrupted and core.is_cancel(msg) == "interrupted") then
        io.stderr:write("sbx: a task failed and nobody waited for it: ", tostring(msg), "\n")
      end
    end
    if t:done() then spawned[t] = nil end
  end
  if not ok then io.stderr:write("sbx: ", err, "\n") end
  return ok
end

-- Boxes -----------------------------------------------------------------------

local box = require "sbx.box"
box.init(sbx)

sbx.box = box.new
sbx.pool = require("sbx.pool").new
sbx.boxes = box.open_boxes
sbx.reap = box.reap

-- Closes every box this process still has open (normal exit, error, signal).
function sbx.shutdown()
  box.close_all()
end

sbx.tools = require "sbx.tools"
sbx.tools.init(sbx)

sbx.harness = require "sbx.harness"
sbx.httpc = require "sbx.httpc"
sbx.trace = require "sbx.trace"
return sbx

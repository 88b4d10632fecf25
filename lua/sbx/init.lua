-- sbx: the public Lua API. Mechanism comes from sbx.core (C); everything
-- that decides (limits, names, texts) comes from the active policy.
local core = require "sbx.core"

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
function sbx.model_text(s)
  local text, runs = core.text.sanitize(s)
  if runs == 0 then return text, 0 end
  return text, #s - (#text - 3 * runs)
end

-- Policy ------------------------------------------------------------------

local defaults = require "sbx.policy"

local function is_list(t)
  return type(t) == "table" and (#t > 0 or next(t) == nil)
end

-- Merges src over dst in place: tables merge recursively, lists and every
-- other value replace.
local function merge(dst, src)
  for k, v in pairs(src) do
    if type(v) == "table" and type(dst[k]) == "table" and not is_list(v) and not is_list(dst[k]) then
      merge(dst[k], v)
    else
      dst[k] = v
    end
  end
  return dst
end

local function deep_copy(t)
  if type(t) ~= "table" then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = deep_copy(v) end
  return setmetatable(c, getmetatable(t))
end

sbx.policy = deep_copy(defaults)
sbx.merge_policy = merge
sbx.deep_copy = deep_copy
sbx.policy_check = require "sbx.policy_check"

-- Policy changes bump this, so what was derived from the policy (a box's
-- merged view) is derived again.
sbx.policy_generation = 0

-- sbx.load_policy(p [, base]) -> overlay: a table, a bundled name
-- ("lm-deluge") or a file whose chunk returns a table. A file's chunk gets a
-- copy of base (the live policy by default) and may edit it and return
-- nothing, which makes that copy the overlay. The overlay is validated:
-- a mistake raises an error naming the field and what it needs.
function sbx.load_policy(p, base)
  local overlay = p
  local what = type(p) == "string" and string.format("policy '%s': ", p) or ""
  if type(p) == "string" then
    local ok, mod = pcall(require, "sbx.policies." .. p)
    if ok then
      overlay = deep_copy(mod)
    else
      local chunk, err = loadfile(p, "t")
      if not chunk then
        error(string.format("policy '%s' is neither a bundled policy nor a readable file: %s", p, err), 0)
      end
      local work = deep_copy(base or sbx.policy)
      local cok, ret = pcall(chunk, work)
      if not cok then error(string.format("policy '%s' failed to load: %s", p, tostring(ret)), 0) end
      overlay = ret == nil and work or ret
    end
  elseif type(p) == "table" then
    overlay = deep_copy(p)
  end
  if type(overlay) ~= "table" then
    error(string.format("%sa policy must be a table (got %s)", what, type(overlay)), 0)
  end
  local ok, msg = sbx.policy_check.policy(overlay)
  if not ok then error(what .. msg, 0) end
  return overlay
end

-- sbx.use_policy(file_or_name_or_table) -> the live policy, with the
-- overlay merged in. Every box reads the live policy at each call, so the
-- change reaches the next call of every existing box.
function sbx.use_policy(p)
  local overlay = sbx.load_policy(p)
  local merged = merge(deep_copy(sbx.policy), overlay)
  local ok, msg = sbx.policy_check.policy(merged)
  if not ok then error(msg, 0) end
  merge(sbx.policy, overlay)
  sbx.policy_generation = sbx.policy_generation + 1
  core.scheduler(sbx.policy.scheduler)
  return sbx.policy
end

core.scheduler(sbx.policy.scheduler)

-- sbx.deadline(seconds, fn, ...) -> true, results... | false, message, code.
-- Runs fn(...) for at most seconds, waits included: code "timeout" when it
-- ran out (a loop that never waits is stopped by the instruction-count
-- hook; a pcall inside fn cannot keep it going), "interrupted" on SIGINT or
-- SIGTERM, "error" when fn raised. docs/lua-deadlines.md.
sbx.deadline = core.deadline

-- Tasks ---------------------------------------------------------------------

local spawned = setmetatable({}, { __mode = "k" })

-- sbx.spawn(fn, ...) -> task: runs fn(...) as a coroutine on the loop.
function sbx.spawn(fn, ...)
  local t = core.spawn(fn, ...)
  spawned[t] = true
  return t
end

-- sbx.wait(task [, timeout]) -> the task's results; re-raises its error.
-- With a timeout, returns nil, "timeout", "timeout" when it is not done.
function sbx.wait(task, timeout)
  if not task:join(timeout) then return nil, "timeout", "timeout" end
  local r = table.pack(task:result())
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- sbx.gather(tasks) -> { first result of each task, in order }. Waits for
-- all of them; then raises the first error, if any.
function sbx.gather(tasks)
  local out, first_err = {}, nil
  for i, t in ipairs(tasks) do
    t:join()
    local r = table.pack(t:result())
    if r[1] then out[i] = r[2] elseif not first_err then first_err = r[2] end
  end
  if first_err then error(first_err, 0) end
  return out
end

-- sbx.semaphore(n): sem:acquire(), sem:release(), sem:with(fn, ...).
local Semaphore = {}
Semaphore.__index = Semaphore

function sbx.semaphore(n)
  assert(math.type(n) == "integer" and n > 0, "semaphore size must be a positive integer")
  return setmetatable({ free = n, size = n, queue = {} }, Semaphore)
end

function Semaphore:acquire()
  while self.free <= 0 do
    local ev = core.event()
    self.queue[#self.queue + 1] = ev
    ev:wait()
  end
  self.free = self.free - 1
end

function Semaphore:release()
  self.free = self.free + 1
  local ev = table.remove(self.queue, 1)
  if ev then ev:set() end
end

function Semaphore:with(fn, ...)
  self:acquire()
  local r = table.pack(pcall(fn, ...))
  self:release()
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

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
      if finished ~= nil and not (interrupted and tostring(msg):find("^interrupted")) then
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

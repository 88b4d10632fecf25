-- sbx.pool: warm pools. A pool keeps `size` boxes of one spec made ahead,
-- on any backend, so a taker gets a box without waiting for one to be made.
--
--   local pool = assert(sbx.pool { size = 8, box = { image = "sbx-debian:12" } })
--   local box <close> = assert(pool:take(30))   -- yours: close() destroys it
--   print(pool:stats().ready)
--   pool:close()                                 -- the boxes still waiting go
--
-- What a pool promises:
--   * A box is handed out once. The taker owns it: box:close() destroys it
--     and never gives it back; the pool makes another in the background.
--   * Creation is bounded: the pool aims at `size` ready boxes plus one for
--     every taker waiting, with at most policy.pool.create_concurrency
--     creations at once, or one per waiting taker when more wait (as many
--     as those takers would make on their own: a pool never makes a caller
--     queue behind its bound). After a failed creation it makes one box at
--     a time, min(backoff.max, backoff.base * 2^(k-1)) seconds after the
--     k-th failure in a row: a failing image never loops hot.
--   * take() answers at once with a ready box; else it waits for the next
--     one. While the pool is failing (its latest creation failed and none
--     succeeded since) and nothing is ready, take() returns that failure at
--     once (nil, message, code), and every taker already waiting gets it
--     when it happens: a broken image fails callers fast instead of holding
--     them through the backoff; the first successful creation ends it.
--   * A pooled box's lifetime counts from the start of its creation. A box
--     that waited past its retirement age (policy.pool.max_age, and
--     1 - lifetime_margin of its lifetime) is closed and replaced, and
--     take() never hands one out.
--   * Pooled boxes are ordinary boxes of this process: labelled (the
--     owner's labels, and sbx.pool=<pool id>), removed at exit, on SIGINT
--     or SIGTERM (creations in flight are cancelled and cleaned up first),
--     and by `sbx reap` after kill -9. The pool's tasks never keep `sbx run`
--     from ending.
local M = {}

local core = require "sbx.core"
local config = require "sbx.config"
local util = require "sbx.util"
local policy_check = require "sbx.policy_check"

local Pool = {}
Pool.__index = Pool
M.Pool = Pool

-- Pools not closed yet: closed at exit, before the open boxes are removed.
local live = {}

-- The per-pool overrides of policy.pool that sbx.pool{} takes.
local KNOBS = { create_concurrency = true, backoff = true, max_age = true, lifetime_margin = true }
local OPTIONS = { "size", "box", "create_concurrency", "backoff", "max_age", "lifetime_margin" }

local function is_stop(e)
  local kind = core.is_cancel(e)
  return kind == "interrupted" or kind == "cancelled"
end

-- Equality of box options ----------------------------------------------------

-- same(a, b): deep equality. Tables are equal when they have the same keys
-- with equal values at every depth (metatables ignored); numbers compare by
-- value (1 == 1.0); everything else (strings, booleans, functions) by ==.
local function same(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  for k, v in pairs(a) do
    if not same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end
M.same = same

-- resolve(opts) -> spec: what sbx.box(opts) would make under the live
-- policy: policy.box (of the box's overlay, when opts.policy is one) with
-- opts over it, the overlay itself kept as given.
local function resolve(opts)
  local pol = config.policy
  if opts.policy ~= nil then
    pol = util.merge(util.deep_copy(config.policy), config.load(opts.policy))
  end
  local spec = util.merge({}, util.deep_copy(pol.box))
  for k, v in pairs(opts) do spec[k] = v end
  return spec
end
M.resolve = resolve

-- Knobs -------------------------------------------------------------------------

local function knob(self, name)
  local v = self.knobs[name]
  if v == nil then v = config.policy.pool[name] end
  return v
end

local function backoff_delay(self, failures)
  local b, d = self.knobs.backoff or {}, config.policy.pool.backoff
  local base, max = b.base or d.base, b.max or d.max
  return util.backoff(failures, base, max, false)
end

-- The resolved spec, again after a policy change (sbx.use_policy).
local function spec_of(self)
  local gen = config.generation
  if self.spec_gen ~= gen then
    self.spec, self.spec_gen = resolve(self.box), gen
  end
  return self.spec
end

-- Seconds a box may wait in the pool.
local function retire_age(self)
  local age = spec_of(self).lifetime * (1 - knob(self, "lifetime_margin"))
  local max_age = knob(self, "max_age")
  if max_age then age = math.min(age, max_age) end
  return age
end

-- Background work ---------------------------------------------------------------

-- Runs fn(...) as an unref'd task the pool tracks in set until it ends
-- (pool:close joins them, so none is cut off by the host's teardown).
local function background(set, fn, ...)
  local rec = { signals = core.signals() }
  local args = table.pack(...)
  rec.task = core.spawn(function()
    pcall(fn, table.unpack(args, 1, args.n))
    set[rec] = nil
  end)
  rec.task:unref()
  set[rec] = true
  return rec
end

-- Closes a box the pool will not hand out (too old, above size, drained).
local function retire(self, box)
  self.retired = self.retired + 1
  if box.closed then return end
  background(self.closing, box.close, box)
end

-- A new box goes to the first waiting taker, else to the ready list, else
-- (the pool is full: it shrank, or a taker gave up) it is retired.
local function deliver(self, entry)
  local w = table.remove(self.waiters, 1)
  if w then
    w.entry = entry
    w.ev:set()
  elseif #self.ready < self.size and not self.closed then
    self.ready[#self.ready + 1] = entry
  else
    retire(self, entry.box)
  end
end

-- One creation, in its own task.
local function create(self)
  local born = core.now()
  local ok, b, err, code = pcall(require("sbx.box").new, self.create_opts)
  self.creating = self.creating - 1
  if not ok then
    -- Cancelled (pool:close) or interrupted (a signal): a box half made
    -- was removed by the backend on the way out; nothing to count.
    if is_stop(b) then self.wake:set() return end
    b, err, code = nil, tostring(b), "raised"
  end
  if b then
    self.created = self.created + 1
    self.failing, self.backoff_until = 0, 0
    deliver(self, { box = b, born = born })
  else
    self.failures = self.failures + 1
    self.failing = self.failing + 1
    self.last_error, self.last_code = tostring(err), code
    self.backoff_until = core.now() + backoff_delay(self, self.failing)
    local waiters = self.waiters
    self.waiters = {}
    for _, w in ipairs(waiters) do
      w.err, w.code = self.last_error, code
      w.ev:set()
    end
  end
  self.wake:set()
end

-- Takes ready boxes past their age (or closed under the pool) out and
-- retires them; returns the seconds until the next one is due, or nil.
local function retire_old(self, now)
  local age, due = retire_age(self), nil
  local keep = {}
  for _, e in ipairs(self.ready) do
    if e.box.closed or now - e.born >= age then
      retire(self, e.box)
    else
      keep[#keep + 1] = e
      local left = e.born + age - now
      if not due or left < due then due = left end
    end
  end
  self.ready = keep
  -- Above size (pool:resize): the oldest go first.
  while #self.ready > self.size do retire(self, table.remove(self.ready, 1).box) end
  return due
end

-- The keeper: one task per pool. Retires old boxes and starts creations
-- until ready + creating covers size and the waiting takers, within the
-- concurrency and outside the backoff; then sleeps until something is due
-- or the pool's wake event is set (a take, a creation ended, a resize).
local function keep(self)
  while not self.closed do
    self.wake:clear()
    local now = core.now()
    local due = retire_old(self, now)
    local want = self.size + #self.waiters - #self.ready - self.creating
    if want > 0 then
      if now < self.backoff_until then
        local left = self.backoff_until - now
        if not due or left < due then due = left end
      else
        -- Takers waiting with nothing ready get one creation each, as if
        -- each made its own box: the pool never makes them queue behind
        -- its bound.
        local limit = self.failing > 0 and 1 or math.max(knob(self, "create_concurrency"), #self.waiters)
        while want > 0 and self.creating < limit do
          self.creating = self.creating + 1
          background(self.creators, create, self)
          want = want - 1
        end
      end
    end
    self.wake:wait(due)
  end
end

local function ensure_keeper(self)
  if self.keeper and not self.keeper:done() then return end
  self.keeper = core.spawn(function() pcall(keep, self) end)
  self.keeper:unref()
end

-- The pool ------------------------------------------------------------------------

local function check_pool(self, level)
  if getmetatable(self) ~= Pool then error("pool method called without a pool (use pool:method)", level + 1) end
end

local function check_size(size, what, min)
  local n = type(size) == "number" and math.tointeger(size)
  if not n or n < min then
    error(string.format("%s must be an integer >= %d, not %s", what, min, tostring(size)), 3)
  end
  return n
end

-- sbx.pool{ size = N, box = { ... }, create_concurrency, backoff, max_age,
-- lifetime_margin } -> pool | nil, message, code. box: the options of
-- sbx.box{} (checked now: a mistake raises here, not in the background);
-- size defaults to policy.pool.size; the other keys override policy.pool
-- for this pool. Isolation the backend cannot enforce is refused before
-- anything is made (nil, message, "unsupported"); creation failures come
-- from take(). The pool starts filling at once.
function M.new(opts)
  if type(opts) ~= "table" then error("sbx.pool expects a table of options", 2) end
  for k in pairs(opts) do
    local known = false
    for _, n in ipairs(OPTIONS) do if n == k then known = true end end
    if not known then
      local near = type(k) == "string" and policy_check.nearest(k, OPTIONS)
      error(string.format("sbx.pool: unknown option '%s'%s", tostring(k),
        near and string.format(" (did you mean '%s'?)", near) or string.format(" (known: %s)", table.concat(OPTIONS, ", "))), 2)
    end
  end
  local size = opts.size
  if size == nil then
    size = config.policy.pool.size
    if size == 0 then error("sbx.pool needs size = N (policy.pool.size is 0)", 2) end
  end
  size = check_size(size, "sbx.pool: size", 1)
  if opts.box ~= nil and type(opts.box) ~= "table" then error("sbx.pool: box must be a table of box options", 2) end
  local knobs = {}
  for k in pairs(KNOBS) do knobs[k] = opts[k] end
  local kok, kmsg = policy_check.policy { pool = util.deep_copy(knobs) }
  if not kok then error("sbx.pool: " .. kmsg:gsub("^policy field pool%.", "option "), 2) end

  local box = util.deep_copy(opts.box or {})
  local pol = config.policy
  if box.policy ~= nil then
    pol = util.merge(util.deep_copy(config.policy), config.load(box.policy))
  end
  local bname = require("sbx.box").backend_name(box.backend or pol.box.backend, box, pol)
  local bok, backend = pcall(require("sbx.backend").load, bname)
  if not bok then error("sbx.pool: " .. tostring(backend), 2) end
  local ok, msg = policy_check.box_options(box, backend)
  if not ok then error("sbx.pool: " .. msg, 2) end
  local spec = resolve(box)
  local limits, lerr, lcode = require("sbx.limits").resolve(backend, spec, box, pol)
  if limits == nil then return nil, lerr, lcode end

  local id = require("sbx.job").random_id()
  local create_opts = util.deep_copy(box)
  create_opts.labels = create_opts.labels or {}
  create_opts.labels["sbx.pool"] = id
  local self = setmetatable({
    id = id,
    size = size,
    box = box,                 -- the options every pooled box is made with (sbx.pool label aside)
    create_opts = create_opts,
    knobs = knobs,
    ready = {},                -- { box, born } oldest first
    waiters = {},              -- { ev, entry | err, code } first come, first served
    creators = {},             -- creations in flight (tasks)
    closing = {},              -- retirements in flight (tasks)
    wake = core.event(),
    creating = 0, created = 0, taken = 0, failures = 0, retired = 0,
    failing = 0,               -- failed creations in a row
    backoff_until = 0,
    closed = false,
  }, Pool)
  live[self] = true
  ensure_keeper(self)
  return self
end

function Pool:__tostring()
  return string.format("sbx.pool %s (%d of %d ready%s)", self.id, #self.ready, self.size, self.closed and ", closed" or "")
end

-- pool:take([timeout]) -> box | nil, message, code. A ready box at once
-- (never yields then); else waits up to timeout seconds (nil: as long as
-- it takes) for the next one. Codes: "timeout"; a creation's own code
-- (the pool is failing: see the top of this file); "closed" when the pool
-- was closed while waiting. Raises on a closed pool.
function Pool:take(timeout)
  check_pool(self, 2)
  if self.closed then error("attempt to take from a closed pool", 2) end
  if timeout ~= nil and (type(timeout) ~= "number" or not (timeout >= 0)) then
    error("timeout must be a number of seconds >= 0", 2)
  end
  ensure_keeper(self)
  local now, age = core.now(), retire_age(self)
  while self.ready[1] do
    local e = table.remove(self.ready, 1)
    if not e.box.closed and now - e.born < age then
      self.taken = self.taken + 1
      self.wake:set()
      return e.box
    end
    retire(self, e.box)
  end
  if self.failing > 0 then return nil, self.last_error, self.last_code end
  if timeout == 0 then return nil, "no box is ready", "timeout" end
  local w = { ev = core.event() }
  self.waiters[#self.waiters + 1] = w
  self.wake:set()
  local ok, err = pcall(w.ev.wait, w.ev, timeout)
  for i, x in ipairs(self.waiters) do
    if x == w then table.remove(self.waiters, i) break end
  end
  if not ok then
    -- Cancelled or interrupted: a box given to us meanwhile goes back.
    if w.entry then deliver(self, w.entry) end
    error(err, 0)
  end
  if w.entry then
    self.taken = self.taken + 1
    return w.entry.box
  end
  if w.err then return nil, w.err, w.code end
  if self.closed then return nil, "the pool was closed while waiting for a box", "closed" end
  return nil, string.format("no box was ready within %g s", timeout), "timeout"
end

-- pool:resize(n): keep n boxes ready from now on (0 is allowed: then only
-- waiting takers get boxes made). Boxes above it are retired, oldest first.
function Pool:resize(n)
  check_pool(self, 2)
  if self.closed then error("attempt to resize a closed pool", 2) end
  self.size = check_size(n, "size", 0)
  self.wake:set()
  return self
end

-- pool:matches(opts) -> bool: whether sbx.box(opts) would make a box of
-- this pool's spec: both resolved under the live policy (policy.box with
-- the options over it, as sbx.box merges them) and compared deeply (same
-- keys, equal values at every depth; numbers by value; functions by
-- identity). The pool's own sbx.pool label is not part of its spec.
function Pool:matches(opts)
  check_pool(self, 2)
  if type(opts) ~= "table" then error("matches expects a table of box options", 2) end
  return same(spec_of(self), resolve(opts))
end

-- pool:stats() -> { size, ready, creating, waiting, created, taken,
-- failures, retired, failing, last_error, last_code, closed }. created =
-- taken + retired + ready, once no box is on its way to a taker.
function Pool:stats()
  check_pool(self, 2)
  return {
    size = self.size,
    ready = #self.ready,
    creating = self.creating,
    waiting = #self.waiters,
    created = self.created,        -- boxes made
    taken = self.taken,            -- boxes handed out
    failures = self.failures,      -- creations that failed
    retired = self.retired,        -- boxes closed unused: too old, above size, drained by close
    failing = self.failing,        -- failed creations in a row (0: healthy)
    last_error = self.last_error,  -- the latest creation failure
    last_code = self.last_code,
    closed = self.closed,
  }
end

-- pool:close(): no more boxes. Waiting takers get nil, message, "closed";
-- creations in flight are cancelled (the backend removes what they had
-- made); ready boxes are destroyed, all at once. Boxes already taken stay
-- their takers'. Idempotent; waits for its removals (each bounded by
-- policy.box.destroy_timeout).
function Pool:close()
  check_pool(self, 2)
  if self.closed then return true end
  self.closed = true
  live[self] = nil
  local waiters = self.waiters
  self.waiters = {}
  for _, w in ipairs(waiters) do w.ev:set() end
  self.wake:set()
  local function join_all(set)
    local list = {}
    for rec in pairs(set) do list[#list + 1] = rec.task end
    for _, t in ipairs(list) do pcall(t.join, t) end
  end
  -- A creation a signal already interrupted is removing what it made
  -- (the backend's clean-up runs in the creation's task): cancelling it
  -- again would cut that short and leave the box behind. Only the others
  -- are cancelled; all are waited for.
  local signals = core.signals()
  for rec in pairs(self.creators) do
    if rec.signals == signals then rec.task:cancel() end
  end
  join_all(self.creators)
  local ready = self.ready
  self.ready = {}
  for _, e in ipairs(ready) do retire(self, e.box) end
  join_all(self.closing)
  return true
end
Pool.__close = Pool.close

-- At exit (box.close_all): every pool stops and drains first, so no box a
-- pool was still making lands among the open boxes after they were removed.
function M.close_all()
  local pools = {}
  for p in pairs(live) do pools[#pools + 1] = p end
  for _, p in ipairs(pools) do pcall(p.close, p) end
end
table.insert(require("sbx.box").before_close_all, M.close_all)

return M

-- needs: nothing
-- Warm pools (sbx.pool) on the daemon-free fake backend: the contract,
-- taking, never twice, bounded creation, backoff on a failing backend,
-- retirement by age, resize, close and drain, the exit hook, spec matching
-- and the harness with a pool. tests/pool_docker_test.lua has real boxes.
package.loaded["sbx.backends.fake"] = require "fake_backend"
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local fake = require "fake_backend"

-- Waits (bounded) until cond() holds; returns whether it did.
local function until_(cond, limit)
  local deadline = sbx.now() + (limit or 10)
  while not cond() do
    if sbx.now() > deadline then return false end
    sbx.sleep(0.01)
  end
  return true
end

-- Handles of the fake backend still alive that a pool made.
local function live_of(pool)
  local n = 0
  for _, h in pairs(fake.live) do
    if h.labels and h.labels["sbx.pool"] == pool.id then n = n + 1 end
  end
  return n
end

local FAKE = { backend = "fake", respond = function(_, cmd) return { stdout = "ran " .. tostring(cmd) } end }

-- The contract --------------------------------------------------------------------

tap.ok(type(sbx.pool) == "function", "sbx.pool is exposed")
tap.checkerr("expects a table", sbx.pool, 3)
tap.checkerr("size must be an integer >= 1, not 0", sbx.pool, { size = 0, box = FAKE })
tap.checkerr("size must be an integer >= 1, not 2.5", sbx.pool, { size = 2.5, box = FAKE })
tap.checkerr("size must be an integer >= 1, not 3", sbx.pool, { size = "3", box = FAKE })
tap.checkerr("needs size = N %(policy.pool.size is 0%)", sbx.pool, { box = FAKE })
tap.checkerr("unknown option 'sise' %(did you mean 'size'%?%)", sbx.pool, { sise = 2, box = FAKE })
tap.checkerr("sbx.pool: unknown box option 'memroy' %(did you mean 'memory'%?%)", sbx.pool,
  { size = 1, box = { backend = "fake", memroy = 1 } })
tap.checkerr("unknown backend 'nope'", sbx.pool, { size = 1, box = { backend = "nope" } })
tap.checkerr("option create_concurrency must be > 0", sbx.pool, { size = 1, box = FAKE, create_concurrency = 0 })
tap.checkerr("option lifetime_margin: must be below 1", sbx.pool, { size = 1, box = FAKE, lifetime_margin = 1 })
tap.checkerr("unknown policy field pool.backoff.bse %(did you mean pool.backoff.base%?%)",
  sbx.load_policy, { pool = { backoff = { bse = 1 } } })
tap.checkerr("pool.size must be >= 0", sbx.load_policy, { pool = { size = -1 } })
tap.checkerr("pool.max_age must be > 0", sbx.load_policy, { pool = { max_age = 0 } })
do
  local p, err, code = sbx.pool { size = 1, box = { backend = "fake", pids = 64, isolation = { pids = false } } }
  tap.is(p, nil, "isolation the backend cannot enforce: no pool")
  tap.is(code, "unsupported", "code unsupported")
  tap.like(err, "pids = 64", "the message names the option")
  tap.is(#fake.attempts, 0, "and nothing was made")
end

-- Taking ----------------------------------------------------------------------------

do
  local pool = assert(sbx.pool { size = 3, box = FAKE })
  tap.like(tostring(pool), "^sbx%.pool %x+ %(0 of 3 ready%)$", "tostring")
  tap.ok(until_(function() return pool:stats().ready == 3 end), "the pool fills to its size")
  local st = pool:stats()
  tap.is(st.created, 3, "three boxes made")
  tap.is(st.creating, 0, "none being made once full")
  local box = pool:take(0)
  tap.ok(box ~= nil, "take(0) from a warm pool hands out a box without waiting")
  tap.is(box.handle.labels["sbx.pool"], pool.id, "a pooled box is labelled sbx.pool=<pool id>")
  local r = assert(box:exec("echo hi"))
  tap.is(r.stdout, "ran echo hi", "the taker's box runs commands")
  tap.is(pool:stats().taken, 1, "taken counts it")
  tap.ok(until_(function() return pool:stats().ready == 3 end), "the pool refills in the background")
  tap.is(pool:stats().created, 4, "with one more box")
  local id = box.id
  box:close()
  tap.is(fake.live[id], nil, "close() destroys a taken box")
  tap.is(pool:stats().ready, 3, "and does not give it back")
  for _, e in ipairs(pool.ready) do tap.ok(e.box.id ~= id, "the closed box is not among the ready ones") end
  pool:close()
end

-- Never twice, under concurrent takes ----------------------------------------------

do
  local pool = assert(sbx.pool { size = 4, box = { backend = "fake", create_delay = 0.005 } })
  local seen, dup, got, tasks = {}, 0, 0, {}
  for i = 1, 40 do
    tasks[i] = sbx.spawn(function()
      local b, err = pool:take(30)
      assert(b, err)
      if seen[b.id] then dup = dup + 1 end
      seen[b.id] = true
      got = got + 1
      sbx.sleep((i % 5) * 0.003)
      b:close()
    end)
  end
  sbx.gather(tasks)
  tap.is(got, 40, "40 concurrent takers each got a box")
  tap.is(dup, 0, "no box was handed out twice")
  local st = pool:stats()
  tap.is(st.taken, 40, "taken = 40")
  tap.ok(until_(function() return pool:stats().creating == 0 end), "creations settle")
  st = pool:stats()
  tap.is(st.created, st.taken + st.retired + st.ready, "created = taken + retired + ready")
  pool:close()
  tap.is(live_of(pool), 0, "closing the pool leaves none of its boxes")
end

-- Bounded creation ----------------------------------------------------------------------

do
  fake.peak_creating = 0
  local pool = assert(sbx.pool { size = 4, box = { backend = "fake", create_delay = 0.03 }, create_concurrency = 2 })
  tap.ok(until_(function() return pool:stats().ready == 4 end), "a pool of 4 fills")
  tap.is(fake.peak_creating, 2, "making boxes ahead: create_concurrency creations at once")
  pool:close()

  fake.peak_creating = 0
  pool = assert(sbx.pool { size = 1, box = { backend = "fake", create_delay = 0.03 }, create_concurrency = 2 })
  local tasks = {}
  for i = 1, 6 do tasks[i] = sbx.spawn(function() local b = assert(pool:take()) sbx.sleep(0.2) b:close() end) end
  sbx.gather(tasks)
  tap.ok(fake.peak_creating <= 6, "with takers waiting: no more than one creation each", fake.peak_creating)
  tap.ok(fake.peak_creating > 2, "but not held to create_concurrency", fake.peak_creating)
  pool:close()
end

-- A failing backend backs off -----------------------------------------------------------

do
  local broken = true
  local first = #fake.attempts + 1
  fake.peak_creating = 0
  local pool = assert(sbx.pool {
    size = 2, create_concurrency = 4, backoff = { base = 0.1, max = 0.4 },
    box = { backend = "fake", create_fail = function()
      if broken then return "no such image: sbx-missing:1", "image_unavailable" end
    end },
  })
  local b, err, code = pool:take()
  tap.is(b, nil, "take from a failing pool: no box")
  tap.is(code, "image_unavailable", "the creation's own code")
  tap.like(err, "no such image", "and message")
  -- The first creations start together (size 2 and the taker, up to
  -- create_concurrency) before the pool knows it is failing.
  local burst = #fake.attempts - first + 1
  tap.is(burst, 3, "the first creations: one per box wanted")
  fake.peak_creating = 0
  local n = #fake.attempts
  b, err, code = pool:take(30)
  tap.is(code, "image_unavailable", "a take while failing answers the last error at once")
  tap.is(#fake.attempts, n, "without a creation of its own")
  sbx.sleep(1.2)
  local attempts = #fake.attempts - first + 1
  tap.ok(attempts >= 3 and attempts <= 8, "a second with backoff 0.1..0.4 s makes a handful of attempts, not a hot loop", attempts)
  tap.is(fake.peak_creating, 1, "one creation at a time while failing")
  local ok_gaps = true
  for k = first + burst, #fake.attempts do
    local want = math.min(0.4, 0.1 * 2 ^ (k - first - 1))
    local gap = fake.attempts[k].at - fake.attempts[k - 1].at
    if gap < want * 0.9 then ok_gaps = false; tap.diag(string.format("attempt %d after %.3f s, backoff %.3f s", k - first + 1, gap, want)) end
  end
  tap.ok(ok_gaps, "each retry waits its backoff (doubling from base, up to max)")
  local st = pool:stats()
  -- An attempt the fake has begun but not yet failed (one at most) is
  -- "creating", not yet a failure.
  tap.is(st.failures + st.creating, #fake.attempts - first + 1,
    "failures counts every failed creation (and the one in flight is creating)")
  tap.ok(st.failing >= 3, "failing counts them in a row", st.failing)
  tap.like(st.last_error, "no such image", "last_error")
  tap.is(st.last_code, "image_unavailable", "last_code")
  broken = false
  tap.ok(until_(function() b, err = pool:take() return b ~= nil end, 5), "the pool recovers at the next successful creation", err)
  tap.is(pool:stats().failing, 0, "and is healthy again")
  if b then b:close() end
  pool:close()
end

-- Retirement by age -----------------------------------------------------------------------

do
  local pool = assert(sbx.pool { size = 2, box = { backend = "fake" }, max_age = 0.15 })
  tap.ok(until_(function() return pool:stats().ready == 2 end), "pool filled")
  local firsts = {}
  for _, e in ipairs(pool.ready) do firsts[#firsts + 1] = e.box.id end
  tap.ok(until_(function() return pool:stats().retired >= 2 end), "boxes older than max_age are retired")
  for _, id in ipairs(firsts) do tap.is(fake.live[id], nil, "a retired box is destroyed") end
  tap.ok(until_(function() return pool:stats().ready == 2 end), "and replaced")
  local b = assert(pool:take(5))
  tap.ok(sbx.now() - b.handle.created_at < 0.15, "take never hands out a box older than max_age")
  b:close()
  pool:close()

  -- The lifetime rule: lifetime 0.4 s, margin 0.5: retired at 0.2 s.
  pool = assert(sbx.pool { size = 1, box = { backend = "fake", lifetime = 0.4 }, lifetime_margin = 0.5 })
  tap.ok(until_(function() return pool:stats().retired >= 1 end), "a box is retired before the end of its lifetime")
  b = assert(pool:take(5))
  tap.ok(sbx.now() - b.handle.created_at < 0.2, "a taker gets at least lifetime_margin of the lifetime")
  b:close()
  pool:close()
end

-- resize ------------------------------------------------------------------------------------

do
  local pool = assert(sbx.pool { size = 3, box = FAKE })
  tap.ok(until_(function() return pool:stats().ready == 3 end), "pool filled")
  pool:resize(1)
  tap.ok(until_(function() return pool:stats().ready == 1 end), "resize(1) keeps one ready")
  tap.is(pool:stats().retired, 2, "the others are retired")
  pool:resize(0)
  tap.ok(until_(function() return pool:stats().ready == 0 end), "resize(0) keeps none")
  local b = pool:take(5)
  tap.ok(b ~= nil, "a take on an empty pool gets a box made for it")
  sbx.sleep(0.05)
  tap.is(pool:stats().ready, 0, "and none is made ahead")
  b:close()
  tap.checkerr("integer >= 0", pool.resize, pool, -1)
  pool:close()
  tap.checkerr("closed pool", pool.resize, pool, 1)
end

-- close and drain ------------------------------------------------------------------------

do
  local pool = assert(sbx.pool { size = 3, box = FAKE })
  tap.ok(until_(function() return pool:stats().ready == 3 end), "pool filled")
  local kept = assert(pool:take(0))
  tap.ok(until_(function() return pool:stats().ready == 3 end), "refilled")
  tap.ok(pool:close(), "close")
  tap.is(live_of(pool), 1, "close destroys the ready boxes, not the taken one")
  tap.is(pool:stats().ready, 0, "stats: none ready")
  tap.ok(pool:stats().closed, "stats: closed")
  tap.is(assert(kept:exec("true")).exit_code, 0, "the taken box still works")
  kept:close()
  tap.ok(pool:close(), "close is idempotent")
  tap.checkerr("attempt to take from a closed pool", pool.take, pool)
  tap.checkerr("without a pool", pool.take)

  -- Creations in flight are cancelled; a waiting taker hears "closed".
  local slow = assert(sbx.pool { size = 2, box = { backend = "fake", create_delay = 30 } })
  local made = fake.created
  local waiter = sbx.spawn(function() return slow:take() end)
  tap.ok(until_(function() return slow:stats().creating >= 2 and slow:stats().waiting == 1 end), "creations in flight, a taker waits")
  slow:close()
  local b, err, code = sbx.wait(waiter)
  tap.is(b, nil, "the waiting taker gets no box")
  tap.is(code, "closed", "code closed")
  tap.like(err, "closed", "message says so")
  tap.is(slow:stats().creating, 0, "no creation left in flight")
  tap.is(fake.created, made, "the cancelled creations made nothing")
end

tap.checkerr("timeout must be a number", function()
  local p = assert(sbx.pool { size = 1, box = FAKE })
  local ok, e = pcall(p.take, p, "soon")
  p:close()
  error(e, 0)
end)

do
  local pool = assert(sbx.pool { size = 1, box = { backend = "fake", create_delay = 30 } })
  local b, err, code = pool:take(0.05)
  tap.is(b, nil, "take with a timeout and no box ready")
  tap.is(code, "timeout", "code timeout")
  tap.like(err, "within 0%.05 s", "message")
  tap.is(pool:stats().waiting, 0, "the taker left the queue")
  pool:close()
end

-- Spec matching ---------------------------------------------------------------------------

do
  local fn = function() return {} end
  local pool = assert(sbx.pool { size = 1, box = { backend = "fake", memory = 256 * 2 ^ 20, env = { A = "1", B = "2" },
    labels = { team = "x" }, respond = fn } })
  local base = { backend = "fake", memory = 256 * 2 ^ 20, env = { A = "1", B = "2" }, labels = { team = "x" }, respond = fn }
  local function with(changes)
    local o = sbx.deep_copy(base)
    for k, v in pairs(changes) do if v == "nil" then o[k] = nil else o[k] = v end end
    return o
  end
  tap.ok(pool:matches(base), "the same options match")
  tap.ok(pool:matches(with { memory = 268435456 }), "numbers compare by value (integer and float)")
  tap.ok(pool:matches(with { env = { B = "2", A = "1" } }), "tables compare by content")
  tap.ok(pool:matches(with { image = sbx.policy.box.image }), "a default given explicitly matches")
  tap.ok(pool:matches(with { cpus = sbx.policy.box.cpus }), "any default given explicitly matches")
  tap.ok(not pool:matches(with { memory = 128 * 2 ^ 20 }), "another memory does not")
  tap.ok(not pool:matches(with { env = { A = "1" } }), "a missing env name does not")
  tap.ok(not pool:matches(with { env = { A = "1", B = "2", C = "3" } }), "an extra env name does not")
  tap.ok(not pool:matches(with { labels = { team = "x", ["sbx.task"] = "t1" } }), "an extra label does not")
  tap.ok(not pool:matches(with { image = "other:1" }), "another image does not")
  tap.ok(not pool:matches(with { respond = function() return {} end }), "another function does not")
  tap.ok(not pool:matches(with { cap_drop = {} }), "an emptied list does not")
  tap.ok(not pool:matches(with { backend = "nil" }), "another backend does not")
  tap.checkerr("matches expects a table", pool.matches, pool, "x")
  pool:close()
end

-- The harness takes from a pool ------------------------------------------------------------

do
  local labels = {}
  local function run(box, task)
    labels[task.id] = fake.made[box.id].labels
    return box:exec("true")
  end
  local tasks = {}
  for i = 1, 6 do tasks[i] = { id = "t" .. i, run = run } end
  tasks[7] = { id = "own", box = { memory = 128 * 2 ^ 20 }, run = run }
  tasks[8] = { id = "same", box = { image = sbx.policy.box.image }, run = run }
  local s = sbx.harness.run { tasks = tasks, concurrency = 3, pool = 2, progress = "none", box = { backend = "fake" } }
  tap.is(s.passed, 8, "every task passed")
  tap.ok(s.pool ~= nil, "the summary has the pool")
  tap.is(s.pool.taken, 7, "tasks whose options equal the run's took pooled boxes")
  tap.is(s.pool.fresh, 1, "the task with its own box options made its own")
  tap.ok(labels.t1 and labels.t1["sbx.pool"] ~= nil and labels.t1["sbx.task"] == nil, "a pooled box has the pool label, no task label")
  tap.ok(labels.own and labels.own["sbx.task"] == "own" and labels.own["sbx.pool"] == nil, "a fresh box has its task label")
  tap.is(s.pool.created, s.pool.taken + s.pool.retired, "every box made was taken or retired")
  tap.is(s.pool.retired, 0, "no box was made that no task took")
  tap.like(sbx.harness.format_summary(s), "pool%s+2: 7 task%(s%) took a ready box, 1 made their own", "the summary says so")
  local left = 0
  for _, h in pairs(fake.live) do if h.labels and h.labels["sbx.pool"] then left = left + 1 end end
  tap.is(left, 0, "no pooled box is left after the run")

  s = sbx.harness.run { tasks = { { id = "a", run = "true" } }, pool = 0, progress = "none", box = { backend = "fake" } }
  tap.is(s.pool, nil, "pool = 0: no pool")
  tap.checkerr("pool must be an integer >= 0", sbx.harness.run, { tasks = { { id = "a", run = "true" } }, pool = -1, progress = "none" })

  -- A pool that fails fails the tasks that take from it, with its reason.
  s = sbx.harness.run { tasks = { { id = "a", run = "true" }, { id = "b", run = "true" } }, pool = 2, progress = "none",
    box = { backend = "fake", create_fail = function() return "no such image", "image_unavailable" end } }
  tap.is(s.errors, 2, "a failing pool: the tasks are errors")
  tap.is(s.results[1].code, "image_unavailable", "with the creation's code")
end

-- The command line -----------------------------------------------------------------------

do
  local out, code = H.sh(H.sbx_bin .. " eval /nonexistent.jsonl --pool -1")
  tap.is(code, 2, "eval --pool -1 is a usage error")
  tap.like(out, "%-%-pool must be an integer >= 0", "and says so")
  out, code = H.sh(H.sbx_bin .. " eval /nonexistent.jsonl --pool")
  tap.is(code, 2, "eval --pool without a value is a usage error")
end

-- At exit: pools drain before the open boxes go ------------------------------------------

do
  local path = os.tmpname() .. ".lua"
  local report = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(string.format([[
package.loaded["sbx.backends.fake"] = require "fake_backend"
local sbx = require "sbx"
local fake = require "fake_backend"
local ready = assert(sbx.pool { size = 2, box = { backend = "fake" } })
local slow = assert(sbx.pool { size = 2, box = { backend = "fake", create_delay = 30 } })
while ready:stats().ready < 2 or slow:stats().creating < 2 do sbx.sleep(0.01) end
-- Runs after the pools' hook, before the open boxes are removed.
table.insert(require("sbx.box").before_close_all, function()
  local n = 0
  for _, h in pairs(fake.live) do if h.labels and h.labels["sbx.pool"] then n = n + 1 end end
  local out = io.open(%q, "w")
  out:write(n, " ", tostring(ready:stats().closed), " ", tostring(slow:stats().closed), " ", slow:stats().creating, "\n")
  out:close()
end)
]], report))
  f:close()
  local out, code = H.sh(string.format("LUA_PATH='tests/lib/?.lua;;' %s run %s", H.sbx_bin, path))
  tap.is(code, 0, "a script with two pools ends by itself (their tasks hold nothing open)", out)
  local rf = io.open(report)
  local line = rf and rf:read("l")
  if rf then rf:close() end
  tap.is(line, "0 true true 0", "at exit the pools are closed, in-flight creations cancelled, no pooled box left before close_all")
  os.remove(path)
  os.remove(report)
end

tap.done()

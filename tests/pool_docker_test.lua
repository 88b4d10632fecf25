-- needs: docker
-- Warm pools with real boxes: labels, taking and refilling, concurrent
-- takes, and what is left after a normal exit, SIGINT (boxes ready, boxes
-- still being made), kill -9 plus `sbx reap`; `sbx eval --pool` and `sbx
-- mcp` taking from a pool. Pools of at most 4 (the CI machine's daemon).
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local json = sbx.json

local dir = H.tmpdir()

local write = H.write

local slurp = H.slurp

-- Containers carrying every label of the list ("k=v" or "k").
local function containers(labels)
  return H.containers(labels)
end

-- Waits (bounded) until cond() holds; returns whether it did.
local function until_(cond, limit)
  local deadline = sbx.now() + (limit or 30)
  while not cond() do
    if sbx.now() > deadline then return false end
    sbx.sleep(0.05)
  end
  return true
end

local function alive(pid)
  return H.sh("kill -0 " .. pid .. " 2>/dev/null; echo $?"):match("^0") ~= nil
end

-- Taking and refilling ---------------------------------------------------------------

do
  local pool = assert(sbx.pool { size = 2, box = { image = H.busybox } })
  tap.ok(until_(function() return pool:stats().ready == 2 end), "a pool of 2 fills")
  local mine = containers { "sbx.pool=" .. pool.id }
  tap.is(#mine, 2, "two containers carry the pool's label")
  local box = pool:take(0)
  tap.ok(box ~= nil, "take(0) hands out a ready box")
  local labels = H.container(box.id).Config.Labels
  tap.is(labels["sbx.pool"], pool.id, "label sbx.pool=<pool id>")
  tap.is(labels["sbx.owner.pid"], tostring(sbx.core.pid()), "and the owner's labels, as any box")
  local r = assert(box:exec("echo hi"))
  tap.is(r.stdout, "hi\n", "the taken box runs commands")
  tap.ok(until_(function() return pool:stats().ready == 2 end), "the pool refills")
  local id = box.id
  box:close()
  tap.is(H.container(id), nil, "close() removes the taken box")
  tap.is(#containers { "sbx.pool=" .. pool.id }, 2, "the pool's two ready boxes remain")

  -- Concurrent takes.
  local seen, dup, tasks = {}, 0, {}
  for i = 1, 8 do
    tasks[i] = sbx.spawn(function()
      local b = assert(pool:take(120))
      if seen[b.id] then dup = dup + 1 end
      seen[b.id] = true
      b:close()
      return true
    end)
  end
  local got = sbx.gather(tasks)
  tap.is(#got, 8, "8 concurrent takers each got a box")
  tap.is(dup, 0, "no box was handed out twice")
  pool:close()
  -- A creation cancelled in flight may still be made by the daemon after
  -- close() (a loaded daemon): the sweeper removes it when it appears.
  tap.ok(until_(function() return #containers { "sbx.pool=" .. pool.id } == 0 end),
    "pool:close() removes its ready boxes, and what a cancelled creation made", #containers { "sbx.pool=" .. pool.id })
end

-- A failing image backs off --------------------------------------------------------------

do
  local pool = assert(sbx.pool { size = 2, box = { image = "sbx-no-such-image:never", pull = "never" },
    backoff = { base = 0.2, max = 1 } })
  local b, err, code = pool:take()
  tap.is(b, nil, "a pool of a missing image hands out nothing")
  tap.is(code, "image_unavailable", "take says why: image_unavailable")
  tap.like(err, "sbx%-no%-such%-image", "naming the image")
  sbx.sleep(1)
  tap.ok(pool:stats().failures <= 6, "and retries a few times a second at most, not in a loop", pool:stats().failures)
  pool:close()
end

-- Exit, SIGINT, kill -9 -------------------------------------------------------------------

-- Runs a script in a child sbx that makes a pool of 3 and writes its id and
-- its pid to a file once `ready` boxes are ready (0: at once, while the
-- boxes are still being made), then does `after`. Returns pid, pool id.
local function child(name, ready, after)
  local script, idfile = dir .. "/" .. name .. ".lua", dir .. "/" .. name .. ".id"
  os.remove(idfile)
  write(script, string.format([[
local sbx = require "sbx"
local pool = assert(sbx.pool { size = 3, box = { image = %q } })
while pool:stats().ready < %d do sbx.sleep(0.02) end
local f = io.open(%q, "w"); f:write(pool.id, " ", sbx.core.pid(), "\n"); f:close()
%s
]], H.busybox, ready, idfile, after))
  H.sh(string.format("%s run %s >%s/%s.log 2>&1 &", H.sbx_bin, script, dir, name))
  local id, pid
  until_(function()
    local s = slurp(idfile)
    if s then id, pid = s:match("^(%x+) (%d+)") end
    return id ~= nil
  end)
  return pid, id
end

local function gone_after_exit(pid, id, what)
  tap.ok(pid and until_(function() return not alive(pid) end), what .. ": the child exited")
  tap.ok(id and until_(function() return #containers { "sbx.pool=" .. id } == 0 end, 10),
    what .. ": none of its pool's boxes is left", id and #containers { "sbx.pool=" .. id })
end

do
  local pid, id = child("normal", 3, "")
  gone_after_exit(pid, id, "normal exit with 3 ready")

  pid, id = child("early", 0, "sbx.sleep(0.05)")
  gone_after_exit(pid, id, "normal exit while the boxes are being made")

  pid, id = child("sigint", 3, "sbx.sleep(120)")
  tap.is(id and #containers { "sbx.pool=" .. id }, 3, "SIGINT case: three boxes ready")
  H.sh("kill -INT " .. pid)
  gone_after_exit(pid, id, "SIGINT with 3 ready")

  for _, delay in ipairs { 0.05, 0.15, 0.3 } do
    pid, id = child(string.format("sigint-early-%d", math.floor(delay * 100)), 0, "sbx.sleep(120)")
    sbx.sleep(delay)
    H.sh("kill -INT " .. pid)
    gone_after_exit(pid, id, string.format("SIGINT %.2f s into making the boxes", delay))
  end

  pid, id = child("kill9", 3, "sbx.sleep(120)")
  H.sh("kill -9 " .. pid)
  tap.ok(until_(function() return not alive(pid) end), "kill -9: the child is gone")
  tap.is(id and #containers { "sbx.pool=" .. id }, 3, "kill -9 leaves its pool's boxes")
  local out = H.sh(H.sbx_bin .. " reap")
  tap.like(out, "owner process " .. pid .. " is gone", "sbx reap names them")
  tap.is(id and #containers { "sbx.pool=" .. id }, 0, "and removes them")
end

-- sbx eval --pool ----------------------------------------------------------------------------

do
  local tasks = dir .. "/tasks.jsonl"
  local lines = {}
  for i = 1, 6 do lines[i] = json.encode { id = "t" .. i, run = "echo " .. i } end
  lines[7] = json.encode { id = "own", box = { memory = 128 * 1024 * 1024 }, run = "echo own" }
  write(tasks, table.concat(lines, "\n") .. "\n")
  local pidfile, outfile = dir .. "/eval.pid", dir .. "/eval.out"
  local out, code = H.sh(string.format("sh -c 'echo $$ > %s; exec %s eval %s --pool 2 --concurrency 3 --image %s --out %s'",
    pidfile, H.sbx_bin, tasks, H.busybox, outfile))
  tap.is(code, 0, "sbx eval --pool 2 passes every task", out)
  tap.like(out, "passed%s+7", "7 passed")
  tap.like(out, "pool%s+2: 6 task%(s%) took a ready box, 1 made their own", "6 tasks took pooled boxes, the other made its own")
  local pid = (slurp(pidfile) or ""):match("%d+")
  tap.is(pid and #containers { "sbx.owner.pid=" .. pid }, 0, "no box of the run is left")
end

-- sbx mcp with policy.pool.size -----------------------------------------------------------------

do
  local policy = dir .. "/pool-policy.lua"
  write(policy, "return { pool = { size = 1 }, box = { backend = 'docker' } }\n")
  local input = dir .. "/mcp.in"
  local INIT = { jsonrpc = "2.0", id = 1, method = "initialize", params = { protocolVersion = "2025-06-18",
    capabilities = json.object(), clientInfo = { name = "t", version = "1" } } }
  local CALL = { jsonrpc = "2.0", id = 2, method = "tools/call",
    params = { name = "bash", arguments = { command = "hostname; sleep 2" } } }
  write(input, json.encode(INIT) .. "\n" .. json.encode(CALL) .. "\n")
  local pidfile, outfile = dir .. "/mcp.pid", dir .. "/mcp.out"
  H.sh(string.format("sh -c 'echo $$ > %s; exec %s --policy %s mcp --image %s <%s >%s 2>&1' &",
    pidfile, H.sbx_bin, policy, H.busybox, input, outfile))
  local pid
  until_(function() pid = (slurp(pidfile) or ""):match("%d+") return pid ~= nil end)
  local during
  until_(function()
    during = containers { "sbx.owner.pid=" .. tostring(pid), "sbx.pool" }
    return #during > 0
  end)
  tap.ok(#during >= 1, "the MCP server's box comes from a pool (label sbx.pool)")
  tap.ok(until_(function() return not alive(pid) end), "the session ends at end of input")
  local text
  for l in (slurp(outfile) or ""):gmatch("[^\n]+") do
    local m = json.decode(l)
    if type(m) == "table" and m.id == 2 and m.result then text = m.result.content[1].text end
  end
  local host = text and text:match("^(%x+)")
  local pooled = false
  for _, c in ipairs(during) do if host and c.Id:sub(1, #host) == host then pooled = true end end
  tap.ok(pooled, "the tool call ran in the pooled box", text)
  tap.is(#containers { "sbx.owner.pid=" .. tostring(pid) }, 0, "the session's box and the pool are gone after it")
end

os.execute("rm -rf " .. dir)
tap.done()

-- needs: docker, local
-- Boxes that need one image the cache lacks share its fetch: eight local
-- boxes at once from a freshly tagged image (a name no cache has seen)
-- all start, and the image is exported from the daemon once and each of
-- its layers unpacked once (counted, not timed); two sbx processes at once
-- do the same across processes. A box's start deadline begins when its
-- image is ready, so boxes waiting for the fetch do not time out.
local sbx = require "sbx"
local t = require "tap"
local H = require "helper"
local IH = require "images_helper"
local images = require "sbx.images"

local q = IH.q
local tag = string.format("sbx-images-shared-%d:t", sbx.core.pid())
local out, rc = H.sh(string.format("docker tag %s %s", q(H.busybox), q(tag)))
assert(rc == 0, out)

local function box_policy(dir)
  -- The daemon is the only source: no archive of this name exists.
  return { images = { dir = dir, archives = {} }, agent = { start_timeout = 60 } }
end

do
  local dir = IH.tmpdir("shared") .. "/images"
  local before = images.stats()
  local n, tasks, boxes, errs = 8, {}, {}, {}
  for i = 1, n do
    tasks[i] = sbx.spawn(function()
      local box, err, code = sbx.box { backend = "local", image = tag, policy = box_policy(dir) }
      if not box then errs[#errs + 1] = tostring(code) .. ": " .. tostring(err) return end
      boxes[#boxes + 1] = box
      local r = box:exec({ "sh", "-c", "echo ok" })
      if not (r and r.stdout == "ok\n") then errs[#errs + 1] = "exec: " .. tostring(r and r.stderr) end
    end)
  end
  for _, task in ipairs(tasks) do sbx.wait(task) end
  t.is(#boxes, n, "eight boxes at once from an uncached image all start")
  t.is(#errs, 0, "and run", table.concat(errs, "\n"))
  local after = images.stats()
  local img = assert(images.resolve(tag, { policy = IH.policy(box_policy(dir)), pull = "never" }))
  t.is(after.exports - before.exports, 1, "the image is exported from the daemon once")
  t.is(after.unpacks - before.unpacks, #img.layers, string.format("each of its %d layer(s) unpacked once", #img.layers))
  for _, b in ipairs(boxes) do b:close() end
end

-- Two processes at once: one export between them (each prints its own
-- count; the file lock makes the second wait and find the image).
do
  local dir = IH.tmpdir("shared2") .. "/images"
  local script = os.tmpname() .. ".lua"
  local f = assert(io.open(script, "w"))
  f:write(string.format([[
local sbx = require "sbx"
local images = require "sbx.images"
local pol = sbx.deep_copy(sbx.policy)
sbx.merge_policy(pol, { images = { dir = %q, archives = {} } })
local img, err = images.resolve(%q, { policy = pol })
local s = images.stats()
io.write(string.format("%%s exports=%%d unpacks=%%d\n", img and "ok" or ("fail " .. tostring(err)), s.exports, s.unpacks))
]], dir, tag))
  f:close()
  local procs = {}
  for i = 1, 2 do
    procs[i] = io.popen(string.format("%s run %s 2>&1", q(H.sbx_bin), q(script)))
  end
  local exports, unpacks, oks, texts = 0, 0, 0, {}
  for i = 1, 2 do
    local text = procs[i]:read("a")
    procs[i]:close()
    texts[#texts + 1] = text
    if text:match("^ok") then oks = oks + 1 end
    exports = exports + tonumber(text:match("exports=(%d+)") or 99)
    unpacks = unpacks + tonumber(text:match("unpacks=(%d+)") or 99)
  end
  os.remove(script)
  t.is(oks, 2, "two sbx processes resolve the uncached image at once", table.concat(texts))
  t.is(exports, 1, "one export between them")
  t.is(unpacks, 1, "one unpack between them (busybox has one layer)")
end

-- The start deadline begins when the image is ready: another process
-- holds the image's fetch turn (its flock) for longer than the box's whole
-- start timeout, and the box, which waits for it, still starts.
do
  local dir = IH.tmpdir("turn") .. "/images"
  local pol = box_policy(dir)
  pol.agent.start_timeout = 6
  assert(images.list { policy = IH.policy(pol) })   -- makes the cache's directories
  local canonical = require("sbx.images.ref").docker_name(tag, sbx.policy.images.hub).canonical
  local lock = dir .. "/locks/fetch-" .. sbx.core.layer.sha256(canonical):sub(8, 39) .. ".lock"
  local ready = lock .. ".held"
  os.execute(string.format("flock %s sh -c 'touch %s; sleep 10' >/dev/null 2>&1 &", q(lock), q(ready)))
  for _ = 1, 200 do
    if sbx.core.layer.stat(ready) then break end
    sbx.sleep(0.05)
  end
  local t0 = sbx.now()
  local box, err, code = sbx.box { backend = "local", image = tag, policy = pol }
  local waited = sbx.now() - t0
  t.ok(box, string.format("a box that waited %.1f s for another process's fetch (start timeout 6 s) starts", waited),
    tostring(code) .. ": " .. tostring(err))
  t.ok(waited >= 6, "  (it did wait past its start timeout for the turn)")
  if box then box:close() end
end

H.sh("docker rmi " .. q(tag))
IH.cleanup()
t.done()

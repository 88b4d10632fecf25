-- Local boxes from an image no cache holds yet (scripts/bench-images.sh):
-- one box, then eight at once, each round into a fresh cache, from the
-- daemon's sbx-debian:12 (exported once and unpacked once however many
-- boxes wait for it). Prints a markdown table of medians and the ratio of
-- eight boxes' wall time to one's; the exports and unpacks are counted.
--   LUA_PATH='tests/lib/?.lua;;' sbx run scripts/bench/images_shared.lua [N] [IMAGE]
local sbx = require "sbx"
local IH = require "images_helper"
local images = require "sbx.images"
local n = tonumber(arg[1]) or 3
local image = arg[2] or os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12"

local function median(list) local t = { table.unpack(list) } table.sort(t) return t[math.max(1, math.ceil(#t / 2))] end
local function load() return (io.open("/proc/loadavg"):read("l") or ""):match("^(%S+ %S+ %S+)") end

-- k boxes at once from image into a fresh cache, each running `true`:
-- wall seconds, failures, exports, unpacks.
local function round(k)
  local pol = { images = { dir = IH.tmpdir("bench-shared") .. "/images", archives = {} } }
  local s0 = images.stats()
  local t0 = sbx.now()
  local tasks, failures = {}, 0
  for i = 1, k do
    tasks[i] = sbx.spawn(function()
      local box = sbx.box { backend = "local", image = image, policy = pol }
      local r = box and box:exec { "true" }
      if not (r and r.exit_code == 0) then failures = failures + 1 end
      if box then box:close() end
    end)
  end
  for _, t in ipairs(tasks) do sbx.wait(t) end
  local wall = sbx.now() - t0
  local s1 = images.stats()
  IH.cleanup()
  return wall, failures, s1.exports - s0.exports, s1.unpacks - s0.unpacks
end

print("# load average at start: " .. load())
round(1)   -- warms the launcher and the page cache
local ones, eights, ratios, fails, exports, unpacks = {}, {}, {}, 0, 0, 0
for i = 1, n do
  local w1, f1 = round(1)
  local w8, f8, e8, u8 = round(8)
  ones[i], eights[i], ratios[i] = w1, w8, w8 / w1
  fails, exports, unpacks = fails + f1 + f8, math.max(exports, e8), math.max(unpacks, u8)
end
print("| measure | median | note |")
print("|---|---|---|")
print(string.format("| one local box from uncached %s (export, unpack, create, `true`) | %.2f s | n=%d |", image, median(ones), n))
print(string.format("| eight at once from it uncached | %.2f s | %d failures; at most %d export(s), %d unpack(s) per round |",
  median(eights), fails, exports, unpacks))
print(string.format("| eight / one (wall time) | %.2fx | |", median(ratios)))
print("# load average at end: " .. load())

-- Images for the daemon-free backends (scripts/bench-images.sh): the first
-- pull of a 30 MB image from a loopback registry (the real distribution
-- server, tests/images_registry.py), and a local box from that image once
-- it is cached (pull = "missing": no registry contact). Prints a markdown
-- table of medians.
--   LUA_PATH='tests/lib/?.lua;;' sbx run scripts/bench/images.lua [N]
local sbx = require "sbx"
local IH = require "images_helper"
local images = require "sbx.images"
local n = tonumber(arg[1]) or 5

local function sorted(list) local t = { table.unpack(list) } table.sort(t) return t end
local function median(list) local t = sorted(list) return t[math.max(1, math.ceil(#t / 2))] end
local function pct(list, q) local t = sorted(list) return t[math.max(1, math.ceil(#t * q))] end
local function load() return (io.open("/proc/loadavg"):read("l") or ""):match("^(%S+ %S+ %S+)") end

local reg = IH.registry()
local ref = "docker://" .. reg.registry .. "/library/big:latest"
print("# load average at start: " .. load())

-- First pulls, each into a fresh cache.
local pulls, compressed, unpacked = {}, 0, 0
for i = 1, n do
  local pol = IH.cache_policy()
  local t0 = sbx.now()
  local img = assert(images.resolve(ref, { policy = pol }))
  pulls[i] = sbx.now() - t0
  unpacked = img.size
  local m = sbx.json.decode(IH.read(pol.images.dir .. "/blobs/sha256/" .. img.manifest:sub(8)))
  compressed = 0
  for _, l in ipairs(m.layers) do compressed = compressed + l.size end
end

-- Boxes from the cached image: the registry is stopped first, so a box
-- that asked it would fail.
local pol = IH.cache_policy()
assert(images.resolve(ref, { policy = pol }))
reg:stop()
sbx.use_policy { images = { dir = pol.images.dir } }
-- (The image is library files only, with no program to run: the box's
-- only process is sbx's agent.)
local creates, cycles = {}, {}
for i = 1, 4 * n + 1 do
  local t0 = sbx.now()
  local box, err, code = sbx.box { backend = "local", image = ref, pull = "missing" }
  if not box then error(string.format("sbx.box: %s (%s)", tostring(err), tostring(code))) end
  local t1 = sbx.now()
  box:close()
  if i > 1 then   -- the first box also warms the launcher
    creates[#creates + 1], cycles[#cycles + 1] = t1 - t0, sbx.now() - t0
  end
end

local function ms(s) return string.format("%.1f ms", s * 1000) end
print("| measure | median | note |")
print("|---|---|---|")
print(string.format("| first pull of a %.0f MB image (%.0f MB unpacked) from the loopback registry | %.2f s | n=%d, max %.2f s |",
  compressed / 1e6, unpacked / 1e6, median(pulls), n, pct(pulls, 1)))
print(string.format("| a local box from the cached image (`pull = \"missing\"`, the registry stopped): `sbx.box{}` | %s | n=%d, p90 %s |",
  ms(median(creates)), #creates, ms(pct(creates, 0.9))))
print(string.format("| ... create + destroy | %s | p90 %s |", ms(median(cycles)), ms(pct(cycles, 0.9))))
print("# load average at end: " .. load())
IH.cleanup()

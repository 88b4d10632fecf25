-- 200 local boxes alive at once in a fresh sbx: its RSS (scripts/bench-local.sh).
--   sbx run scripts/bench/local_alive.lua ROOTFS [COUNT]
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local image = "rootfs:" .. assert(arg[1], "usage: sbx run scripts/bench/local_alive.lua ROOTFS [COUNT]")
local count = tonumber(arg[2]) or 200
local rss0 = C.status_kb("VmRSS")
local boxes = {}
for i = 1, count do boxes[i] = assert(sbx.box { backend = "local", image = image }) end
for i = 1, count do C.exec_ok(boxes[i], { "/bin/true" }) end
C.full_gc()
print(string.format("| %d local boxes alive, each after one exec (a fresh sbx) | RSS %.1f MB | %.1f MB before the first box; %.1f KB per box |",
  count, C.status_kb("VmRSS") / 1024, rss0 / 1024, (C.status_kb("VmRSS") - rss0) / count))
for i = 1, count do boxes[i]:close() end

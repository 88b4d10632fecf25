-- Host memory per idle box: the resident set of this process holding 0
-- boxes (after a warm-up box was made and closed) and then COUNT idle boxes
-- (made PAR at a time, then collectgarbage()). Also the Lua heap, and the
-- resident set after closing them all (a leak shows up there).
-- usage: sbx run idle.lua COUNT PAR
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local count = tonumber(arg[1]) or 50
local par = tonumber(arg[2]) or 8

C.box():close()
C.full_gc()
sbx.sleep(0.2)
local rss0, heap0 = C.status_kb("VmRSS"), collectgarbage("count")

local sem = sbx.semaphore(par)
local tasks, boxes = {}, {}
for i = 1, count do
  tasks[i] = sbx.spawn(function() return sem:with(C.box) end)
end
boxes = sbx.gather(tasks)
tasks = nil
C.full_gc()
sbx.sleep(0.2)
C.full_gc()
local rss1, heap1 = C.status_kb("VmRSS"), collectgarbage("count")
C.emit("idle_rss0_kb", rss0)
C.emit("idle_rss1_kb", rss1)
C.emit("idle_per_box_kb", (rss1 - rss0) / count)
C.emit("idle_heap_per_box_kb", (heap1 - heap0) / count)

local closers = {}
for i, b in ipairs(boxes) do closers[i] = sbx.spawn(function() return sem:with(b.close, b) end) end
sbx.gather(closers)
boxes, closers = nil, nil
C.full_gc()
sbx.sleep(0.2)
C.full_gc()
C.emit("idle_rss_after_close_kb", C.status_kb("VmRSS"))
C.emit("idle_heap_after_close_kb", collectgarbage("count") - heap0)

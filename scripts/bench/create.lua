-- box create+destroy: sbx.box{} then box:close(), N times (after a warm-up
-- that pays the daemon ping and the image check once).
-- usage: sbx run create.lua N
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local n = tonumber(arg[1]) or 10

C.box():close()
for _ = 1, n do
  local t0 = sbx.now()
  local b = C.box()
  local t1 = sbx.now()
  local ok, err = b:close()
  local t2 = sbx.now()
  if not ok then error("box:close failed: " .. tostring(err)) end
  C.emit("create_destroy", t2 - t0)
  C.emit("create", t1 - t0)
  C.emit("destroy", t2 - t1)
end

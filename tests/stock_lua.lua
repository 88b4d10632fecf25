-- needs: docker, lua5.4
-- The sbx module loads into a stock lua5.4 (sbx.so on LUA_CPATH) and its
-- tasks and blocking calls work there as under the sbx binary.
local tap = require "tap"
-- The signals this process catches (SigCgt in /proc/self/status): bit N-1
-- for signal N.
local function caught(signum)
  local f = assert(io.open("/proc/self/status"))
  local mask = f:read("a"):match("SigCgt:%s*(%x+)")
  f:close()
  return (tonumber(mask:sub(-8), 16) >> (signum - 1)) & 1 == 1
end
local int0, term0 = caught(2), caught(15)
local sbx = require "sbx"
tap.ok(caught(2) == int0 and caught(15) == term0,
  "loading the module leaves the program's SIGINT and SIGTERM alone")
tap.ok(sbx.core.handle_signals() and caught(2) and caught(15), "core.handle_signals() takes them when asked")
tap.is(type(sbx.box), "function", "require 'sbx' gives the module in lua5.4")
local t = sbx.spawn(function() sbx.sleep(0.02) return "done" end)
tap.is(sbx.wait(t), "done", "a task runs on the loop under lua5.4")
local box = sbx.box { image = os.getenv("SBX_TEST_BUSYBOX") }
tap.ok(box, "a box is created from lua5.4")
if box then
  local r = box:exec("echo from-stock-lua")
  tap.is(r and r.stdout, "from-stock-lua\n", "exec works from lua5.4")
  box:close()
end
sbx.shutdown()
tap.done()

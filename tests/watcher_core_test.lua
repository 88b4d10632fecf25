-- needs: nothing
-- The two core primitives the disk watcher stands on: a stream ended with
-- an error from Lua (a frozen box fails its commands), and a task that does
-- not hold `sbx run` open (one poller per daemon, for as long as boxes are).
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"

do
  local s = sbx.core.stream.sink { capture = { stdout = { head = 64, tail = 0 },
    stderr = { head = 64, tail = 0 }, output = { head = 64, tail = 0 } } }
  s:push("stdout", "partial")
  s:close(("disk_" .. "exceeded"), "the box wrote too much")
  collectgarbage()
  collectgarbage()
  local info = s:info()
  tap.is(info.eof, true, "stream:close(code, message) ends the stream")
  tap.is(info.error_code, "disk_exceeded", "with that error code (a copy: the Lua string is gone)")
  tap.is(info.error, "the box wrote too much", "and message")
  tap.is((s:captured("stdout")), "partial", "what arrived before stays readable")
  s:close("other", "x")
  tap.is(s:info().error_code, "disk_exceeded", "an ended stream keeps its first end")
  local plain = sbx.core.stream.sink {}
  plain:close()
  tap.is(plain:info().error_code, nil, "close() without a code ends it without an error, as before")
end

do
  -- An unref'd task does not hold `sbx run` open, yet runs while anything else does.
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write([[
local sbx = require "sbx"
local ticks = 0
local t = sbx.spawn(function() while true do sbx.sleep(0.05); ticks = ticks + 1 end end)
t:unref()
sbx.sleep(0.3)
print("ticks " .. ticks)
]])
  f:close()
  local t0 = sbx.now()
  local out, code = H.sh("timeout 20 " .. H.sbx_bin .. " run " .. script)
  os.remove(script)
  tap.is(code, 0, "a script whose only task left is unref'd ends", out)
  tap.ok(sbx.now() - t0 < 10, string.format("at once (%.1f s)", sbx.now() - t0))
  tap.ok((tonumber(out:match("ticks (%d+)")) or 0) >= 3, "and the task ran meanwhile", out)
end

tap.done()

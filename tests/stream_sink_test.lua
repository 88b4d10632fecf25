-- needs: nothing
-- core.stream.sink: the socketless stream a Lua transport (the SSM data
-- channel) feeds; readers see the same methods as on a Docker exec stream.
local tap = require "tap"
local sbx = require "sbx"
local core = sbx.core

local s = core.stream.sink { chunks = true, capture = { stdout = { head = 4, tail = 4 }, output = { head = 64, tail = 0 } } }
tap.is(s:push("stdout", "hello world"), 11, "push returns the queued chunk bytes")
tap.is(s:push("stderr", "err"), 14, "both streams count")
tap.is(s:wait(0), "data", "queued data wakes a reader")
local out, err = s:take()
tap.is(out, "hello world", "take: stdout")
tap.is(err, "err", "take: stderr")
local head, tail, total, omitted = s:captured("stdout")
tap.is(head .. "|" .. tail, "hell|orld", "stdout capture keeps head and tail")
tap.is(total, 11, "stdout total counts every byte")
tap.is(omitted, 3, "and the middle is omitted")
tap.is((s:captured("output")), "hello worlderr", "output interleaves both")

-- A feeder in another task; the reader waits on the loop.
core.spawn(function()
  core.sleep(0.05)
  s:push("stdout", "\xe2\x82")          -- half a euro sign
  core.sleep(0.02)
  s:push("stdout", "\xac!")
  s:finish("disconnected", "the channel dropped")
end)
local got = ""
while true do
  local ev = s:wait(5)
  if ev == "timeout" then break end
  got = got .. (s:take())
  if ev == "eof" then break end
end
tap.is(got, "\xe2\x82\xac!", "a character split across pushes arrives whole")
local info = s:info()
tap.ok(info.eof, "finish ends the stream")
tap.is(info.error_code, "disconnected", "with the feeder's error code")
tap.is(info.error, "the channel dropped", "and message")
tap.is(s:push("stdout", "late"), nil, "push after the end is refused")
tap.is(select(3, s:captured("output")), 18, "and not captured")

local plain = core.stream.sink {}
plain:push("stdout", "x")
tap.is(plain:wait(0), "timeout", "without chunks, only the end wakes a reader")
plain:finish()
tap.is(plain:wait(0), "eof", "finish without error")
tap.is(plain:info().error_code, nil, "no error code")
tap.ok(not pcall(plain.push, plain, "stdin", "x"), "an unknown stream name raises")
plain:close()
tap.ok(pcall(plain.close, plain), "close twice does not raise")
tap.done()

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
-- wait_room: a producer waits for the reader instead of polling.
do
  local q = core.stream.sink { chunks = true, capture = { stdout = { head = 0, tail = 0 } } }
  tap.is(q:wait_room(0), "room", "wait_room: an empty queue has room at once")
  q:push("stdout", string.rep("x", 1000))
  tap.is(q:wait_room(1000), "room", "wait_room: a queue at the limit has room")
  tap.is(q:wait_room(10, 0.05), "timeout", "wait_room: a reader that takes nothing holds the producer")
  tap.checkerr("at least 0", q.wait_room, q, -1)
  tap.checkerr("negative timeout", q.wait_room, q, 10, -1)
  local taken = false
  core.spawn(function() core.sleep(0.1) taken = true q:take() end)
  tap.is(q:wait_room(10), "room", "wait_room: room once the reader took the queue")
  tap.ok(taken, "and not before")
  q:push("stdout", string.rep("y", 100))
  local producer = sbx.spawn(function() return q:wait_room(10, 30) end)
  sbx.sleep(0.02)
  tap.checkerr("already waiting for room", q.wait_room, q, 10, 1)
  q:finish()
  tap.is(sbx.wait(producer), "eof", "wait_room: the end of the stream ends the wait")
  tap.is(q:wait_room(0), "eof", "an ended stream: eof at once")
end
tap.done()

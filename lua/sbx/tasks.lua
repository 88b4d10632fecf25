--[[
sbx.tasks: coroutines on the loop, as the facade offers them (sbx.spawn,
sbx.wait, sbx.gather, sbx.semaphore: these functions). A leaf (it requires
only sbx.core), so modules below the facade spawn without it. sbx.drain
reports the failures of spawned tasks nobody waited for (M.spawned).
]]
local core = require "sbx.core"

local M = {}

-- Every task spawn made, weakly: sbx.drain reads it.
local spawned = setmetatable({}, { __mode = "k" })
M.spawned = spawned

-- spawn(fn, ...) -> task: runs fn(...) as a coroutine on the loop.
function M.spawn(fn, ...)
  local t = core.spawn(fn, ...)
  spawned[t] = true
  return t
end

-- wait(task [, timeout]) -> the task's results; re-raises its error.
-- With a timeout, returns nil, "timeout", "timeout" when it is not done.
function M.wait(task, timeout)
  if not task:join(timeout) then return nil, "timeout", "timeout" end
  local r = table.pack(task:result())
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- gather(tasks) -> { first result of each task, in order }. Waits for
-- all of them; then raises the first error, if any.
function M.gather(tasks)
  local out, first_err = {}, nil
  for i, t in ipairs(tasks) do
    t:join()
    local r = table.pack(t:result())
    if r[1] then out[i] = r[2] elseif not first_err then first_err = r[2] end
  end
  if first_err then error(first_err, 0) end
  return out
end

-- semaphore(n): sem:acquire(), sem:release(), sem:with(fn, ...).
local Semaphore = {}
Semaphore.__index = Semaphore

function M.semaphore(n)
  assert(math.type(n) == "integer" and n > 0, "semaphore size must be a positive integer")
  return setmetatable({ free = n, size = n, queue = {} }, Semaphore)
end

function Semaphore:acquire()
  while self.free <= 0 do
    local ev = core.event()
    self.queue[#self.queue + 1] = ev
    ev:wait()
  end
  self.free = self.free - 1
end

function Semaphore:release()
  self.free = self.free + 1
  local ev = table.remove(self.queue, 1)
  if ev then ev:set() end
end

function Semaphore:with(fn, ...)
  self:acquire()
  local r = table.pack(pcall(fn, ...))
  self:release()
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

return M

--[[
sbx.progress: what a long step (an image's export from a daemon, its
download, its unpacking) tells the person waiting for it. Lines go to
stderr, never stdout, and only as policy.progress says: on a terminal from
the start, elsewhere only once a step has run policy.progress.after
seconds, and at most one line per interval. The text is
policy.progress.format's.

  local meter = progress.start("exporting sbx-debian:12 from the Docker daemon", { total = bytes })
  meter:add(n)            -- n more bytes done
  meter:step()            -- one more of `of` parts done (layers)
  meter:finish()          -- a last line, if the step said anything before
]]
local M = {}

local core = require "sbx.core"
local config = require "sbx.config"
local util = require "sbx.util"

local tty
local function on_tty()
  if tty == nil then
    local p = io.popen("test -t 2 && echo tty")
    tty = p and (p:read("a") or ""):match("tty") ~= nil or false
    if p then p:close() end
  end
  return tty
end
-- For tests: whether stderr counts as a terminal (nil: look again).
function M.set_tty(v) tty = v end

local Meter = {}
Meter.__index = Meter

-- progress.start(what, opts) -> meter. opts: total (bytes expected), of
-- (parts expected), pol (the policy; default the live one).
function M.start(what, opts)
  opts = opts or {}
  local pol = opts.pol and opts.pol.progress or config.policy.progress
  local now = core.now()
  return setmetatable({
    what = what, total = opts.total, of = opts.of, bytes = 0, count = 0,
    t0 = now, last = nil, said = false, pol = pol, out = opts.stream or io.stderr,
  }, Meter)
end

function Meter:info(done)
  local seconds = core.now() - self.t0
  return {
    what = self.what, bytes = self.bytes, total = self.total, count = self.count, of = self.of,
    seconds = seconds, rate = seconds > 0 and self.bytes / seconds or nil, done = done or false,
  }
end

function Meter:show(done)
  local pol = self.pol
  if pol.mode == "never" then return end
  local now = core.now()
  local terminal = on_tty()
  if not done then
    if pol.mode ~= "always" and not terminal and now - self.t0 < pol.after then return end
    local interval = terminal and pol.interval or pol.plain_interval
    if self.last and now - self.last < interval then return end
  elseif not self.said then
    -- A step that never spoke says nothing at its end either, unless it
    -- took long enough that it would have.
    if pol.mode ~= "always" and not terminal and now - self.t0 < pol.after then return end
  end
  self.last, self.said = now, true
  local ok, text = pcall(pol.format, self:info(done))
  if ok and type(text) == "string" and text ~= "" then
    self.out:write(text, "\n")
    self.out:flush()
  end
end

-- A step ends when its total (bytes or parts) is reached, whatever its
-- caller does after (a download's bytes are in before they are unpacked).
function Meter:add(n)
  self.bytes = self.bytes + (n or 0)
  if self.total and self.bytes >= self.total then return self:finish() end
  self:show(false)
end

-- meter:set(bytes [, total]): where the step is (a sum the caller keeps).
function Meter:set(bytes, total)
  self.bytes, self.total = bytes, total or self.total
  self:show(false)
end

function Meter:step(n)
  self.count = self.count + 1
  self.bytes = self.bytes + (n or 0)
  if self.of and self.count >= self.of then return self:finish() end
  self:show(false)
end

function Meter:finish()
  if self.finished then return end
  self.finished = true
  self:show(true)
end

-- size(n) -> n bytes for a person: "512 B", "1.5 MiB".
M.size = util.size

return M

-- A backend for daemon-free tests: it implements the backend contract of
-- lua/sbx/box.lua (create, destroy, start, finish, kill, restart, reap) over
-- core.stream.sink, so results go through the real capture and the real
-- result and formatting code. What a command prints comes from the box
-- option `respond`: function(req, command) -> { stdout =, stderr =,
-- exit_code =, hang = bool }, where command is the shell command string
-- (or nil for an argv command). A hanging command ends when killed.
--   package.loaded["sbx.backends.fake"] = require "fake_backend"
--   local box = sbx.box{ backend = "fake", respond = function(req, cmd) ... end }
-- Isolation: every option is enforced ("daemon") unless the box option
-- `isolation` says otherwise: { pids = false } (not enforceable), or
-- { disk = { enforced = "watched", note = "..." } }.
local core = require "sbx.core"

local M = { started = {}, killed = {}, created = 0 }

function M.options(check)
  return { respond = check.FN, isolation = check.map(check.ANY) }
end

function M.limits(spec)
  local out = {}
  for _, name in ipairs(require("sbx.limits").OPTIONS) do
    local d = (spec.isolation or {})[name]
    if d == nil then d = "daemon" end
    if type(d) ~= "table" then d = { enforced = d, note = d and "the fake enforces it" or "the fake cannot" } end
    out[name] = d
  end
  return out
end

local n = 0

function M.create(spec)
  M.created = M.created + 1
  n = n + 1
  return { id = string.format("fake%04d", n), respond = spec.respond or function() return {} end, jobs = {} }
end

function M.destroy(h)
  h.destroyed = true
  return true
end

function M.reap() return { removed = {}, kept = 0 } end

-- The shell command inside a policy's shell argv (its last element).
local function command_of(argv)
  if argv[1] == "sh" or argv[1] == "bash" then return argv[#argv] end
  return nil
end

function M.start(h, req)
  local command = command_of(req.argv)
  M.started[#M.started + 1] = { argv = req.argv, command = command, env = req.env, cwd = req.cwd }
  -- A helper (file transfer) reads stdin: echo it back for read-after-write.
  local out = h.respond(req, command) or {}
  local sink = core.stream.sink { capture = req.capture, chunks = req.chunks, chunk_limit = req.chunk_limit }
  local job = { stream = sink, marker = req.marker, exit_code = out.exit_code or 0 }
  if out.stdout then sink:push("stdout", out.stdout) end
  if out.stderr then sink:push("stderr", out.stderr) end
  if not out.hang then sink:finish() end
  h.jobs[#h.jobs + 1] = job
  return job
end

function M.finish(_, job)
  return job.exit_code
end

function M.kill(_, job, signal)
  M.killed[#M.killed + 1] = { marker = job.marker, signal = signal }
  job.exit_code = 137
  if not job.stream:info().eof then job.stream:finish() end
  return true
end

function M.restart() return true end

return M

-- A backend for daemon-free tests: it implements the backend contract of
-- lua/sbx/box.lua (create, destroy, start, finish, kill, restart, reap) over
-- core.stream.sink, so results go through the real capture and the real
-- result and formatting code. What a command prints comes from the box
-- option `respond`: function(req, command) -> { stdout =, stderr =,
-- exit_code =, hang = bool, oom = memory limit in bytes (the OOM killer
-- ended it: exit 137, job.oom_killed) }, where command is the shell command
-- string (or nil for an argv command). A hanging command ends when killed.
--   package.loaded["sbx.backends.fake"] = require "fake_backend"
--   local box = sbx.box{ backend = "fake", respond = function(req, cmd) ... end }
-- Isolation: every option is enforced ("daemon") unless the box option
-- `isolation` says otherwise: { pids = false } (not enforceable), or
-- { disk = { enforced = "watched", note = "..." } }.
-- Creation: the box option `create_delay` (seconds) makes create wait that
-- long (a cancel or a signal during it makes nothing); `create_fail`, a
-- function(n) called with the attempt's number, makes it fail when it
-- returns a message (and a code). M.attempts lists every attempt's start
-- ({ at = core.now() }), M.live the handles made and not destroyed,
-- M.creating / M.peak_creating the creations in flight and their peak,
-- M.made every handle made (id -> handle, with the box's labels and
-- created_at = core.now() when create returned).
local core = require "sbx.core"

local M = { started = {}, killed = {}, created = 0, attempts = {}, live = {}, made = {}, creating = 0, peak_creating = 0 }

function M.options(check)
  return { respond = check.FN, isolation = check.map(check.ANY), create_delay = check.num { ge = 0 },
    create_fail = check.FN }
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
  M.attempts[#M.attempts + 1] = { at = core.now() }
  local attempt = #M.attempts
  if spec.create_delay or spec.create_fail then
    M.creating = M.creating + 1
    M.peak_creating = math.max(M.peak_creating, M.creating)
    local ok, err = pcall(core.sleep, spec.create_delay or 0)
    M.creating = M.creating - 1
    if not ok then error(err, 0) end
    local msg, code
    if spec.create_fail then msg, code = spec.create_fail(attempt) end
    if msg then return nil, msg, code or "create_failed" end
  end
  M.created = M.created + 1
  n = n + 1
  local h = { id = string.format("fake%04d", n), respond = spec.respond or function() return {} end, jobs = {},
    labels = spec.labels, created_at = core.now() }
  M.live[h.id] = h
  M.made[h.id] = h
  return h
end

function M.destroy(h)
  h.destroyed = true
  M.live[h.id] = nil
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
  if out.oom then job.exit_code, job.oom_killed, job.memory_limit = 137, true, out.oom end
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

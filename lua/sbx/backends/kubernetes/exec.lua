-- The Kubernetes backend's per-command functions (the exec transport):
-- one pods/exec websocket per command.
local sbx_config = require "sbx.config"
local core = require "sbx.core"
local util = require "sbx.util"
local client_mod = require "sbx.kubernetes.client"
local start_check = require "sbx.transports.start_check"
local readiness = require "sbx.backends.kubernetes.readiness"
local check_gone = readiness.check_gone
local gone_after_stream = readiness.gone_after_stream
local mark_gone = readiness.mark_gone

local M = {}

-- Commands over exec ------------------------------------------------------------------------------

-- The command each exec runs. The exec subresource takes argv in its URL
-- and nothing else (no directory, no environment), and a long URL does not
-- pass every proxy (nor this websocket client, past 2 kB): so every exec
-- runs the same short boot line, which reads a script from stdin, line by
-- line (a shell's read takes no byte past its newline), and evals it. The
-- script sets the directory and the environment and execs the command; what
-- follows it on stdin is the command's own stdin. v5 ends stdin with its
-- close signal; v4 has none, so there a command with stdin reads exactly
-- its N bytes through head, and a command without reads /dev/null.
local BOOT = 'IFS= read -r n || exit 125; s=; while [ "$n" -gt 0 ]; do IFS= read -r l || exit 125; ' ..
  's="$s$l\n"; n=$((n-1)); done; eval "$s"'

local shq = util.shell_quote

local function command_script(h, req, v5, check_id)
  local setup = {}
  if not req.cwd and h.k.workdir then
    setup[#setup + 1] = "cd -- " .. shq(h.k.workdir) .. " 2>/dev/null"
  end
  for _, kv in ipairs(req.env or {}) do setup[#setup + 1] = "export " .. shq(kv) end
  -- The start check (transports/start_check.lua): a missing cwd or program
  -- is exec_failed, not an exit status the command could have chosen.
  local lines = start_check.lines(req, check_id, setup)
  local words = {}
  for i, a in ipairs(req.argv) do words[i] = shq(a) end
  local cmd = table.concat(words, " ")
  if not req.stdin then
    cmd = "exec " .. cmd .. " </dev/null"
  elseif v5 then
    cmd = "exec " .. cmd
  else
    cmd = "head -c " .. #req.stdin .. " | " .. cmd
  end
  lines[#lines + 1] = cmd
  local script = table.concat(lines, "\n")
  local _, newlines = script:gsub("\n", "")
  return (newlines + 1) .. "\n" .. script .. "\n"
end

-- Reads an exec stream into a sink until it ends; sets job.exit_code or
-- job.error. Holds back (stops reading the websocket) while a slow
-- on_output reader has more than chunk_limit bytes queued.
local function pump(h, job, ex, sink, req)
  local limit = req.chunk_limit or (1 << 20)
  local status, why
  local q
  local check = start_check.filter(job.check_id, function(bytes) q = sink:push("stdout", bytes) end)
  while true do
    local ch, data, code = ex:recv()
    if not ch then why, job.drop_code = data, code break end
    if ch == 1 or ch == 2 then
      if ch == 1 then
        q = false
        check.feed(data)
        -- Held back by the check (a marker's first bytes): the queue as it is.
        if q == false then q = sink:push("stdout", "") end
      else
        q = sink:push("stderr", data)
      end
      if q == nil then ex:close() h.streams[ex] = nil return end
      -- Back-pressure: the reader is behind; stop reading the exec stream
      -- (its TCP window then stops the server) until it caught up.
      if req.chunks and q and q > limit then sink:wait_room(limit) end
    elseif ch == 3 then
      status = data
    end
  end
  h.streams[ex] = nil
  check.flush()
  -- A stream that ended because the pod went (deleted, evicted, its
  -- lifetime) is the box gone, whatever the runtime said on the way out.
  local ecode = status and client_mod.exit_status(status)
  if not req.is_kill and not h.destroyed and (h.gone or not ecode or ecode >= 128)
      and gone_after_stream(h, job.killed or (ecode and ecode ~= 137)) then
    job.error, job.code = h.gone, "box_gone"
    sink:finish("box_gone", h.gone)
    return
  end
  if check.failed then
    job.error = start_check.message(check.failed, req, sbx_config.policy)
    sink:finish("exec_failed", job.error)
    return
  end
  if status then
    local code, err = client_mod.exit_status(status)
    if code then
      job.exit_code = code
      sink:finish()
    else
      job.error = "the command could not run: " .. tostring(err)
      sink:finish("exec_failed", job.error)
    end
    return
  end
  local msg = "the exec stream ended without the command's exit status: " .. tostring(why)
  if not h.destroyed and not req.is_kill then
    local kok, kerr = require("sbx.job").kill_by_exec(M, h, job, "KILL", core.now() + h.k.kill_timeout)
    msg = msg .. (kok and "; the command was killed" or ("; killing the command failed: " .. tostring(kerr)))
  end
  job.error = msg
  sink:finish("disconnected", msg)
end

-- start(handle, req) -> job | nil, message, code
function M.start(h, req)
  if h.destroyed then return nil, "the box is closed", "box_gone" end
  if h.gone then return nil, h.gone, "box_gone" end
  if req.user then
    return nil, "the exec subresource runs commands as the container's user; a per-command user needs the agent transport", "unsupported"
  end
  local c = h.client
  local ex, err, code = c:exec(h.namespace, h.name, h.k.container, { "sh", "-c", BOOT },
    { stdin = true, timeout = req.deadline and math.max(1, req.deadline - core.now()) or nil })
  if not ex then
    if code == "not_found" then mark_gone(h, "the box's pod is gone (" .. tostring(err) .. ")") end
    -- A refused exec (500 "container not found", 400 "not running") of a
    -- pod that ended is the box gone, not a server error.
    if not h.gone and not h.destroyed and code ~= "forbidden" and code ~= "unauthorized" then check_gone(h) end
    if h.gone then return nil, h.gone, "box_gone" end
    return nil, err, code
  end
  h.streams[ex] = true
  local sink = core.stream.sink { capture = req.capture, chunks = req.chunks, chunk_limit = req.chunk_limit }
  local job = { stream = sink, marker = req.marker, ex = ex, check_id = require("sbx.job").random_id() }
  -- a helper past its deadline (sbx.job.run_helper) ends its exec stream
  job.abandon = function() ex:close() end
  local script = command_script(h, req, ex.v5, job.check_id)
  if not req.stdin or #req.stdin <= h.k.stdin_chunk then
    ex:send_stdin(script .. (req.stdin or ""))
    if ex.v5 then ex:close_stdin() end
  else
    ex:send_stdin(script)
    core.spawn(function()
      local chunk = h.k.stdin_chunk
      for pos = 1, #req.stdin, chunk do
        if not ex:send_stdin(req.stdin:sub(pos, pos + chunk - 1)) then return end
        if not ex:wait_drained(4 * chunk) then return end
      end
      -- v5 ends stdin here; on v4 head has read exactly its bytes.
      if ex.v5 then ex:close_stdin() end
    end)
  end
  core.spawn(pump, h, job, ex, sink, req)
  return job
end

-- finish(handle, job) -> exit_code | nil, message, code
function M.finish(_, job)
  if job.exit_code then return job.exit_code end
  return nil, job.error or "the command ended without an exit status", job.code or "no_exit_code"
end

-- clear(handle, deadline) -> true | nil, message, code: ends every process
-- of the pod's container but its lifetime process (a lost agent's box,
-- before a fresh agent is placed; a box past its budget), with
-- box.clear_request over an exec. The exec runs as the container's user,
-- which is every process of the box's user. A pod cannot restart in place,
-- so processes that did not end (a box at its pids limit) are an error
-- and the box is not used again.
function M.clear(h, deadline)
  local job_mod = require "sbx.job"
  local req = job_mod.clear_request()
  req.user = nil
  local exit_code, kjob, code = job_mod.run_helper(M, h, req, deadline or core.now() + h.k.kill_timeout,
    "ending the box's processes")
  if exit_code == nil then return nil, kjob, code end
  local n = tostring((kjob.stream:captured("stdout"))):match("^%s*(%d+)")
  if exit_code == 0 and n == "0" then return true end
  return nil, string.format("%s of the box's processes did not end (exit %s): %s", tostring(n or "some"),
    tostring(exit_code), (kjob.stream:captured("stderr"))), "kill_failed"
end

return M

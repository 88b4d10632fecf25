-- The Fargate backend's agent channel: one ECS Exec session whose PTY
-- carries sbx-agent's frames.
local core = require "sbx.core"
local session_mod = require "sbx.aws.ssm_session"
local exec = require "sbx.backends.fargate.exec"
local execute = exec.execute
local shq = exec.shq

local M = {}

-- The agent's channel ----------------------------------------------------------------

-- One ECS Exec session whose PTY becomes a channel: a small sh script turns
-- echo and line editing off (stty raw), says the task's architecture, reads
-- a length line and exactly that many bytes (a fresh sbx-agent, into a new
-- private directory: a copy left in the task is never trusted) and execs it
-- with args. Where the image has no stty the PTY stays cooked while the
-- agent is uploaded, so the upload is text: lines of octal escapes
-- (\ooo, three digits each) that the shell's printf turns back into bytes,
-- ended by a "." line; the PTY echoes them (cut with the rest of the
-- loader's output), and the agent, started with --say-raw, makes the PTY
-- raw itself and says so before the host sends anything else.
-- -> channel | nil, reason, code
local AGENT_READY = "__SBXAGENT_"
local TEXT_LINE_BYTES = 240            -- bytes per text line: 961 characters, far below a cooked PTY's 4095
local OCTAL = {}
for i = 0, 255 do OCTAL[string.char(i)] = string.format("\\%03o", i) end
local function text_upload(bin)
  local lines = {}
  for i = 1, #bin, TEXT_LINE_BYTES do
    lines[#lines + 1] = bin:sub(i, i + TEXT_LINE_BYTES - 1):gsub(".", OCTAL)
  end
  lines[#lines + 1] = "."
  return table.concat(lines, "\n") .. "\n"
end

local function run_agent(h, opts, args)
  -- The relay escapes what the agent sends: the SSM agent turns every
  -- EF BF BD of the output into a lone EF (docs/aws-protocol.md 1.9).
  local argstr = " " .. core.agent.escape_arg .. (#args > 0 and (" " .. table.concat(args, " ")) or "")
  local unescape = core.agent.pty_decoder()
  local script = 'if stty raw -echo 2>/dev/null; then t=; else t=text_; fi; ' ..
    'printf "' .. AGENT_READY .. '%s%s__\\n" "$t" "$(uname -m)"; IFS= read -r n || exit 125; umask 077; ' ..
    'd=$(mktemp -d 2>/dev/null) || exit 125; ' ..
    'if [ -z "$t" ]; then head -c "$n" > "$d/a"; ' ..
    'else while IFS= read -r l && [ "$l" != . ]; do printf "$l"; done > "$d/a"; fi && chmod 700 "$d/a" && ' ..
    'printf "' .. AGENT_READY .. 'go__\\n" && if [ -z "$t" ]; then exec "$d/a"' .. argstr ..
    '; else exec "$d/a" ' .. core.agent.say_raw .. argstr .. '; fi'
  local out, err, code = execute(h, "sh -c " .. shq(script))
  if not out then return nil, err, code end
  local sink = core.stream.sink { chunks = true, chunk_limit = opts.pol.agent.channel_buffer,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 0, tail = 0 }, output = { head = 4096, tail = 0 } } }
  local ready, go, said = core.event(), core.event(), ""
  local placed, seen, text = false, "", false
  -- The loader's lines end in CR-LF while the PTY is cooked (no stty).
  local GO = { AGENT_READY .. "go__\n", AGENT_READY .. "go__\r\n" }
  local s, serr, scode = session_mod.open {
    url = out.session.streamUrl, token = out.session.tokenValue, pol = h.f.ssm,
    on_output = function(bytes)
      if placed then
        local clear, why = unescape:decode(bytes)
        if clear then sink:push("stdout", clear)
        elseif not sink:info().eof then sink:finish("bad_frame", why) end
        return
      end
      if #seen < 512 then seen = seen .. bytes:sub(1, 512 - #seen) end
      -- Only the tail matters while looking for a marker (the echo of a
      -- text upload is hundreds of kilobytes).
      said = (said .. bytes)
      if not ready:is_set() and said:find(AGENT_READY .. "[%w_]+__\r?\n") then ready:set() end
      local stop
      if text then
        local _, e = said:find(core.agent.raw_line, 1, true)
        stop = e
      else
        for _, m in ipairs(GO) do
          local _, e = said:find(m, 1, true)
          if e then stop = e break end
        end
      end
      if stop then
        -- The loader is done (and, with a text upload, the agent has made
        -- the PTY raw): what follows is the agent's.
        placed = true
        local rest = said:sub(stop + 1)
        if #rest > 0 then
          local clear, why = unescape:decode(rest)
          if clear then sink:push("stdout", clear)
          else sink:finish("bad_frame", why) end
        end
        go:set()
        return
      end
      if #said > 65536 then said = said:sub(-256) end
      if not ready:is_set() and #seen >= 512 then ready:set() go:set() end
    end,
    room = function(timeout)
      return sink:wait_room(opts.pol.agent.channel_buffer, timeout) ~= "timeout"
    end,
  }
  if not s then return nil, serr, scode end
  -- The channel lives as long as the box: `sbx run` ends when its script
  -- does, and closes the box after (the session's tasks do not hold it).
  s:unref()
  h.sessions[s] = true
  core.spawn(function()
    local r = s:wait()
    h.sessions[s] = nil
    if r.reason == "closed" or r.reason == "cancelled" then sink:finish()
    else sink:finish(r.code or r.reason, r.message) end
  end):unref()
  ready:wait(math.max(0.001, opts.deadline - core.now()))
  local arch = said:match(AGENT_READY .. "([%w_]+)__\r?\n")
  local function fail(msg, c) s:close() return nil, msg, c or "agent_unavailable" end
  if not arch then return fail("the agent's loader did not start: " .. seen:sub(1, 200)) end
  if arch:match("^text_") then text, arch = true, arch:sub(6) end
  local bin = core.agent.binary(arch)
  if not bin then return fail("this build of sbx carries no agent for " .. arch, "unsupported") end

  -- Writes go out in order through one sender (a send may wait for the
  -- session's window): the agent's length and bytes first.
  local upload = text and text_upload(bin) or bin
  local queue, queued, wake = { #bin .. "\n" .. upload }, #upload, core.event()
  local sender = core.spawn(function()
    while not sink:info().eof do
      local bytes = table.remove(queue, 1)
      if bytes then
        queued = queued - #bytes
        if not s:send(bytes) then break end
      else
        wake:clear()
        wake:wait()
      end
    end
  end)
  sender:unref()
  -- Nothing more goes in until the loader has read exactly the agent's
  -- bytes (busybox head reads ahead through stdio and would eat the key).
  go:wait(math.max(0.001, opts.deadline - core.now()))
  if not placed then return fail("the agent's loader did not finish: " .. said:sub(-200)) end
  return require("sbx.channel").over_sink(sink, {
    ended = "the session ended",
    write = function(bytes)
      queue[#queue + 1] = bytes
      queued = queued + #bytes
      wake:set()
      return queued
    end,
    close = function()
      s:close()
      wake:set()       -- the sender sees the end and goes
    end,
  })
end

-- agent_channel(handle, { key, deadline, pol }) -> channel, true, extra |
-- nil, reason, code. The agent keeps the PTY raw. Other processes of the
-- task's user could write into a PTY, so every frame is authenticated (mac
-- = true). Without stty the agent makes the PTY raw itself. When a
-- session ends, the SSM agent kills the process it started and closes the
-- PTY (amazon-ssm-agent, agent/session/shell: execCmd.Kill, then the pty
-- file closed; docs/aws-protocol.md 1.9): so the agent runs beside that process
-- (relay = true) and outlives a dropped session.
function M.agent_channel(h, opts)
  local ch, err, code = run_agent(h, opts, {})
  if not ch then return nil, err, code end
  return ch, true, { relay = true }
end

-- agent_attach(handle, { name, deadline, pol }) -> channel | nil, reason,
-- code: a new session whose freshly placed agent relays to the running one.
function M.agent_attach(h, opts)
  if not tostring(opts.name):match("^[%w%-]+$") then error("agent_attach: a bad socket name", 2) end
  return run_agent(h, opts, { "attach", opts.name })
end

return M

-- The Kubernetes backend's agent channel: sbx-agent loaded over an exec
-- stream that then carries its frames.
local core = require "sbx.core"
local readiness = require "sbx.backends.kubernetes.readiness"
local check_gone = readiness.check_gone
local gone_after_stream = readiness.gone_after_stream

local M = {}

-- The agent's channel ------------------------------------------------------------------------------

-- One exec stream without a TTY runs a small sh loader: it says the pod's
-- architecture, reads a length line and exactly that many bytes (a fresh
-- sbx-agent, into a new private directory: a copy left in the box is never
-- trusted), and execs it with args. The stream's stdin and stdout are then
-- the channel: 8-bit clean, and its pipes belong to the agent as an
-- attached Docker exec's do, so frames go without tags (mac = false).
-- -> channel | nil, reason, code
local AGENT_READY = "__SBXAGENT_"
local function run_agent(h, opts, args)
  local script = 'printf "' .. AGENT_READY .. '%s__\\n" "$(uname -m)"; IFS= read -r n || exit 125; umask 077; ' ..
    'd=$(mktemp -d 2>/dev/null) || exit 125; head -c "$n" > "$d/a" && chmod 700 "$d/a" && ' ..
    'printf "' .. AGENT_READY .. 'go__\\n" && exec "$d/a"' .. (#args > 0 and (" " .. table.concat(args, " ")) or "")
  local c = h.client
  local ex, err, code = c:exec(h.namespace, h.name, h.k.container, { "sh", "-c", script },
    { stdin = true, timeout = math.max(1, opts.deadline - core.now()) })
  if not ex then return nil, err, code end
  h.streams[ex] = true
  local limit = opts.pol.agent.channel_buffer
  local sink = core.stream.sink { chunks = true, chunk_limit = limit,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 4096, tail = 0 } } }
  local said, placed = "", false
  local ready, go = core.event(), core.event()
  -- The channel's reader lives as long as the box: `sbx run` ends when its
  -- script does, and closes the box after (task:unref).
  local pump = core.spawn(function()
    local why
    while true do
      local ch, data, rcode = ex:recv()
      if not ch then why = data break end
      if ch == 1 then
        if placed then
          local q = sink:push("stdout", data)
          if q == nil then break end
          if q and q > limit then sink:wait_room(limit) end
        else
          said = said .. data
          if said:find(AGENT_READY .. "[%w_]+__\n") then ready:set() end
          local g = said:find(AGENT_READY .. "go__\n", 1, true)
          if g then
            placed = true
            local rest = said:sub(g + #AGENT_READY + 5)
            if #rest > 0 then sink:push("stdout", rest) end
            go:set()
          end
          if #said > 4096 then ready:set() go:set() end
        end
      elseif ch == 2 then
        sink:push("stderr", data)
      elseif ch == 3 then
        why = "the agent ended: " .. data:sub(1, 200)
      end
      local _ = rcode
    end
    h.streams[ex] = nil
    ready:set()
    go:set()
    if not sink:info().eof then
      if gone_after_stream(h, false) then sink:finish("box_gone", h.gone)
      else sink:finish("agent_lost", why or "the exec stream ended") end
    end
  end)
  pump:unref()
  local function fail(msg, fcode) ex:close() return nil, msg, fcode or "agent_unavailable" end
  ready:wait(math.max(0.001, opts.deadline - core.now()))
  local arch = said:match(AGENT_READY .. "([%w_]+)__\n")
  if not arch then return fail("the agent's loader did not start: " .. said:sub(1, 200) .. (sink:captured("stderr") or "")) end
  local bin = core.agent.binary(arch)
  if not bin then return fail("this build of sbx carries no agent for " .. arch, "unsupported") end
  ex:send_stdin(#bin .. "\n")
  local chunk = 256 * 1024
  for pos = 1, #bin, chunk do ex:send_stdin(bin:sub(pos, pos + chunk - 1)) end
  -- Nothing more goes in until the loader has read exactly the agent's
  -- bytes (busybox head reads ahead through stdio and would eat the key).
  go:wait(math.max(0.001, opts.deadline - core.now()))
  if not placed then return fail("the agent's loader did not finish: " .. said:sub(1, 200) .. (sink:captured("stderr") or "")) end
  return require("sbx.channel").over_sink(sink, {
    ended = "the exec stream ended",
    write = function(bytes)
      local ok, werr = ex:send_stdin(bytes)
      if not ok then return nil, werr end
      return ex:buffered()
    end,
    close = function()
      ex:close()
      h.streams[ex] = nil
    end,
  })
end

-- agent_channel(handle, { key, deadline, pol }) -> channel, mac, extra | nil,
-- reason, code. The agent runs beside the exec's process (relay = true):
-- containerd's CRI kills an exec's process with SIGKILL when the exec call's
-- context ends (internal/cri/server/container_execsync.go, execInternal;
-- docs/kubernetes.md), which a dropped stream can bring about; the agent
-- and its commands outlive that, and sbx attaches again.
function M.agent_channel(h, opts)
  if h.gone then return nil, h.gone, "box_gone" end
  local ch, err, code = run_agent(h, opts, {})
  if not ch and not h.destroyed and check_gone(h) then return nil, h.gone, "box_gone" end
  if not ch then return nil, err, code end
  return ch, false, { relay = true }
end

-- agent_attach(handle, { name, deadline, pol }) -> channel | nil, reason,
-- code: a new exec stream whose freshly placed agent relays to the running one.
function M.agent_attach(h, opts)
  if not tostring(opts.name):match("^[%w%-]+$") then error("agent_attach: a bad socket name", 2) end
  if h.gone then return nil, h.gone, "box_gone" end
  local ch, err, code = run_agent(h, opts, { "attach", opts.name })
  if not ch and not h.destroyed and check_gone(h) then return nil, h.gone, "box_gone" end
  return ch, err, code
end

return M

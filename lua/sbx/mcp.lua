-- An MCP server over stdio: JSON-RPC 2.0, one JSON message per line.
-- One box per server session, created at the first tool call; tools come
-- from the policy (sbx.tools.export "mcp"). Each tools/call runs as its own
-- task, so a notifications/cancelled stops it (and kills its process tree)
-- while other calls go on. End of input or a signal removes the box.
local sbx = require "sbx"
local json = sbx.json

local M = {}

-- Protocol versions this server speaks, newest first.
M.versions = { "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05" }

-- SBX_MCP_TRACE=1 logs every message in and out on stderr.
local trace = os.getenv("SBX_MCP_TRACE") == "1"

local function send(msg)
  msg.jsonrpc = "2.0"
  local line = json.encode(setmetatable(msg, { __jsonorder = { "jsonrpc", "id", "method", "params", "result", "error" } }))
  if trace then io.stderr:write(string.format("[%.3f] >> %s\n", sbx.now(), line:sub(1, 300))) end
  io.stdout:write(line, "\n")
  io.stdout:flush()
end

local function reply(id, result) send { id = id, result = result } end

local function fail(id, code, message)
  send { id = id == nil and json.null or id, error = { code = code, message = message } }
end

function M.serve(opts)
  opts = opts or {}
  local box, box_err
  local tools
  local inflight = {}      -- request id (as a string key) -> task
  local initialized = false

  local function get_box()
    if box then return box end
    local b, err = sbx.box(opts.box or {})
    if not b then box_err = err return nil, err end
    box = b
    tools = box:tools()
    return box
  end

  local function key(id) return type(id) .. ":" .. tostring(id) end

  local handlers = {}

  function handlers.initialize(id, params)
    local want = type(params) == "table" and params.protocolVersion
    local version = M.versions[1]
    for _, v in ipairs(M.versions) do if v == want then version = v end end
    initialized = true
    reply(id, {
      protocolVersion = version,
      capabilities = { tools = { listChanged = false } },
      serverInfo = { name = "sbx", version = sbx.version },
      instructions = "Tools run commands in an isolated sandbox (" .. tostring(sbx.policy.box.backend) .. ").",
    })
  end

  function handlers.ping(id) reply(id, json.object()) end

  handlers["tools/list"] = function(id)
    reply(id, { tools = assert(sbx.tools.export("mcp")) })
  end

  handlers["tools/call"] = function(id, params)
    if type(params) ~= "table" or type(params.name) ~= "string" then
      return fail(id, -32602, "tools/call needs params.name (a string) and params.arguments (an object)")
    end
    local k = key(id)
    local token = type(params._meta) == "table" and params._meta.progressToken or nil
    inflight[k] = sbx.spawn(function() xpcall(function()
      local b, err = get_box()
      local text, is_error
      if not b then
        text, is_error = sbx.policy.format_tool_error("the sandbox could not be created: " .. tostring(err)), true
      else
        local ctx, done
        if token ~= nil then
          local count, bytes, last, t0 = 0, 0, "", sbx.now()
          local function progress()
            count = count + 1
            send { method = "notifications/progress", params = {
              progressToken = token, progress = count,
              message = string.format("running for %.0fs; %d bytes of output; last line: %s", sbx.now() - t0, bytes, last:sub(1, 200)) } }
          end
          ctx = {
            on_output = function(_, chunk)
              bytes = bytes + #chunk
              last = chunk:match("([^\n]+)\n?$") or last
              progress()
            end,
          }
          -- A quiet command still reports that it is alive.
          done = sbx.event()
          sbx.spawn(function()
            while not done:wait(sbx.policy.mcp.progress_interval) do progress() end
          end)
        end
        local ok, t, e = pcall(sbx.tools.call, tools, params.name, params.arguments or {}, ctx)
        if done then done:set() end
        if not ok then
          inflight[k] = nil
          if tostring(t):find("^cancelled") then return end  -- no response to a cancelled request
          error(t, 0)
        end
        text, is_error = t, e
      end
      inflight[k] = nil
      reply(id, { content = { { type = "text", text = text } }, isError = is_error and true or false })
    end, function(e) io.stderr:write("sbx mcp: tools/call failed: ", debug.traceback(tostring(e)), "\n") end) end)
  end

  handlers["notifications/cancelled"] = function(_, params)
    local t = type(params) == "table" and params.requestId ~= nil and inflight[key(params.requestId)]
    if t then t:cancel() end
  end

  handlers["notifications/initialized"] = function() end

  local reader = sbx.core.lines.open(0, sbx.policy.mcp.max_line)
  local ok, err = pcall(function()
    while true do
      local line, rerr, code = reader:read()
      if not line then
        if code ~= "eof" then io.stderr:write("sbx mcp: ", tostring(rerr), "\n") end
        break
      end
      if trace then io.stderr:write(string.format("[%.3f] << %s\n", sbx.now(), line:sub(1, 300))) end
      if line:match("%S") then
        local msg, jerr = json.decode(line)
        if type(msg) ~= "table" or msg[1] ~= nil then
          fail(nil, msg == nil and -32700 or -32600, msg == nil and ("parse error: " .. tostring(jerr)) or "expected one JSON-RPC object per line")
        elseif type(msg.method) ~= "string" then
          if msg.id ~= nil and msg.result == nil and msg.error == nil then fail(msg.id, -32600, "a request needs a method") end
        else
          local h = handlers[msg.method]
          if not h then
            if msg.id ~= nil then fail(msg.id, -32601, "method not found: " .. msg.method) end
          elseif not initialized and msg.method ~= "initialize" and msg.method ~= "ping" and msg.id ~= nil then
            fail(msg.id, -32002, "the server is not initialized")
          else
            h(msg.id, msg.params)
          end
        end
      end
    end
  end)
  -- End of input: calls in flight finish (a client that wants them gone
  -- sends SIGTERM, which cancels them and kills their processes). Then the
  -- box is removed.
  if not ok then
    for _, t in pairs(inflight) do t:cancel() end
  end
  for _, t in pairs(inflight) do pcall(t.join, t) end
  if box then box:close() end
  if not ok then error(err, 0) end
  return 0
end

return M

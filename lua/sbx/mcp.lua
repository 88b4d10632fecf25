-- An MCP server over stdio: JSON-RPC 2.0, one JSON message per line.
-- One box per server session, created at the first tool call; tools come
-- from the policy (sbx.tools.export "mcp"). Each tools/call runs as its own
-- task, so a notifications/cancelled stops it (and kills its process tree)
-- while other calls go on. End of input, a signal or a client that stops
-- reading (a failed write) removes the box. A message without id is a
-- notification: never answered, and before initialize never run. A line
-- over policy.mcp.max_line is answered with an error and dropped.
local sbx = require "sbx"
local json = sbx.json

local M = {}

-- Protocol versions this server speaks, newest first.
M.versions = { "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05" }

-- SBX_MCP_TRACE=1 logs every message in and out on stderr.
local trace = os.getenv("SBX_MCP_TRACE") == "1"

-- A cancelled call and a call ended by a signal get no answer and say nothing.
local function quiet_end(e)
  local kind = require("sbx.core").is_cancel(tostring(e))
  return kind == "cancelled" or kind == "interrupted"
end

function M.serve(opts)
  opts = opts or {}
  local pol = sbx.policy.mcp
  local box, creating
  local tools
  local inflight = {}      -- request id (as a string key) -> task
  local initialized = false
  local reader = sbx.core.lines.open(0, pol.max_line)
  -- The client stopped reading (a write to stdout failed): the session is
  -- over, whatever still comes in.
  local gone = false

  local function key(id) return type(id) .. ":" .. tostring(id) end

  -- Writes one message; false once stdout failed. The first failure cancels
  -- every call in flight (their processes are killed) and closes stdin, so
  -- serve winds down and removes the box.
  local function send(msg)
    if gone then return false end
    msg.jsonrpc = "2.0"
    local line = json.encode(setmetatable(msg, { __jsonorder = { "jsonrpc", "id", "method", "params", "result", "error" } }))
    if trace then io.stderr:write(string.format("[%.3f] >> %s\n", sbx.now(), line:sub(1, 300))) end
    local ok, err = io.stdout:write(line, "\n")
    if ok then ok, err = io.stdout:flush() end
    if ok then return true end
    gone = true
    if trace then io.stderr:write(string.format("[%.3f] stdout: %s; ending the session\n", sbx.now(), tostring(err))) end
    for _, t in pairs(inflight) do t:cancel() end
    reader:close()
    return false
  end

  local function reply(id, result) send { id = id, result = result } end

  local function fail(id, code, message)
    send { id = id == nil and json.null or id, error = { code = code, message = message } }
  end

  -- With policy.pool.size above 0 the box is made ahead, while the client
  -- starts up: a warm pool of that size for the session's box spec, taken
  -- from at the first call and drained when the session ends. A pool that
  -- cannot be made leaves the box to be made at the first call, which then
  -- says why.
  local pool
  if sbx.policy.pool.size > 0 then
    local ok, p = pcall(sbx.pool, { size = sbx.policy.pool.size, box = opts.box or {} })
    if ok then pool = p end
  end

  -- The session's box, made by the first call that needs it (or taken from
  -- the pool); calls that arrive while it is being made wait for it
  -- instead of making their own.
  local function get_box()
    while not box do
      if creating then
        creating:wait()
      else
        local ev = sbx.event()
        creating = ev
        local ok, b, err, code
        if pool then
          ok, b, err, code = pcall(pool.take, pool)
        else
          ok, b, err, code = pcall(sbx.box, opts.box or {})
        end
        creating = nil
        ev:set()
        if not ok then error(b, 0) end
        if not b then
          -- The client gets it as the call's result; whoever runs the
          -- server (often only a log of its stderr) gets it too.
          local why = (code and (tostring(code) .. ": ") or "") .. tostring(err)
          io.stderr:write("sbx mcp: the sandbox could not be created: ", why, "\n")
          return nil, why   -- the next call tries again
        end
        box, tools = b, b:tools()
      end
    end
    return box
  end

  -- Requests (they carry an id and get exactly one answer) ----------------------

  local requests = {}

  function requests.initialize(id, params)
    local want = type(params) == "table" and params.protocolVersion
    local version = M.versions[1]
    for _, v in ipairs(M.versions) do if v == want then version = v end end
    initialized = true
    local instructions = pol.instructions
    if type(instructions) == "function" then
      local p = sbx.policy
      instructions = instructions(p, require("sbx.box").backend_name(p.box.backend, nil, p))
    end
    reply(id, {
      protocolVersion = version,
      capabilities = { tools = { listChanged = false } },
      serverInfo = { name = "sbx", version = sbx.version },
      instructions = instructions,
    })
  end

  function requests.ping(id) reply(id, json.object()) end

  requests["tools/list"] = function(id)
    reply(id, { tools = assert(sbx.tools.export("mcp")) })
  end

  requests["tools/call"] = function(id, params)
    if type(params) ~= "table" or type(params.name) ~= "string" then
      return fail(id, -32602, "tools/call needs params.name (a string) and params.arguments (an object)")
    end
    local k = key(id)
    if inflight[k] then return fail(id, -32600, "this request id is already used by a call in flight") end
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
              message = pol.format_progress { elapsed = sbx.now() - t0, bytes = bytes, last_line = last, count = count } } }
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
            while not done:wait(pol.progress_interval) do progress() end
          end)
        end
        local ok, t, e = pcall(sbx.tools.call, tools, params.name, params.arguments or {}, ctx)
        if done then done:set() end
        if not ok then
          inflight[k] = nil
          error(t, 0)
        end
        text, is_error = t, e
      end
      inflight[k] = nil
      reply(id, { content = { { type = "text", text = text } }, isError = is_error and true or false })
    end, function(e)
      inflight[k] = nil
      if not quiet_end(e) then io.stderr:write("sbx mcp: tools/call failed: ", debug.traceback(tostring(e)), "\n") end
    end) end)
  end

  -- Notifications (no id: never answered) ----------------------------------------

  local notifications = {}

  notifications["notifications/cancelled"] = function(params)
    local t = type(params) == "table" and params.requestId ~= nil and inflight[key(params.requestId)]
    if t then t:cancel() end
  end

  notifications["notifications/initialized"] = function() end

  local function dispatch(msg)
    local id, method = msg.id, msg.method
    if id == nil then
      -- A notification, or a response to a request this server never
      -- sends. Before initialize nothing runs.
      local h = initialized and type(method) == "string" and notifications[method]
      if h then h(msg.params) end
    elseif id ~= json.null and type(id) ~= "string" and math.type(id) ~= "integer" then
      fail(nil, -32600, "a request id must be a string or an integer")
    elseif type(method) ~= "string" then
      if msg.result == nil and msg.error == nil then fail(id, -32600, "a request needs a method") end
    elseif not requests[method] then
      fail(id, -32601, "method not found: " .. method)
    elseif not initialized and method ~= "initialize" and method ~= "ping" then
      fail(id, -32002, "the server is not initialized")
    else
      requests[method](id, msg.params)
    end
  end

  local ok, err = pcall(function()
    while not gone do
      local line, rerr, code = reader:read()
      if code == "too_long" then
        -- The rest of the line is dropped by the reader; its id is unknown.
        fail(nil, -32600, string.format("a message longer than %d bytes (policy.mcp.max_line) was dropped", pol.max_line))
      elseif not line then
        if code ~= "eof" and not gone then io.stderr:write("sbx mcp: ", tostring(rerr), "\n") end
        break
      else
        if trace then io.stderr:write(string.format("[%.3f] << %s\n", sbx.now(), line:sub(1, 300))) end
        if line:match("%S") then
          local msg, jerr = json.decode(line)
          if type(msg) ~= "table" or msg[1] ~= nil then
            fail(nil, msg == nil and -32700 or -32600, msg == nil and ("parse error: " .. tostring(jerr)) or "expected one JSON-RPC object per line")
          else
            dispatch(msg)
          end
        end
      end
    end
  end)
  -- End of input: calls in flight finish (a client that wants them gone
  -- sends SIGTERM, which cancels them and kills their processes). A client
  -- that stopped reading or a signal cancels them. Then the box is removed.
  if not ok or gone then
    for _, t in pairs(inflight) do t:cancel() end
  end
  for _, t in pairs(inflight) do pcall(t.join, t) end
  if box then box:close() end
  if pool then pool:close() end
  if not ok then error(err, 0) end
  return 0
end

return M

-- A Kubernetes API client on the shared loop: REST calls over sbx.httpc
-- (TLS from the kubeconfig: the cluster's CA, a client certificate as
-- libcurl blobs), watches read line by line from a streamed response, and
-- exec streams on a websocket (core.ws) in the v5 or v4 channel protocol.
-- Protocol notes: docs/kubernetes.md.
--
--   client.new(conn, pol) -> client   (conn from sbx.kubernetes.config)
--   c:call(method, path, { body, query, ok, timeout }) -> status, decoded | nil, message, code
--   c:watch(path, query, on_event, { timeout }) -> "ended" | "stopped" | nil, message, code
--   c:exec(namespace, pod, container, argv, { stdin }) -> exec stream | nil, message, code
-- Failures: API errors carry the Status's own reason (code "not_found",
-- "already_exists", "forbidden", "unauthorized", "invalid", "throttled",
-- "expired", "server_error", else "http_<status>"); 429 and 5xx are
-- retried (Retry-After honoured), as are refused and cut connections; a 401
-- fetches the credentials again (token file, exec plugin) and retries once.
local M = {}

local core = require "sbx.core"
local json = core.json
local http = require "sbx.http"
local httpc = require "sbx.httpc"
local config = require "sbx.kubernetes.config"

local Client = {}
Client.__index = Client

local REASON_CODES = {
  NotFound = "not_found", AlreadyExists = "already_exists", Forbidden = "forbidden", Unauthorized = "unauthorized",
  Invalid = "invalid", TooManyRequests = "throttled", Expired = "expired", Gone = "expired", Conflict = "conflict",
  InternalError = "server_error", ServiceUnavailable = "server_error", Timeout = "timeout", BadRequest = "bad_request",
  MethodNotAllowed = "bad_request",
}
M.REASON_CODES = REASON_CODES

function M.new(conn, pol)
  return setmetatable({ conn = conn, pol = pol, exec_protocol = nil }, Client)
end

local function query_string(q)
  if not q then return "" end
  local parts = {}
  local keys = {}
  for k in pairs(q) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = q[k]
    if type(v) == "table" then
      for _, x in ipairs(v) do parts[#parts + 1] = http.escape(k) .. "=" .. http.escape(tostring(x)) end
    elseif v ~= nil and v ~= false then
      parts[#parts + 1] = http.escape(k) .. "=" .. http.escape(tostring(v))
    end
  end
  return #parts > 0 and ("?" .. table.concat(parts, "&")) or ""
end
M.query_string = query_string

-- The message and code of a failed call from its Status body (or, when
-- the body is not a Status, the server's own text, such as the kubelet's
-- "406: Not Acceptable").
function M.status_error(status, body)
  local st = type(body) == "string" and body ~= "" and json.decode(body) or nil
  if type(st) == "table" and st.kind == "Status" then
    local code = REASON_CODES[st.reason] or ("http_" .. tostring(status))
    return tostring(st.message or st.reason or ("HTTP " .. status)), code, st
  end
  local text = type(body) == "string" and body:gsub("%s+$", ""):sub(1, 300) or ""
  if text ~= "" and not text:find("[%z\1-\8\14-\31]") then
    return string.format("HTTP %d from the API server: %s", status, text), "http_" .. tostring(status)
  end
  return string.format("HTTP %d from the API server", status), "http_" .. tostring(status)
end

-- Options of a request with TLS and credentials (nil, message, code when
-- the credentials cannot be had).
function Client:_prepare(refresh)
  local cred, err, code = config.credentials(self.conn, self.pol, refresh)
  if not cred then return nil, err, code end
  local tls = self.conn.tls
  local headers = { Accept = "application/json", ["User-Agent"] = "sbx/" .. tostring(core.version) }
  for k, v in pairs(cred.headers) do headers[k] = v end
  return { headers = headers, ca_data = tls.ca_data, insecure = tls.insecure,
    cert_data = cred.cert_data, key_data = cred.key_data }
end

local function merge(a, b) for k, v in pairs(b) do a[k] = v end return a end

-- One request with retries and the 401 refresh: the response | nil, message, code.
function Client:request(opts)
  local pol = self.pol
  for attempt = 1, 2 do
    local base, err, code = self:_prepare(attempt > 1)
    if not base then return nil, err, code end
    local o = merge({}, opts)
    o.headers = merge(base.headers, opts.headers or {})
    o.ca_data, o.insecure, o.cert_data, o.key_data = base.ca_data, base.insecure, base.cert_data, base.key_data
    o.url = self.conn.server .. opts.path .. query_string(opts.query)
    o.path, o.query = nil, nil
    o.retries = opts.retries or pol.retries
    o.backoff = pol.backoff
    o.timeout = opts.timeout or (not opts.stream and pol.request_timeout) or nil
    o.connect_timeout = pol.connect_timeout
    local r, rerr, rcode = httpc.request(o)
    if not r then
      if rcode == "tls" then
        return nil, "TLS with the Kubernetes API server " .. self.conn.server .. " failed: " .. tostring(rerr), "tls"
      end
      return nil, string.format("the Kubernetes API server %s: %s", self.conn.server, tostring(rerr)), rcode
    end
    if r.status ~= 401 or attempt == 2 then return r end
    if r.body_stream then r.body_stream:close() end
  end
end

-- c:call(method, path, opts) -> status, decoded body, response | nil, message, code, status object
function Client:call(method, path, opts)
  opts = opts or {}
  local body = opts.body ~= nil and json.encode(opts.body) or nil
  local r, err, code = self:request { method = method, path = path, query = opts.query, body = body,
    headers = body and { ["Content-Type"] = "application/json" } or nil, timeout = opts.timeout,
    retries = opts.retries }
  if not r then return nil, err, code end
  if r.status >= 300 and not (opts.ok and opts.ok[r.status]) then
    return nil, M.status_error(r.status, r.body)
  end
  local decoded = r.body ~= "" and json.decode(r.body) or nil
  return r.status, decoded, r
end

-- c:watch(path, query, on_event, opts) -> "ended" (the server closed it),
-- "stopped" (on_event returned false) | nil, message, code. Events are
-- JSON lines {type, object}; an ERROR event is returned as a failure with
-- its Status (410: code "expired": list again, then watch from there).
function Client:watch(path, query, on_event, opts)
  opts = opts or {}
  local q = merge({ watch = "1" }, query or {})
  local r, err, code = self:request { method = "GET", path = path, query = q, stream = true,
    idle_timeout = opts.idle_timeout, retries = opts.retries }
  if not r then return nil, err, code end
  local body <close> = r.body_stream
  if r.status ~= 200 then
    local head = body:read(5) or ""
    return nil, M.status_error(r.status, head)
  end
  local buf = ""
  local deadline = opts.deadline
  while true do
    local left = deadline and deadline - core.now() or nil
    if left and left <= 0 then return nil, "timeout", "timeout" end
    local chunk, rerr, rcode = body:read(left)
    if not chunk then
      if rerr == "eof" then return "ended" end
      if rcode == "timeout" and deadline then return nil, "timeout", "timeout" end
      return nil, "the watch stream broke: " .. tostring(rerr), rcode or "closed"
    end
    buf = buf .. chunk
    while true do
      local nl = buf:find("\n", 1, true)
      if not nl then break end
      local line = buf:sub(1, nl - 1)
      buf = buf:sub(nl + 1)
      if line:match("%S") then
        local ev = json.decode(line)
        if type(ev) ~= "table" or type(ev.type) ~= "string" then
          return nil, "the watch sent a line that is not an event", "bad_response"
        end
        if ev.type == "ERROR" then
          local st = type(ev.object) == "table" and ev.object or {}
          return nil, tostring(st.message or "the watch failed"), REASON_CODES[st.reason] or
            (st.code == 410 and "expired" or "watch_error"), st
        end
        if on_event(ev.type, ev.object) == false then return "stopped" end
      end
    end
  end
end

-- Exec streams ----------------------------------------------------------------------

local Exec = {}
Exec.__index = Exec
M.Exec = Exec

local function ws_url(server)
  return (server:gsub("^https://", "wss://"):gsub("^http://", "ws://"))
end

-- The HTTP status of a refused websocket upgrade, from core.ws's message.
local function upgrade_status(msg) return tonumber(tostring(msg):match("HTTP (%d%d%d)")) end

-- c:exec(ns, pod, container, argv, opts) -> exec | nil, message, code.
-- opts.stdin: open stdin (channel 0). The stream speaks whichever of
-- policy.kubernetes.exec_protocols the server chose (exec.protocol, and
-- exec.v5: channel 255 can close stdin). The messages are read by
-- exec:recv(); see the backend for the pump.
function Client:exec(ns, pod, container, argv, opts)
  opts = opts or {}
  local pol = self.pol
  local q = { command = argv, container = container, stdin = opts.stdin and "true" or nil,
    stdout = "true", stderr = "true" }
  local path = string.format("/api/v1/namespaces/%s/pods/%s/exec", http.escape(ns), http.escape(pod))
  local url = ws_url(self.conn.server) .. path .. query_string(q)
  if #url > pol.exec_max_url then
    return nil, string.format("the command is %d bytes as an exec URL; the exec subresource's URL takes at most %d " ..
      "(policy.kubernetes.exec_max_url)", #url,
      pol.exec_max_url), "exec_failed"
  end
  local deadline = core.now() + (opts.timeout or pol.exec_connect_timeout)
  local refreshed = false
  local attempt = 0
  while true do
    attempt = attempt + 1
    local base, err, code = self:_prepare(refreshed)
    if not base then return nil, err, code end
    -- The API server proxies the upgrade with these headers to the
    -- kubelet, whose /exec route answers 406 to an Accept other than */*
    -- (docs/kubernetes.md).
    base.headers.Accept = "*/*"
    local ws, werr, wcode = core.ws.connect {
      url = url, headers = base.headers, protocols = pol.exec_protocols,
      ca_data = base.ca_data, cert_data = base.cert_data, key_data = base.key_data, insecure = base.insecure,
      timeout = math.max(0.001, deadline - core.now()), max_message = pol.exec_max_message,
      max_send = pol.exec_max_send,
    }
    if ws then
      local proto = ws:info().protocol
      if not proto then
        ws:close()
        return nil, "the API server chose no channel protocol for exec (sbx speaks " ..
          table.concat(pol.exec_protocols, ", ") .. ")", "exec_failed"
      end
      self.exec_protocol = proto
      return setmetatable({ ws = ws, protocol = proto, v5 = proto == "v5.channel.k8s.io",
        max_send = pol.exec_max_send }, Exec)
    end
    local status = upgrade_status(werr)
    if status == 401 and not refreshed then
      refreshed = true
    elseif (status == 429 or status == 500 or status == 502 or status == 503 or status == 504 or wcode == "ECONNREFUSED")
        and attempt <= pol.retries and core.now() < deadline then
      core.sleep(require("sbx.util").backoff(attempt, pol.backoff.base, pol.backoff.max))
    else
      local code2 = status == 404 and "not_found" or status == 403 and "forbidden" or
        status == 401 and "unauthorized" or (status == 400 and "exec_failed") or
        (status == 406 and "exec_failed") or wcode
      local words = status and self:_refusal(path, q, base, pol) or nil
      return nil, string.format("exec in pod %s (GET %s): %s%s", pod, path, tostring(werr),
        words and (": " .. words) or ""), code2
    end
  end
end

-- The server's own words for a refused exec upgrade. core.ws reads only
-- the status line of a refusal (libwebsockets 4.1 drops the body), so the
-- same upgrade request is sent once more through libcurl, which reads the
-- body; a refusal that is the server's decision (403, 404, 406, a pod that
-- is not running) comes back the same. -> text | nil
function Client:_refusal(path, q, base, pol)
  local r = self:request { method = "GET", path = path, query = q, retries = 0,
    timeout = math.min(10, pol.request_timeout), headers = {
      Accept = base.headers.Accept, Connection = "Upgrade", Upgrade = "websocket", ["Sec-WebSocket-Version"] = "13",
      ["Sec-WebSocket-Key"] = "c2J4LXJlZnVzYWwtd29yZHM=", ["Sec-WebSocket-Protocol"] = table.concat(pol.exec_protocols, ", "),
    } }
  if not r or r.status == 101 or r.status < 300 then return nil end
  return (M.status_error(r.status, r.body))
end

-- exec:send_stdin(bytes) -> true | nil, message, code. As messages of at
-- most max_send bytes, channel byte included, each one frame: the exec
-- server reads every frame as a message of its own (docs/kubernetes.md).
function Exec:send_stdin(bytes)
  local room = self.max_send - 1
  local pos = 1
  repeat
    local ok, err, code = self.ws:send("\0" .. bytes:sub(pos, pos + room - 1), "binary")
    if not ok then return nil, err, code end
    pos = pos + room
  until pos > #bytes
  return true
end

-- exec:close_stdin(): v5's close signal for stdin; v4 has none.
function Exec:close_stdin()
  if not self.v5 then return false end
  return self.ws:send("\255\0", "binary")
end

-- exec:recv(timeout) -> channel, bytes | nil, message, code
function Exec:recv(timeout)
  local m, kind, code = self.ws:recv(timeout)
  if not m then return nil, kind, code end
  if #m == 0 then return self:recv(timeout) end
  return m:byte(1), m:sub(2)
end

function Exec:buffered() return self.ws:buffered() end

-- exec:wait_drained(limit[, timeout]) -> true | nil, message, code: until at
-- most limit bytes of stdin are still unwritten (ws:wait_drained).
function Exec:wait_drained(limit, timeout) return self.ws:wait_drained(limit, timeout) end

function Exec:close() self.ws:close() end

-- The exit code in a channel-3 Status: code | nil, message.
function M.exit_status(text)
  local st = json.decode(text)
  if type(st) ~= "table" then return nil, "the exec status is not JSON" end
  if st.status == "Success" then return 0 end
  if st.reason == "NonZeroExitCode" then
    for _, c in ipairs(type(st.details) == "table" and type(st.details.causes) == "table" and st.details.causes or {}) do
      if c.reason == "ExitCode" and tonumber(c.message) then return math.tointeger(tonumber(c.message)) end
    end
  end
  return nil, tostring(st.message or st.reason or "the command failed to run")
end

return M

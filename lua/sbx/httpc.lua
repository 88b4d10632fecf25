-- sbx.httpc: the HTTP client layer over core.http (C, libcurl on the loop).
--
--   httpc.request(opts)        core.http.request plus retries with backoff
--   httpc.json(opts)           JSON in, JSON out -> decoded, response
--   httpc.sse(opts, on_event)  a Server-Sent Events stream, event by event
--   httpc.sse_parser()         the pure SSE parser: p:feed(bytes) -> events
--
-- Failures of the environment return nil, message, code; misuse raises.
-- Defaults (backoff, retried codes and statuses) come from policy.http.
local core = require "sbx.core"
local util = require "sbx.util"

local http, json = require "sbx.http", core.json

local M = {}

local function pol() return require("sbx.config").policy.http end

-- Hooks the tests (or a policy) may replace.
M.sleep = core.sleep
M.random = math.random

-- Retry-After in seconds (delta-seconds only; an HTTP date is ignored).
local function retry_after(r)
  local v = r and r.headers and r.headers["retry-after"]
  local n = v and tonumber(v:match("^%s*(%d+%.?%d*)%s*$"))
  return n
end

local function close_body(r)
  if r and r.body_stream then r.body_stream:close() end
end

--[[
httpc.request(opts) -> response | nil, message, code
  opts: everything core.http.request takes (url, method, headers, body,
    timeout, connect_timeout, idle_timeout, stream, max_buffer, ...) plus
    retries = n (default 0), backoff = {base=, max=, max_retry_after=},
    retry_codes = {code=true}, on_retry = function(info) (info: attempt,
    delay, status or code, message).
  Retries transport failures in retry_codes and statuses 429 and 5xx, with
  exponential backoff and full jitter, or Retry-After seconds when given. A
  streamed response is retried only at its head, before any body byte was
  handed out. The response (or the failure's 4th value) carries attempts
  and retry_delays. May yield.
]]
function M.request(opts)
  if type(opts) ~= "table" then error("httpc.request expects a table of options", 2) end
  local retries = opts.retries or 0
  if type(retries) ~= "number" or retries < 0 then error("retries must be a number >= 0", 2) end
  local bo, defaults = opts.backoff or {}, pol()
  local base = bo.base or defaults.backoff.base
  local max = bo.max or defaults.backoff.max
  local max_ra = bo.max_retry_after or defaults.backoff.max_retry_after
  local codes = opts.retry_codes or defaults.retry_codes
  local statuses = opts.retry_statuses or defaults.retry_statuses
  local delays = {}
  local attempt = 0
  while true do
    attempt = attempt + 1
    local r, err, code = http.request(opts)
    local last = attempt > retries
    local retry = false
    if r then
      if type(r) == "table" and r.status and statuses[r.status] then
        retry = true
      end
    elseif codes[code] then
      retry = true
    end
    if not retry or last then
      if type(r) == "table" then
        r.attempts, r.retry_delays = attempt, delays
        return r
      end
      return r, err, code, { attempts = attempt, retry_delays = delays }
    end
    local delay = retry_after(r)
    if delay then
      delay = math.min(delay, max_ra)
    else
      delay = util.backoff(attempt, base, max, M.random)
    end
    close_body(r) -- a streamed head we will not use
    delays[#delays + 1] = delay
    if opts.on_retry then
      opts.on_retry { attempt = attempt, delay = delay, status = r and r.status,
                      code = not r and code or nil, message = err }
    end
    M.sleep(delay)
  end
end

-- A copy of headers (list of "K: V" or map) with name: value added unless
-- the caller already set that name.
local function with_header(headers, name, value)
  local out, lname = {}, name:lower()
  local have = false
  for k, v in pairs(headers or {}) do
    out[k] = v
    local hname = type(k) == "string" and k or tostring(v):match("^([^:]+):")
    if hname and hname:lower() == lname then have = true end
  end
  if not have then out[#out + 1] = name .. ": " .. value end
  return out
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

--[[
httpc.json(opts) -> decoded, response | nil, message, code, response
  opts.json (any value) is encoded as the body with Content-Type
  application/json (method defaults to POST then, GET otherwise). A 2xx body
  is decoded (an empty body decodes to json.null). A non-2xx status returns
  nil, "HTTP <status>: <start of body>", "status", response; a body that is
  not JSON returns nil, message, "json", response. Retries as request().
]]
function M.json(opts)
  if type(opts) ~= "table" then error("httpc.json expects a table of options", 2) end
  local o = copy(opts)
  o.stream = nil
  o.headers = with_header(o.headers, "Accept", "application/json")
  if opts.json ~= nil then
    o.body = json.encode(opts.json)
    o.method = o.method or "POST"
    o.headers = with_header(o.headers, "Content-Type", "application/json")
  end
  o.json = nil
  local r, err, code, info = M.request(o)
  if not r then return nil, err, code, info end
  if r.status < 200 or r.status > 299 then
    return nil, string.format("HTTP %d: %s", r.status, r.body:sub(1, 200)), "status", r
  end
  if r.body:match("^%s*$") then return json.null, r end
  local v, jerr = json.decode(r.body)
  if v == nil then return nil, jerr, "json", r end
  return v, r
end

-- Server-Sent Events --------------------------------------------------------

local Parser = {}
Parser.__index = Parser

local BOM = "\239\187\191"

--[[
httpc.sse_parser() -> parser. parser:feed(bytes) -> list of events
{event=, data=, id=} per the WHATWG event-stream rules: CRLF, LF or CR line
ends (also split across feeds), one leading BOM dropped, comments ignored,
data lines joined with "\n", an event dispatched on a blank line only (so an
unterminated last event never is), "message" as the default type. parser.id
is the last event ID, parser.retry the last valid retry field (ms) or nil.
]]
function M.sse_parser()
  return setmetatable({
    parts = {},        -- the pending partial line
    started = false,  -- past the BOM check
    cr = false,        -- the last byte seen was a CR (an LF may follow)
    data = nil,        -- data lines of the event being built
    etype = "",
    id = "",
    retry = nil,
  }, Parser)
end

function Parser:_line(line, out)
  if line == "" then
    local data = self.data
    local etype = self.etype
    self.data, self.etype = nil, ""
    if data then
      out[#out + 1] = { event = etype ~= "" and etype or "message",
                        data = table.concat(data, "\n"), id = self.id }
    end
    return
  end
  local field, value = line:match("^([^:]*):(.*)$")
  if not field then
    field, value = line, ""
  elseif field == "" then
    return -- a comment
  else
    value = value:gsub("^ ", "", 1)
  end
  if field == "data" then
    self.data = self.data or {}
    self.data[#self.data + 1] = value
  elseif field == "event" then
    self.etype = value
  elseif field == "id" then
    if not value:find("\0", 1, true) then self.id = value end
  elseif field == "retry" then
    if value:match("^%d+$") then self.retry = tonumber(value) end
  end
end

function Parser:feed(bytes)
  local out = {}
  if type(bytes) ~= "string" then error("feed expects a string", 2) end
  if bytes == "" then return out end
  if not self.started then
    local head = table.concat(self.parts) .. bytes
    if #head < 3 and BOM:sub(1, #head) == head then
      self.parts = { head } -- maybe a BOM still arriving
      return out
    end
    self.started = true
    self.parts = {}
    bytes = head:sub(1, 3) == BOM and head:sub(4) or head
  end
  if self.cr then
    self.cr = false
    if bytes:sub(1, 1) == "\n" then bytes = bytes:sub(2) end
  end
  local i = bytes:find("[\r\n]")
  if not i then
    if bytes ~= "" then self.parts[#self.parts + 1] = bytes end
    return out
  end
  local s = table.concat(self.parts) .. bytes
  self.parts = {}
  local pos, n = 1, #s
  i = s:find("[\r\n]", pos)
  while i do
    self:_line(s:sub(pos, i - 1), out)
    if s:byte(i) == 13 then
      if i == n then
        self.cr = true
      elseif s:byte(i + 1) == 10 then
        i = i + 1
      end
    end
    pos = i + 1
    i = s:find("[\r\n]", pos)
  end
  if pos <= n then self.parts[1] = s:sub(pos) end
  return out
end

--[[
httpc.sse(opts, on_event) -> result | nil, message, code, result
  Streams opts (a request, with retries at the head as request()) and calls
  on_event{event=, data=, id=} for each event; on_event returning false
  stops early (the transfer is aborted). opts.read_timeout bounds each wait
  for bytes. result: {status, headers, events = count, stopped = bool,
  last_event_id, retry}. A non-2xx status returns nil, message, "status",
  result. The body stream is closed on every path, errors included. May yield.
]]
function M.sse(opts, on_event)
  if type(opts) ~= "table" then error("httpc.sse expects a table of options", 2) end
  if type(on_event) ~= "function" then error("httpc.sse expects an on_event function", 2) end
  local o = copy(opts)
  o.stream = true
  o.headers = with_header(o.headers, "Accept", "text/event-stream")
  local r, err, code, info = M.request(o)
  if not r then return nil, err, code, info end
  local body <close> = r.body_stream
  local result = { status = r.status, headers = r.headers, events = 0, stopped = false,
                   attempts = r.attempts, retry_delays = r.retry_delays }
  if r.status < 200 or r.status > 299 then
    local head = body:read(opts.read_timeout or 5) or ""
    return nil, string.format("HTTP %d: %s", r.status, head:sub(1, 200)), "status", result
  end
  local p = M.sse_parser()
  while true do
    local chunk, rerr, rcode = body:read(opts.read_timeout)
    if not chunk then
      result.last_event_id, result.retry = p.id, p.retry
      if rerr == "eof" then return result end
      return nil, rerr, rcode, result
    end
    for _, ev in ipairs(p:feed(chunk)) do
      result.events = result.events + 1
      if on_event(ev) == false then
        result.stopped = true
        result.last_event_id, result.retry = p.id, p.retry
        return result
      end
    end
  end
end

return M

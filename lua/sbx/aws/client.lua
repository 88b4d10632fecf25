-- sbx.aws.client: AWS service clients over sbx's HTTP layer, for the two
-- wire protocols sbx needs (docs/aws-protocol.md sections 2-4):
-- awsJson1_1 (ECS) and awsQuery (IAM, STS).
--
--   local aws = require "sbx.aws.client"
--   local ecs, err, code = aws.new("ecs", opts)
--   local out, err, code, info = ecs:call("RunTask", params)
--
-- opts (all optional): region, profile, credentials (a table {access_key,
-- secret_key, session_token, expiration} or a function returning one, or the
-- same nil, message, code on failure), access_key/secret_key/session_token,
-- env (a table read instead of os.getenv), home, endpoint (a URL), retry (a
-- number of attempts or {max_attempts, backoff_base, backoff_cap}), timeout
-- (seconds per attempt). Unset numbers come from sbx.policy.aws at each call.
--
-- call() returns out, nil, nil, info on success: for JSON services the
-- decoded body, for Query services the <OpResult> element as plain values
-- (sbx.aws.xml value rules; {} when the operation has no result). Failures
-- return nil, message, code, info: code is the AWS error code parsed as
-- botocore does, or a transport code ("ECONNREFUSED", "timeout", "closed",
-- ...), "no_credentials" or "bad_response"; the message starts with the
-- service and the operation ("ECS RunTask: ..."). info = { status,
-- request_id, attempts, retry_delays }. Wrong argument types raise.
--
-- Secrets (secret key, session token, the Authorization header) are kept out
-- of the client table and are scrubbed from every message, including text a
-- server echoes back.
local core = require "sbx.core"
local credentials = require "sbx.aws.credentials"
local xml = require "sbx.aws.xml"

local json, sigv4 = core.json, core.sigv4

local M = {}

-- Hooks the tests (or an embedder) may replace.
M.sleep = core.sleep
M.random = math.random
M.http_request = require("sbx.http").request
M.clock = os.time               -- wall clock, epoch seconds: credential expiry

local function policy()
  return require("sbx.config").policy.aws
end

-- Services ------------------------------------------------------------------

-- How each service is reached. endpoint(region) gives the default URL and the
-- region to sign with; env_id names AWS_ENDPOINT_URL_<ID>.
local function partition_suffix(region)
  if region and region:match("^cn%-") then return "amazonaws.com.cn" end
  return "amazonaws.com"
end

M.services = {
  ecs = {
    name = "ECS", signing_name = "ecs", env_id = "ECS", protocol = "json",
    target_prefix = "AmazonEC2ContainerServiceV20141113.",
    needs_region = true,
    endpoint = function(region)
      return string.format("https://ecs.%s.%s", region, partition_suffix(region)), region
    end,
  },
  -- IAM is global: one endpoint per partition, always signed with that
  -- partition's home region, whatever region the client was given.
  iam = {
    name = "IAM", signing_name = "iam", env_id = "IAM", protocol = "query",
    version = "2010-05-08",
    needs_region = false,
    endpoint = function(region)
      if region and region:match("^cn%-") then return "https://iam.cn-north-1.amazonaws.com.cn", "cn-north-1" end
      if region and region:match("^us%-gov%-") then return "https://iam.us-gov.amazonaws.com", "us-gov-west-1" end
      return "https://iam.amazonaws.com", "us-east-1"
    end,
    -- An explicit endpoint keeps the partition's signing region too.
    signing_region = function(region) return select(2, M.services.iam.endpoint(region)) end,
  },
  sts = {
    name = "STS", signing_name = "sts", env_id = "STS", protocol = "query",
    version = "2011-06-15",
    needs_region = true,
    endpoint = function(region)
      return string.format("https://sts.%s.%s", region, partition_suffix(region)), region
    end,
  },
}

-- Small helpers ---------------------------------------------------------------

local getenv = credentials.getenv

-- s with every literal secret replaced. secrets comes longest first (as
-- secrets_of sorts it), so a secret that contains another is not half-replaced.
local function scrub(s, secrets)
  s = tostring(s)
  for _, secret in ipairs(secrets) do
    if #secret >= 4 and s:find(secret, 1, true) then
      s = s:gsub(secret:gsub("%p", "%%%0"), "[redacted]")
    end
  end
  return s
end

local function secrets_of(creds, extra)
  local list = {}
  if creds then
    if creds.secret_key then list[#list + 1] = creds.secret_key end
    if creds.session_token then list[#list + 1] = creds.session_token end
  end
  if extra then list[#list + 1] = extra end
  table.sort(list, function(a, b) return #a > #b end)
  return list
end

-- {scheme, host (the Host header), path (ends in "/")} | nil, message.
local function parse_endpoint(url)
  local scheme, authority, path = url:match("^(%a[%w+.-]*)://([^/?#]+)([^?#]*)$")
  if not scheme then return nil, string.format("invalid endpoint URL %q", url) end
  scheme = scheme:lower()
  if scheme ~= "http" and scheme ~= "https" then
    return nil, string.format("endpoint URL %q: the scheme must be http or https", url)
  end
  if authority:find("@", 1, true) then
    return nil, string.format("endpoint URL %q: user information is not allowed", url)
  end
  -- It becomes the Host header and the signed path: no room for spaces or
  -- control bytes.
  if not authority:match("^[%w%.%-_:%[%]]+$") or path:find("[%c%s]") then
    return nil, string.format("endpoint URL %q: invalid host or path", url)
  end
  local host = authority:lower()
  local port = host:match(":(%d+)$")
  if port and tonumber(port) == (scheme == "https" and 443 or 80) then
    host = host:sub(1, -(#port + 2))
  end
  if path == "" or path:sub(-1) ~= "/" then path = path .. "/" end
  return { scheme = scheme, host = host, path = path,
           url = scheme .. "://" .. authority .. path }
end

-- Days from 1970-01-01 to a proleptic Gregorian date (os.time would read the
-- date as local time).
local function days_from_civil(y, m, d)
  y = m <= 2 and y - 1 or y
  local era = (y >= 0 and y or y - 399) // 400
  local yoe = y - era * 400
  local doy = (153 * (m + (m > 2 and -3 or 9)) + 2) // 5 + d - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  return era * 146097 + doe - 719468
end

-- client.parse_time(v) -> epoch seconds | nil. v: ISO 8601 as AWS writes
-- expirations (2024-05-01T12:34:56Z, with a fraction, or a +hh:mm offset),
-- or a number already in epoch seconds.
function M.parse_time(v)
  if type(v) == "number" then return v end
  if type(v) ~= "string" then return nil end
  local y, mo, d, h, mi, sec, rest = v:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)[Tt ](%d%d):(%d%d):(%d%d)(.*)$")
  if not y then return nil end
  rest = rest:gsub("^%.%d+", "")
  local offset
  if rest == "Z" or rest == "z" or rest == "" then
    offset = 0
  else
    local sign, oh, om = rest:match("^([+-])(%d%d):?(%d%d)$")
    if not sign then return nil end
    offset = (tonumber(oh) * 3600 + tonumber(om) * 60) * (sign == "-" and -1 or 1)
  end
  local days = days_from_civil(tonumber(y), tonumber(mo), tonumber(d))
  return days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec) - offset
end

-- Query parameters ------------------------------------------------------------

local function is_array_marked(t)
  local mt = getmetatable(t)
  return mt and mt.__jsontype == "array"
end

local function param_string(v, name)
  local t = type(v)
  if t == "string" then return v end
  if t == "boolean" then return v and "true" or "false" end
  if t == "number" then
    if math.type(v) == "integer" then return string.format("%d", v) end
    return json.encode(v) -- the shortest text that reads back exactly
  end
  error(string.format("Query parameter '%s': a %s has no Query form", name, t), 0)
end

local function flatten_into(out, name, v)
  if type(v) ~= "table" then
    out[name] = param_string(v, name)
    return
  end
  local n = #v
  if n > 0 or is_array_marked(v) then
    -- A list: Name.member.N; an empty one is sent as "Name=" as botocore does.
    if n == 0 then out[name] = "" end
    for i = 1, n do flatten_into(out, name .. ".member." .. i, v[i]) end
    return
  end
  for k, sub in pairs(v) do
    if type(k) ~= "string" then
      error(string.format("Query parameter '%s': structure keys must be strings", name), 0)
    end
    flatten_into(out, name .. "." .. k, sub)
  end
end

--[[
client.flatten(params) -> { ["Tags.member.1.Key"] = "a", ... }
  The awsQuery names for nested parameters: a list (a sequence, or a table
  marked with json.array) becomes Name.member.1, Name.member.2, ...; a
  structure becomes Name.Field. Numbers and booleans become text. Keys that
  are already flat ("Tags.member.1.Key") pass through. Raises on values that
  have no Query form (functions, non-string structure keys).
]]
function M.flatten(params)
  local out = {}
  for k, v in pairs(params or {}) do
    if type(k) ~= "string" then error("Query parameter names must be strings", 2) end
    flatten_into(out, k, v)
  end
  return out
end

-- The form body: Action and Version first, then the rest sorted by name.
function M.form_body(action, version, params)
  local flat = M.flatten(params)
  local names = {}
  for k in pairs(flat) do
    if k == "Action" or k == "Version" then
      error("Query parameter '" .. k .. "' is set by the client, not by the parameters", 0)
    end
    names[#names + 1] = k
  end
  table.sort(names)
  local esc = core.http.escape
  local parts = { "Action=" .. esc(action), "Version=" .. esc(version) }
  for _, k in ipairs(names) do parts[#parts + 1] = esc(k) .. "=" .. esc(flat[k]) end
  return table.concat(parts, "&")
end

-- Protocols -----------------------------------------------------------------------
-- encode(svc, op, params) -> body, content_type, extra headers (raises on
--   params the protocol cannot carry)
-- success(svc, op, response) -> value, request_id | nil, message
-- error(svc, response) -> code, message, request_id (never fails: a body it
--   cannot read gives the HTTP status as the code)

local protocols = {}

protocols.json = {
  encode = function(svc, op, params)
    local body
    if params == nil or next(params) == nil then
      body = "{}"
    else
      if is_array_marked(params) or #params > 0 then
        error("the parameters of a JSON operation are a structure, not a list", 3)
      end
      body = json.encode(params)
    end
    return body, "application/x-amz-json-1.1", { { "X-Amz-Target", svc.target_prefix .. op } }
  end,
  success = function(_, _, r)
    if r.body:match("^%s*$") then return json.object {} end
    local v, err = json.decode(r.body)
    if v == nil then return nil, "the response is not JSON (" .. tostring(err) .. ")" end
    return v
  end,
  -- botocore's BaseJSONParser: the body's __type, cut at ':' and after the
  -- last '#'; message or Message. The x-amzn-ErrorType header only when the
  -- body has no code; the HTTP status when neither has.
  error = function(_, r)
    local doc = json.decode(r.body)
    if type(doc) ~= "table" then doc = {} end
    local code = doc.__type
    if type(code) ~= "string" or code == "" then code = r.headers["x-amzn-errortype"] end
    if type(code) == "string" then code = code:match("^[^:]*"):match("[^#]*$") end
    if code == nil or code == "" then code = tostring(r.status) end
    local msg = doc.message or doc.Message
    if type(msg) ~= "string" then msg = nil end
    return code, msg
  end,
}

protocols.query = {
  encode = function(svc, op, params)
    return M.form_body(op, svc.version, params), "application/x-www-form-urlencoded; charset=utf-8", {}
  end,
  success = function(_, op, r)
    local root, err = xml.parse(r.body)
    if not root then return nil, "the response is not XML (" .. err .. ")" end
    local result = xml.child(root, op .. "Result")
    local meta = xml.child(root, "ResponseMetadata")
    local rid = meta and xml.child(meta, "RequestId")
    if not result then return json.object {}, rid and rid.text end
    return M.decode_documents(xml.value(result)), rid and rid.text
  end,
  -- <ErrorResponse><Error><Code/><Message/></Error><RequestId/></...>; also
  -- the <Response><Errors><Error> form some Query services use.
  error = function(_, r)
    local root = xml.parse(r.body)
    if not root then return tostring(r.status), nil end
    local function find(el, tag)
      if el.tag == tag then return el end
      for _, c in ipairs(el.children) do
        local f = find(c, tag)
        if f then return f end
      end
    end
    local e = find(root, "Error")
    local code = e and xml.child(e, "Code")
    local msg = e and xml.child(e, "Message")
    local rid = find(root, "RequestId")
    code = code and code.text ~= "" and code.text or tostring(r.status)
    return code, msg and msg.text, rid and rid.text
  end,
}

-- IAM returns policy documents percent-encoded (RFC 3986); botocore decodes
-- them after each call. They come back here as the JSON text that was sent.
local DOCUMENT_FIELDS = { AssumeRolePolicyDocument = true, PolicyDocument = true, Document = true }

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

function M.decode_documents(v)
  if type(v) ~= "table" then return v end
  for k, sub in pairs(v) do
    if DOCUMENT_FIELDS[k] and type(sub) == "string" then
      v[k] = unescape(sub)
    else
      M.decode_documents(sub)
    end
  end
  return v
end

-- Clients -----------------------------------------------------------------------

local Client = {}
Client.__index = Client
Client.__tostring = function(c)
  return string.format("aws client %s (%s, %s)", c.service, tostring(c.region), c.endpoint)
end

-- Per-client state that must not be reachable from the client table, so
-- dumping, tracing or encoding a client shows no secret.
local private = setmetatable({}, { __mode = "k" })

local function check_number(v, what)
  if v ~= nil and (type(v) ~= "number" or v < 0) then
    error(what .. " must be a number >= 0", 3)
  end
end

-- nil when c has usable keys, else what is wrong with it.
local function creds_problem(c, what)
  for _, k in ipairs({ "access_key", "secret_key" }) do
    if type(c[k]) ~= "string" or c[k] == "" then
      return string.format("%s.%s must be a non-empty string", what, k)
    end
  end
  if c.session_token ~= nil and type(c.session_token) ~= "string" then
    return what .. ".session_token must be a string"
  end
end

--[[
aws.new(service, opts) -> client | nil, message, code
  service: "ecs", "iam" or "sts" (raises for any other). Resolves the region
  (services that need one) and the credentials now, through
  sbx.aws.credentials (may yield: container and IMDS providers do HTTP).
  Endpoint, as the AWS SDKs choose it: opts.endpoint, else
  AWS_ENDPOINT_URL_<SERVICE>, else AWS_ENDPOINT_URL (both ignored when
  AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true), else the service's default.
  Codes: "no_region", "no_credentials", "bad_endpoint".
]]
function M.new(service, opts)
  if type(service) ~= "string" then error("aws.new: the service must be a string", 2) end
  local svc = M.services[service]
  if not svc then error(string.format("aws.new: unknown service %q", service), 2) end
  if opts ~= nil and type(opts) ~= "table" then error("aws.new: opts must be a table", 2) end
  opts = opts or {}
  if opts.env ~= nil and type(opts.env) ~= "table" then error("aws.new: opts.env must be a table", 2) end
  if opts.endpoint ~= nil and type(opts.endpoint) ~= "string" then
    error("aws.new: opts.endpoint must be a string", 2)
  end
  local retry = opts.retry
  if type(retry) == "number" then retry = { max_attempts = retry } end
  if retry ~= nil and type(retry) ~= "table" then error("aws.new: opts.retry must be a number or a table", 2) end
  retry = retry or {}
  if retry.max_attempts ~= nil and (math.type(retry.max_attempts) ~= "integer" or retry.max_attempts < 1) then
    error("aws.new: retry.max_attempts must be an integer >= 1", 2)
  end
  check_number(retry.backoff_base, "aws.new: retry.backoff_base")
  check_number(retry.backoff_cap, "aws.new: retry.backoff_cap")
  if opts.timeout ~= nil and (type(opts.timeout) ~= "number" or opts.timeout <= 0) then
    error("aws.new: opts.timeout must be a number > 0", 2)
  end
  local provider = opts.credentials
  if provider ~= nil and type(provider) ~= "table" and type(provider) ~= "function" then
    error("aws.new: opts.credentials must be a table or a function", 2)
  end
  if type(provider) == "table" then
    local problem = creds_problem(provider, "aws.new: opts.credentials")
    if problem then error(problem, 2) end
  end

  -- Region: required by regional services; IAM only uses it for its partition.
  local ropts = { region = opts.region, profile = opts.profile, env = opts.env, home = opts.home }
  local region, rerr, rcode = credentials.region(ropts)
  if not region and svc.needs_region then
    return nil, svc.name .. ": " .. tostring(rerr), rcode
  end

  local url, signing_region = svc.endpoint(region)
  if svc.signing_region then signing_region = svc.signing_region(region) end
  local configured = opts.endpoint
  if not configured then
    local ignore = (getenv(opts, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or ""):lower() == "true"
    if not ignore then
      configured = getenv(opts, "AWS_ENDPOINT_URL_" .. svc.env_id) or getenv(opts, "AWS_ENDPOINT_URL")
    end
  end
  local ep, eerr = parse_endpoint(configured or url)
  if not ep then return nil, svc.name .. ": " .. eerr, "bad_endpoint" end

  local self = setmetatable({
    service = service,
    region = region,
    endpoint = ep.url,
    signing_region = signing_region,
    signing_name = svc.signing_name,
    max_attempts = retry.max_attempts,
    backoff_base = retry.backoff_base,
    backoff_cap = retry.backoff_cap,
    timeout = opts.timeout,
  }, Client)
  private[self] = {
    svc = svc, host = ep.host, path = ep.path,
    provider = provider,
    cred_opts = { profile = opts.profile, env = opts.env, home = opts.home,
                  access_key = opts.access_key, secret_key = opts.secret_key,
                  session_token = opts.session_token, http_request = opts.http_request },
    creds = nil,        -- the current credentials
    expires = nil,      -- their expiry in epoch seconds, nil for none
    flight = nil,       -- the refresh under way: {done = event, ok, err, code}
  }
  local creds, cerr, ccode = self:credentials()
  if not creds then return nil, svc.name .. ": " .. cerr, ccode end
  return self
end

-- Fetches credentials once, whoever asks: the first caller resolves, the
-- others wait for its result.
local function fetch(p)
  local current = p.flight
  if current then
    current.done:wait()
    return current.ok, current.err, current.code
  end
  local flight = { done = core.event() }
  p.flight = flight
  local ok, c, err, code = pcall(function()
    if type(p.provider) == "function" then return p.provider() end
    if type(p.provider) == "table" then return p.provider end
    return credentials.resolve(p.cred_opts)
  end)
  if not ok then
    c, err, code = nil, "the credential provider failed: " .. tostring(c), "no_credentials"
  elseif type(c) == "table" then
    local problem = creds_problem(c, "credentials")
    if problem then c, err, code = nil, "the credential provider's result is unusable: " .. problem, "no_credentials" end
  elseif c ~= nil then
    c, err, code = nil, "the credential provider returned a " .. type(c), "no_credentials"
  end
  if c then
    p.creds, p.expires = c, M.parse_time(c.expiration)
  end
  flight.ok, flight.err, flight.code = c, err, code or "no_credentials"
  p.flight = nil
  flight.done:set()
  return flight.ok, flight.err, flight.code
end

--[[
client:credentials() -> credentials | nil, message, code
  The credentials the next request is signed with. When they expire within
  policy.aws.refresh_advisory seconds they are fetched again (once, however
  many calls ask at the same time); if that fails they are still used until
  refresh_mandatory seconds before expiry. May yield.
]]
function Client:credentials()
  local p = private[self]
  local pol = policy()
  local c, expires = p.creds, p.expires
  if c and (not expires or expires - M.clock() > pol.refresh_advisory) then return c end
  local fresh, err, code = fetch(p)
  if fresh then return fresh end
  if c and expires and expires - M.clock() > pol.refresh_mandatory then return c end
  return nil, err, code
end

local function backoff(self, pol, attempt)
  local base = self.backoff_base or pol.backoff_base
  local cap = self.backoff_cap or pol.backoff_cap
  return require("sbx.util").backoff(attempt, base, cap, M.random)
end

local function retryable(pol, status, code, transport)
  if transport then return pol.retry_transport[code] == true end
  return pol.retry_statuses[status] == true or pol.throttling_codes[code] == true
    or pol.transient_codes[code] == true
end

--[[
client:call(op, params) -> out, nil, nil, info | nil, message, code, info
  One operation, signed afresh for every attempt. Retries throttling and
  transient error codes, HTTP 500/502/503/504 and transport failures in
  policy.aws.retry_transport, with full-jitter exponential backoff, up to
  max_attempts attempts; every operation is retried, idempotent or not, as
  botocore does. params: a table (nil for none). JSON services send it as
  the body (mark empty lists with json.array); Query services flatten it
  (client.flatten). May yield; many calls may run at once on one client.
]]
function Client:call(op, params)
  if getmetatable(self) ~= Client then error("call: use client:call(op, params)", 2) end
  if type(op) ~= "string" or not op:match("^%a%w*$") then
    error("call: the operation must be a name such as \"DescribeClusters\"", 2)
  end
  if params ~= nil and type(params) ~= "table" then error("call: params must be a table", 2) end
  local p = private[self]
  local svc = p.svc
  local proto = protocols[svc.protocol]
  local body, ctype, extra = proto.encode(svc, op, params)
  local pol = policy()
  local max = self.max_attempts or pol.max_attempts
  local timeout = self.timeout or pol.timeout
  local info = { attempts = 0, retry_delays = {} }
  local prefix = svc.name .. " " .. op .. ": "

  while true do
    info.attempts = info.attempts + 1
    info.status, info.request_id = nil, nil
    local creds, cerr, ccode = self:credentials()
    if not creds then return nil, prefix .. cerr, ccode, info end

    local sign_headers = { { "Host", p.host }, { "Content-Type", ctype } }
    for _, h in ipairs(extra) do sign_headers[#sign_headers + 1] = h end
    local signed = sigv4.sign {
      method = "POST", path = p.path, headers = sign_headers, body = body,
      service = self.signing_name, region = self.signing_region,
      access_key = creds.access_key, secret_key = creds.secret_key,
      session_token = creds.session_token,
    }
    local lines = {}
    for _, h in ipairs(sign_headers) do lines[#lines + 1] = h[1] .. ": " .. h[2] end
    for k, v in pairs(signed.headers) do lines[#lines + 1] = k .. ": " .. v end
    lines[#lines + 1] = "User-Agent: sbx/" .. core.version
    local secrets = secrets_of(creds, signed.authorization)

    local r, terr, tcode = M.http_request {
      url = self.endpoint, method = "POST", headers = lines, body = body,
      timeout = timeout, connect_timeout = math.min(timeout, pol.connect_timeout),
    }
    local code, msg, out
    if r then
      info.status = r.status
      info.request_id = r.headers["x-amzn-requestid"]
      if r.status >= 200 and r.status <= 299 then
        local rid
        out, msg, rid = proto.success(svc, op, r)
        if rid and not info.request_id then info.request_id = rid end
        if out == nil then
          return nil, prefix .. scrub(msg, secrets), "bad_response", info
        end
        return out, nil, nil, info
      end
      local rid
      code, msg, rid = proto.error(svc, r)
      if rid and not info.request_id then info.request_id = rid end
      msg = code .. ": " .. (msg and msg ~= "" and msg or ("HTTP " .. r.status))
    else
      code, msg = tcode, terr
    end

    if info.attempts >= max or not retryable(pol, r and r.status, code, r == nil) then
      if info.attempts > 1 then msg = msg .. string.format(" (%d attempts)", info.attempts) end
      return nil, prefix .. scrub(msg, secrets), code, info
    end
    local delay = backoff(self, pol, info.attempts)
    info.retry_delays[#info.retry_delays + 1] = delay
    M.sleep(delay)
  end
end

return M

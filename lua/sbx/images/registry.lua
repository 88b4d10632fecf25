-- A client of the OCI distribution API (what Docker Hub, the distribution
-- server and every registry speak), over sbx.http on the shared loop:
--
--   local c = registry.client("127.0.0.1:5000", pol)   -- pol: policy.images
--   local m, err, code = c:manifest("library/busybox", "latest")
--   local n, err, code = c:blob_to_file("library/busybox", digest, size, path)
--
-- Authentication as Docker Hub does it: a request answered 401 with
-- `WWW-Authenticate: Bearer realm=...,service=...,scope=...` (or, when the
-- answer has no challenge, the one GET /v2/ gives) gets a token
-- from the realm (anonymously, or with the credentials of
-- sbx.images.credentials) and is sent again with it; `Basic` sends the
-- credentials themselves. Tokens are kept per scope until they expire.
-- Plain HTTP only for loopback hosts and policy.images.insecure_registries;
-- credentials never travel over it to any other host, realms and
-- redirects included.
--
-- Errors and retries follow the AWS client (sbx.aws.client): statuses in
-- retry_statuses (429, 5xx) and transport failures in retry_transport are
-- tried again up to max_attempts attempts with full-jitter backoff, or
-- after Retry-After (at most max_retry_after seconds); anything else is an
-- answer. Failures return nil, message, code: "unauthorized" (401),
-- "denied" (403), "not_found" (404), "throttled" (429 after every attempt),
-- "registry_error" (5xx or an unexpected status), "insecure" (plain HTTP
-- refused), "digest_mismatch", "too_large", "bad_image", or a transport
-- code ("timeout", "ECONNREFUSED", "closed", "tls", ...). Messages start
-- with the registry and never carry a credential or a token.
local core = require "sbx.core"
local util = require "sbx.util"
local ref = require "sbx.images.ref"
local credentials = require "sbx.images.credentials"

local json, layer = core.json, core.layer

local M = {}

-- Hooks the tests may replace.
M.sleep = core.sleep
M.random = math.random
M.http_request = function(o) return require("sbx.http").request(o) end

M.MANIFEST_TYPES = {
  "application/vnd.oci.image.index.v1+json",
  "application/vnd.docker.distribution.manifest.list.v2+json",
  "application/vnd.oci.image.manifest.v1+json",
  "application/vnd.docker.distribution.manifest.v2+json",
}
M.INDEX = {
  ["application/vnd.oci.image.index.v1+json"] = true,
  ["application/vnd.docker.distribution.manifest.list.v2+json"] = true,
}

local function host_of(url)
  return (url:match("^%a+://([^/?#]+)") or ""):lower()
end

local function scheme_of(url)
  return (url:match("^(%a+)://") or ""):lower()
end

-- May this host be reached over plain HTTP?
function M.plain_http_allowed(host, pol)
  if ref.is_loopback(host) then return true end
  for _, h in ipairs(pol.insecure_registries or {}) do
    if h:lower() == host or h:lower():gsub("^%a+://", ""):gsub("/.*$", "") == host then return true end
  end
  return false
end

local Client = {}
Client.__index = Client
Client.__tostring = function(c) return "registry client " .. c.domain end

-- Per-client secrets, out of the client table.
local private = setmetatable({}, { __mode = "k" })

--[[
registry.client(domain, pol) -> client
  domain: a registry's host[:port] as image names carry it (pol.hub.name
  for Docker Hub, which is reached at pol.hub.registry). Loopback and
  insecure registries are reached over plain HTTP, others over HTTPS.
]]
function M.client(domain, pol)
  if type(domain) ~= "string" or domain == "" then error("registry.client: a registry host", 2) end
  if type(pol) ~= "table" then error("registry.client: the images policy", 2) end
  local base
  if domain == pol.hub.name then
    base = pol.hub.registry:gsub("/+$", "")
  else
    base = (M.plain_http_allowed(domain, pol) and "http://" or "https://") .. domain
  end
  local c = setmetatable({ domain = domain, base = base, pol = pol }, Client)
  private[c] = { tokens = {}, basic = nil, creds = false }
  return c
end

-- The credentials for this registry, looked up once.
function Client:credentials()
  local p = private[self]
  if p.creds == false then
    local c, err = credentials.lookup(self.domain, self.pol)
    if err then p.creds_error = err end
    p.creds = c
  end
  return p.creds, p.creds_error
end

local function parse_challenge(h)
  if type(h) ~= "string" then return nil end
  local scheme, rest = h:match("^%s*(%a+)%s*(.*)$")
  if not scheme then return nil end
  local params = {}
  for k, v in rest:gmatch('([%w_]+)%s*=%s*"([^"]*)"') do params[k:lower()] = v end
  for k, v in rest:gmatch('([%w_]+)%s*=%s*([^",%s]+)') do params[k:lower()] = params[k:lower()] or v end
  return scheme:lower(), params
end

local function registry_errors(body)
  local doc = type(body) == "string" and body:sub(1, 1) == "{" and json.decode(body)
  if type(doc) ~= "table" or type(doc.errors) ~= "table" then return nil end
  local parts = {}
  for _, e in ipairs(doc.errors) do
    if type(e) == "table" then
      parts[#parts + 1] = tostring(e.code or "?") .. ": " .. tostring(e.message or "")
    end
  end
  return #parts > 0 and table.concat(parts, "; ") or nil
end

local function retry_after(r)
  local v = r and r.headers and r.headers["retry-after"]
  return v and tonumber(v:match("^%s*(%d+%.?%d*)%s*$"))
end

local function close_body(r)
  if r and r.body_stream then r.body_stream:close() end
end

-- Sends o once per attempt until an answer that is not retried; follows
-- redirects (without credentials to another host). -> response | nil,
-- message, code, attempts
function Client:_send(o)
  local pol = self.pol
  local attempt, redirects = 0, 0
  local url = o.url
  local headers = o.headers or {}
  while true do
    attempt = attempt + 1
    if scheme_of(url) ~= "https" and not M.plain_http_allowed(host_of(url), pol) then
      return nil, string.format("registry %s: refusing plain HTTP to %s (only loopback registries and policy.images.insecure_registries)",
        self.domain, host_of(url)), "insecure", attempt
    end
    local lines = {}
    for _, h in ipairs(headers) do lines[#lines + 1] = h end
    if o.auth and host_of(url) == host_of(o.url) then lines[#lines + 1] = "Authorization: " .. o.auth end
    lines[#lines + 1] = "User-Agent: sbx/" .. core.version
    local r, err, code = M.http_request {
      url = url, method = o.method or "GET", headers = lines, body = o.body,
      timeout = o.timeout or pol.timeout, connect_timeout = pol.connect_timeout,
      stream = o.stream, max_body = o.max_body,
    }
    if r and r.status >= 300 and r.status < 400 and r.headers.location and redirects < 5 then
      close_body(r)
      local loc = r.headers.location
      if not loc:match("^%a+://") then
        loc = url:match("^(%a+://[^/]+)") .. (loc:sub(1, 1) == "/" and loc or ("/" .. loc))
      end
      url = loc
      redirects = redirects + 1
      attempt = attempt - 1
    else
      local retry
      if r then
        retry = pol.retry_statuses[r.status] == true
      else
        retry = pol.retry_transport[code] == true
      end
      if not retry or attempt >= pol.max_attempts then
        if r then return r, nil, nil, attempt end
        return nil, err, code, attempt
      end
      local delay = retry_after(r)
      if delay then
        delay = math.min(delay, pol.max_retry_after)
      else
        delay = util.backoff(attempt, pol.backoff_base, pol.backoff_cap, M.random)
      end
      close_body(r)
      if o.on_retry then o.on_retry(attempt, delay, r and r.status or code) end
      M.sleep(delay)
    end
  end
end

-- A token for scope from the realm of a Bearer challenge.
function Client:_token(params, scope)
  local p = private[self]
  local realm = params.realm
  if not realm or not realm:match("^https?://") then
    return nil, string.format("registry %s: a Bearer challenge without a usable realm", self.domain), "unauthorized"
  end
  local creds, cerr = self:credentials()
  if cerr then return nil, string.format("registry %s: %s", self.domain, cerr), "unauthorized" end
  local q = {}
  if params.service then q[#q + 1] = "service=" .. core.http.escape(params.service) end
  if scope then q[#q + 1] = "scope=" .. core.http.escape(scope) end
  local url = realm .. (realm:find("?", 1, true) and "&" or "?") .. table.concat(q, "&")
  local o = { url = url, headers = {}, timeout = self.pol.timeout, max_body = self.pol.max_manifest_bytes }
  if creds and creds.identity_token then
    o.url, o.method = realm, "POST"
    o.headers = { "Content-Type: application/x-www-form-urlencoded" }
    o.body = table.concat({ "grant_type=refresh_token", "client_id=sbx",
      "refresh_token=" .. core.http.escape(creds.identity_token),
      params.service and ("service=" .. core.http.escape(params.service)) or nil,
      scope and ("scope=" .. core.http.escape(scope)) or nil }, "&")
  elseif creds then
    o.auth = "Basic " .. credentials.base64(creds.username .. ":" .. creds.password)
  end
  if o.auth and scheme_of(realm) ~= "https" and not M.plain_http_allowed(host_of(realm), self.pol) then
    return nil, string.format("registry %s: refusing to send credentials over plain HTTP to %s", self.domain, host_of(realm)), "insecure"
  end
  local r, err, code, attempts = self:_send(o)
  if not r then
    return nil, string.format("registry %s: token service %s: %s%s", self.domain, host_of(realm), err,
      attempts > 1 and string.format(" (%d attempts)", attempts) or ""), code
  end
  if r.status == 401 or r.status == 403 then
    return nil, string.format("registry %s: the token service refused %s (HTTP %d)", self.domain,
      creds and ("the credentials from " .. creds.source) or "an anonymous request", r.status), "unauthorized"
  end
  if r.status ~= 200 then
    return nil, string.format("registry %s: token service answered HTTP %d", self.domain, r.status),
      r.status == 429 and "throttled" or "registry_error"
  end
  local doc = json.decode(r.body)
  local token = type(doc) == "table" and (doc.token or doc.access_token)
  if type(token) ~= "string" or token == "" then
    return nil, string.format("registry %s: the token service's answer holds no token", self.domain), "unauthorized"
  end
  local ttl = type(doc.expires_in) == "number" and doc.expires_in or 60
  p.tokens[scope or ""] = { token = token, expires = core.now() + math.max(ttl - 5, 1) }
  return token
end

-- The Authorization header value for a repository, if any is known.
function Client:_auth_for(repo)
  local p = private[self]
  local t = p.tokens["repository:" .. repo .. ":pull"] or p.tokens[""]
  if t and t.expires > core.now() then return "Bearer " .. t.token end
  return p.basic
end

--[[
client:get(path, o) -> response | nil, message, code
  GET base .. path for repository o.repo, authenticating on a 401 once per
  call. o: headers, stream, max_body, timeout, on_retry. A 2xx answer is
  returned (streamed ones with body_stream); anything else is a failure.
]]
function Client:get(path, o)
  o = o or {}
  local url = self.base .. path
  local authed = false
  while true do
    local r, err, code, attempts = self:_send { url = url, headers = o.headers, stream = o.stream,
      max_body = o.max_body, timeout = o.timeout, auth = self:_auth_for(o.repo), on_retry = o.on_retry }
    local what = string.format("registry %s: GET %s", self.domain, path)
    if not r then
      return nil, string.format("%s: %s%s", what, err, attempts > 1 and string.format(" (%d attempts)", attempts) or ""), code
    end
    if r.status == 401 and not authed then
      close_body(r)
      authed = true
      local scheme, params = parse_challenge(r.headers["www-authenticate"])
      if not scheme then
        -- No challenge on the resource: the API root says how to log in.
        local root = self:_send { url = self.base .. "/v2/", timeout = o.timeout }
        if root and root.status == 401 then scheme, params = parse_challenge(root.headers["www-authenticate"]) end
      end
      if scheme == "bearer" then
        local scope = params.scope or ("repository:" .. o.repo .. ":pull")
        local token, terr, tcode = self:_token(params, scope)
        if not token then return nil, terr, tcode end
        private[self].tokens["repository:" .. o.repo .. ":pull"] = private[self].tokens[scope]
      elseif scheme == "basic" then
        local creds, cerr = self:credentials()
        if not creds or not creds.username then
          return nil, string.format("%s: the registry asks for a login and there are no credentials for %s%s (docker login, or %s/config.json)",
            what, self.domain, cerr and (" (" .. cerr .. ")") or "", credentials.config_dir(self.pol)), "unauthorized"
        end
        private[self].basic = "Basic " .. credentials.base64(creds.username .. ":" .. creds.password)
      else
        return nil, what .. ": unauthorized, and no challenge sbx can answer", "unauthorized"
      end
    elseif r.status >= 200 and r.status < 300 then
      return r
    else
      local body = r.body
      if r.body_stream then
        body = r.body_stream:read(1) or ""
        close_body(r)
      end
      local detail = registry_errors(body) or ("HTTP " .. r.status)
      local suffix = attempts > 1 and string.format(" (%d attempts)", attempts) or ""
      if r.status == 401 then
        local creds = self:credentials()
        return nil, string.format("%s: unauthorized (%s)%s", what, creds and ("the credentials from " .. creds.source .. " were refused")
          or string.format("no credentials for %s: docker login, or %s/config.json", self.domain, credentials.config_dir(self.pol)), suffix), "unauthorized"
      end
      local code_for = { [403] = "denied", [404] = "not_found", [429] = "throttled" }
      return nil, string.format("%s: %s%s", what, detail, suffix), code_for[r.status] or "registry_error"
    end
  end
end

--[[
client:manifest(repo, reference) -> { body, media_type, digest } | nil, message, code
  reference: a tag or a digest. The body's sha256 must be the digest asked
  for, and the registry's Docker-Content-Digest when it sends one.
]]
function Client:manifest(repo, reference)
  local r, err, code = self:get("/v2/" .. repo .. "/manifests/" .. reference, {
    repo = repo, max_body = self.pol.max_manifest_bytes + 1,
    headers = { "Accept: " .. table.concat(M.MANIFEST_TYPES, ", ") },
  })
  if not r then return nil, err, code end
  if r.truncated or #r.body > self.pol.max_manifest_bytes then
    return nil, string.format("registry %s: the manifest of %s:%s is larger than %d bytes", self.domain, repo,
      reference, self.pol.max_manifest_bytes), "too_large"
  end
  local digest = layer.sha256(r.body)
  if reference:match("^sha256:") and reference ~= digest then
    return nil, string.format("registry %s: the manifest asked for as %s has the digest %s", self.domain, reference, digest), "digest_mismatch"
  end
  local said = r.headers["docker-content-digest"]
  if said and said:match("^sha256:") and said ~= digest then
    return nil, string.format("registry %s: the manifest of %s:%s has the digest %s, the registry says %s", self.domain,
      repo, reference, digest, said), "digest_mismatch"
  end
  local doc = json.decode(r.body)
  if type(doc) ~= "table" then
    return nil, string.format("registry %s: the manifest of %s:%s is not JSON", self.domain, repo, reference), "bad_image"
  end
  local mt = (r.headers["content-type"] or ""):match("^%s*([^;%s]+)")
  if type(doc.mediaType) == "string" then mt = doc.mediaType end
  return { body = r.body, doc = doc, media_type = mt, digest = digest }
end

--[[
client:blob_to_file(repo, digest, size, path [, on_bytes]) -> bytes | nil, message, code
  Writes the blob to path (created or truncated). A download that stalls
  for stall_timeout seconds or is cut is started again (the same attempts
  and backoff as any request); more bytes than size (when known) is
  refused at once. The digest itself is checked by whoever reads the file
  (core.layer.unpack hashes while it unpacks). on_bytes(n) is called as
  each chunk is written (progress).
]]
function Client:blob_to_file(repo, digest, size, path, on_bytes)
  local pol = self.pol
  local attempt = 0
  while true do
    attempt = attempt + 1
    local r, err, code = self:get("/v2/" .. repo .. "/blobs/" .. digest, {
      repo = repo, stream = true, timeout = pol.blob_timeout })
    if not r then return nil, err, code end
    local body <close> = r.body_stream
    local f, ferr = io.open(path, "wb")
    if not f then return nil, "cannot write " .. path .. ": " .. tostring(ferr), "io" end
    local total, failure, fcode = 0, nil, nil
    while true do
      local chunk, rerr, rcode = body:read(pol.stall_timeout)
      if not chunk then
        if rerr ~= "eof" then failure, fcode = rerr, rcode end
        break
      end
      total = total + #chunk
      if size and total > size then
        f:close()
        return nil, string.format("registry %s: blob %s: the registry sent more than the %d bytes the manifest says", self.domain, digest, size), "digest_mismatch"
      end
      local ok, werr = f:write(chunk)
      if not ok then
        f:close()
        return nil, "cannot write " .. path .. ": " .. tostring(werr), "io"
      end
      if on_bytes then on_bytes(#chunk) end
    end
    f:close()
    if not failure then
      if size and total ~= size then
        return nil, string.format("registry %s: blob %s: %d bytes arrived, the manifest says %d", self.domain, digest, total, size), "digest_mismatch"
      end
      return total
    end
    if not pol.retry_transport[fcode] or attempt >= pol.max_attempts then
      return nil, string.format("registry %s: blob %s: %s after %d bytes%s", self.domain, digest, failure, total,
        attempt > 1 and string.format(" (%d attempts)", attempt) or ""), fcode
    end
    M.sleep(util.backoff(attempt, pol.backoff_base, pol.backoff_cap, M.random))
  end
end

-- Platforms ---------------------------------------------------------------------

local MACHINES = {
  x86_64 = { "amd64" }, amd64 = { "amd64" },
  aarch64 = { "arm64", "v8" }, arm64 = { "arm64", "v8" },
  armv7l = { "arm", "v7" }, armv6l = { "arm", "v6" }, armv5tel = { "arm", "v5" },
  i686 = { "386" }, i386 = { "386" }, ppc64le = { "ppc64le" }, s390x = { "s390x" },
  riscv64 = { "riscv64" }, mips64 = { "mips64le" },
}

-- The platform images are chosen for: { os, architecture, variant }.
function M.platform(pol)
  if pol.platform then
    local os_, arch, variant = pol.platform:match("^([^/]+)/([^/]+)/?([^/]*)$")
    return { os = os_, architecture = arch, variant = variant ~= "" and variant or nil }
  end
  local m = MACHINES[layer.machine()] or { layer.machine() }
  return { os = "linux", architecture = m[1], variant = m[2] }
end

function M.platform_string(p)
  return tostring(p.os) .. "/" .. tostring(p.architecture) .. (p.variant and ("/" .. tostring(p.variant)) or "")
end

--[[
registry.select(index, want) -> descriptor | nil, message
  The manifest of an index for platform want: os and architecture equal,
  and the variant equal when both say one (arm64's "v8" may be left out).
  Attestations (unknown/unknown) never match.
]]
function M.select(index, want)
  local seen, best = {}, nil
  for _, d in ipairs(type(index.manifests) == "table" and index.manifests or {}) do
    local p = type(d) == "table" and type(d.platform) == "table" and d.platform or {}
    if p.os then seen[#seen + 1] = M.platform_string { os = p.os, architecture = tostring(p.architecture), variant = p.variant } end
    if p.os == want.os and p.architecture == want.architecture then
      local v = p.variant
      if v == want.variant then return d end
      if want.variant == nil or v == nil or (want.architecture == "arm64" and (v == "v8" or v == nil)) then
        best = best or d
      end
    end
  end
  if best then return best end
  return nil, string.format("no image for %s in the index (it has: %s)", M.platform_string(want),
    #seen > 0 and table.concat(seen, ", ") or "nothing")
end

return M

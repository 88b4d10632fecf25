-- sbx.aws.credentials: the AWS credential and region chain, as botocore
-- resolves it (see docs/aws-protocol.md section 4).
--   credentials.resolve(opts)
--     -> {access_key, secret_key, session_token, expiration, source}
--      | nil, message, "no_credentials"
--   credentials.region(opts) -> region | nil, message, "no_region"
-- opts: access_key, secret_key, session_token (explicit keys), profile,
-- region, env (a table read instead of os.getenv), home (instead of $HOME).
-- Order: explicit keys; env (skipped when opts.profile is given); the shared
-- credentials file; static keys in the config file; container credentials;
-- IMDSv2. Secret values never appear in messages or in tostring(result).
-- Not done (yet): assume-role, web identity, SSO, credential_process, and
-- refreshing temporary credentials before `expiration`.
local core = require "sbx.core"

local M = {}

local CODE = "no_credentials"

-- An environment variable from opts.env when given (tests, embedders), else
-- the process environment; empty counts as unset.
local function getenv(opts, name)
  local v
  if opts.env then v = opts.env[name] else v = os.getenv(name) end
  if v == "" then return nil end
  return v
end
M.getenv = getenv

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

---------------------------------------------------------------------------
-- The result: secrets masked in tostring.

local Creds = {}
Creds.__index = Creds
Creds.__tostring = function(c)
  return string.format("aws credentials{access_key=%s, secret_key=%s, session_token=%s, expiration=%s, source=%s}",
    tostring(c.access_key), c.secret_key and "****" or "nil", c.session_token and "****" or "nil",
    tostring(c.expiration), tostring(c.source))
end

local function creds(ak, sk, token, expiration, source)
  return setmetatable({ access_key = ak, secret_key = sk, session_token = token,
    expiration = expiration, source = source }, Creds)
end

local function fail(msg) return nil, msg, CODE end

---------------------------------------------------------------------------
-- INI files (Python configparser as botocore uses it, RawConfigParser):
-- whole-line comments with # or ; (no inline comments), "key = value" or
-- "key: value", option names lowercased, indented lines continue the
-- previous value (and so never become keys of their own).

function M.parse_ini(text)
  local sections, cur, key = {}, nil, nil
  for raw in (text .. "\n"):gmatch("([^\n]*)\n") do
    local line = raw:gsub("\r$", "")
    local stripped = trim(line)
    if stripped == "" or stripped:match("^[#;]") then
      -- A blank line or a comment: nothing (a comment does not end a value).
      if stripped == "" then key = nil end
    elseif line:match("^%s") and cur and key then
      cur[key] = cur[key] .. "\n" .. stripped
    elseif line:match("^%s") then
      -- An indented line with no value to continue: configparser refuses it;
      -- skipping it is safer than mis-reading it as a key.
    else
      local name = stripped:match("^%[(.*)%]$")
      if name then
        name = trim(name)
        cur = sections[name] or {}
        sections[name] = cur
        key = nil
      elseif cur then
        local k, v = stripped:match("^([^=:]-)%s*[=:]%s*(.*)$")
        if k and k ~= "" then
          key = k:lower()
          cur[key] = v
        else
          key = nil
        end
      end
    end
  end
  return sections
end

local read_file = require("sbx.fs").read

local function expand(opts, path)
  if path:sub(1, 1) == "~" then
    local home = opts.home or getenv(opts, "HOME") or ""
    return home .. path:sub(2)
  end
  return path
end

local function files(opts)
  local cred = expand(opts, getenv(opts, "AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials")
  local conf = expand(opts, getenv(opts, "AWS_CONFIG_FILE") or "~/.aws/config")
  return cred, conf
end

-- The profile name and whether it was chosen (not the default).
local function profile_name(opts)
  local p = opts.profile or getenv(opts, "AWS_DEFAULT_PROFILE") or getenv(opts, "AWS_PROFILE")
  if p then return p, true end
  return "default", false
end

-- Loads both files: {cred = section|nil, conf = section|nil, merged = {...},
-- found = bool, files = "a, b"}.
local function load_profile(opts, name)
  local cred_path, conf_path = files(opts)
  local cred_text, conf_text = read_file(cred_path), read_file(conf_path)
  local cred_sec, conf_sec
  if cred_text then cred_sec = M.parse_ini(cred_text)[name] end
  if conf_text then
    local all = M.parse_ini(conf_text)
    if name == "default" then
      conf_sec = all["profile default"] or all["default"]
    end
    if not conf_sec then
      for sname, sec in pairs(all) do
        local p = sname:match("^profile%s+(.-)$")
        if p and trim(p) == name then conf_sec = sec break end
      end
    end
  end
  local merged = {}
  for k, v in pairs(conf_sec or {}) do merged[k] = v end
  for k, v in pairs(cred_sec or {}) do merged[k] = v end
  return {
    cred = cred_sec, conf = conf_sec, merged = merged,
    found = cred_sec ~= nil or conf_sec ~= nil,
    files = cred_path .. (cred_text and "" or " (missing)") .. ", "
      .. conf_path .. (conf_text and "" or " (missing)"),
  }
end

local function missing_profile(name, prof)
  return string.format("AWS profile %q not found (tried %s)", name, prof.files)
end

-- Static keys from one INI section.
local function section_creds(sec, source, where)
  local ak = sec.aws_access_key_id
  if not ak or ak == "" then return nil end
  local sk = sec.aws_secret_access_key
  if not sk or sk == "" then
    return nil, string.format("partial credentials in %s: aws_access_key_id without aws_secret_access_key", where)
  end
  local token = sec.aws_session_token
  if token == "" then token = nil end
  token = token or (sec.aws_security_token ~= "" and sec.aws_security_token or nil)
  return creds(ak, sk, token, nil, source)
end

---------------------------------------------------------------------------
-- HTTP providers.

-- The metadata endpoints' timeouts and tries, as the SDKs set them
-- (policy.aws; environment variables the SDKs read win where they exist).
local function meta_pol()
  local ok, config = pcall(require, "sbx.config")
  return ok and config.policy and config.policy.aws or { container_timeout = 2, container_attempts = 3,
    imds_timeout = 1, imds_token_ttl = 21600 }
end

local function http(opts)
  return opts.http_request or require("sbx.http").request
end

local function parse_url(url)
  local scheme, rest = url:match("^(%a[%w+.-]*)://(.*)$")
  if not scheme then return nil end
  local authority = rest:match("^([^/?#]*)")
  authority = authority:gsub("^.*@", "")
  local host = authority:match("^%[(.-)%]") or authority:gsub(":%d*$", "")
  return scheme:lower(), host:lower()
end

local function is_loopback(host)
  local a, b, c, d = host:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  if a then
    a, b, c, d = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
    return a == 127 and b <= 255 and c <= 255 and d <= 255
  end
  if host:find(":", 1, true) then
    -- IPv6: ::1 in any spelling (all groups zero but the last, which is 1).
    local head, tail = host:match("^(.-)::(.*)$")
    local groups = {}
    if head then
      local h, t = {}, {}
      for g in head:gmatch("[^:]+") do h[#h + 1] = g end
      for g in tail:gmatch("[^:]+") do t[#t + 1] = g end
      if #h + #t > 7 then return false end
      for _, g in ipairs(h) do groups[#groups + 1] = g end
      for _ = 1, 8 - #h - #t do groups[#groups + 1] = "0" end
      for _, g in ipairs(t) do groups[#groups + 1] = g end
    else
      for g in host:gmatch("[^:]+") do groups[#groups + 1] = g end
    end
    if #groups ~= 8 then return false end
    for i = 1, 8 do
      local n = groups[i]:match("^%x%x?%x?%x?$") and tonumber(groups[i], 16)
      if n == nil or n ~= (i == 8 and 1 or 0) then return false end
    end
    return true
  end
  return false
end

local ALLOWED_HOSTS = { ["169.254.170.2"] = true, ["169.254.170.23"] = true,
  ["fd00:ec2::23"] = true, ["localhost"] = true }

function M.container_uri_allowed(url)
  local scheme, host = parse_url(url)
  if scheme == "https" then return true end
  if scheme ~= "http" then return false end
  return ALLOWED_HOSTS[host] or is_loopback(host) or false
end

local function has_crlf(s) return s:find("[\r\n]") ~= nil end

-- Credentials JSON from the container endpoint or IMDS.
local function from_json(body, source, what)
  local ok, doc = pcall(core.json.decode, body)
  if not ok or type(doc) ~= "table" then return fail(what .. ": the response is not JSON") end
  if doc.Code and doc.Code ~= "Success" then
    return fail(string.format("%s: the response Code is %q", what, tostring(doc.Code)))
  end
  if type(doc.AccessKeyId) ~= "string" or type(doc.SecretAccessKey) ~= "string" then
    return fail(what .. ": the response has no AccessKeyId and SecretAccessKey")
  end
  local token = type(doc.Token) == "string" and doc.Token or nil
  local exp = type(doc.Expiration) == "string" and doc.Expiration or nil
  return creds(doc.AccessKeyId, doc.SecretAccessKey, token, exp, source)
end

-- Returns creds | false (not configured) | nil, message.
local function container(opts)
  local rel = getenv(opts, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
  local full = getenv(opts, "AWS_CONTAINER_CREDENTIALS_FULL_URI")
  local url
  if rel then
    url = "http://169.254.170.2" .. rel
  elseif full then
    if not M.container_uri_allowed(full) then
      local scheme, host = parse_url(full)
      return fail(string.format(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI refused: host %q over %s is not https, a loopback address, "
        .. "169.254.170.2, 169.254.170.23, fd00:ec2::23 or localhost", tostring(host), tostring(scheme)))
    end
    url = full
  else
    return false
  end
  local headers = { Accept = "application/json" }
  local token
  local tfile = getenv(opts, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
  if tfile then
    token = read_file(tfile)
    if not token then
      return fail("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE: cannot read " .. tfile)
    end
    if has_crlf(token) then
      return fail("the container authorization token (from AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE) contains CR or LF")
    end
  else
    token = getenv(opts, "AWS_CONTAINER_AUTHORIZATION_TOKEN")
    if token and has_crlf(token) then
      return fail("the container authorization token (AWS_CONTAINER_AUTHORIZATION_TOKEN) contains CR or LF")
    end
  end
  if token then headers.Authorization = token end
  local last
  local mp = meta_pol()
  for _ = 1, mp.container_attempts do
    local r, msg = http(opts) { url = url, method = "GET", headers = headers, timeout = mp.container_timeout }
    if r and r.status == 200 then
      return from_json(r.body, "container-role", "container credentials")
    elseif r then
      last = "HTTP " .. r.status
      if r.status < 500 then break end
    else
      last = tostring(msg)
    end
  end
  return fail("container credentials: " .. last)
end

-- Returns creds | false (not available) | nil, message.
local function imds(opts)
  local disabled = getenv(opts, "AWS_EC2_METADATA_DISABLED")
  if disabled and disabled:lower() == "true" then return false end
  local base = getenv(opts, "AWS_EC2_METADATA_SERVICE_ENDPOINT")
  if not base then
    local mode = getenv(opts, "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE")
    base = (mode and mode:lower() == "ipv6") and "http://[fd00:ec2::254]" or "http://169.254.169.254"
  end
  base = base:gsub("/+$", "")
  local timeout = tonumber(getenv(opts, "AWS_METADATA_SERVICE_TIMEOUT") or "") or meta_pol().imds_timeout
  local v1_disabled = (getenv(opts, "AWS_EC2_METADATA_V1_DISABLED") or ""):lower() == "true"
  local req = http(opts)

  local headers = {}
  local r, msg, code = req { url = base .. "/latest/api/token", method = "PUT",
    headers = { ["x-aws-ec2-metadata-token-ttl-seconds"] = tostring(meta_pol().imds_token_ttl) }, timeout = timeout }
  if r and r.status == 200 then
    headers["x-aws-ec2-metadata-token"] = r.body
  elseif r and (r.status == 403 or r.status == 404 or r.status == 405) then
    if v1_disabled then return fail("IMDS: no session token (HTTP " .. r.status .. ") and IMDSv1 is disabled") end
  elseif r then
    return false, "IMDS token: HTTP " .. r.status
  else
    return false, "IMDS token: " .. tostring(msg) .. " (" .. tostring(code) .. ")"
  end

  local path = base .. "/latest/meta-data/iam/security-credentials/"
  r, msg = req { url = path, method = "GET", headers = headers, timeout = timeout }
  if not r then return false, "IMDS role: " .. tostring(msg) end
  if r.status ~= 200 then return false, "IMDS role: HTTP " .. r.status end
  local role = trim(r.body:match("^[^\n]*") or "")
  if role == "" then return false, "IMDS: no instance role" end
  r, msg = req { url = path .. role, method = "GET", headers = headers, timeout = timeout }
  if not r then return false, "IMDS credentials: " .. tostring(msg) end
  if r.status ~= 200 then return false, "IMDS credentials: HTTP " .. r.status end
  return from_json(r.body, "iam-role", "IMDS credentials")
end

---------------------------------------------------------------------------

function M.resolve(opts)
  opts = opts or {}
  -- 1. Explicit keys.
  if opts.access_key or opts.secret_key then
    if not (opts.access_key and opts.secret_key) then
      return fail("explicit credentials need both access_key and secret_key")
    end
    return creds(opts.access_key, opts.secret_key, opts.session_token, nil, "explicit")
  end
  -- 2. The environment, unless a profile was given in code.
  if not opts.profile then
    local ak, sk = getenv(opts, "AWS_ACCESS_KEY_ID"), getenv(opts, "AWS_SECRET_ACCESS_KEY")
    if ak and sk then
      return creds(ak, sk, getenv(opts, "AWS_SESSION_TOKEN") or getenv(opts, "AWS_SECURITY_TOKEN"),
        getenv(opts, "AWS_CREDENTIAL_EXPIRATION"), "env")
    elseif ak or sk then
      return fail("partial credentials in the environment: "
        .. (ak and "AWS_SECRET_ACCESS_KEY" or "AWS_ACCESS_KEY_ID") .. " is not set")
    end
  end
  -- 3. The shared credentials file, then static keys in the config file.
  local name, chosen = profile_name(opts)
  local prof = load_profile(opts, name)
  if chosen and not prof.found then return fail(missing_profile(name, prof)) end
  local cred_path, conf_path = files(opts)
  if prof.cred then
    local c, err = section_creds(prof.cred, "shared-credentials-file", cred_path .. " [" .. name .. "]")
    if c then return c end
    if err then return fail(err) end
  end
  if prof.conf then
    local c, err = section_creds(prof.conf, "config-file", conf_path .. " profile " .. name)
    if c then return c end
    if err then return fail(err) end
  end
  -- 4. Container credentials.
  local c, err = container(opts)
  if c then return c end
  if c == nil then return fail(err) end
  -- 5. IMDS.
  local why
  c, why = imds(opts)
  if c then return c end
  if c == nil then return fail(why) end
  return fail(string.format("no AWS credentials found (explicit keys, environment, profile %q in %s, "
    .. "container, IMDS%s)", name, prof.files, why and (": " .. why) or ""))
end

local function valid_region(r)
  return #r <= 63 and r:match("^%w[%w%-]*$") ~= nil and r:match("%-$") == nil
end

function M.region(opts)
  opts = opts or {}
  local r = opts.region or getenv(opts, "AWS_REGION") or getenv(opts, "AWS_DEFAULT_REGION")
  local name, chosen, prof
  if not r then
    name, chosen = profile_name(opts)
    prof = load_profile(opts, name)
    if chosen and not prof.found then return nil, missing_profile(name, prof), "no_region" end
    r = prof.merged.region
    if r == "" then r = nil end
  end
  if not r then
    return nil, string.format("no AWS region: set region=, AWS_REGION, AWS_DEFAULT_REGION or region in profile %q (%s)",
      name, prof.files), "no_region"
  end
  if not valid_region(r) then return nil, string.format("invalid AWS region %q", r), "no_region" end
  return r
end

return M

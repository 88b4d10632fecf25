-- Registry credentials as the docker CLI keeps them. config.json lives in
-- policy.images.docker_config, else $DOCKER_CONFIG, else ~/.docker:
--   auths.<server>.auth           base64 "user:password" (or username and
--                                 password fields); identitytoken: an OAuth2
--                                 refresh token
--   credHelpers.<server> = NAME   run docker-credential-NAME for that server
--   credsStore = NAME             the helper for every other server
-- A helper runs as `docker-credential-NAME get` with the server on stdin
-- and answers {"ServerURL", "Username", "Secret"} (Username "<token>":
-- Secret is an identity token), as the docker CLI runs it.
local core = require "sbx.core"

local M = {}

local b64 = require "sbx.base64"
M.base64, M.unbase64 = b64.encode, b64.decode

-- The directory holding config.json.
function M.config_dir(pol)
  if pol and pol.docker_config then return pol.docker_config end
  local d = os.getenv("DOCKER_CONFIG")
  if d and d ~= "" then return d end
  return (os.getenv("HOME") or "/root") .. "/.docker"
end

-- host[:port] of a config.json key ("https://host:port/v1/", "host").
local function key_host(k)
  return (k:gsub("^%a+://", ""):gsub("/.*$", ""):lower())
end

-- The keys a registry's credentials may be filed under.
local function matches(key, host, pol)
  local h = key_host(key)
  if h == host then return true end
  local hub = pol and pol.hub
  if hub and host == hub.name then
    return key == hub.auth_key or h == key_host(hub.auth_key) or h == key_host(hub.registry)
  end
  return false
end

local shell_quote = require("sbx.util").shell_quote

-- Runs docker-credential-NAME get for server. -> creds | nil | nil, message
local function helper(name, server)
  if not name:match("^[%w_.%-]+$") then
    return nil, string.format("credential helper name %q is not a program name", name)
  end
  local cmd = string.format("printf '%%s' %s | docker-credential-%s get 2>/dev/null",
    shell_quote(server), name)
  local p = io.popen(cmd)
  if not p then return nil, "cannot run docker-credential-" .. name end
  local out = p:read("a")
  local ok = p:close()
  if not ok then
    -- "credentials not found in native keychain": anonymous, as docker does.
    return nil
  end
  local doc = core.json.decode(out)
  if type(doc) ~= "table" or type(doc.Secret) ~= "string" then
    return nil, "docker-credential-" .. name .. " answered something that is not credentials"
  end
  if doc.Username == "<token>" then return { identity_token = doc.Secret, source = "docker-credential-" .. name } end
  return { username = doc.Username, password = doc.Secret, source = "docker-credential-" .. name }
end

--[[
credentials.lookup(host, pol) -> creds | nil | nil, message
  host: a registry's host[:port] as images name it (policy.images.hub.name
  for Docker Hub). creds: { username, password } or { identity_token }, with source
  (where they came from, for messages). nil alone: none (anonymous). A
  config.json that cannot be parsed is an error. Runs a helper (blocking:
  helpers answer at once) when one is named and pol.credential_helpers.
]]
function M.lookup(host, pol)
  host = host:lower()
  local dir = M.config_dir(pol)
  local f = io.open(dir .. "/config.json", "rb")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  local doc = core.json.decode(text)
  if type(doc) ~= "table" then return nil, dir .. "/config.json is not JSON" end
  local server = host
  if pol and pol.hub and host == pol.hub.name then server = pol.hub.auth_key end
  if pol == nil or pol.credential_helpers ~= false then
    if type(doc.credHelpers) == "table" then
      for k, name in pairs(doc.credHelpers) do
        if type(k) == "string" and type(name) == "string" and matches(k, host, pol) then
          return helper(name, k)
        end
      end
    end
  end
  if type(doc.auths) == "table" then
    for k, a in pairs(doc.auths) do
      if type(k) == "string" and type(a) == "table" and matches(k, host, pol) then
        if type(a.identitytoken) == "string" and a.identitytoken ~= "" then
          return { identity_token = a.identitytoken, source = dir .. "/config.json" }
        end
        local user, pass = a.username, a.password
        if type(a.auth) == "string" and a.auth ~= "" then
          user, pass = (M.unbase64(a.auth) or ""):match("^([^:]*):(.*)$")
          if not user then return nil, string.format("%s/config.json: auths[%q].auth is not base64 of user:password", dir, k) end
        end
        if type(user) == "string" and type(pass) == "string" then
          return { username = user, password = pass, source = dir .. "/config.json" }
        end
      end
    end
  end
  if (pol == nil or pol.credential_helpers ~= false) and type(doc.credsStore) == "string" and doc.credsStore ~= "" then
    return helper(doc.credsStore, server)
  end
  return nil
end

return M

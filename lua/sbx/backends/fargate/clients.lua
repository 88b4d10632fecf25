-- The Fargate backend's clients (ECS, IAM) and one-time work per process;
-- the box's policy.fargate with its options over it (fspec).
local config = require "sbx.config"
local core = require "sbx.core"
local function pol_f() return config.policy.fargate end

local M = {}

-- Clients and one-time work, per process -------------------------------------------

local clients = {}              -- region/profile key -> { ecs, iam }
local once = {}                 -- key -> { done = event, ok, err, code, value }

-- Runs fn once per key even when many boxes ask at the same time. Those
-- who waited share its result, failure included; a failure is not kept, so
-- a later box tries again (and so does a waiter whose runner was cancelled).
local function run_once(key, fn)
  local o = once[key]
  if o then
    o.done:wait()
    if o.ok then return o.value end
    if o.err then return nil, o.err, o.code end
    return run_once(key, fn)
  end
  o = { done = core.event() }
  once[key] = o
  local ok, value, err, code = pcall(fn)
  if not ok then
    once[key] = nil
    o.done:set()
    error(value, 0)
  end
  if value == nil then
    o.err, o.code = err, code
    once[key] = nil
  else
    o.ok, o.value = true, value
  end
  o.done:set()
  if value == nil then return nil, err, code end
  return value
end

local function get_clients(spec)
  local aws = require "sbx.aws.client"
  local key = table.concat({ tostring(spec.region), tostring(spec.profile), tostring(spec.endpoint_url),
    -- Explicit credentials count by a hash: a client never serves other keys.
    spec.credentials and core.sigv4.sha256(tostring(spec.credentials.access_key) .. "\0" ..
      tostring(spec.credentials.secret_key) .. "\0" .. tostring(spec.credentials.session_token)) or "" }, "|")
  local c = clients[key]
  if c then return c end
  local opts = { region = spec.region, profile = spec.profile, credentials = spec.credentials, endpoint = spec.endpoint_url }
  local ecs, err, code = aws.new("ecs", opts)
  if not ecs then return nil, err, code end
  local iam, ierr, icode = aws.new("iam", opts)
  if not iam then return nil, ierr, icode end
  c = { ecs = ecs, iam = iam, key = key }
  clients[key] = c
  return c
end

-- policy.fargate of pol (the box's policy, its overlay included; default
-- the live one) with the box's options over it, key by key.
local function fspec(spec, pol)
  local base = pol and pol.fargate or pol_f()
  local f = {}
  for k, v in pairs(base) do f[k] = v end
  for k, v in pairs(spec) do if base[k] ~= nil or f[k] == nil then f[k] = v end end
  return f
end

M.fspec = fspec
M.get_clients = get_clients
M.once = once
M.run_once = run_once

return M

-- The Kubernetes backend's clients, one per configuration; the box's
-- policy.kubernetes with its options over it (kspec); paths and deletes.
local sbx_config = require "sbx.config"
local http = require "sbx.http"
local config = require "sbx.kubernetes.config"
local client_mod = require "sbx.kubernetes.client"
local function pol_k() return sbx_config.policy.kubernetes end

local M = {}

-- policy.kubernetes of pol (the box's policy, its overlay included;
-- default the live one) with the box's options over it, key by key.
local function kspec(spec, pol)
  local base = pol and pol.kubernetes or pol_k()
  local k = {}
  for key, v in pairs(base) do k[key] = v end
  for key, v in pairs(spec or {}) do if base[key] ~= nil or k[key] == nil then k[key] = v end end
  return k
end

-- Clients, one per configuration ---------------------------------------------------------

local clients = {}

local function get_client(k)
  local key = table.concat({ tostring(k.kubeconfig), tostring(k.context), tostring(k.namespace),
    tostring(k.in_cluster), os.getenv("KUBECONFIG") or "" }, "|")
  local c = clients[key]
  if c then return c end
  local conn, err, code = config.resolve(k)
  if not conn then return nil, err, code end
  c = client_mod.new(conn, k)
  c.namespace = conn.namespace
  clients[key] = c
  return c
end
M.client = get_client

local function ns_path(c, kind, name)
  local base = kind == "networkpolicies"
    and "/apis/networking.k8s.io/v1/namespaces/" .. http.escape(c.namespace) .. "/networkpolicies"
    or "/api/v1/namespaces/" .. http.escape(c.namespace) .. "/pods"
  return name and (base .. "/" .. http.escape(name)) or base
end

local function delete(c, kind, name, timeout)
  return c:call("DELETE", ns_path(c, kind, name), {
    body = { apiVersion = "v1", kind = "DeleteOptions", gracePeriodSeconds = 0, propagationPolicy = "Background" },
    query = kind == "pods" and { gracePeriodSeconds = "0" } or nil,
    ok = { [404] = true }, timeout = timeout,
  })
end

M.delete = delete
M.get_client = get_client
M.kspec = kspec
M.ns_path = ns_path

return M

-- Kubernetes client configuration as kubectl and client-go find it
-- (docs/kubernetes.md, "Configuration"):
--   * the files: policy.kubernetes.kubeconfig (a path, "a:b", or a list;
--     a missing file is an error), else KUBECONFIG (":"-separated, merged
--     in order, missing files skipped), else ~/.kube/config; with none of
--     them and KUBERNETES_SERVICE_HOST set, the pod's service account
--     (in-cluster);
--   * merging: for clusters, users and contexts the first file that names
--     one wins; current-context comes from the first file that has one;
--   * relative paths (certificate-authority, client-certificate,
--     client-key, tokenFile, an exec command with a "/") are relative to
--     the file that names them;
--   * the context: policy.kubernetes.context, else current-context; the
--     namespace: policy.kubernetes.namespace, else the context's, else
--     "default" (in-cluster: the service account's namespace file).
-- Credentials: a client certificate (file or data), a bearer token (or
-- tokenFile, re-read every token_reread seconds and after a 401), an exec
-- credential plugin (client.authentication.k8s.io/v1 and v1beta1: EKS's
-- aws eks get-token, GKE's gke-gcloud-auth-plugin), basic auth, or the
-- in-cluster service account token (re-read as it rotates). Secrets never
-- appear in messages: they name the file, field or plugin, never a value.
local M = {}

local core = require "sbx.core"
local json = core.json
local yaml = require "sbx.kubernetes.yaml"
local read_file = require("sbx.fs").read

local function home() return os.getenv("HOME") or "/root" end

local function fail(msg) return nil, msg, "kubeconfig" end

-- Base64 (sbx.base64: padding optional, whitespace ignored, nil when not base64).
local b64 = require "sbx.base64"
M.unbase64 = b64.decode

-- The files to read: list, explicit.
function M.paths(explicit)
  local list, seen = {}, {}
  local function add(p)
    if p ~= "" and not seen[p] then seen[p] = true; list[#list + 1] = p end
  end
  if explicit ~= nil then
    if type(explicit) == "table" then for _, p in ipairs(explicit) do add(p) end
    else for p in tostring(explicit):gmatch("[^:]+") do add(p) end end
    return list, true
  end
  local env = os.getenv("KUBECONFIG")
  if env and env ~= "" then
    for p in env:gmatch("[^:]+") do add(p) end
    return list, false
  end
  return { home() .. "/.kube/config" }, false
end

local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end

local function resolve(dir, p)
  if type(p) ~= "string" or p == "" then return p end
  if p:sub(1, 1) == "/" then return p end
  if p == "~" or p:sub(1, 2) == "~/" then return home() .. p:sub(2) end
  return dir .. "/" .. p
end

-- The named entries of one file's list (clusters, users, contexts).
local function named(list, what, file)
  local out = {}
  if list == nil then return out end
  if type(list) ~= "table" then error(string.format("%s: %s must be a list", file, what), 0) end
  for i, e in ipairs(list) do
    if type(e) ~= "table" or type(e.name) ~= "string" then
      error(string.format("%s: %s[%d] has no name", file, what, i), 0)
    end
    out[#out + 1] = e
  end
  return out
end

-- load(paths, explicit) -> merged config | nil, message, code. merged:
-- { clusters = name -> cluster, users = name -> user, contexts = name ->
-- context, current_context, files = { read ... } }. Paths in entries are
-- resolved against their own file already.
function M.load(paths, explicit)
  local merged = { clusters = {}, users = {}, contexts = {}, files = {} }
  for _, path in ipairs(paths) do
    local text = read_file(path)
    if not text then
      if explicit then return fail("cannot read the kubeconfig " .. path) end
    else
      local doc, err = yaml.decode(text)
      if err then return fail(string.format("the kubeconfig %s is not valid YAML: %s", path, err)) end
      if doc ~= nil and type(doc) ~= "table" then return fail("the kubeconfig " .. path .. " is not a mapping") end
      doc = doc or {}
      merged.files[#merged.files + 1] = path
      local dir = dirname(path)
      local ok, perr = pcall(function()
        for _, e in ipairs(named(doc.clusters, "clusters", path)) do
          if merged.clusters[e.name] == nil and type(e.cluster) == "table" then
            local c = e.cluster
            c["certificate-authority"] = resolve(dir, c["certificate-authority"])
            merged.clusters[e.name] = c
          end
        end
        for _, e in ipairs(named(doc.users, "users", path)) do
          if merged.users[e.name] == nil then
            local u = type(e.user) == "table" and e.user or {}
            u["client-certificate"] = resolve(dir, u["client-certificate"])
            u["client-key"] = resolve(dir, u["client-key"])
            u.tokenFile = resolve(dir, u.tokenFile)
            if type(u.exec) == "table" and type(u.exec.command) == "string" and u.exec.command:find("/", 1, true) then
              u.exec.command = resolve(dir, u.exec.command)
            end
            merged.users[e.name] = u
          end
        end
        for _, e in ipairs(named(doc.contexts, "contexts", path)) do
          if merged.contexts[e.name] == nil and type(e.context) == "table" then merged.contexts[e.name] = e.context end
        end
      end)
      if not ok then return fail("the kubeconfig " .. tostring(perr)) end
      local cc = doc["current-context"]
      if merged.current_context == nil and type(cc) == "string" and cc ~= "" then merged.current_context = cc end
    end
  end
  return merged
end

local warned = {}
local function warn_insecure(name)
  if warned[name] then return end
  warned[name] = true
  io.stderr:write(string.format("sbx: warning: the Kubernetes cluster %q is used without verifying its TLS " ..
    "certificate (insecure-skip-tls-verify)\n", name))
end

-- The in-cluster configuration, or nil when this is no pod.
local function in_cluster(pol)
  local host, port = os.getenv("KUBERNETES_SERVICE_HOST"), os.getenv("KUBERNETES_SERVICE_PORT")
  if not host or host == "" or not port or port == "" then return nil end
  local dir = pol.service_account_dir
  local ca = read_file(dir .. "/ca.crt")
  if not read_file(dir .. "/token") then return nil end
  if host:find(":", 1, true) then host = "[" .. host .. "]" end
  local ns = (read_file(dir .. "/namespace") or ""):gsub("%s+$", "")
  return {
    server = "https://" .. host .. ":" .. port, context = "in-cluster", cluster_name = "in-cluster",
    namespace = pol.namespace or (ns ~= "" and ns or "default"),
    tls = { ca_data = ca }, user = { tokenFile = dir .. "/token" }, source = "in-cluster service account",
  }
end

-- resolve(pol) -> conn | nil, message, code. pol: policy.kubernetes (with
-- box options over it). conn: { server, namespace, context, tls = {
-- ca_data, insecure }, user (the kubeconfig's user entry), source }.
function M.resolve(pol)
  if pol.in_cluster == true then
    local c = in_cluster(pol)
    if not c then
      return fail("policy.kubernetes.in_cluster is true, but KUBERNETES_SERVICE_HOST/PORT or the service " ..
        "account token (" .. pol.service_account_dir .. "/token) is missing")
    end
    return c
  end
  local paths, explicit = M.paths(pol.kubeconfig)
  local cfg, err, code = M.load(paths, explicit)
  if not cfg then return nil, err, code end
  if #cfg.files == 0 then
    local c = pol.in_cluster ~= false and in_cluster(pol)
    if c then return c end
    return fail("no Kubernetes configuration: none of " .. table.concat(paths, ", ") ..
      " exists (set KUBECONFIG or policy.kubernetes.kubeconfig), and this is no pod (KUBERNETES_SERVICE_HOST)")
  end
  local name = pol.context or cfg.current_context
  if not name then
    return fail("the kubeconfig (" .. table.concat(cfg.files, ", ") .. ") has no current-context; " ..
      "set policy.kubernetes.context")
  end
  local ctx = cfg.contexts[name]
  if not ctx then
    local known = {}
    for k in pairs(cfg.contexts) do known[#known + 1] = k end
    table.sort(known)
    return fail(string.format("no context %q in the kubeconfig (known: %s)", name,
      #known > 0 and table.concat(known, ", ") or "none"))
  end
  local cl = cfg.clusters[ctx.cluster or ""]
  if not cl then return fail(string.format("context %q names cluster %q, which is not in the kubeconfig", name, tostring(ctx.cluster))) end
  if type(cl.server) ~= "string" or not cl.server:match("^https?://") then
    return fail(string.format("cluster %q has no server URL (https://...)", tostring(ctx.cluster)))
  end
  if cl["proxy-url"] then
    return nil, string.format("cluster %q sets proxy-url, which sbx does not support", tostring(ctx.cluster)), "unsupported"
  end
  if cl["tls-server-name"] then
    return nil, string.format("cluster %q sets tls-server-name, which sbx does not support", tostring(ctx.cluster)), "unsupported"
  end
  local user = cfg.users[ctx.user or ""]
  if ctx.user and not user then
    return fail(string.format("context %q names user %q, which is not in the kubeconfig", name, tostring(ctx.user)))
  end
  local tls = {}
  if cl["insecure-skip-tls-verify"] == true then
    tls.insecure = true
    warn_insecure(ctx.cluster)
  elseif cl["certificate-authority-data"] then
    tls.ca_data = M.unbase64(tostring(cl["certificate-authority-data"]))
    if not tls.ca_data then return fail(string.format("cluster %q: certificate-authority-data is not base64", ctx.cluster)) end
  elseif cl["certificate-authority"] then
    tls.ca_data = read_file(cl["certificate-authority"])
    if not tls.ca_data then return fail(string.format("cluster %q: cannot read certificate-authority %s", ctx.cluster, cl["certificate-authority"])) end
  end
  return {
    server = cl.server:gsub("/+$", ""), context = name, cluster_name = ctx.cluster,
    namespace = pol.namespace or (type(ctx.namespace) == "string" and ctx.namespace ~= "" and ctx.namespace) or "default",
    tls = tls, user = user or {}, source = table.concat(cfg.files, ":"),
    cluster = cl,
  }
end

-- Credentials ---------------------------------------------------------------------------

-- Seconds since the epoch of an RFC 3339 time (UTC or with an offset).
function M.rfc3339(s)
  local y, mo, d, h, mi, sec, rest = tostring(s):match("^(%d+)-(%d+)-(%d+)[Tt ](%d+):(%d+):(%d+)(.*)$")
  if not y then return nil end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  -- Days from civil (Howard Hinnant's algorithm): no time zone involved.
  local yy = mo <= 2 and y - 1 or y
  local era = (yy >= 0 and yy or yy - 399) // 400
  local yoe = yy - era * 400
  local doy = (153 * (mo + (mo > 2 and -3 or 9)) + 2) // 5 + d - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  local days = era * 146097 + doe - 719468
  local t = days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec)
  rest = rest:gsub("^%.%d+", "")
  local sign, oh, om = rest:match("^([+-])(%d%d):?(%d%d)$")
  if sign then
    local off = tonumber(oh) * 3600 + tonumber(om) * 60
    t = sign == "+" and t - off or t + off
  elseif rest ~= "Z" and rest ~= "z" and rest ~= "" then
    return nil
  end
  return t
end

local shq = require("sbx.util").shell_quote

local EXEC_VERSIONS = {
  ["client.authentication.k8s.io/v1"] = true,
  ["client.authentication.k8s.io/v1beta1"] = true,
}

-- Runs an exec credential plugin: { token, cert_data, key_data, expires }
-- | nil, message, code. The plugin runs synchronously (a credential lives
-- for minutes, so this is once per lifetime, or after a 401).
local function run_plugin(conn, ex, pol)
  local api = ex.apiVersion
  if not EXEC_VERSIONS[api] then
    return nil, string.format("the exec credential plugin's apiVersion %q is not supported " ..
      "(client.authentication.k8s.io/v1 or v1beta1)", tostring(api)), "unsupported"
  end
  if type(ex.command) ~= "string" or ex.command == "" then return fail("an exec credential plugin without a command") end
  local mode = ex.interactiveMode
  if api == "client.authentication.k8s.io/v1" and mode == nil then
    return fail("an exec credential plugin of client.authentication.k8s.io/v1 needs interactiveMode")
  end
  if mode == "Always" then
    return nil, string.format("the exec credential plugin %s needs an interactive terminal (interactiveMode: Always), " ..
      "which sbx never gives it", ex.command), "unsupported"
  end
  local spec = { interactive = false }
  if ex.provideClusterInfo and conn.cluster then
    spec.cluster = { server = conn.server, ["insecure-skip-tls-verify"] = conn.tls.insecure or nil,
      ["certificate-authority-data"] = conn.cluster["certificate-authority-data"] }
  end
  local info = json.encode { apiVersion = api, kind = "ExecCredential", spec = spec }
  local env = { "KUBERNETES_EXEC_INFO=" .. info }
  for _, e in ipairs(type(ex.env) == "table" and ex.env or {}) do
    if type(e) == "table" and type(e.name) == "string" then env[#env + 1] = e.name .. "=" .. tostring(e.value or "") end
  end
  local argv = { ex.command }
  for _, a in ipairs(type(ex.args) == "table" and ex.args or {}) do argv[#argv + 1] = tostring(a) end
  local parts = { "env" }
  for _, kv in ipairs(env) do parts[#parts + 1] = shq(kv) end
  for _, a in ipairs(argv) do parts[#parts + 1] = shq(a) end
  local errfile = os.tmpname()
  local cmd = table.concat(parts, " ") .. " </dev/null 2>" .. shq(errfile)
  if pol.exec_plugin_timeout then cmd = "timeout " .. math.floor(pol.exec_plugin_timeout) .. " " .. cmd end
  local p = io.popen(cmd, "r")
  local out = p and p:read("a") or ""
  local ok, _, status = true, nil, 0
  if p then ok, _, status = p:close() end
  local said = (read_file(errfile) or ""):gsub("%s+$", "")
  os.remove(errfile)
  if not ok then
    local msg = string.format("the exec credential plugin %s failed (exit %s)", ex.command, tostring(status))
    if status == 124 then msg = string.format("the exec credential plugin %s did not finish within %gs", ex.command, pol.exec_plugin_timeout) end
    if said ~= "" then msg = msg .. ": " .. said:sub(1, 300) end
    if status == 127 and type(ex.installHint) == "string" then msg = msg .. " (" .. ex.installHint:gsub("%s+$", "") .. ")" end
    return nil, msg, "credentials"
  end
  local cred = json.decode(out)
  if type(cred) ~= "table" or cred.kind ~= "ExecCredential" or type(cred.status) ~= "table" then
    return nil, "the exec credential plugin " .. ex.command .. " did not print an ExecCredential", "credentials"
  end
  if cred.apiVersion ~= api then
    return nil, string.format("the exec credential plugin %s answered with apiVersion %s, not %s", ex.command,
      tostring(cred.apiVersion), api), "credentials"
  end
  local s = cred.status
  local r = { token = type(s.token) == "string" and s.token ~= "" and s.token or nil,
    cert_data = s.clientCertificateData, key_data = s.clientKeyData }
  if not r.token and not (r.cert_data and r.key_data) then
    return nil, "the exec credential plugin " .. ex.command .. " gave neither a token nor a client certificate and key", "credentials"
  end
  if s.expirationTimestamp then
    r.expires = M.rfc3339(s.expirationTimestamp)
    if not r.expires then return nil, "the exec credential plugin's expirationTimestamp is not RFC 3339", "credentials" end
  end
  return r
end

-- credentials(conn, pol, refresh) -> { headers = {...}, cert_data, key_data }
-- | nil, message, code. Cached on conn; refresh forces the token file and
-- the plugin to be read or run again (after a 401).
function M.credentials(conn, pol, refresh)
  local u = conn.user
  local now = core.now()
  local cache = conn.cache
  if cache and not refresh and (not cache.until_t or now < cache.until_t) then return cache.value end
  local v = { headers = {} }
  local until_t
  if u["client-certificate-data"] or u["client-certificate"] then
    v.cert_data = u["client-certificate-data"] and M.unbase64(tostring(u["client-certificate-data"]))
      or read_file(u["client-certificate"])
    v.key_data = u["client-key-data"] and M.unbase64(tostring(u["client-key-data"])) or
      (u["client-key"] and read_file(u["client-key"]))
    if not v.cert_data then return fail("cannot read the client certificate (" .. tostring(u["client-certificate"] or "client-certificate-data") .. ")") end
    if not v.key_data then return fail("cannot read the client key (" .. tostring(u["client-key"] or "client-key-data") .. ")") end
  end
  if type(u.token) == "string" and u.token ~= "" then
    v.headers.Authorization = "Bearer " .. u.token
  elseif type(u.tokenFile) == "string" and u.tokenFile ~= "" then
    local t = read_file(u.tokenFile)
    if not t then return fail("cannot read the token file " .. u.tokenFile) end
    v.headers.Authorization = "Bearer " .. t:gsub("%s+$", "")
    until_t = now + pol.token_reread
  elseif type(u.exec) == "table" then
    local r, err, code = run_plugin(conn, u.exec, pol)
    if not r then return nil, err, code end
    if r.token then v.headers.Authorization = "Bearer " .. r.token end
    if r.cert_data then v.cert_data, v.key_data = r.cert_data, r.key_data end
    if r.expires then until_t = now + math.max(0, r.expires - os.time() - pol.credential_slack) end
    if not r.expires then until_t = nil end
  elseif u["auth-provider"] then
    return nil, "the kubeconfig's user uses auth-provider, which sbx does not support: use an exec credential " ..
      "plugin (gke-gcloud-auth-plugin, kubelogin)", "unsupported"
  elseif type(u.username) == "string" and type(u.password) == "string" then
    v.headers.Authorization = "Basic " .. M.base64(u.username .. ":" .. u.password)
  end
  conn.cache = { value = v, until_t = until_t }
  return v
end

M.base64 = b64.encode

return M

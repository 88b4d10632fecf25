-- The Docker backend's client: finding the daemon and one Engine API call
-- (libcurl). Every other part of the backend talks to the daemon through
-- it; it knows nothing of boxes.
local core = require "sbx.core"
local json, http = core.json, require "sbx.http"

local M = {}
local CLIENT_API = "1.47"   -- the newest API this code is written against

local function pol() return require("sbx.config").policy.docker end

local daemons = {}          -- endpoint string -> daemon (one ping per process)
local function version_less(a, b)
  local a1, a2 = a:match("^(%d+)%.(%d+)")
  local b1, b2 = b:match("^(%d+)%.(%d+)")
  a1, a2, b1, b2 = tonumber(a1), tonumber(a2), tonumber(b1), tonumber(b2)
  return a1 < b1 or (a1 == b1 and a2 < b2)
end

local function home() return os.getenv("HOME") or "/root" end

-- Where a daemon may listen, in the order the docker CLI's users expect.
function M.candidates(explicit)
  if explicit then return { explicit } end
  local env = os.getenv("DOCKER_HOST")
  if env and env ~= "" then return { env } end
  local list = {
    home() .. "/.colima/default/docker.sock",
    home() .. "/.colima/docker.sock",
    "/var/run/docker.sock",
    home() .. "/.docker/run/docker.sock",
    home() .. "/.local/share/containers/podman/machine/podman.sock",
  }
  local xdg = os.getenv("XDG_RUNTIME_DIR")
  if xdg then
    list[#list + 1] = xdg .. "/docker.sock"
    list[#list + 1] = xdg .. "/podman/podman.sock"
  end
  list[#list + 1] = "/run/podman/podman.sock"
  for i, p in ipairs(list) do list[i] = "unix://" .. p end
  return list
end

local function parse_endpoint(ep)
  local path = ep:match("^unix://(.+)$")
  if path then return { unix_socket = path, base = "http://localhost" } end
  local host, port = ep:match("^tcp://%[?([^%]/]+)%]?:(%d+)/?$")
  if not host then host = ep:match("^tcp://([^:/]+)/?$"); port = host and "2375" end
  if host then return { host = host, port = tonumber(port), base = "http://" .. host .. ":" .. port } end
  return nil
end

local function exists(path)
  return core.path_type(path) ~= nil
end

-- Finds the daemon: explicit option, DOCKER_HOST, then the usual sockets.
-- Returns daemon | nil, message, "daemon_unavailable".
function M.connect(explicit, deadline)
  local cands = M.candidates(explicit)
  local tried = {}
  for _, ep in ipairs(cands) do
    if daemons[ep] then return daemons[ep] end
    local d = parse_endpoint(ep)
    if not d then
      tried[#tried + 1] = ep .. " (not a unix:// or tcp:// address)"
    elseif d.unix_socket and #cands > 1 and not exists(d.unix_socket) then
      tried[#tried + 1] = ep .. " (no such socket)"
    else
      local r, err = http.request { url = d.base .. "/_ping", unix_socket = d.unix_socket,
        timeout = M.seconds_left(deadline, pol().ping_timeout),
        connect_timeout = M.seconds_left(deadline, pol().ping_connect_timeout) }
      if r and r.status == 200 then
        local server = r.headers["api-version"] or "1.24"
        d.endpoint = ep
        d.api = version_less(server, CLIENT_API) and server or CLIENT_API
        d.podman = r.headers["libpod-api-version"] ~= nil
        d.libpod_api = r.headers["libpod-api-version"]
        d.prefix = d.base .. "/v" .. d.api
        d.images = {}
        daemons[ep] = d
        return d
      end
      tried[#tried + 1] = string.format("%s (%s)", ep, r and ("HTTP " .. r.status) or err)
    end
  end
  return nil, "no Docker daemon answered; tried: " .. table.concat(tried, "; ") ..
    ". Start dockerd (scripts/setup.sh does) or set DOCKER_HOST.", "daemon_unavailable"
end

local codes = { [400] = "bad_request", [404] = "not_found", [409] = "conflict", [500] = "daemon_error" }

-- Seconds a call may take: cap, or less when a deadline (an absolute
-- core.now() time) comes first. Never zero: libcurl reads 0 as "no limit".
function M.seconds_left(deadline, cap)
  if not deadline then return cap end
  return math.max(0.001, math.min(cap, deadline - core.now()))
end

-- One API call. Returns status, decoded body | nil, message, code.
-- opts.deadline bounds it (a frozen daemon answers nothing: the call then
-- fails with "daemon_unresponsive"); opts.timeout caps it (api_timeout);
-- opts.versioned: path carries its own version (Podman's libpod API).
local function call(d, method, path, body, opts)
  opts = opts or {}
  local limit = M.seconds_left(opts.deadline, opts.timeout or pol().api_timeout)
  local r, err, code = http.request {
    url = (opts.versioned and d.base or d.prefix) .. path, method = method, unix_socket = d.unix_socket,
    headers = body and { ["Content-Type"] = "application/json" } or nil,
    body = body and json.encode(body) or nil,
    timeout = limit, detached = opts.detached,
  }
  if opts.detached then return r end
  if not r then
    if code == "timeout" then
      return nil, string.format("the Docker daemon at %s did not answer %s %s within %.1f s",
        d.endpoint, method, path:match("^[^?]*"), limit), "daemon_unresponsive"
    end
    -- A GET whose connection broke before any answer (a daemon dying
    -- under it, a cut proxy connection) is asked once more: a daemon that
    -- is gone then refuses.
    if code == "closed" and method == "GET" and not opts.retried then
      local again = {}
      for k, v in pairs(opts) do again[k] = v end
      again.retried = true
      return call(d, method, path, body, again)
    end
    return nil, string.format("Docker daemon at %s: %s", d.endpoint, err), code == "ECONNREFUSED" and "daemon_unavailable" or code
  end
  local decoded = r.body ~= "" and json.decode(r.body) or nil
  if r.status >= 300 and not (opts.ok and opts.ok[r.status]) then
    local msg = type(decoded) == "table" and decoded.message or r.body
    return nil, tostring(msg):gsub("%s+$", ""), codes[r.status] or ("http_" .. r.status)
  end
  return r.status, decoded, r
end
M.call = call

local function urlq(s) return http.escape(s) end
M.urlq = urlq

-- list(d, filters, opts) -> status, containers | nil, message, code: every
-- container (all=true) matching filters (Docker's filter map), in the
-- compat API's shape (Id, Names, Labels, State; SizeRw with opts.size).
-- Podman's compat list fails whole while one container of its database has
-- no storage left ("getting container from store ...: container not known",
-- Podman 4.3 after a create that was cut off); its own libpod list shows
-- that one too, and a DELETE removes it: on Podman the list is libpod's.
function M.list(d, filters, opts)
  opts = opts or {}
  local query = "?all=true" .. (opts.size and "&size=true" or "") .. "&filters=" .. urlq(json.encode(filters))
  if not d.podman or not d.libpod_api then
    return call(d, "GET", "/containers/json" .. query, nil, opts)
  end
  local lopts = setmetatable({ versioned = true }, { __index = opts })
  local st, list, code = call(d, "GET", "/v" .. d.libpod_api .. "/libpod/containers/json" .. query, nil, lopts)
  if not st then return nil, list, code end
  for _, c in ipairs(list or {}) do
    if type(c.Size) == "table" and c.SizeRw == nil then c.SizeRw = c.Size.rwSize end
  end
  return st, list or {}
end
M.pol = pol
M.home = home
M.exists = exists

return M

-- The Kubernetes stand-in (scripts/k8s-standin) for tests: one per test
-- file, on a free port, with its own CA, client certificate and kubeconfig
-- in a private directory, and a watcher that stops it (SIGTERM: it removes
-- its containers) as soon as the test process is gone, however it ends.
local sbx = require "sbx"
local K = {}

local shq = require("helper").q

local slurp = require("helper").slurp
K.slurp = slurp

function K.write(path, text, mode)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  if mode then os.execute("chmod " .. mode .. " " .. shq(path)) end
end

local Standin = {}
Standin.__index = Standin

local function helper_call(self, path, body)
  return require("sbx.httpc").json { url = self.url .. path, json = body, ca_file = self.files.ca, timeout = 30 }
end

-- s:state() -> GET /_standin/state, decoded
function Standin:state() return helper_call(self, "/_standin/state") end
-- s:faults(t) -> the switches after the change
function Standin:faults(t) return helper_call(self, "/_standin/faults", sbx.json.object(t or {})) end
-- s:tokens(list): the bearer tokens the server accepts from now on
function Standin:tokens(list) return helper_call(self, "/_standin/tokens", { tokens = sbx.json.array(list) }) end
function Standin:log() return slurp(self.files.err) or "" end

-- s:stop() -> exit status: SIGTERM, then wait for the process to be gone.
function Standin:stop(timeout)
  return require("helper").stop_watched(self, timeout, function() os.execute("rm -rf " .. shq(self.base)) end)
end

--[[
K.standin([args]) -> standin | nil, message. args: a list of extra
arguments (fault flags, --token T, ...). The standin has .url, .port, .pid,
.kubeconfig (its own, with the client certificate), .dir (ca.crt,
client.crt, client.key), .files, :state(), :faults(t), :tokens(list),
:log(), :stop().
]]
function K.standin(args)
  args = args or {}
  local base = os.tmpname()
  os.remove(base)
  assert(os.execute("mkdir -m 700 -p " .. shq(base)))
  local files = { out = base .. "/out", err = base .. "/err", pid = base .. "/pid", rc = base .. "/rc",
    ca = base .. "/certs/ca.crt", kubeconfig = base .. "/kubeconfig" }
  local argv = { shq(os.getenv("SBX_K8S_STANDIN") or "scripts/k8s-standin"), "--port", "0",
    "--dir", shq(base .. "/certs"), "--kubeconfig", shq(files.kubeconfig) }
  for _, a in ipairs(args) do argv[#argv + 1] = shq(a) end
  local pid, url = require("helper").start_watched("k8s-standin", argv, files, "^(https://[^\n]+)\n")
  if not pid then return nil, url end
  return setmetatable({ url = url, port = tonumber(url:match(":(%d+)$")), pid = pid, base = base,
    kubeconfig = files.kubeconfig, dir = base .. "/certs", files = files }, Standin)
end

return K

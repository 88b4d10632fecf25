-- What the image tests share: the fixtures (built once per build directory
-- by tests/images_registry.py and kept while the local images stay the
-- same), a loopback registry with its token issuer and fault proxy, fresh
-- cache directories and policies that point at them.
local sbx = require "sbx"
local H = require "helper"

local IH = {}

IH.python = "/usr/bin/python3"
IH.script = "tests/images_registry.py"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
IH.q = q

local function build_dir()
  return (H.sbx_bin:match("^(.*)/[^/]+$") or "build")
end

-- The fixtures' directory (built on first use; about 20 s).
function IH.fixtures()
  if IH._fixtures then return IH._fixtures end
  local dir = build_dir() .. "/images-fixtures"
  if dir:sub(1, 1) ~= "/" then dir = os.getenv("PWD") .. "/" .. dir end
  local out, rc = H.sh(string.format("%s %s fixtures %s", IH.python, IH.script, q(dir)))
  assert(rc == 0, "building the image fixtures failed: " .. out)
  IH._fixtures = dir
  return dir
end

local Registry = {}
Registry.__index = Registry

-- POST /_faults: a list of faults (see tests/images_registry.py).
function Registry:faults(list)
  return assert(require("sbx.httpc").json { url = "http://" .. self.proxy .. "/_faults",
    json = sbx.json.array(list or {}), timeout = 10 })
end

function Registry:stats()
  return assert(require("sbx.httpc").json { url = "http://" .. self.proxy .. "/_stats", timeout = 10 })
end

function Registry:stop()
  if self.pid then os.execute("kill " .. self.pid .. " 2>/dev/null") end
  self.pid = nil
end

--[[
IH.registry() -> registry: { registry = "127.0.0.1:R" (the distribution
server itself), proxy = "127.0.0.1:P" (the same through the fault proxy;
the token issuer answers there too), faults(list), stats(), stop() }.
Ends with this process.
]]
function IH.registry()
  local dir = IH.fixtures()
  local portfile = os.tmpname()
  local p = io.popen(string.format("%s %s serve %s %d > %s 2>&1 & echo $!", IH.python, IH.script, q(dir),
    sbx.core.pid(), q(portfile)))
  local pid = tonumber(p:read("l"))
  p:close()
  local info
  for _ = 1, 200 do
    local f = io.open(portfile)
    local text = f and f:read("a")
    if f then f:close() end
    local line = text and text:match("^(%b{})")
    if line then info = sbx.json.decode(line) break end
    sbx.sleep(0.05)
  end
  os.remove(portfile)
  assert(info, "the test registry did not start")
  return setmetatable({ pid = pid, registry = "127.0.0.1:" .. info.registry, proxy = "127.0.0.1:" .. info.proxy,
                        dir = dir }, Registry)
end

-- A fresh scratch directory, removed at the end by IH.cleanup().
local scratch = {}
function IH.tmpdir(tag)
  local d = assert(sbx.core.layer.mkdtemp("/tmp/sbx-images-" .. (tag or "test") .. "-"))
  scratch[#scratch + 1] = d
  return d
end

function IH.cleanup()
  for _, d in ipairs(scratch) do sbx.core.layer.remove(d) end
  scratch = {}
end

-- A whole policy: the live one with overlay (a table) merged over a copy.
function IH.policy(overlay)
  local pol = sbx.deep_copy(sbx.policy)
  sbx.merge_policy(pol, overlay or {})
  return pol
end

-- The policy of a fresh cache, plus images options.
function IH.cache_policy(extra)
  local images = { dir = IH.tmpdir("cache") .. "/images" }
  for k, v in pairs(extra or {}) do images[k] = v end
  return IH.policy { images = images }
end

-- The entries of a directory (sorted), {} when it does not exist.
function IH.ls(dir)
  local l = sbx.core.layer.list(dir) or {}
  table.sort(l)
  return l
end

function IH.image_id(name)
  local out, rc = H.sh("docker image inspect -f '{{.Id}}' " .. q(name))
  assert(rc == 0, out)
  return (out:gsub("%s+$", ""))
end

IH.read = require("sbx.fs").read   -- a file's bytes | nil

function IH.median(list)
  local c = { table.unpack(list) }
  table.sort(c)
  return c[(#c + 1) // 2]
end

return IH

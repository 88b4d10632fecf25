-- Shared test helpers: images, raw Engine API access (to check what sbx did
-- from the daemon's side), and running sbx as a child process.
local sbx = require "sbx"
local H = {}

H.image = os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12"
H.busybox = os.getenv("SBX_TEST_BUSYBOX") or "sbx-busybox:latest"
H.sbx_bin = os.getenv("SBX_BIN") or "build/sbx"

function H.daemon()
  return assert(require("sbx.backends.docker").connect())
end

-- A raw Engine API call that bypasses sbx's box layer.
function H.api(method, path, body)
  return require("sbx.backends.docker").call(H.daemon(), method, path, body, { ok = { [404] = true } })
end

function H.container(id)
  local st, info = H.api("GET", "/containers/" .. id .. "/json")
  if st == 404 then return nil end
  return info
end

function H.box(opts)
  opts = opts or {}
  if not opts.image then opts.image = H.image end
  return assert(sbx.box(opts))
end

-- Processes in a box whose command line matches pattern (ps-free: /proc).
function H.procs_matching(box, pattern)
  local r = assert(box:exec([[for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); [ -n "$c" ] && echo "${p#/proc/} $c"; done]], { shell = "sh" }))
  local found = {}
  for line in r.stdout:gmatch("[^\n]+") do
    if line:find(pattern) and not line:find("/proc/%[0%-9%]") then found[#found + 1] = line end
  end
  return found
end

function H.sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return out, ok and 0 or code
end

-- Resident set size of this process in KiB (VmRSS) and its peak (VmHWM).
function H.rss()
  local f = io.open("/proc/self/status")
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s+(%d+)")), tonumber(s:match("VmHWM:%s+(%d+)"))
end

return H

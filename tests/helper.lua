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

-- The end of every test server: serve on a free loopback port, print it,
-- and exit when the test process (argv[1]) is gone.
local SERVE = [=[

def watch(pid):
    while True:
        time.sleep(0.5)
        try: os.kill(pid, 0)
        except OSError: os._exit(0)

srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
srv.daemon_threads = True
threading.Thread(target=watch, args=(int(sys.argv[1]),), daemon=True).start()
print(srv.server_address[1], flush=True)
srv.serve_forever()
]=]

-- Starts a Python 3 test server on 127.0.0.1 from source that imports os,
-- sys, threading, time and ThreadingHTTPServer and defines a handler class H.
-- Returns base URL, port, stop() | nil when it did not start.
function H.start_python_server(source)
  local script, portfile = os.tmpname(), os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(source, SERVE)
  f:close()
  local pid_out = io.popen(string.format("python3 %s %d > %s 2>&1 & echo $!", script, sbx.core.pid(), portfile))
  local server_pid = tonumber(pid_out:read("l"))
  pid_out:close()
  local function stop()
    if server_pid then os.execute("kill " .. server_pid .. " 2>/dev/null") end
    server_pid = nil
    os.remove(script)
    os.remove(portfile)
  end
  local port
  for _ = 1, 100 do
    local pf = io.open(portfile)
    local text = pf and pf:read("a")
    if pf then pf:close() end
    port = text and tonumber(text:match("^(%d+)\n"))
    if port then break end
    sbx.sleep(0.05)
  end
  if not port then stop() return nil end
  return "http://127.0.0.1:" .. port, port, stop
end

-- Resident set size of this process in KiB (VmRSS) and its peak (VmHWM).
function H.rss()
  local f = io.open("/proc/self/status")
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s+(%d+)")), tonumber(s:match("VmHWM:%s+(%d+)"))
end

return H

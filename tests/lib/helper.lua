-- Shared test helpers: images, raw Engine API access (to check what sbx did
-- from the daemon's side), and running sbx as a child process.
local sbx = require "sbx"
local H = {}

H.image = os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12"
H.busybox = os.getenv("SBX_TEST_BUSYBOX") or "sbx-busybox:latest"
H.sbx_bin = os.getenv("SBX_BIN") or "build/sbx"

-- The unix socket of the daemon the tests use (DOCKER_HOST, which may be
-- Podman's; else Docker's own), for proxies put in front of it.
function H.daemon_socket()
  local host = os.getenv("DOCKER_HOST") or ""
  return host:match("^unix://(.+)$") or "/var/run/docker.sock"
end

-- The daemon sbx finds (DOCKER_HOST, ...), or the one at docker_host.
function H.daemon(docker_host)
  return assert(require("sbx.backends.docker").connect(docker_host))
end

-- A raw Engine API call that bypasses sbx's box layer.
function H.api(method, path, body, docker_host)
  return require("sbx.backends.docker").call(H.daemon(docker_host), method, path, body, { ok = { [404] = true } })
end

-- Every container (running or not) carrying each label of labels ("k=v"
-- or "k"), through sbx's own list (Podman's libpod list where Podman is the
-- daemon: its compat list fails while a broken record exists). Raises when
-- the daemon cannot list.
function H.containers(labels, docker_host)
  local json = require("sbx.core").json
  local st, list = require("sbx.backends.docker").list(H.daemon(docker_host), { label = json.array(labels) })
  assert(st, list)
  return list
end

-- A container's inspect on sbx's daemon or the one at docker_host, or nil.
function H.container(id, docker_host)
  local st, info = H.api("GET", "/containers/" .. id .. "/json", nil, docker_host)
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

-- The AWS stand-in (scripts/aws-standin) ------------------------------------

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
H.q = shell_quote

-- H.slurp(path) -> the file's bytes | nil when it cannot be read (sbx.fs.read).
local slurp = require("sbx.fs").read
H.slurp = slurp

-- H.write(path, text): the file holds text (raises when it cannot).
function H.write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

-- H.tmpdir() -> a new empty directory of this test's own.
function H.tmpdir()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. shell_quote(dir)))
  return dir
end

local Standin = {}
Standin.__index = Standin

-- s:state() -> the decoded GET /_standin/state | nil, message, code
function Standin:state()
  return require("sbx.httpc").json { url = self.url .. "/_standin/state", timeout = 30 }
end

-- s:faults(t) -> the fault switches after the change | nil, message, code.
-- t: { throttle = n, error5xx = n, agent_never_connects = bool, ... }
function Standin:faults(t)
  return require("sbx.httpc").json { url = self.url .. "/_standin/faults", json = sbx.json.object(t or {}),
    timeout = 10 }
end

-- Its stderr so far (log lines with --verbose, tracebacks).
function Standin:log()
  return slurp(self.files.err) or ""
end

-- s:stop([timeout]) -> exit status | nil, "timeout". SIGTERM (the stand-in
-- removes its containers then), and waits until the process is gone.
-- Idempotent.
function Standin:stop(timeout)
  return H.stop_watched(self, timeout, function() for _, f in pairs(self.files) do os.remove(f) end end)
end

-- H.stop_watched(s, timeout, cleanup) -> exit status | nil, "timeout": the
-- stop of a process H.start_watched started (s.pid, s.files.rc): SIGTERM,
-- then wait for its status; cleanup() once it is gone. Idempotent.
function H.stop_watched(s, timeout, cleanup)
  if s.status ~= nil then return s.status end
  os.execute("kill -TERM " .. s.pid .. " 2>/dev/null")
  local deadline = sbx.now() + (timeout or 30)
  while sbx.now() < deadline do
    local rc = slurp(s.files.rc)
    if rc and rc:match("%d") then
      s.status = tonumber(rc:match("%d+"))
      cleanup()
      return s.status
    end
    sbx.sleep(0.05)
  end
  return nil, "timeout"
end

-- The option value after flag in a list of arguments, or nil.
local function arg_value(args, flag)
  for i, a in ipairs(args) do
    if a == flag then return args[i + 1] end
    local v = a:match("^" .. flag:gsub("%-", "%%-") .. "=(.*)$")
    if v then return v end
  end
end

-- H.start_watched(name, argv, files, url_pattern) -> pid, url | nil,
-- message: runs argv (words already quoted for sh) in the background, its
-- stdout in files.out and stderr in files.err, its pid written to
-- files.pid and, once it ended, its status to files.rc. A watcher sends it
-- SIGTERM as soon as this test process is gone, however it ends, so nothing
-- it made outlives the test. Waits up to 60 s for url_pattern (one capture)
-- at the start of its stdout.
function H.start_watched(name, argv, files, url_pattern)
  local watcher = string.format([[
%s >%s 2>%s & s=$!
echo $s >%s
( while kill -0 %d 2>/dev/null; do sleep 0.5; done; kill -TERM $s 2>/dev/null ) & w=$!
wait $s; echo $? >%s.tmp; mv %s.tmp %s
kill $w 2>/dev/null]],
    table.concat(argv, " "), shell_quote(files.out), shell_quote(files.err), shell_quote(files.pid),
    sbx.core.pid(), shell_quote(files.rc), shell_quote(files.rc), shell_quote(files.rc))
  os.execute("sh -c " .. shell_quote(watcher) .. " >/dev/null 2>&1 </dev/null &")
  local pid, url
  local deadline = sbx.now() + 60
  while sbx.now() < deadline do
    pid = pid or tonumber((slurp(files.pid) or ""):match("%d+"))
    url = (slurp(files.out) or ""):match(url_pattern)
    if pid and url then return pid, url end
    local rc = slurp(files.rc)
    if rc and rc:match("%d") then
      return nil, name .. " exited (" .. rc:match("%d+") .. ") before it was ready: " .. (slurp(files.err) or "")
    end
    sbx.sleep(0.05)
  end
  if pid then os.execute("kill -TERM " .. pid .. " 2>/dev/null") end
  return nil, name .. " printed no URL within 60 s: " .. (slurp(files.err) or "")
end

--[[
H.standin([args]) -> standin | nil, message
  Starts scripts/aws-standin --port 0 <args> (a list of strings) in the
  background and waits for the URL it prints. The standin has .url, .port,
  .pid, .docker_host (the daemon its task containers run on), .credentials
  ({access_key, secret_key, session_token} it accepts, for sbx.aws),
  :state(), :faults(t), :log() and :stop(). A watcher stops it
  (SIGTERM) as soon as this test process is gone, however it ends, so no
  container outlives the test. SBX_STANDIN overrides the script's path.
]]
function H.standin(args)
  args = args or {}
  local script = os.getenv("SBX_STANDIN") or "scripts/aws-standin"
  local base = os.tmpname()
  local files = { out = base .. ".out", err = base .. ".err", pid = base .. ".pid", rc = base .. ".rc", base = base }
  local argv = { shell_quote(script), "--port", "0" }
  for _, a in ipairs(args) do argv[#argv + 1] = shell_quote(a) end
  local pid, url = H.start_watched("aws-standin", argv, files, "^(http://[^\n]+)\n")
  if not pid then
    for _, f in pairs(files) do os.remove(f) end
    return nil, url
  end
  return setmetatable({
    url = url,
    port = tonumber(url:match(":(%d+)$")),
    pid = pid,
    -- Where its task containers run: its own --docker-socket, whatever
    -- daemon the test itself talks to (DOCKER_HOST may be Podman).
    docker_host = "unix://" .. (arg_value(args, "--docker-socket") or "/var/run/docker.sock"),
    files = files,
    credentials = {
      access_key = arg_value(args, "--access-key") or "AKIDSTANDIN",
      secret_key = arg_value(args, "--secret-key") or "standin-secret",
      session_token = arg_value(args, "--session-token"),
    },
  }, Standin)
end

-- Resident set size of this process in KiB (VmRSS) and its peak (VmHWM).
function H.rss()
  local f = io.open("/proc/self/status")
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s+(%d+)")), tonumber(s:match("VmHWM:%s+(%d+)"))
end

-- A second dockerd of the test's own -------------------------------------------

local Daemon = {}
Daemon.__index = Daemon

-- d:freeze() / d:thaw(): SIGSTOP / SIGCONT of that dockerd (its containers
-- and containerd go on running, as when a daemon hangs).
function Daemon:freeze() os.execute("kill -STOP " .. self.pid .. " 2>/dev/null") end
function Daemon:thaw() os.execute("kill -CONT " .. self.pid .. " 2>/dev/null") end

-- Container names on it whose sbx.owner.pid label is pid (all when nil).
function Daemon:boxes(pid)
  local out = H.sh(string.format("DOCKER_HOST=%s docker ps -a --filter label=sbx.owner.pid%s --format '{{.Names}}'",
    self.host, pid and ("=" .. pid) or ""))
  local names = {}
  for n in out:gmatch("[^\n]+") do names[#names + 1] = n end
  return names
end

-- d:stop(): thaws, removes its containers, stops it and its files. Idempotent.
function Daemon:stop()
  if self.stopped then return end
  self.stopped = true
  self:thaw()
  H.sh(string.format("DOCKER_HOST=%s docker rm -f $(DOCKER_HOST=%s docker ps -aq) 2>/dev/null", self.host, self.host))
  os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
  for _ = 1, 200 do
    if not io.open("/proc/" .. self.pid .. "/stat") then break end
    sbx.sleep(0.05)
  end
  os.execute("rm -rf " .. self.dir)
end

--[[
H.second_daemon([images]) -> daemon | nil, message
  Starts a dockerd of its own (data root, exec root, socket under a temp
  dir; no bridge, no iptables) in a network namespace of its own: a dockerd
  with --bridge none deletes the host's docker0, which would break the main
  daemon's bridge network. It loads the images (default: the busybox test
  image) from the main daemon, and returns { host = "unix://...", pid,
  dir, :freeze(), :thaw(), :boxes(pid), :stop() }. A watcher thaws and stops
  it when the test process is gone, however it ends. Needs root and dockerd.
]]
function H.second_daemon(images)
  images = images or { H.busybox }
  local dockerd = H.sh("command -v dockerd"):match("^(/%S+)")
  if not dockerd then return nil, "no dockerd on this machine" end
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local sock = dir .. "/docker.sock"
  local cmd = string.format([[
unshare --net %s --data-root %s/data --exec-root %s/exec --pidfile %s/pid -H unix://%s --bridge none --iptables=false --ip-masq=false --ip6tables=false >%s/log 2>&1 & d=$!
( while kill -0 %d 2>/dev/null; do sleep 0.5; done; kill -CONT $d; kill -TERM $d; sleep 5; rm -rf %s ) >/dev/null 2>&1 &]],
    dockerd, dir, dir, dir, sock, dir, sbx.core.pid(), dir)
  os.execute("sh -c " .. shell_quote(cmd) .. " </dev/null >/dev/null 2>&1")
  local pid
  for _ = 1, 300 do
    pid = pid or tonumber((slurp(dir .. "/pid") or ""):match("%d+"))
    if pid and select(2, H.sh("curl -sf --max-time 2 --unix-socket " .. sock .. " http://x/_ping")) == 0 then break end
    sbx.sleep(0.1)
  end
  if not pid then return nil, "the second dockerd did not start: " .. (slurp(dir .. "/log") or "") end
  local d = setmetatable({ host = "unix://" .. sock, pid = pid, dir = dir }, Daemon)
  for _, image in ipairs(images) do
    local out, code = H.sh(string.format("docker save %s | DOCKER_HOST=%s docker load", image, d.host))
    if code ~= 0 then d:stop() return nil, "cannot load " .. image .. ": " .. out end
  end
  return d
end

return H

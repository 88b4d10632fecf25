-- needs: python3
-- core.ws against a real websocket server written here from RFC 6455
-- (tests/ws_server.py, Python stdlib, on 127.0.0.1, port chosen by the
-- kernel; a second copy speaks TLS with a certificate made for this run).
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"
local core = sbx.core
local ws = core.ws

-- Starts tests/ws_server.py with extra arguments; returns its port and a stop().
local function start_server(extra)
  local portfile = os.tmpname()
  local p = io.popen(string.format("python3 tests/ws_server.py %d %s > %s 2>&1 & echo $!",
                                   core.pid(), extra or "", portfile))
  local pid = tonumber(p:read("l"))
  p:close()
  local function stop()
    if pid then os.execute("kill " .. pid .. " 2>/dev/null") end
    pid = nil
  end
  for _ = 1, 200 do
    local f = io.open(portfile)
    local text = f and f:read("a")
    if f then f:close() end
    local port = text and tonumber(text:match("^(%d+)\n"))
    if port then
      os.remove(portfile)
      return port, stop
    end
    sbx.sleep(0.05)
  end
  stop()
  os.remove(portfile)
  return nil
end

-- Open fds of this process (the pipe that lists them is closed before).
local function fds()
  local p = io.popen("ls /proc/" .. core.pid() .. "/fd")
  local out = p:read("a")
  p:close()
  local n = 0
  for _ in out:gmatch("%d+") do n = n + 1 end
  return n - 1
end

-- The fd count once earlier connections have finished closing (it stops
-- changing for half a second).
local function settled_fds()
  local last, since = fds(), sbx.now()
  local deadline = since + 10
  while sbx.now() < deadline and sbx.now() - since < 0.5 do
    sbx.sleep(0.05)
    local n = fds()
    if n ~= last then last, since = n, sbx.now() end
  end
  return last
end

-- Waits until f() is true (polling the loop), up to seconds; returns f().
local function eventually(f, seconds)
  local deadline = sbx.now() + (seconds or 10)
  while not f() and sbx.now() < deadline do sbx.sleep(0.05) end
  return f()
end

local port, stop = start_server()
if not tap.ok(port, "the test websocket server starts") then tap.done() end
local base = "ws://127.0.0.1:" .. port

-- What the server saw on the connection that had ?id=name.
local function server_close_of(name)
  local q = assert(ws.connect { url = base .. "/lastclose?of=" .. name })
  local v = q:recv(10)
  q:close()
  return v
end

-- Contract errors raise -------------------------------------------------------

tap.checkerr("table expected", ws.connect)
tap.checkerr("url string expected", ws.connect, {})
tap.checkerr("ws:// or wss:// expected", ws.connect, { url = "http://127.0.0.1/" })
tap.checkerr("bad port", ws.connect, { url = "ws://127.0.0.1:99999/" })
tap.checkerr("timeout must be positive", ws.connect, { url = base .. "/echo", timeout = 0 })
tap.checkerr("bad header", ws.connect, { url = base .. "/echo", headers = { ["X-A"] = "a\r\nInjected: 1" } })

-- Back-pressure: a 50 MiB flood while nobody reads (first, while the heap is
-- small, so RSS shows what the queue holds) ----------------------------------

collectgarbage()
collectgarbage()
local rss0, hwm0 = H.rss()
local total, msize = 50 * 1024 * 1024, 64 * 1024
local flood = assert(ws.connect { url = base .. "/flood?total=" .. total .. "&size=" .. msize, max_queue = 1024 * 1024 })
sbx.sleep(2) -- the server writes as fast as the connection takes it
local queued = flood:info().queued
local rss1 = H.rss()
-- ASan's quarantine and valgrind's own heap make RSS say little there.
local instrumented = os.getenv("SBX_SANITIZED") or (os.getenv("LD_PRELOAD") or ""):find("vgpreload")
local function rss_ok(grew_kib, limit_kib, name)
  if instrumented then
    return tap.skip(name .. " (grew " .. grew_kib .. " KiB)", "meaningless under ASan or valgrind")
  end
  return tap.ok(grew_kib < limit_kib, name .. " (grew " .. grew_kib .. " KiB)")
end
tap.ok(queued <= 1024 * 1024 + msize, "reading stops near max_queue (" .. queued .. " bytes queued)")
tap.ok(queued > 0 and flood:info().bytes_in < total / 2, "and the flood is held back (" .. flood:info().bytes_in .. " bytes in)")
rss_ok(rss1 - rss0, 24 * 1024, "RSS stays bounded while nobody reads")
local n, sum, good = 0, 0, true
while true do
  local m, k = flood:recv(30)
  if not m then good = false break end
  if k == "text" then break end
  if m ~= string.rep(string.char(n % 251), msize) then good = false end
  n = n + 1
  sum = sum + #m
end
local _, hwm1 = H.rss()
tap.ok(good and sum == total and n == total / msize, "every flooded byte arrives, in order, once recv drains ("
  .. sum .. " bytes in " .. n .. " messages)")
rss_ok(hwm1 - hwm0, 32 * 1024, "peak RSS for the whole 50 MiB stays bounded")
flood:close()

-- Echo: binary with NUL bytes, text, empty, 5 MiB ------------------------------

local c, err, code = ws.connect { url = base .. "/echo?id=echo1" }
tap.ok(c, "connect to /echo", err)
tap.is(c:info().state, "open", "info: open after connect")
local bin = "a\0b\0\255\0" .. string.rep("\0", 100) .. "z"
tap.is(c:send(bin), true, "send returns true")
local got, kind = c:recv(10)
tap.ok(got == bin and kind == "binary", "binary echo keeps NUL bytes (" .. tostring(got and #got) .. " bytes)")
c:send("héllo wörld", "text")
got, kind = c:recv(10)
tap.ok(got == "héllo wörld" and kind == "text", "text echo comes back as text")
c:send("", "text")
got, kind = c:recv(10)
tap.ok(got == "" and kind == "text", "an empty message round-trips")
tap.checkerr("bad argument #2", c.send, c, {})
tap.checkerr("invalid option 'json'", c.send, c, "x", "json")
tap.checkerr("at most 125 bytes", c.ping, c, string.rep("p", 126))
tap.checkerr("not a close code", c.close, c, 1005)

local parts = {}
for i = 0, 5 * 1024 * 1024 / 1024 - 1 do
  parts[#parts + 1] = string.pack(">I4", i) .. string.rep(string.char(i % 256), 1020)
end
local big = table.concat(parts)
c:send(big)
tap.is(c:buffered(), #big, "send queues the whole 5 MiB and returns before writing")
got, kind = c:recv(60)
tap.ok(got == big and kind == "binary", "a 5 MiB message round-trips intact")
tap.is(c:buffered(), 0, "nothing left queued after the echo")
local info = c:info()
tap.ok(info.messages_out == 4 and info.messages_in == 4, "info counts messages both ways",
  string.format("out %d in %d", info.messages_out, info.messages_in))
tap.ok(info.bytes_out == #bin + #"héllo wörld" + #big and info.bytes_in == info.bytes_out,
  "info counts payload bytes both ways")

-- Many messages, in order, both directions
for i = 1, 2000 do c:send("n" .. i) end
local in_order = true
for i = 1, 2000 do
  if c:recv(10) ~= "n" .. i then in_order = false break end
end
tap.ok(in_order, "2000 echoed messages arrive in the order sent")

-- ping and pong
tap.is(c:ping("hi"), true, "ping is queued")
tap.ok(eventually(function() return c:info().pongs >= 1 end), "the pong is counted")

-- wait_drained: a sender's back-pressure without polling. 64 MiB is more
-- than loopback's socket buffers hold, so a peer that reads nothing for a
-- while holds most of it in the queue.
do
  local slow = assert(ws.connect { url = base .. "/slowread?delay=1.5" })
  local msg = string.rep("d", 1024 * 1024)
  for _ = 1, 64 do slow:send(msg) end
  local ok, _, code = slow:wait_drained(0, 0.3)
  tap.ok(ok == nil and code == "timeout",
    "wait_drained: a peer that reads nothing holds the queue (" .. slow:buffered() .. " bytes unwritten)")
  tap.checkerr("negative timeout", slow.wait_drained, slow, 0, -1)
  tap.checkerr("at least 0", slow.wait_drained, slow, -1)
  local waiter = sbx.spawn(function() return slow:wait_drained(0, 60) end)
  sbx.sleep(0.05)
  tap.checkerr("already waiting in wait_drained", slow.wait_drained, slow, 0, 1)
  tap.is(sbx.wait(waiter), true, "wait_drained: true once the peer read it all")
  tap.is(slow:buffered(), 0, "and nothing is left unwritten")
  tap.is(slow:wait_drained(0), true, "an empty queue returns at once")
  slow:close()
  -- A connection that drops while a sender waits ends the wait.
  local dropfile = os.tmpname()
  local df = assert(io.open(dropfile, "w"))
  df:write('[{"sleep": 0.5}, {"drop": true}]')
  df:close()
  local gone = assert(ws.connect { url = base .. "/script?file=" .. dropfile })
  for _ = 1, 64 do gone:send(msg) end
  local gok, _, gcode = gone:wait_drained(0, 30)
  tap.ok(gok == nil and gcode == "closed", "wait_drained: a connection lost meanwhile ends the wait (closed)")
  gone:close()
  os.remove(dropfile)
  os.remove(dropfile .. ".got")
end

-- Closing: the server sees our code and reason; recv and send report closed
tap.is(c:close(4002, "done"), true, "close returns true")
tap.is(c:close(), true, "close twice is harmless")
local r1, r2, r3 = c:recv(10)
tap.ok(r1 == nil and r3 == "closed" and r2:find("4002 done", 1, true), "recv after close: nil, message, closed", r2)
tap.is(select(3, c:send("late")), "closed", "send after close fails with closed")
tap.is(c:info().state, "closed", "info: closed")
tap.is(server_close_of("echo1"), "4002 done", "the server got our close code and reason")

-- Fragments from the server arrive whole, with a ping in between ------------

c = assert(ws.connect { url = base .. "/frag?parts=7&size=100000" })
got, kind = c:recv(10)
local expect = {}
for i = 0, 99999 do expect[#expect + 1] = string.char((i * 7) % 256) end
tap.ok(got == table.concat(expect) and kind == "binary", "a message in 7 fragments arrives as one")
c:close()
c = assert(ws.connect { url = base .. "/frag?parts=3&size=10&type=text&empty_tail=1" })
got, kind = c:recv(10)
tap.ok(got == string.rep("x", 10) and kind == "text", "fragments ending in an empty final frame")
c:close()

-- Server-sent sequence
c = assert(ws.connect { url = base .. "/count?n=5000" })
in_order = true
for i = 1, 5000 do
  if c:recv(10) ~= tostring(i) then in_order = false break end
end
tap.ok(in_order, "5000 server messages arrive in order")
c:close()

-- Extra headers reach the server
c = assert(ws.connect { url = base .. "/headers", headers = { ["X-Sbx-Test"] = "v1", Authorization = "Bearer t" } })
local seen = core.json.decode((c:recv(10)))
tap.ok(seen["x-sbx-test"] == "v1" and seen.authorization == "Bearer t", "extra upgrade headers are sent")
tap.is(seen.host, "127.0.0.1:" .. port, "Host carries the port")
c:close()

-- The server pings: lws answers with the same payload
c = assert(ws.connect { url = base .. "/pingme" })
tap.is(c:recv(10), "pong:srv", "a server ping is answered with its payload")
c:close()

-- recv timeout ---------------------------------------------------------------

c = assert(ws.connect { url = base .. "/echo" })
local t0 = sbx.now()
local a, b, cc = c:recv(0.2)
local waited = sbx.now() - t0
tap.ok(a == nil and b == "timeout" and cc == "timeout", "recv(0.2) on a quiet connection: nil, timeout, timeout")
tap.ok(waited >= 0.15 and waited < 5, "and it waited about that long (" .. waited .. " s)")
tap.is(c:info().state, "open", "a timeout leaves the connection open")

-- Cancelling a coroutine blocked in recv --------------------------------------

local reader = sbx.spawn(function() return c:recv() end)
sbx.sleep(0.1)
tap.is(reader:status(), "waiting", "a task waits in recv")
tap.checkerr("already waiting in recv", c.recv, c, 0.1)
tap.ok(reader:cancel(), "the waiting task is cancelled")
tap.checkerr("cancelled", sbx.wait, reader)
c:send("after cancel")
tap.is(c:recv(10), "after cancel", "the connection still works after the cancelled recv")
local reader2 = sbx.spawn(function() return c:recv(10) end)
sbx.sleep(0.05)
c:send("to the new reader")
tap.is(sbx.wait(reader2), "to the new reader", "a new task can wait in recv again")
-- recv wakes with closed when another task closes
local reader3 = sbx.spawn(function() return c:recv(10) end)
sbx.sleep(0.05)
c:close()
local _, m3, k3 = sbx.wait(reader3)
tap.ok(k3 == "closed" and m3:find("closed locally"), "a waiting recv wakes with closed when the socket is closed", m3)

-- Server closes with a code; server drops TCP ----------------------------------

c = assert(ws.connect { url = base .. "/close?code=4001&reason=bye&after=2&id=srvclose" })
tap.is(c:recv(10), "m1", "messages before the server's close: 1")
tap.is(c:recv(10), "m2", "messages before the server's close: 2")
a, b, cc = c:recv(10)
tap.ok(a == nil and cc == "closed" and b:find("4001 bye", 1, true), "then nil, message with code and reason, closed", b)
info = c:info()
tap.ok(info.close_code == 4001 and info.close_reason == "bye" and info.state == "closed",
  "info shows the peer's close code and reason")
tap.ok(eventually(function() return (server_close_of("srvclose") or ""):find("^4001") end),
  "the client answered the close frame with the same code")

c, err = ws.connect { url = base .. "/close?code=4003&reason=at+once" }
tap.ok(c, "a connection the server closes right after the upgrade still connects", err)
a, b, cc = c:recv(10)
tap.ok(a == nil and cc == "closed" and b:find("4003 at once", 1, true), "and recv reports the close", b)

c = assert(ws.connect { url = base .. "/drop?after=1" })
tap.is(c:recv(10), "m1", "a message before the drop")
t0 = sbx.now()
a, b, cc = c:recv(10)
tap.ok(a == nil and cc == "closed" and b == "connection lost", "a dropped TCP connection: nil, connection lost, closed", b)
tap.ok(sbx.now() - t0 < 5, "without waiting for the recv timeout")
tap.is(c:info().close_code, nil, "no close code when none was sent")

-- Connect failures -------------------------------------------------------------

a, b, cc = ws.connect { url = "ws://127.0.0.1:1/" }
tap.ok(a == nil and cc == "ECONNREFUSED", "nothing listening: ECONNREFUSED", b)
a, b, cc = ws.connect { url = base .. "/status?code=403" }
tap.ok(a == nil and cc == "handshake" and b:find("403"), "a 403 answer to the upgrade: handshake, with the status", b)
a, b, cc = ws.connect { url = base .. "/status?code=200" }
tap.ok(a == nil and cc == "handshake" and b:find("200"), "a 200 answer without the upgrade: handshake", b)
a, b, cc = ws.connect { url = "ws://no-such-host.invalid/", timeout = 60 }
tap.ok(a == nil and cc == "ENOTFOUND", "an unknown host: ENOTFOUND", b)
t0 = sbx.now()
a, b, cc = ws.connect { url = base .. "/silent", timeout = 1 }
waited = sbx.now() - t0
tap.ok(a == nil and cc == "timeout", "a server that never answers: timeout", b)
tap.ok(waited >= 0.9 and waited < 5, "within the given timeout (" .. waited .. " s)")
c, err = ws.connect { url = "ws://localhost:" .. port .. "/echo" }
tap.ok(c and c:send("by name") and c:recv(10) == "by name", "a host name is resolved", err)
if c then c:close() end

-- max_message ------------------------------------------------------------------

c = assert(ws.connect { url = base .. "/echo?id=toolarge", max_message = 1000 })
c:send(string.rep("s", 1000))
tap.is(#(c:recv(10) or ""), 1000, "a message of exactly max_message is fine")
c:send(string.rep("L", 1001))
a, b, cc = c:recv(10)
tap.ok(a == nil and cc == "closed" and b:find("max_message"), "a larger one: nil, message, closed", b)
tap.is(c:info().close_code, 1009, "closed with 1009")
tap.ok(eventually(function() return (server_close_of("toolarge") or ""):find("^1009") end),
  "the server got close code 1009")

-- 200 concurrent connections ---------------------------------------------------

local N = 200
local open_now, open_max, failures = 0, 0, {}
local all_open = core.event()
local tasks = {}
for i = 1, N do
  tasks[i] = sbx.spawn(function()
    local w, e = ws.connect { url = base .. "/echo", timeout = 60 }
    if not w then failures[#failures + 1] = e return false end
    open_now = open_now + 1
    open_max = math.max(open_max, open_now)
    if open_now == N then all_open:set() end
    all_open:wait(60)
    for j = 1, 10 do w:send(string.format("%d-%d", i, j)) end
    for j = 1, 10 do
      if w:recv(30) ~= string.format("%d-%d", i, j) then return false end
    end
    open_now = open_now - 1
    w:close()
    return true
  end)
end
local ok_count = 0
for _, t in ipairs(tasks) do
  if t:join(120) and t:result() and select(2, t:result()) then ok_count = ok_count + 1 end
end
tap.is(open_max, N, "200 connections are open at once")
tap.is(ok_count, N, "each of 200 concurrent connections exchanges 10 messages in order", failures[1])

-- Cancelling a coroutine blocked in connect ----------------------------------

local baseline = settled_fds()
local connector = sbx.spawn(function() return ws.connect { url = base .. "/silent", timeout = 30 } end)
sbx.sleep(0.3)
tap.is(fds(), baseline + 1, "a connect in progress holds one socket")
t0 = sbx.now()
connector:cancel()
tap.checkerr("cancelled", sbx.wait, connector)
tap.ok(sbx.now() - t0 < 2, "a cancelled connect ends at once")
tap.ok(eventually(function() return fds() <= baseline end), "and its socket is closed (" .. fds() .. " fds, was " .. baseline .. ")")

-- A dropped ws object closes its connection and frees its fd --------------------

baseline = settled_fds()
-- (made and dropped in a function of its own: a register of this chunk
-- could otherwise keep it past the collection)
local function open_and_drop()
  local dropped = assert(ws.connect { url = base .. "/echo?id=dropped" })
  dropped:send("x")
  assert(dropped:recv(10) == "x")
  tap.is(fds(), baseline + 1, "an open websocket holds one fd")
end
open_and_drop()
collectgarbage()
collectgarbage()
tap.ok(eventually(function() return fds() <= baseline end), "after collection no fd is left (" .. fds() .. " fds, was " .. baseline .. ")")
tap.ok(eventually(function() return server_close_of("dropped") == "1000 " end), "the server got a normal close frame")

do
  local scoped <close> = assert(ws.connect { url = base .. "/echo" })
  scoped:send("y")
  c = scoped
end
tap.checkerr("closed websocket", c.send, c, "z")
tap.is(tostring(c), "sbx.ws (closed)", "a to-be-closed websocket is closed at scope exit")

-- wss:// with a certificate made for this run ----------------------------------

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)
local _, rc = H.sh(string.format("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
  .. "-addext 'subjectAltName=DNS:localhost,IP:127.0.0.1' -keyout %s/key.pem -out %s/cert.pem", dir, dir))
tap.is(rc, 0, "openssl makes a self-signed certificate")
local tport, tstop = start_server(string.format("--tls %s/cert.pem %s/key.pem", dir, dir))
tap.ok(tport, "the TLS server starts")
if tport then
  c, err, code = ws.connect { url = "wss://localhost:" .. tport .. "/echo", ca_file = dir .. "/cert.pem" }
  tap.ok(c, "wss:// with ca_file connects", err)
  if c then
    c:send("secret\0bytes")
    tap.is(c:recv(10), "secret\0bytes", "and echoes over TLS")
    c:send(big)
    tap.is(c:recv(60), big, "5 MiB over TLS")
    c:close()
  end
  a, b, cc = ws.connect { url = "wss://localhost:" .. tport .. "/echo" }
  tap.ok(a == nil and cc == "tls" and b:find("certificate verify failed", 1, true),
    "without ca_file the self-signed certificate fails: tls, saying why", b)
  a, b, cc = ws.connect { url = "wss://127.0.0.1:" .. tport .. "/echo", ca_file = "/nonexistent/ca.pem" }
  tap.ok(a == nil and cc == "tls", "an unreadable ca_file: tls", b)
  c, err = ws.connect { url = "wss://localhost:" .. tport .. "/echo", insecure = true }
  tap.ok(c and c:send("i") and c:recv(10) == "i", "insecure = true skips verification", err)
  if c then c:close() end
  -- The CA as PEM bytes instead of a file.
  local f = assert(io.open(dir .. "/cert.pem"))
  local pem = f:read("a")
  f:close()
  c, err = ws.connect { url = "wss://127.0.0.1:" .. tport .. "/echo", ca_data = pem }
  tap.ok(c and c:send("d") and c:recv(10) == "d", "ca_data (PEM bytes) verifies the server", err)
  if c then c:close() end
  a, b, cc = ws.connect { url = "wss://127.0.0.1:" .. tport .. "/echo", ca_data = "not a certificate" }
  tap.ok(a == nil and cc == "tls" and b:find("no CA certificate", 1, true), "ca_data without a certificate: tls", b)

  tstop()
end

-- A server that wants a client certificate (the Kubernetes API server's
-- x509 login): the certificate and key go in as PEM bytes, never a file.
local _, crc = H.sh(string.format("(cd %s && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca "
  .. "-keyout ca.key -out ca.pem && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=someone "
  .. "-keyout client.key -out client.csr && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key "
  .. "-CAcreateserial -days 1 -out client.pem)", dir))
tap.is(crc, 0, "openssl makes a client CA and an EC client certificate")
local function read(p) local f = assert(io.open(p)) local s = f:read("a") f:close() return s end
local mport, mstop = start_server(string.format("--tls %s/cert.pem %s/key.pem --client-ca %s/ca.pem", dir, dir, dir))
tap.ok(mport, "the mutual-TLS server starts")
if mport then
  local url = "wss://127.0.0.1:" .. mport .. "/echo"
  c, err = ws.connect { url = url, ca_file = dir .. "/cert.pem",
    cert_data = read(dir .. "/client.pem"), key_data = read(dir .. "/client.key") }
  tap.ok(c and c:send("m") and c:recv(10) == "m", "cert_data and key_data log in", err)
  if c then c:close() end
  a, b = ws.connect { url = url, ca_file = dir .. "/cert.pem", timeout = 10 }
  tap.ok(a == nil, "without a client certificate the server hangs up", b)
  a, b, cc = ws.connect { url = url, ca_file = dir .. "/cert.pem",
    cert_data = read(dir .. "/client.pem"), key_data = read(dir .. "/key.pem") }
  tap.ok(a == nil and cc == "tls" and not b:find("PRIVATE", 1, true), "a key that does not match: tls, no key in the message", b)
  tap.checkerr("go together", ws.connect, { url = url, cert_data = "x" })
  mstop()
end
os.execute("rm -rf " .. dir)

-- Subprotocols: offered in order, the server's choice in info().protocol.
c = assert(ws.connect { url = base .. "/proto?pick=v4.channel.k8s.io", protocols = { "v5.channel.k8s.io", "v4.channel.k8s.io" } })
tap.is(c:info().protocol, "v4.channel.k8s.io", "the server's choice among the offered subprotocols")
tap.is(c:recv(10), "v4.channel.k8s.io", "the server saw both offered")
c:close()
c = assert(ws.connect { url = base .. "/proto?pick=none", protocols = { "v5.channel.k8s.io" } })
tap.is(c:info().protocol, nil, "no protocol chosen: info().protocol is nil")
c:close()
a, b = ws.connect { url = base .. "/proto?pick=x&force=v9.channel.k8s.io", protocols = { "v5.channel.k8s.io" } }
tap.ok(a == nil, "a protocol that was not offered fails the connection", b)
tap.checkerr("bad name", ws.connect, { url = base .. "/echo", protocols = { "a b" } })


tap.is(server_close_of("violations"), "none", "every frame the client sent was masked")

-- lws's own timer, idle and wake-up handles do not keep the loop alive: a
-- wait nothing can end is still reported after websockets were used.
local script = os.tmpname()
local sf = assert(io.open(script, "w"))
sf:write(string.format([[
local core = require("sbx").core
local w = assert(core.ws.connect { url = %q })
w:close()
assert(w:recv(10) == nil)
core.event():wait()
]], base .. "/echo"))
sf:close()
local out, status = H.sh(string.format("timeout 30 %s run %s", H.sbx_bin, script))
os.remove(script)
tap.ok(status ~= 124 and out:find("deadlock"), "a wait nothing can end is reported as a deadlock", out)

-- The end closes the Lua state (os.exit(..., true)) with one connection
-- still open, so the host's teardown of lws runs too (valgrind checks it).
-- The server leaves by itself once this process is gone.
local kept = assert(ws.connect { url = base .. "/echo" })
kept:send("kept")
tap.is(kept:recv(10), "kept", "a connection left open at exit")
io.write("1..", tap.n, "\n")
io.flush()
os.exit(tap.failed == 0 and 0 or 1, true)

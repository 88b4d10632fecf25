-- needs: python3
-- The HTTP client against a real local server (Python's http.server, started
-- here on 127.0.0.1, port chosen by the kernel): streamed bodies, bounded
-- buffering, timeouts, retries with backoff and Retry-After, JSON, SSE. The
-- SSE parser is also checked alone, without a network.
local tap = require "tap"
local sbx = require "sbx"
local httpc = sbx.httpc
local http = sbx.http
local H = require "helper"

-- SSE parser, no network ----------------------------------------------------

local function feed_all(chunks)
  local p, evs = httpc.sse_parser(), {}
  for _, c in ipairs(chunks) do
    for _, e in ipairs(p:feed(c)) do evs[#evs + 1] = e end
  end
  return evs, p
end

local function summary(evs)
  local t = {}
  for _, e in ipairs(evs) do t[#t + 1] = e.event .. "=" .. e.data .. "#" .. e.id end
  return table.concat(t, "|")
end

local stream = ": hello\r\nevent: a\r\ndata: one\r\ndata:two\r\n\r\nid: 7\r\ndata:  sp\r\n\r\n" ..
               "retry: 1500\r\ndata: x\r\n\r\ndata: unterminated\r\n"
local evs, p = feed_all { stream }
tap.is(summary(evs), "a=one\ntwo#|message= sp#7|message=x#7", "SSE: CRLF, comments, multi-line data, id")
tap.is(p.retry, 1500, "SSE: retry field")
local split = {}
for i = 1, #stream do split[i] = stream:sub(i, i) end
tap.is(summary(feed_all(split)), "a=one\ntwo#|message= sp#7|message=x#7", "SSE: byte-by-byte feeds give the same events")
tap.is(summary(feed_all { "data: a\r", "\ndata: b\r", "\r", "\n" }), "message=a\nb#",
  "SSE: CRLF split across feeds is one line end")
tap.is(summary(feed_all { "data: a\rdata: b\r\rdata: c\r\r" }), "message=a\nb#|message=c#", "SSE: CR-only line ends")
tap.is(summary(feed_all { "\239\187", "\191data: bom\n\n" }), "message=bom#", "SSE: a BOM at the start is dropped (split)")
tap.is(summary(feed_all { "\239\187\191\239\187\191data: x\n\n" }), "",
  "SSE: only one BOM is dropped (the second makes an unknown field)")
tap.is(summary(feed_all { "data\n\nevent: e\n\ndata:\n\n" }), "message=#|message=#",
  "SSE: a bare data field, an event with no data is not dispatched")
tap.is(summary(feed_all { "event: t\ndata: 1\n\ndata: 2\n\n" }), "t=1#|message=2#", "SSE: event type resets")
tap.is(summary(feed_all { "id: 1\ndata: a\n\nid\ndata: b\n\nid: x\0y\ndata: c\n\n" }), "message=a#1|message=b#|message=c#",
  "SSE: id persists, empty id resets, id with NUL ignored")
local _, rp = feed_all { "retry: 12x\nretry: 30\nretry: 4.5\n" }
tap.is(rp.retry, 30, "SSE: a non-digit retry is ignored")

-- The server ----------------------------------------------------------------

local SERVER = [=[
import json, os, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from urllib.parse import urlparse, parse_qs

counts = {}
lock = threading.Lock()

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass

    def send(self, code, body, ctype="text/plain", extra=None):
        if isinstance(body, str): body = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items(): self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def count(self):
        with lock:
            counts[self.path] = counts.get(self.path, 0) + 1
            return counts[self.path]

    def chunk(self, data):
        if isinstance(data, str): data = data.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self): self.do_GET()

    def do_GET(self):
        u = urlparse(self.path); q = parse_qs(u.query)
        n = self.headers.get("Content-Length")
        body = self.rfile.read(int(n)) if n else b""
        try:
            if u.path == "/echo":
                try: parsed = json.loads(body) if body else None
                except ValueError: parsed = None
                self.send(200, json.dumps({"method": self.command, "path": u.path, "json": parsed,
                    "body": body.decode("latin-1"),
                    "ctype": self.headers.get("Content-Type"), "x": self.headers.get("X-Test")}),
                    "application/json")
            elif u.path == "/slow":
                time.sleep(float(q.get("s", ["2"])[0])); self.send(200, "slow")
            elif u.path == "/chunked":
                n, d = int(q.get("n", ["5"])[0]), float(q.get("d", ["0.1"])[0])
                self.send_response(200); self.send_header("Transfer-Encoding", "chunked")
                self.send_header("X-Chunks", str(n)); self.end_headers(); self.wfile.flush()
                for i in range(n):
                    time.sleep(d); self.chunk("chunk %d\n" % i)
                self.wfile.write(b"0\r\n\r\n"); self.wfile.flush()
            elif u.path == "/big":
                size = int(q.get("mb", ["10"])[0]) * 1024 * 1024
                self.send_response(200); self.send_header("Content-Length", str(size)); self.end_headers()
                block = b"x" * 65536
                for _ in range(size // 65536): self.wfile.write(block)
            elif u.path == "/stall":
                self.send_response(200); self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
                self.chunk("first"); time.sleep(float(q.get("s", ["4"])[0])); self.chunk("late")
                self.wfile.write(b"0\r\n\r\n")
            elif u.path.startswith("/flaky/"):
                c = self.count()
                if c <= 2: self.send(503, "busy %d" % c)
                else: self.send(200, "ok after %d" % c)
            elif u.path.startswith("/limited/"):
                c = self.count()
                if c == 1: self.send(429, "slow down", extra={"Retry-After": "1"})
                else: self.send(200, "ok after %d" % c)
            elif u.path == "/count":
                self.send(200, str(counts.get(q["p"][0], 0)))
            elif u.path == "/sse":
                self.send_response(200); self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
                for piece in [": a comment\r\n", "event: greet\r\ndata: hel", "lo\r\n\r\n",
                              "id: 7\r\ndata: line1\r\ndata: line2\r", "\n\r\n", "retry: 1500\r\n",
                              "data: last\r\n\r\n", "data: never dispatched\r\n"]:
                    self.chunk(piece); time.sleep(0.02)
                self.wfile.write(b"0\r\n\r\n")
            elif u.path == "/sse-forever":
                self.send_response(200); self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
                i = 0
                while True:
                    i += 1; self.chunk("id: %d\ndata: tick %d\n\n" % (i, i)); time.sleep(0.02)
            else:
                self.send(404, "no such endpoint")
        except (BrokenPipeError, ConnectionResetError):
            pass

]=]

local base, port, stop_server = H.start_python_server(SERVER)
if not base then
  tap.ok(false, "the test server started")
  tap.done()
end

local function hwm_kb()
  local f = io.open("/proc/self/status")
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmHWM:%s*(%d+)"))
end

local function tests()
  -- Plain requests keep working.
  local r = assert(http.request { url = base .. "/echo", method = "POST", body = "raw", headers = { "X-Test: 1" } })
  tap.is(r.status, 200, "plain request")
  tap.like(r.body, '"x": "1"', "list headers go out")

  -- JSON.
  local v, resp = httpc.json { url = base .. "/echo", json = { a = 1, list = { 1, 2 } }, headers = { ["X-Test"] = "map" } }
  tap.is(v and v.json.a, 1, "json: body encoded and the reply decoded")
  tap.is(v and v.ctype, "application/json", "json: Content-Type set")
  tap.is(v and v.x, "map", "json: map headers go out")
  tap.is(v and v.method, "POST", "json: POST by default with a body")
  tap.is(resp and resp.status, 200, "json: the response comes second")
  local nv, nerr, ncode, nresp = httpc.json { url = base .. "/nope" }
  tap.ok(nv == nil and ncode == "status" and nresp.status == 404, "json: a 404 is nil, message, 'status', response", nerr)
  nv, nerr, ncode = httpc.json { url = base .. "/slow?s=0", method = "GET" }
  tap.is(ncode, "json", "json: a non-JSON body is a 'json' failure")

  -- Whole-transfer timeout.
  local t0 = sbx.now()
  -- The body cap comes from policy.http (C keeps only a fallback).
  sbx.use_policy { http = { max_body = 100000 } }
  local capped = assert(http.request { url = base .. "/big?mb=1" })
  tap.ok(capped.truncated and #capped.body == 100000, "policy.http.max_body caps a response body",
    #capped.body)
  sbx.use_policy { http = { max_body = 64 * 1024 * 1024 } }
  capped = assert(http.request { url = base .. "/big?mb=1" })
  tap.ok(not capped.truncated and #capped.body == 1024 * 1024, "and the default policy keeps 1 MiB whole")

  local tr, terr, tcode = http.request { url = base .. "/slow?s=3", timeout = 0.5 }
  tap.ok(tr == nil and tcode == "timeout", "timeout: nil, message, 'timeout'", terr)
  tap.ok(sbx.now() - t0 < 2, "timeout: ends early")

  -- Streamed body: returns at the head, chunks arrive as sent.
  t0 = sbx.now()
  local sr = assert(http.request { url = base .. "/chunked?n=5&d=0.15", stream = true })
  local head_at = sbx.now() - t0
  tap.is(sr.status, 200, "stream: status")
  tap.is(sr.headers["x-chunks"], "5", "stream: headers")
  tap.is(sr.body, nil, "stream: no body field")
  tap.ok(head_at < 0.5, "stream: returns at the head, before the body (" .. head_at .. " s)")
  local got, reads = {}, 0
  while true do
    local c, e = sr.body_stream:read(5)
    if not c then
      tap.is(e, "eof", "stream: ends with nil, 'eof'")
      break
    end
    reads = reads + 1
    got[#got + 1] = c
  end
  tap.is(table.concat(got), "chunk 0\nchunk 1\nchunk 2\nchunk 3\nchunk 4\n", "stream: every byte in order")
  tap.ok(reads >= 3, "stream: bytes came in several reads (" .. reads .. ")")
  tap.is(select(2, sr.body_stream:read()), "eof", "stream: eof again after eof")
  sr.body_stream:close()
  tap.ok(pcall(sr.body_stream.close, sr.body_stream), "stream: close is idempotent")
  tap.checkerr("closed body stream", sr.body_stream.read, sr.body_stream)

  -- Read timeout, idle timeout, abort.
  local st = assert(http.request { url = base .. "/stall?s=3", stream = true })
  tap.is(st.body_stream:read(2), "first", "stall: the first bytes")
  local c, e, code = st.body_stream:read(0.2)
  tap.ok(c == nil and code == "timeout", "read(timeout): nil, message, 'timeout'", e)
  t0 = sbx.now()
  st.body_stream:close()
  tap.ok(sbx.now() - t0 < 0.5, "close aborts a stalled transfer at once")
  tap.like(tostring(st.body_stream), "closed", "and the stream says closed")
  do
    local idle = assert(http.request { url = base .. "/stall?s=4", stream = true, idle_timeout = 1 })
    local body <close> = idle.body_stream
    t0 = sbx.now()
    local chunk, ierr, icode
    repeat chunk, ierr, icode = body:read(10) until not chunk
    tap.ok(icode == "timeout" and sbx.now() - t0 < 3.5, "idle_timeout ends a silent transfer", ierr)
    tap.like(ierr, "idle_timeout", "with a message naming it")
  end

  -- Concurrent streams in tasks.
  local tasks = {}
  for i = 1, 4 do
    tasks[i] = sbx.spawn(function()
      local x = assert(http.request { url = base .. "/chunked?n=4&d=0.1", stream = true })
      local n = 0
      while true do
        local s = x.body_stream:read(5)
        if not s then break end
        n = n + #s
      end
      x.body_stream:close()
      return n
    end)
  end
  t0 = sbx.now()
  local sizes = sbx.gather(tasks)
  tap.ok(sizes[1] == 32 and sizes[4] == 32, "4 streams in tasks read every byte")
  tap.ok(sbx.now() - t0 < 1.2, "and run concurrently")

  -- Bounded buffering: 10 MB read slowly with a 256 KiB cap.
  collectgarbage()
  local before = hwm_kb()
  local big = assert(http.request { url = base .. "/big?mb=10", stream = true, max_buffer = 256 * 1024,
                                    idle_timeout = 1 })
  sbx.sleep(1.6) -- paused by us longer than idle_timeout: not idle
  tap.like(tostring(big.body_stream), "paused", "big: the transfer pauses at the cap")
  local total, largest, n = 0, 0, 0
  while true do
    local s, be = big.body_stream:read(10)
    if not s then
      tap.is(be, "eof", "big: ends with eof")
      break
    end
    total = total + #s
    largest = math.max(largest, #s)
    n = n + 1
    if n % 8 == 0 then sbx.sleep(0.005) end
  end
  big.body_stream:close()
  tap.is(total, 10 * 1024 * 1024, "big: every byte arrives")
  tap.ok(largest <= 256 * 1024 + 64 * 1024, "big: no read returns much more than the cap (" .. largest .. ")")
  local growth = hwm_kb() - before
  if os.getenv("SBX_SANITIZED") then
    tap.skip("big: VmHWM grew " .. growth .. " KiB", "meaningless under ASan (quarantine)")
  else
    tap.ok(growth < 4 * 1024, "big: VmHWM grew " .. growth .. " KiB, well under 10 MB")
  end

  -- Retries: 503 twice then 200, with jittered exponential backoff.
  local infos = {}
  local fr = httpc.request { url = base .. "/flaky/a", retries = 3, backoff = { base = 0.2, max = 5 },
                             on_retry = function(i) infos[#infos + 1] = i end }
  tap.is(fr.status, 200, "retries: 503, 503, then 200")
  tap.is(fr.attempts, 3, "retries: three attempts")
  tap.is(http.request { url = base .. "/count?p=/flaky/a" }.body, "3", "retries: the server saw three requests")
  tap.ok(#fr.retry_delays == 2 and fr.retry_delays[1] <= 0.2 and fr.retry_delays[2] <= 0.4
    and fr.retry_delays[1] >= 0 and fr.retry_delays[2] >= 0, "retries: full-jitter delays within base*2^n",
    table.concat(fr.retry_delays, ", "))
  tap.ok(#infos == 2 and infos[1].status == 503, "retries: on_retry sees each retry")
  local fr2 = httpc.request { url = base .. "/flaky/b", retries = 1 }
  tap.ok(fr2.status == 503 and fr2.attempts == 2, "retries: the last 503 is returned when retries run out")
  local none = httpc.request { url = base .. "/flaky/c" }
  tap.ok(none.status == 503 and none.attempts == 1, "retries: none by default")
  t0 = sbx.now()
  local lr = httpc.request { url = base .. "/limited/a", retries = 2, backoff = { base = 0.01 } }
  local waited = sbx.now() - t0
  tap.is(lr.status, 200, "429: retried")
  tap.ok(lr.retry_delays[1] == 1 and waited >= 0.95, "429: Retry-After: 1 honoured (" .. waited .. " s)")
  local rr, rerr, rcode, rinfo = httpc.request { url = "http://127.0.0.1:1/", retries = 2, backoff = { base = 0.01 } }
  tap.ok(rr == nil and rcode == "ECONNREFUSED" and rinfo.attempts == 3, "retries: refused connections retried", rerr)
  local sfr = httpc.request { url = base .. "/flaky/d", retries = 3, stream = true, backoff = { base = 0.01 } }
  tap.ok(sfr.status == 200 and sfr.attempts == 3 and sfr.body_stream:read(5) == "ok after 3",
    "retries: a streamed 503 is retried at the head")
  sfr.body_stream:close()

  -- SSE over the wire.
  local seen = {}
  local res, serr = httpc.sse({ url = base .. "/sse", read_timeout = 5 }, function(ev) seen[#seen + 1] = ev end)
  tap.ok(res, "sse: completes", serr)
  tap.is(summary(seen), "greet=hello#|message=line1\nline2#7|message=last#7", "sse: events, multi-line data, id, CRLF")
  tap.is(res and res.retry, 1500, "sse: retry reported")
  tap.is(res and res.events, 3, "sse: the unterminated last event is not dispatched")
  local ticks = 0
  t0 = sbx.now()
  res = httpc.sse({ url = base .. "/sse-forever", read_timeout = 5 }, function(ev)
    ticks = ticks + 1
    return ticks < 3
  end)
  tap.ok(res and res.stopped and ticks == 3 and res.last_event_id == "3", "sse: on_event returning false stops")
  tap.ok(sbx.now() - t0 < 2, "sse: and the endless stream is dropped")
  tap.checkerr("on_event", httpc.sse, { url = base .. "/sse" })
end

local ok, err = xpcall(tests, debug.traceback)
tap.ok(ok, "the HTTP tests ran to the end", err)
stop_server()
tap.done()

#!/usr/bin/env python3
"""A websocket server for tests/ws_test.lua, RFC 6455 by hand (stdlib only).

Usage: ws_server.py PARENT_PID [--tls CERT KEY [--client-ca CA]]
With --client-ca the TLS server requires a client certificate signed by CA.
Prints the port it listens on (127.0.0.1, chosen by the kernel) and exits
when PARENT_PID is gone. The path picks the behaviour:

  /echo                    every message back with its type
  /frag?parts=&size=&type=&empty_tail=1
                           one message in `parts` frames with a ping between
                           the first two (and an empty final frame), then echo
  /count?n=                messages "1".."n", then echo
  /close?code=&reason=&after=
                           `after` messages "m1".., then a close frame
  /drop?after=             `after` messages, then the TCP connection ends
                           without a close frame
  /status?code=            answers the upgrade with that HTTP status
  /silent                  accepts, reads the request, never answers
  /flood?total=&size=      `total` bytes in binary messages of `size`
                           (message i is bytes of value i % 251), then "done"
  /headers                 one text message: the request headers as JSON
  /proto?pick=a,b          answers with the first of the client's
                           Sec-WebSocket-Protocol names that is in pick (none
                           when none is), then sends it as a text message
  /proto?pick=a&force=x    answers with protocol x whatever was offered
  /pingme                  pings the client with "srv"; sends "pong:<data>"
                           when the pong comes back
  /script?file=PATH        a scripted peer (steps in the JSON file; see serve)
  /lastclose?of=ID         one text message: "code reason" of the close frame
                           the server got on the connection that had ?id=
                           (or "none"); of=violations counts bad frames

Every client frame must be masked with no RSV bits (else close 1002), as
RFC 6455 5.1 requires of clients.
"""
import base64
import hashlib
import json
import os
import socket
import socketserver
import ssl
import struct
import sys
import threading
import time
from urllib.parse import parse_qs, urlparse

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

closes = {}          # id -> "code reason" of the client's close frame
lock = threading.Lock()


class Closed(Exception):
    pass


def unmask(data, key):
    if not data:
        return data
    reps = key * (len(data) // 4 + 1)
    n = len(data)
    return (int.from_bytes(data, "big") ^ int.from_bytes(reps[:n], "big")).to_bytes(n, "big")


class Conn:
    def __init__(self, sock, conn_id):
        self.sock = sock
        self.buf = b""
        self.id = conn_id
        self.on_pong = None

    def read_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise Closed()
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_request(self):
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise Closed()
            self.buf += chunk
            if len(self.buf) > 65536:
                raise Closed()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return method, target, headers

    def send_frame(self, opcode, payload=b"", fin=True):
        head = bytes([(0x80 if fin else 0) | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([n])
        elif n < 65536:
            head += bytes([126]) + struct.pack(">H", n)
        else:
            head += bytes([127]) + struct.pack(">Q", n)
        self.sock.sendall(head + payload)

    def send_close(self, code, reason=b""):
        self.send_frame(OP_CLOSE, struct.pack(">H", code) + reason)

    def recv_frame(self):
        b0, b1 = self.read_exact(2)
        fin, rsv, opcode = b0 & 0x80, b0 & 0x70, b0 & 0x0F
        masked, n = b1 & 0x80, b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self.read_exact(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self.read_exact(8))[0]
        if not masked or rsv:
            with lock:
                closes["violations"] = closes.get("violations", 0) + 1
            self.send_close(1002, b"unmasked or rsv")
            raise Closed()
        key = self.read_exact(4)
        return bool(fin), opcode, unmask(self.read_exact(n), key)

    def recv_message(self):
        """The next whole data message (opcode, bytes); control frames are
        answered on the way. A close frame is recorded, answered, and ends
        the connection (Closed)."""
        opcode, parts = None, []
        while True:
            fin, op, data = self.recv_frame()
            if op == OP_PING:
                self.send_frame(OP_PONG, data)
                continue
            if op == OP_PONG:
                if self.on_pong:
                    self.on_pong(data)
                continue
            if op == OP_CLOSE:
                code = struct.unpack(">H", data[:2])[0] if len(data) >= 2 else 1005
                with lock:
                    closes[self.id] = "%d %s" % (code, data[2:].decode("utf-8", "replace"))
                try:
                    self.send_frame(OP_CLOSE, data[:2])
                except OSError:
                    pass
                raise Closed()
            if op in (OP_TEXT, OP_BIN):
                opcode, parts = op, [data]
            elif op == OP_CONT and opcode is not None:
                parts.append(data)
            else:
                self.send_close(1002, b"bad continuation")
                raise Closed()
            if fin:
                return opcode, b"".join(parts)

    def echo(self):
        while True:
            op, data = self.recv_message()
            self.send_frame(op, data)

    def wait_close(self):
        """After our close frame: read until the client answers or leaves."""
        try:
            while True:
                _, op, data = self.recv_frame()
                if op == OP_CLOSE:
                    code = struct.unpack(">H", data[:2])[0] if len(data) >= 2 else 1005
                    with lock:
                        closes[self.id] = "%d %s" % (code, data[2:].decode("utf-8", "replace"))
                    return
        except (Closed, OSError):
            pass


def pattern(i, size):
    return bytes([i % 251]) * size


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        if self.server.tls:
            try:
                sock = self.server.tls.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError):
                return      # the client refused our certificate
        try:
            self.serve(sock)
        except (Closed, OSError):
            pass
        finally:
            try:
                sock.close()
            except OSError:
                pass

    def serve(self, sock):
        c = Conn(sock, None)
        method, target, headers = c.read_request()
        url = urlparse(target)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        c.id = q.get("id")
        path = url.path
        if path == "/silent":
            while sock.recv(4096):
                pass
            return
        if path == "/status":
            code = int(q.get("code", "403"))
            body = b"no upgrade for you"
            sock.sendall(b"HTTP/1.1 %d Nope\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (code, len(body), body))
            return
        key = headers.get("sec-websocket-key", "")
        if method != "GET" or headers.get("upgrade", "").lower() != "websocket" or not key \
                or headers.get("sec-websocket-version") != "13":
            sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest())
        chosen = ""
        if path == "/proto":
            offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
            pick = q.get("pick", "").split(",")
            chosen = q.get("force") or next((p for p in offered if p in pick), "")
        extra = b"Sec-WebSocket-Protocol: " + chosen.encode() + b"\r\n" if chosen else b""
        sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\n" + extra + b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        if path == "/proto":
            c.send_frame(OP_TEXT, chosen.encode())
            c.echo()
            return

        if path == "/echo":
            c.echo()
        elif path == "/frag":
            parts, size = int(q.get("parts", "4")), int(q.get("size", "1000"))
            op = OP_TEXT if q.get("type") == "text" else OP_BIN
            data = bytes((i * 7) % 256 for i in range(size)) if op == OP_BIN else b"x" * size
            step = max(1, size // parts)
            chunks = [data[i:i + step] for i in range(0, size, step)]
            if q.get("empty_tail"):
                chunks.append(b"")
            for i, chunk in enumerate(chunks):
                c.send_frame(op if i == 0 else OP_CONT, chunk, fin=(i == len(chunks) - 1))
                if i == 0:
                    c.send_frame(OP_PING, b"mid")
            c.echo()
        elif path == "/count":
            for i in range(1, int(q.get("n", "10")) + 1):
                c.send_frame(OP_TEXT, str(i).encode())
            c.echo()
        elif path == "/close":
            for i in range(1, int(q.get("after", "0")) + 1):
                c.send_frame(OP_TEXT, b"m%d" % i)
            c.send_close(int(q.get("code", "1000")), q.get("reason", "").encode())
            c.wait_close()
        elif path == "/drop":
            for i in range(1, int(q.get("after", "0")) + 1):
                c.send_frame(OP_TEXT, b"m%d" % i)
            sock.shutdown(socket.SHUT_RDWR)
        elif path == "/flood":
            total, size = int(q.get("total", "1048576")), int(q.get("size", "65536"))
            i, sent = 0, 0
            while sent < total:
                n = min(size, total - sent)
                c.send_frame(OP_BIN, pattern(i, n))
                sent += n
                i += 1
            c.send_frame(OP_TEXT, b"done")
            c.echo()
        elif path == "/slowread":
            # Reads nothing for ?delay= seconds (the TCP window fills), then
            # reads and drops every message until the client closes (Closed).
            time.sleep(float(q.get("delay", "1")))
            while True:
                c.recv_message()
        elif path == "/headers":
            c.send_frame(OP_TEXT, json.dumps(headers).encode())
            c.echo()
        elif path == "/pingme":
            c.on_pong = lambda data: c.send_frame(OP_TEXT, b"pong:" + data)
            c.send_frame(OP_PING, b"srv")
            c.echo()
        elif path == "/script":
            # A scripted peer for protocol tests: steps from the JSON file
            # ?file=, every received message appended (hex, one per line)
            # to ?file=.got. Steps: {"send": hex} (binary), {"text": str},
            # {"expect": n} (wait until n messages were received in all),
            # {"sleep": s}, {"close": code}, {"drop": true}.
            steps = json.load(open(q["file"]))
            got = []
            out = open(q["file"] + ".got", "w")

            def take():
                op, data = c.recv_message()
                got.append(data)
                out.write(data.hex() + "\n")
                out.flush()
            for st in steps:
                if "send" in st:
                    c.send_frame(OP_BIN, bytes.fromhex(st["send"]))
                elif "text" in st:
                    c.send_frame(OP_TEXT, st["text"].encode())
                elif "expect" in st:
                    while len(got) < st["expect"]:
                        take()
                elif "sleep" in st:
                    time.sleep(st["sleep"])
                elif "close" in st:
                    c.send_close(int(st["close"]))
                elif "drop" in st:
                    sock.shutdown(socket.SHUT_RDWR)
                    return
            while True:
                take()
        elif path == "/lastclose":
            with lock:
                v = closes.get(q.get("of"), "none")
            c.send_frame(OP_TEXT, str(v).encode())
            c.echo()
        else:
            c.send_close(1008, b"unknown path")
            c.wait_close()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


def watch(pid):
    while True:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)


def main():
    srv = Server(("127.0.0.1", 0), Handler)
    srv.tls = None
    if len(sys.argv) >= 5 and sys.argv[2] == "--tls":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[3], sys.argv[4])
        if len(sys.argv) >= 7 and sys.argv[5] == "--client-ca":
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(sys.argv[6])
        srv.tls = ctx
    threading.Thread(target=watch, args=(int(sys.argv[1]),), daemon=True).start()
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()

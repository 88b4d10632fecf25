#!/usr/bin/python3
# needs: docker, python3:botocore
"""The SSM data channel of scripts/aws-standin, seen by a client written here from the protocol notes
(docs/aws-protocol.md section 1) and checked against the official frame vectors
(tests/data/ssm/vectors.jsonl). botocore creates the cluster, task and ExecuteCommand session;
a websocket client and ClientMessage codec of this file (stdlib only) then talk to the agent side.

Needs python3-botocore, a dockerd and the local image sbx-busybox:latest. Prints TAP; exits 1 on failure.
"""

import base64
import hashlib
import http.client
import importlib.machinery
import importlib.util
import json
import os
import secrets
import signal
import socket
import struct
import random
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standin_common  # noqa: E402
from standin_common import Tap, docker  # noqa: E402
import uuid

try:
    import botocore.session
    from botocore.exceptions import ClientError
except ImportError:
    print("not ok 1 - botocore missing (apt-get install python3-botocore)")
    print("1..1")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "..", "scripts", "aws-standin")
VECTORS = os.path.join(HERE, "data", "ssm", "vectors.jsonl")
AK, SK = "AKIDSTANDIN", "standin-secret"
REGION = "us-west-2"
IMAGE = os.environ.get("SBX_TEST_BUSYBOX", "sbx-busybox:latest")
CLUSTER = "sbx-ssm"
PING_INTERVAL = 0.5

T = Tap()
ok = T.ok
diag = T.diag



# ---------------- ClientMessage codec (this test's own, from the byte layout)
SYN, FIN = 1, 2


def cm_build(mtype, seq, flags, ptype, payload, mid=None, created=None):
    mid = uuid.UUID(mid) if isinstance(mid, str) else (mid or uuid.uuid4())
    created = created if created is not None else int(time.time() * 1000)
    out = bytearray()
    out += (116).to_bytes(4, "big")
    out += mtype.encode().ljust(32, b" ")
    out += (1).to_bytes(4, "big")
    out += created.to_bytes(8, "big")
    out += seq.to_bytes(8, "big", signed=True)
    out += flags.to_bytes(8, "big")
    raw = mid.bytes
    out += raw[8:] + raw[:8]
    out += hashlib.sha256(payload).digest()
    out += ptype.to_bytes(4, "big")
    out += len(payload).to_bytes(4, "big")
    out += payload
    return bytes(out)


def cm_parse(b):
    """Strict: 120-byte header, HeaderLength 116, exact length, digest, non-empty type, CreatedDate."""
    if len(b) < 120:
        raise ValueError(f"short frame ({len(b)} bytes)")
    if int.from_bytes(b[0:4], "big") != 116:
        raise ValueError("HeaderLength is not 116")
    mtype = b[4:36].strip(b"\0").strip().decode()
    if not mtype:
        raise ValueError("empty MessageType")
    created = int.from_bytes(b[40:48], "big")
    if created == 0:
        raise ValueError("CreatedDate 0")
    plen = int.from_bytes(b[116:120], "big")
    if len(b) != 120 + plen:
        raise ValueError("length mismatch")
    payload = b[120:]
    if hashlib.sha256(payload).digest() != b[80:112]:
        raise ValueError("digest mismatch")
    return {
        "message_type": mtype,
        "schema_version": int.from_bytes(b[36:40], "big"),
        "created_date_ms": created,
        "sequence_number": int.from_bytes(b[48:56], "big", signed=True),
        "flags": int.from_bytes(b[56:64], "big"),
        "message_id": str(uuid.UUID(bytes=b[72:80] + b[64:72])),
        "payload_type": int.from_bytes(b[112:116], "big"),
        "payload": payload,
    }


def ack_json(mtype, mid, seq):
    return json.dumps({"AcknowledgedMessageType": mtype, "AcknowledgedMessageId": mid,
                       "AcknowledgedMessageSequenceNumber": seq, "IsSequentialMessage": True},
                      separators=(",", ":")).encode()


# ---------------- websocket client (RFC 6455, client side)
class WS:
    def __init__(self, url, timeout=15, upgrade=True):
        u = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.key = base64.b64encode(secrets.token_bytes(16)).decode()
        req = f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
        if upgrade:
            req += (f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {self.key}\r\n"
                    f"Sec-WebSocket-Version: 13\r\n")
        self.sock.sendall((req + "\r\n").encode())
        while b"\r\n\r\n" not in self.buf:
            d = self.sock.recv(4096)
            if not d:
                break
            self.buf += d
        head, _, rest = bytes(self.buf).partition(b"\r\n\r\n")
        self.buf = bytearray(rest)
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines[0] else 0
        self.headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.accept_ok = self.headers.get("sec-websocket-accept") == base64.b64encode(
            hashlib.sha1((self.key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.wlock = threading.Lock()

    def send(self, op, payload=b"", fin=True, mask=True):
        h = bytearray([(0x80 if fin else 0) | op])
        n_ = len(payload)
        mbit = 0x80 if mask else 0
        if n_ < 126:
            h.append(mbit | n_)
        elif n_ < 1 << 16:
            h.append(mbit | 126)
            h += n_.to_bytes(2, "big")
        else:
            h.append(mbit | 127)
            h += n_.to_bytes(8, "big")
        if mask:
            k = secrets.token_bytes(4)
            h += k
            payload = bytes(c ^ k[i % 4] for i, c in enumerate(payload))
        with self.wlock:
            self.sock.sendall(bytes(h) + payload)

    def _need(self, k):
        while len(self.buf) < k:
            d = self.sock.recv(65536)
            if not d:
                raise EOFError
            self.buf += d
        out = bytes(self.buf[:k])
        del self.buf[:k]
        return out

    def recv_frame(self):
        """(fin, opcode, payload); server frames must be unmasked."""
        b0, b1 = self._need(2)
        if b1 & 0x80:
            raise ValueError("server frame is masked")
        ln = b1 & 0x7F
        if ln == 126:
            ln = int.from_bytes(self._need(2), "big")
        elif ln == 127:
            ln = int.from_bytes(self._need(8), "big")
        return bool(b0 & 0x80), b0 & 0x0F, self._need(ln)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ---------------- SSM client
class Client:
    """Talks the client side of the data channel in a reader thread. ack: True, False or fn(msg) -> bool."""

    def __init__(self, session, ack=True, token=None, open_frame=None, send_open=True, resend=True, start=None):
        self.ws = WS(session["streamUrl"])
        self.status = self.ws.status
        self.ack = ack
        self.cond = threading.Condition()
        self.t0 = time.monotonic()
        self.arrivals = []        # (t, msg) for every output_stream_data, duplicates included
        self.raw = {}             # seq -> list of raw frames
        self.delivered = []       # in-order (payload_type, payload)
        self.stream = bytearray()  # in-order PayloadType 1 bytes
        self.expected = 0
        self.ahead = {}
        self.agent_acks = []      # parsed acks of our input
        self.acks_sent = 0
        self.closed = None        # (t, msg, payload dict) of channel_closed
        self.ws_close = None      # (t, code, reason)
        self.eof = None           # t of EOF without a close frame
        self.pings = []
        self.pongs = []
        self.errors = []
        self.other = []
        self.my_seq = 0
        self.pending = {}         # our seq -> [frame, last_sent, sends]
        self.sends = {}           # our seq -> number of times sent
        self.resend = resend
        if self.status != 101:
            return
        if send_open:
            of = open_frame if open_frame is not None else {
                "MessageSchemaVersion": "1.0", "RequestId": str(uuid.uuid4()),
                "TokenValue": token if token is not None else session["tokenValue"],
                "ClientId": str(uuid.uuid4()), "ClientVersion": "1.2.0.0"}
            self.ws.send(0x1, json.dumps(of).encode())
        if start if start is not None else send_open:
            self.start()

    def start(self):
        threading.Thread(target=self._reader, daemon=True).start()
        threading.Thread(target=self._resender, daemon=True).start()

    def now(self):
        return time.monotonic() - self.t0

    def _reader(self):
        frag = None
        while True:
            try:
                fin, op, data = self.ws.recv_frame()
            except (EOFError, OSError):
                with self.cond:
                    if self.ws_close is None:
                        self.eof = self.now()
                    self.cond.notify_all()
                return
            except ValueError as e:
                self.errors.append(str(e))
                return
            if op == 0x9:
                self.pings.append(data)
                try:
                    self.ws.send(0xA, data)
                except OSError:
                    pass
                continue
            if op == 0xA:
                with self.cond:
                    self.pongs.append(data)
                    self.cond.notify_all()
                continue
            if op == 0x8:
                code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
                with self.cond:
                    self.ws_close = (self.now(), code, data[2:].decode("utf-8", "replace"))
                    self.cond.notify_all()
                try:
                    self.ws.send(0x8, data[:2])
                except OSError:
                    pass
                # read until the server closes TCP
                try:
                    while self.ws.sock.recv(65536):
                        pass
                except OSError:
                    pass
                return
            if op in (0x1, 0x2) and not fin:
                frag = [data]
                continue
            if op == 0x0:
                frag.append(data)
                if not fin:
                    continue
                data = b"".join(frag)
            try:
                m = cm_parse(data)
            except ValueError as e:
                self.errors.append(f"bad frame from the agent: {e}")
                continue
            with self.cond:
                self._handle(m, data)
                self.cond.notify_all()

    def _send_ack(self, m):
        self.acks_sent += 1
        self.ws.send(0x2, cm_build("acknowledge", 0, SYN | FIN, 0,
                                   ack_json("output_stream_data", m["message_id"], m["sequence_number"])))

    def _handle(self, m, raw):
        t = m["message_type"]
        if t == "output_stream_data":
            seq = m["sequence_number"]
            self.arrivals.append((self.now(), m))
            self.raw.setdefault(seq, []).append(raw)
            do_ack = self.ack(m) if callable(self.ack) else self.ack
            if seq == self.expected:
                self._deliver(m)
                self.expected += 1
                while self.expected in self.ahead:
                    self._deliver(self.ahead.pop(self.expected))
                    self.expected += 1
            elif seq > self.expected:
                self.ahead.setdefault(seq, m)
            if do_ack:
                self._send_ack(m)  # duplicates are re-acked too
        elif t == "acknowledge":
            a = json.loads(m["payload"])
            self.agent_acks.append((m, a))
            self.pending.pop(a["AcknowledgedMessageSequenceNumber"], None)
        elif t == "channel_closed":
            self.closed = (self.now(), m, json.loads(m["payload"]))
        else:
            self.other.append(m)

    def _deliver(self, m):
        self.delivered.append((m["payload_type"], m["payload"]))
        if m["payload_type"] == 1:
            self.stream += m["payload"]

    def _resender(self):
        while not self.done():
            time.sleep(0.05)
            if not self.resend:
                continue
            with self.cond:
                for seq, p in list(self.pending.items()):
                    if time.monotonic() - p[1] > 0.2:
                        p[1] = time.monotonic()
                        self.sends[seq] += 1
                        try:
                            self.ws.send(0x2, p[0])
                        except OSError:
                            return

    def send_input(self, payload, ptype=1, seq=None):
        with self.cond:
            if seq is None:
                seq = self.my_seq
                self.my_seq += 1
            frame = cm_build("input_stream_data", seq, 0, ptype, payload)
            self.pending[seq] = [frame, time.monotonic(), 1]
            self.sends[seq] = self.sends.get(seq, 0) + 1
        self.ws.send(0x2, frame)
        return cm_parse(frame)

    def done(self):
        return self.ws_close is not None or self.eof is not None or bool(self.errors)

    def wait(self, pred, timeout=15):
        end = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
            return True

    def wait_end(self, timeout=15):
        return self.wait(self.done, timeout)

    def text(self):
        return bytes(self.stream)

    def seqs(self):
        return [m["sequence_number"] for _, m in self.arrivals]

    def close(self):
        self.ws.close()


# ---------------- helpers around the stand-in
proc = None
url = None
ecs = None
task_arn = None
container_id = None


def http_json(method, path, obj=None):
    return standin_common.http_json(url, method, path, obj)


def set_faults(**kw):
    return http_json("POST", "/_standin/faults", kw)


def session_state(sid):
    for s in http_json("GET", "/_standin/state")["sessions"]:
        if s["sessionId"] == sid:
            return s
    return None


def wait_state(sid, pred, timeout=10):
    end = time.time() + timeout
    s = session_state(sid)
    while not pred(s) and time.time() < end:
        time.sleep(0.1)
        s = session_state(sid)
    return s


def exec_cmd(command, task=None, cluster=CLUSTER):
    r = ecs.execute_command(cluster=cluster, task=task or task_arn, container="sandbox", interactive=True,
                            command=command)
    return r["session"]


def setup(cluster=CLUSTER, **kw):
    ecs.create_cluster(clusterName=cluster, **kw)
    ecs.register_task_definition(
        family="sbx-ssm-test", networkMode="awsvpc", requiresCompatibilities=["FARGATE"], cpu="256", memory="512",
        containerDefinitions=[{"name": "sandbox", "image": IMAGE, "essential": True, "command": ["sleep", "600"],
                               "linuxParameters": {"initProcessEnabled": True}}])


def run_task(cluster=CLUSTER):
    r = ecs.run_task(cluster=cluster, taskDefinition="sbx-ssm-test", launchType="FARGATE", enableExecuteCommand=True,
                     networkConfiguration={"awsvpcConfiguration": {"subnets": ["subnet-1"]}})
    arn = r["tasks"][0]["taskArn"]
    deadline = time.time() + 30
    t = None
    while time.time() < deadline:
        t = ecs.describe_tasks(cluster=cluster, tasks=[arn])["tasks"][0]
        if t["lastStatus"] in ("RUNNING", "STOPPED"):
            break
        time.sleep(0.2)
    return arn, t


def load_standin_module():
    sys.dont_write_bytecode = True
    loader = importlib.machinery.SourceFileLoader("aws_standin", STANDIN)
    spec = importlib.util.spec_from_loader("aws_standin", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def simple(command, **kw):
    """Run one command through a fresh session with an acking client; returns (session, client, state)."""
    s = exec_cmd(command)
    c = Client(s, **kw)
    c.wait_end()
    st = wait_state(s["sessionId"], lambda x: x and x["status"] not in ("open", "running", "exited"))
    c.close()
    return s, c, st


# ---------------- the checks
def check_vectors():
    vecs = [json.loads(line) for line in open(VECTORS) if line.strip()]
    acc = [v for v in vecs if v["expect"] == "accept"]
    rej = [v for v in vecs if v["expect"] == "reject"]
    ok(len(acc) >= 20 and len(rej) >= 5, f"vectors: {len(acc)} accept, {len(rej)} reject")

    # this file's codec first, so that the live checks below stand on a verified reader
    bad = []
    for v in acc:
        fr = bytes.fromhex(v["frame_hex"])
        try:
            m = cm_parse(fr)
        except ValueError as e:
            bad.append((v["name"], str(e)))
            continue
        want = (v["message_type"], v["sequence_number"], v["flags"], v["message_id"], v["payload_type"],
                bytes.fromhex(v["payload_hex"]), v["created_date_ms"])
        got = (m["message_type"], m["sequence_number"], m["flags"], m["message_id"], m["payload_type"],
               m["payload"], m["created_date_ms"])
        if got != want:
            bad.append((v["name"], got))
        if cm_build(v["message_type"], v["sequence_number"], v["flags"], v["payload_type"],
                    bytes.fromhex(v["payload_hex"]), v["message_id"], v["created_date_ms"]) != fr:
            bad.append((v["name"], "test encoder differs"))
    for v in rej:
        try:
            cm_parse(bytes.fromhex(v["frame_hex"]))
            bad.append((v["name"], "accepted"))
        except ValueError:
            pass
    ok(not bad, "the test's own codec reads, writes and rejects the official vectors", bad)

    mod = load_standin_module()
    bad = []
    for v in acc:
        fr = bytes.fromhex(v["frame_hex"])
        enc = mod.ssm_encode(v["message_type"], v["sequence_number"], v["flags"], v["payload_type"],
                             bytes.fromhex(v["payload_hex"]), message_id=v["message_id"],
                             created_ms=v["created_date_ms"], schema_version=v["schema_version"])
        if enc != fr:
            bad.append((v["name"], enc.hex()[:80]))
    ok(not bad, f"stand-in encoder is byte-identical to the plugin's serializer on {len(acc)} vectors", bad)

    bad = []
    for v in acc:
        try:
            m = mod.ssm_decode(bytes.fromhex(v["frame_hex"]))
            if (m["message_type"], m["sequence_number"], m["flags"], m["message_id"], m["payload_type"],
                    m["payload"]) != (v["message_type"], v["sequence_number"], v["flags"], v["message_id"],
                                      v["payload_type"], bytes.fromhex(v["payload_hex"])):
                bad.append((v["name"], m))
        except Exception as e:
            bad.append((v["name"], repr(e)))
    for v in rej:
        try:
            mod.ssm_decode(bytes.fromhex(v["frame_hex"]))
            bad.append((v["name"], "accepted"))
        except mod.FrameError:
            pass
    ok(not bad, "stand-in decoder accepts every accept vector and refuses every reject vector", bad)

    # the agent's ack layout against the plugin-made ack vector
    v = next(x for x in acc if x["name"] == "ack_output_seq0")
    enc = mod.ssm_encode("acknowledge", 0, 3, 0, mod.ack_payload("output_stream_data", "6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c12", 0),
                         message_id=v["message_id"], created_ms=v["created_date_ms"])
    ok(enc.hex() == v["frame_hex"], "stand-in ack payload (key order, no spaces) matches the plugin's ack vector")
    v = next(x for x in acc if x["name"] == "handshake_complete")
    enc = mod.ssm_encode("output_stream_data", 1, 0, 7, mod.go_json({"HandshakeTimeToComplete": 52000000,
                                                                      "CustomerMessage": ""}),
                         message_id=v["message_id"], created_ms=v["created_date_ms"])
    ok(enc.hex() == v["frame_hex"], "stand-in HandshakeComplete JSON matches the plugin's vector")

    # RTO arithmetic (TCP style): hand-computed values
    r = mod.Rtt()
    seq = [r.rto]
    seq.append(r.sample(0.05))   # rttvar .0125, rtt .09375 -> .09375 + .05
    seq.append(r.sample(0.001))  # rttvar .75*.0125+.25*.09275, rtt .875*.09375+.125*.001
    rv = 0.75 * 0.0125 + 0.25 * abs(0.09375 - 0.001)
    rt = 0.875 * 0.09375 + 0.125 * 0.001
    r2 = mod.Rtt()
    r2.sample(3.0)
    r3 = mod.Rtt()
    for _ in range(200):
        r3.sample(0.0)
    ok(abs(seq[0] - 0.2) < 1e-12 and abs(seq[1] - 0.14375) < 1e-12 and abs(seq[2] - (rt + 4 * rv)) < 1e-12
       and r2.rto == 1.0 and abs(r3.rto - 0.010) < 1e-6,
       f"RTO: 200 ms first, TCP update, 1 s cap, 10 ms floor of the variance term ({seq}, {r2.rto}, {r3.rto})")
    return mod


def start_standin(*flags):
    global proc, url, ecs
    proc = subprocess.Popen([STANDIN, "--port", "0", *flags], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    ecs = botocore.session.get_session().create_client(
        "ecs", endpoint_url=url, region_name=REGION, aws_access_key_id=AK, aws_secret_access_key=SK)
    return url


def main():
    global proc, url, ecs, task_arn, container_id
    check_vectors()

    start_standin("--ws-ping-interval", str(PING_INTERVAL))
    ok(url.startswith("http://127.0.0.1:"), f"stand-in prints its URL ({url!r})")
    if not url:
        return
    setup()
    task_arn, t = run_task()
    container_id = t["containers"][0].get("runtimeId")
    ok(t["lastStatus"] == "RUNNING" and container_id, "task RUNNING (sleep 600)", t)

    # ---------------- upgrade rules
    s = exec_cmd("echo hi")
    w = WS(url.replace("http", "ws") + "/ssm/ecs-execute-command-000000000000000000")
    ok(w.status == 404, f"unknown session -> HTTP {w.status} before any upgrade")
    w.close()
    w = WS(s["streamUrl"], upgrade=False)
    ok(w.status == 400, f"plain GET of a session URL -> HTTP {w.status}")
    w.close()

    # ---------------- echo hi
    c = Client(s)
    ok(c.status == 101 and c.ws.accept_ok, "websocket upgrade: 101 with the right Sec-WebSocket-Accept")
    c.wait_end()
    first = c.arrivals[0][1] if c.arrivals else None
    ok(c.text() == b"hi\r\n", f"'echo hi' comes back as 'hi\\r\\n' through the PTY ({c.text()!r})")
    ok(first and first["sequence_number"] == 0 and first["flags"] == SYN and first["payload_type"] == 1
       and first["schema_version"] == 1, "first output: seq 0, SYN flag, PayloadType 1, schema 1", first)
    cl = c.closed[2] if c.closed else {}
    ok(c.closed and cl.get("MessageType") == "channel_closed" and cl.get("SessionId") == s["sessionId"]
       and cl.get("Output") == "" and cl.get("SchemaVersion") == 1
       and cl.get("DestinationId", "").startswith(f"ecs:{CLUSTER}_") and cl.get("MessageId") == c.closed[1]["message_id"]
       and c.closed[1]["sequence_number"] == 0 and c.closed[1]["flags"] == 3,
       "channel_closed after the output: payload JSON and header as in the vectors", c.closed and c.closed[2])
    ok(c.ws_close and c.ws_close[1] == 1000 and c.closed and c.closed[0] <= c.ws_close[0],
       f"then a websocket close 1000 ({c.ws_close})")
    ok(c.closed and first and c.closed[0] - c.arrivals[0][0] < 1.0,
       f"output acked: channel_closed without the 2 s flush wait "
       f"({c.closed and c.arrivals and round(c.closed[0] - c.arrivals[0][0], 3)} s after the output)")
    ok(not c.errors, "every frame from the agent passes the strict reader (length, digest)", c.errors)
    st = wait_state(s["sessionId"], lambda x: x["status"] == "closed")
    ok(st["status"] == "closed" and st["exitCode"] == 0 and st["resends"] == 0 and st["acksReceived"] >= 1
       and st["framesSent"] == 1 and st["execId"],
       f"state: closed, exit 0, 1 frame, acked, resends {st['resends']}", st)
    code, ex = docker("GET", f"/exec/{st['execId']}/json")
    pc = ex.get("ProcessConfig", {}) if isinstance(ex, dict) else {}
    ok(code == 200 and pc.get("tty") is True and pc.get("entrypoint") == "echo" and pc.get("arguments") == ["hi"],
       "Docker exec: TTY, command split by shlex and run without a shell", (code, pc))
    w = WS(s["streamUrl"])
    ok(w.status == 409, f"a session opens once: second upgrade -> HTTP {w.status}")
    w.close()

    _, c, st = simple("env")
    env = c.text().decode()
    ok("TERM=xterm-256color\r\n" in env and "LANG=C.UTF-8\r\n" in env,
       "exec env has TERM=xterm-256color and LANG=C.UTF-8 (the image has no LANG)", env)

    # ---------------- exit codes
    _, c, st = simple("sh -c 'exit 3'")
    ok(c.closed and c.text() == b"" and st["exitCode"] == 3 and st["status"] == "closed",
       f"sh -c 'exit 3': channel_closed, no output, exit code 3 in state ({st['exitCode']})")
    _, c, st = simple("no-such-binary")
    ok(c.closed and b"executable file not found" in c.text() and st["exitCode"] in (126, 127),
       f"missing binary: Docker's error text as output, exit {st['exitCode']}", c.text())

    # ---------------- tokens
    s = exec_cmd("echo never")
    c = Client(s, token="not-the-token")
    c.wait_end()
    st = session_state(s["sessionId"])
    ok(c.ws_close and c.ws_close[1] == 1008 and "TokenValue" in c.ws_close[2] and not c.arrivals,
       f"wrong TokenValue -> close 1008 '{c.ws_close and c.ws_close[2]}'")
    ok(st["status"] == "rejected" and st["rejectReason"] and st["execId"] is None, "state: rejected, nothing run", st)
    c.close()
    s = exec_cmd("echo never")
    c = Client(s, open_frame={"MessageSchemaVersion": "1.0", "RequestId": str(uuid.uuid4())})
    c.wait_end()
    ok(c.ws_close and c.ws_close[1] == 1008 and session_state(s["sessionId"])["status"] == "rejected",
       f"open frame without TokenValue -> close 1008 ({c.ws_close})")
    c.close()
    s = exec_cmd("echo never")
    c = Client(s, send_open=False)
    c.ws.send(0x2, cm_build("input_stream_data", 0, 0, 1, b"x"))
    c.start()
    c.wait_end()
    ok(c.ws_close and c.ws_close[1] == 1008, f"binary message before the open frame -> close 1008 ({c.ws_close})")
    c.close()

    # ---------------- resends
    s = exec_cmd("echo hi")
    c = Client(s, ack=False)
    c.wait_end(timeout=20)
    zero = [t for t, m in c.arrivals if m["sequence_number"] == 0]
    ok(len(zero) >= 3 and all(r == c.raw[0][0] for r in c.raw[0]),
       f"no acks: seq 0 is resent, byte for byte the same frame ({len(zero)} copies)")
    gaps = [round(b - a, 3) for a, b in zip(zero, zero[1:])]
    ok(gaps and min(gaps) >= 0.18 and max(gaps) < 0.6, f"resend spacing follows RTO 200 ms + 100 ms tick ({gaps})")
    ok(c.closed and 1.8 <= c.closed[0] - zero[0] < 4,
       f"process done, nothing acked: channel_closed after the 2 s flush wait ({c.closed and round(c.closed[0] - zero[0], 2)} s)")
    st = wait_state(s["sessionId"], lambda x: x["status"] == "closed")
    ok(st["resends"] == len(zero) - 1 and st["resends"] >= 2 and st["framesSent"] == len(zero),
       f"state counts the resends ({st['resends']}) and frames ({st['framesSent']})", st)
    c.close()

    # only the oldest unacked message is resent: seq 1 waits until seq 0 is acked (on its 3rd copy)
    s = exec_cmd("sh -c 'echo a; sleep 1.5; echo b'")
    holder = {}

    def ack_zero_late(m):
        c_ = holder["c"]
        return m["sequence_number"] == 0 and sum(1 for _, x in c_.arrivals if x["sequence_number"] == 0) >= 3

    c = Client(s, ack=ack_zero_late, start=False)
    holder["c"] = c
    c.start()
    c.wait_end(timeout=20)
    q = c.seqs()
    third0 = [i for i, x in enumerate(q) if x == 0][2] if q.count(0) >= 3 else len(q)
    ones = [i for i, x in enumerate(q) if x == 1]
    ok(q.count(0) == 3 and len(ones) >= 2 and all(i > third0 for i in ones[1:]) and c.text() == b"a\r\nb\r\n",
       f"only the oldest unacked message is resent; seq 1 only after seq 0 is acked ({q})")
    c.close()

    # ---------------- input
    s = exec_cmd("cat")
    c = Client(s)
    c.send_input(json.dumps({"cols": 100, "rows": 30}).encode(), ptype=3)
    sent = c.send_input(b"hello\r")
    got = c.wait(lambda: c.text().count(b"hello\r\n") >= 2, 10)
    ok(got, f"cat: input reaches the process (PTY echo + cat's copy: {c.text()!r})")
    ok(c.wait(lambda: not c.pending, 5), "every input message is acked")
    a = [(m, p) for m, p in c.agent_acks if p["AcknowledgedMessageSequenceNumber"] == sent["sequence_number"]]
    ok(a and a[0][0]["sequence_number"] == 0 and a[0][0]["flags"] == 3 and a[0][0]["payload_type"] == 0
       and a[0][1] == {"AcknowledgedMessageType": "input_stream_data", "AcknowledgedMessageId": sent["message_id"],
                       "AcknowledgedMessageSequenceNumber": sent["sequence_number"], "IsSequentialMessage": True}
       and list(a[0][1]) == ["AcknowledgedMessageType", "AcknowledgedMessageId", "AcknowledgedMessageSequenceNumber",
                             "IsSequentialMessage"],
       "agent ack: seq 0, flags 3, PayloadType 0, JSON keys in Go's order, our MessageId", a and a[0][1])
    # a duplicate of an already delivered message is re-acked and not written again
    before = len(c.agent_acks)
    dup = cm_build("input_stream_data", sent["sequence_number"], 0, 1, b"hello\r")
    c.ws.send(0x2, dup)
    ok(c.wait(lambda: len(c.agent_acks) > before, 5)
       and c.agent_acks[-1][1]["AcknowledgedMessageId"] == cm_parse(dup)["message_id"],
       "a duplicate input (seq below the expected one) is re-acked")
    # ahead-of-order: seq+2 first, then seq+1; the process must see them in order
    base = c.my_seq
    c.my_seq += 2
    c.send_input(b"two\r", seq=base + 1)
    c.wait(lambda: base + 1 not in c.pending, 5)
    c.send_input(b"one\r", seq=base)
    # PTY echo comes at once, cat's copy when it reads: either way "one" must come before "two" twice
    c.wait(lambda: c.text().count(b"two\r\n") >= 2, 10)
    lines = c.text().split(b"\r\n")[2:-1]
    ok(lines in ([b"one", b"two", b"one", b"two"], [b"one", b"one", b"two", b"two"]),
       "an ahead-of-order input is acked, held and delivered after the gap is filled", c.text())
    c.send_input(b"\x04")
    c.wait_end()
    st = wait_state(s["sessionId"], lambda x: x["status"] == "closed")
    ok(st["duplicateInputs"] >= 1 and st["inputAhead"] >= 1 and st["inputBytes"] == len(b"hello\rtwo\rone\r\x04")
       and st["exitCode"] == 0 and c.closed,
       f"state: duplicate re-acked not re-written, ahead buffered, inputBytes {st['inputBytes']}, EOF ends cat", st)
    c.close()

    s = exec_cmd("head -c 5")
    c = Client(s)
    c.send_input(b"abcdefgh\r")
    c.wait_end()
    ok(c.text().endswith(b"abcdefgh\r\nabcde") and c.closed,
       f"head -c 5 reads 5 bytes of the input and exits ({c.text()!r})")
    c.close()

    # size before the command is attached: not acked, so the client must resend; then stty sees it
    set_faults(exec_start_delay=0.5)
    s = exec_cmd("sh -c 'sleep 0.5; stty size'")
    c = Client(s)
    c.send_input(json.dumps({"cols": 132, "rows": 40}).encode(), ptype=3)
    c.wait_end()
    set_faults(exec_start_delay=0)
    st = wait_state(s["sessionId"], lambda x: x["status"] == "closed")
    ok(c.text() == b"40 132\r\n", f"Size {{cols 132, rows 40}} resizes the exec TTY (stty size: {c.text()!r})")
    ok(st["inputNotReady"] >= 1 and c.sends.get(0, 0) >= 2 and st["resizes"] == 1
       and st["lastSize"] == {"cols": 132, "rows": 40},
       f"input before the exec was attached was not acked: client sent it {c.sends.get(0)} times", st)
    c.close()

    # ---------------- UTF-8 chunking
    _, c, st = simple("sh -c \"printf '\\342\\202\\254%.0s' $(seq 1000)\"")
    payloads = [m["payload"] for _, m in sorted(c.arrivals, key=lambda x: x[1]["sequence_number"])]
    whole = []
    for p in payloads:
        try:
            p.decode("utf-8")
            whole.append(True)
        except UnicodeDecodeError:
            whole.append(False)
    ok(c.text() == "€".encode() * 1000, f"3000 bytes of 3-byte UTF-8 arrive complete ({len(c.text())} bytes)")
    ok(payloads and max(map(len, payloads)) <= 1024 and len(payloads) >= 3,
       f"chunks of at most 1024 bytes: {[len(p) for p in payloads]}")
    ok(all(whole), "no chunk splits a UTF-8 sequence", [len(p) for p in payloads])

    # ---------------- faults: dup
    set_faults(dup_frames=True)
    s = exec_cmd("echo hi")
    c = Client(s)
    c.wait_end()
    set_faults(dup_frames=False)
    st = wait_state(s["sessionId"], lambda x: x["status"] == "closed")
    ok(c.seqs() == [0, 0] and c.text() == b"hi\r\n" and st["framesSent"] == 2 * st["outputMessages"],
       f"dup_frames: every output frame twice ({c.seqs()}), client output once", st)
    c.close()

    # reorder
    set_faults(reorder_frames=True)
    s = exec_cmd("sh -c \"head -c 5000 /dev/zero | tr '\\\\0' x\"")
    c = Client(s)
    c.wait_end()
    set_faults(reorder_frames=False)
    firsts = []
    for q in c.seqs():
        if q not in firsts:
            firsts.append(q)
    pairs_ok = all(firsts.index(2 * k + 1) < firsts.index(2 * k) for k in range(len(firsts) // 2))
    ok(len(firsts) >= 4 and sorted(firsts) == list(range(len(firsts))) and pairs_ok and firsts[:2] == [1, 0],
       f"reorder_frames: adjacent pairs swapped, none lost ({firsts})")
    ok(c.text() == b"x" * 5000 and c.closed, "reorder_frames: the client reassembles the output in order")
    c.close()

    # drop_ws_after
    set_faults(drop_ws_after=2)
    s = exec_cmd("sh -c 'for i in 1 2 3 4 5 6 7 8; do echo line$i; sleep 0.25; done'")
    c = Client(s)
    ok(c.wait(lambda: c.eof is not None, 10) and c.ws_close is None and len(c.arrivals) == 2,
       f"drop_ws_after=2: 2 output frames, then TCP closed without a close frame ({c.seqs()}, {c.ws_close})")
    st = wait_state(s["sessionId"], lambda x: x["clientGone"])
    code, ex = docker("GET", f"/exec/{st['execId']}/json")
    ok(st["dropped"] and st["clientGone"] and st["status"] == "running" and code == 200 and ex["Running"],
       "drop_ws_after: session marked dropped, the process keeps running", st)
    st = wait_state(s["sessionId"], lambda x: x["status"] == "exited", timeout=10)
    ok(st["status"] == "exited" and st["exitCode"] == 0 and st["discardedBytes"] > 0,
       f"... and finishes on its own; its later output was read and discarded ({st['discardedBytes']} bytes)")
    c.close()
    set_faults(agent_read_delay=0)  # three separate frames: no 1 s wait gathering them into one
    s = exec_cmd("sh -c 'echo a; sleep 0.3; echo b; sleep 0.3; echo c'")
    c = Client(s)
    c.wait_end()
    ok(len(c.arrivals) == 2 and c.eof is not None, "drop_ws_after applies to each new session while set")
    set_faults(agent_read_delay=1)
    set_faults(drop_ws_after=0)
    c.close()

    # drop_acks
    set_faults(drop_acks=3)
    s = exec_cmd("echo hi")
    c = Client(s)
    c.wait_end()
    set_faults(drop_acks=0)
    st = wait_state(s["sessionId"], lambda x: x["status"] == "closed")
    ok(st["acksDropped"] == 3 and st["resends"] >= 3 and c.seqs().count(0) >= 4 and c.text() == b"hi\r\n"
       and c.closed, f"drop_acks=3: 3 acks ignored, seq 0 resent {st['resends']} times until an ack counts", st)
    c.close()

    # handshake session_type
    set_faults(handshake="session_type")
    s = exec_cmd("echo hi")
    c = Client(s)
    got = c.wait(lambda: len(c.delivered) >= 1, 10)
    hs = c.arrivals[0][1] if c.arrivals else {}
    req = json.loads(hs.get("payload") or b"{}")
    ok(got and hs["payload_type"] == 5 and hs["sequence_number"] == 0 and hs["flags"] == SYN
       and req.get("RequestedClientActions") == [{"ActionType": "SessionType", "ActionParameters": {
           "SessionType": "InteractiveCommands", "Properties": None}}],
       "handshake session_type: HandshakeRequest (type 5, seq 0, SYN) with SessionType InteractiveCommands", req)
    junk = c.send_input(b"junk\r")
    c.wait(lambda: not c.pending, 5)
    time.sleep(0.3)
    st = session_state(s["sessionId"])
    ok(not c.pending and st["inputDiscarded"] == 1 and st["execId"] is None and st["status"] == "open"
       and len(c.delivered) == 1,
       "input during the handshake is acked and discarded; the command has not started", st)
    c.send_input(json.dumps({"ClientVersion": "1.2.0.0", "ProcessedClientActions": [
        {"ActionType": "SessionType", "ActionStatus": 1, "ActionResult": None, "Error": ""}], "Errors": None},
        separators=(",", ":")).encode(), ptype=6)
    c.wait_end()
    kinds = [(pt, p) for pt, p in c.delivered]
    hc = json.loads(kinds[1][1]) if len(kinds) > 1 and kinds[1][0] == 7 else {}
    ok([k[0] for k in kinds] == [5, 7, 1] and isinstance(hc.get("HandshakeTimeToComplete"), int)
       and hc["HandshakeTimeToComplete"] > 0 and "CustomerMessage" in hc and c.text() == b"hi\r\n" and c.closed,
       f"HandshakeResponse accepted -> HandshakeComplete (type 7), then the output ({[k[0] for k in kinds]})", hc)
    c.close()

    # handshake session_type refused by the client
    s = exec_cmd("echo hi")
    c = Client(s)
    c.wait(lambda: len(c.delivered) >= 1, 10)
    c.send_input(json.dumps({"ClientVersion": "x", "ProcessedClientActions": [
        {"ActionType": "SessionType", "ActionStatus": 2, "ActionResult": None, "Error": "nope"}], "Errors": None}).encode(),
        ptype=6)
    c.wait_end()
    st = wait_state(s["sessionId"], lambda x: x["status"] == "cancelled")
    ok(c.closed and "SessionType" in c.closed[2]["Output"] and c.ws_close and c.ws_close[1] == 1000
       and st["status"] == "cancelled" and st["execId"] is None and c.text() == b"",
       f"SessionType ActionStatus 2 -> session cancelled: channel_closed '{c.closed and c.closed[2]['Output']}'", st)
    c.close()

    # kms: the client declines
    set_faults(handshake="kms")
    s = exec_cmd("echo hi")
    c = Client(s)
    c.wait(lambda: len(c.delivered) >= 1, 10)
    req = json.loads(c.delivered[0][1]) if c.delivered else {}
    acts = {a["ActionType"]: a for a in req.get("RequestedClientActions", [])}
    ok(set(acts) == {"SessionType", "KMSEncryption"} and acts["KMSEncryption"]["ActionParameters"].get("KMSKeyId"),
       "handshake kms: the request also carries a KMSEncryption action with a KMSKeyId", req)
    c.send_input(json.dumps({"ClientVersion": "x", "ProcessedClientActions": [
        {"ActionType": "SessionType", "ActionStatus": 1, "ActionResult": None, "Error": ""},
        {"ActionType": "KMSEncryption", "ActionStatus": 3, "ActionResult": None, "Error": "unsupported"}],
        "Errors": None}).encode(), ptype=6)
    c.wait_end()
    st = wait_state(s["sessionId"], lambda x: x["status"] == "cancelled")
    ok(c.closed and "KMSEncryption" in c.closed[2]["Output"] and c.ws_close and c.ws_close[1] == 1000
       and st["status"] == "cancelled" and st["execId"] is None,
       f"declined KMSEncryption -> cancelled: '{c.closed and c.closed[2]['Output']}'", st)
    set_faults(handshake="none")
    c.close()

    # agent_never_connects
    set_faults(agent_never_connects=True)
    arn2, _ = run_task()
    try:
        exec_cmd("echo hi", task=arn2)
        code = None
    except ClientError as e:
        code = e.response["Error"]["Code"]
    ok(code == "TargetNotConnectedException", f"agent_never_connects: ExecuteCommand -> {code}")
    set_faults(agent_never_connects=False)
    ecs.stop_task(cluster=CLUSTER, task=arn2)

    # a cluster with executeCommandConfiguration.kmsKeyId gets the KMS handshake, as on ECS
    key = f"arn:aws:kms:{REGION}:000000000000:key/11111111-2222-4333-8444-555555555555"
    setup("sbx-ssm-kms", configuration={"executeCommandConfiguration": {"kmsKeyId": key, "logging": "DEFAULT"}})
    arn3, _ = run_task("sbx-ssm-kms")
    s = exec_cmd("echo hi", task=arn3, cluster="sbx-ssm-kms")
    c = Client(s)
    c.wait(lambda: len(c.delivered) >= 1, 10)
    req = json.loads(c.delivered[0][1]) if c.delivered else {}
    acts = {a["ActionType"]: a for a in req.get("RequestedClientActions", [])}
    c.send_input(json.dumps({"ClientVersion": "x", "ProcessedClientActions": [
        {"ActionType": "SessionType", "ActionStatus": 1}, {"ActionType": "KMSEncryption", "ActionStatus": 2}],
        "Errors": None}).encode(), ptype=6)
    c.wait_end()
    ok("KMSEncryption" in acts and acts["KMSEncryption"]["ActionParameters"]["KMSKeyId"] == key and c.closed
       and session_state(s["sessionId"])["status"] == "cancelled",
       "cluster with executeCommandConfiguration.kmsKeyId: KMS handshake with that key, declined -> cancelled", req)
    c.close()
    ecs.stop_task(cluster="sbx-ssm-kms", task=arn3)

    # StopTask under a running session: the PTY ends, the client gets channel_closed
    arn4, _ = run_task()
    s = exec_cmd("sh -c 'echo up; sleep 60'", task=arn4)
    c = Client(s)
    c.wait(lambda: b"up" in c.text(), 10)
    ecs.stop_task(cluster=CLUSTER, task=arn4)
    c.wait_end()
    st = wait_state(s["sessionId"], lambda x: x["status"] == "closed")
    ok(c.closed and c.ws_close and c.ws_close[1] == 1000 and st["status"] == "closed",
       f"StopTask during a session: channel_closed and close 1000 (exit code {st['exitCode']})", st)
    c.close()

    # ---------------- the client goes away
    s = exec_cmd("sh -c 'echo started; sleep 30'")
    c = Client(s)
    c.wait(lambda: b"started" in c.text(), 10)
    c.ws.sock.close()  # abrupt: no close frame
    st = wait_state(s["sessionId"], lambda x: x["clientGone"])
    time.sleep(0.5)
    code, ex = docker("GET", f"/exec/{st['execId']}/json")
    ok(st["clientGone"] and not st["dropped"] and session_state(s["sessionId"])["status"] == "running"
       and code == 200 and ex["Running"],
       "client dropped the TCP connection: session marked, process still running", st)
    s = exec_cmd("sh -c 'echo started; sleep 30'")
    c = Client(s)
    c.wait(lambda: b"started" in c.text(), 10)
    c.ws.send(0x8, struct.pack(">H", 1001) + b"bye")
    c.wait_end()
    st = wait_state(s["sessionId"], lambda x: x["clientGone"])
    code, ex = docker("GET", f"/exec/{st['execId']}/json")
    ok(c.ws_close and c.ws_close[1] == 1001 and st["clientClose"] == {"code": 1001, "reason": "bye"}
       and st["status"] == "running" and ex["Running"],
       f"client close 1001 is echoed; the process keeps running ({c.ws_close})", st)
    c.close()

    # ---------------- websocket details: pings, fragmentation, protocol errors
    s = exec_cmd("cat")
    c = Client(s, send_open=False)
    of = json.dumps({"MessageSchemaVersion": "1.0", "RequestId": str(uuid.uuid4()), "TokenValue": s["tokenValue"],
                     "ClientId": str(uuid.uuid4()), "ClientVersion": "1.2.0.0"}).encode()
    c.ws.send(0x1, of[:10], fin=False)
    c.ws.send(0x0, of[10:], fin=True)
    c.start()
    c.wait(lambda: session_state(s["sessionId"])["status"] == "running", 10)
    fr = cm_build("input_stream_data", 0, 0, 1, b"frag\r")
    c.my_seq = 1
    c.pending[0] = [fr, time.monotonic() + 60, 1]   # no automatic resend for this one
    c.sends[0] = 1
    c.ws.send(0x2, fr[:50], fin=False)
    c.ws.send(0x9, b"mid-message")
    c.ws.send(0x0, fr[50:100], fin=False)
    c.ws.send(0x0, fr[100:], fin=True)
    ok(c.wait(lambda: b"frag\r\nfrag\r\n" in c.text(), 10) and c.wait(lambda: b"mid-message" in c.pongs, 5),
       "fragmented open frame and input message are joined; a ping between fragments gets its pong")
    ok(c.wait(lambda: len(c.pings) >= 2, 5) and all(p == b"keepalive" for p in c.pings),
       f"agent side pings every --ws-ping-interval ({len(c.pings)} pings, payload {c.pings[:1]})")
    st = wait_state(s["sessionId"], lambda x: x["pongsReceived"] >= 2)
    ok(st["pingsSent"] >= 2 and st["pongsReceived"] >= 2 and st["pingsReceived"] >= 1,
       f"state: pingsSent {st['pingsSent']}, pongsReceived {st['pongsReceived']}")
    bad = bytearray(cm_build("input_stream_data", 1, 0, 1, b"zzz"))
    bad[-1] ^= 1
    c.ws.send(0x2, bytes(bad))
    c.wait_end()
    st = session_state(s["sessionId"])
    ok(c.ws_close and c.ws_close[1] == 1007 and "digest" in c.ws_close[2].lower() and "digest" in (st["error"] or "").lower(),
       f"a ClientMessage with a wrong digest -> close 1007 '{c.ws_close and c.ws_close[2]}'")
    c.close()

    s = exec_cmd("sleep 5")
    c = Client(s)
    c.wait(lambda: session_state(s["sessionId"])["status"] == "running", 10)
    c.ws.send(0x2, cm_build("input_stream_data", 0, 0, 1, b"x"), mask=False)
    c.wait_end()
    ok(c.ws_close and c.ws_close[1] == 1002 and "mask" in c.ws_close[2],
       f"unmasked client frame -> close 1002 '{c.ws_close and c.ws_close[2]}'")
    c.close()
    s = exec_cmd("sleep 5")
    c = Client(s)
    c.ws.send(0x2, cm_build("input_stream_data", 0, 0, 1, b"x")[:100])
    c.wait_end()
    ok(c.ws_close and c.ws_close[1] == 1007 and "120" in c.ws_close[2],
       f"truncated ClientMessage -> close 1007 '{c.ws_close and c.ws_close[2]}'")
    c.close()
    s = exec_cmd("sleep 5")
    c = Client(s)
    c.ws.send(0x1, b"{}")
    c.wait_end()
    ok(c.ws_close and c.ws_close[1] == 1003, f"text message after the open frame -> close 1003 ({c.ws_close})")
    c.close()

    # ---------------- concurrency
    N = 20
    sessions = [exec_cmd(f"sh -c 'echo start-{i}; sleep 1; echo end-{i}'") for i in range(N)]
    clients = [None] * N

    def one(i):
        clients[i] = Client(sessions[i])
        clients[i].wait_end(timeout=30)

    ths = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for th in ths:
        th.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    ecs.describe_tasks(cluster=CLUSTER, tasks=[task_arn])
    ecs.list_tasks(cluster=CLUSTER)
    ecs_time = time.monotonic() - t0
    for th in ths:
        th.join(40)
    good = [i for i in range(N) if clients[i] and clients[i].text() == f"start-{i}\r\nend-{i}\r\n".encode()
            and clients[i].closed]
    ok(len(good) == N, f"{N} concurrent sessions each get their own output and channel_closed ({len(good)}/{N})",
       [clients[i] and clients[i].text() for i in range(N) if i not in good][:3])
    # Not a speed test: the ECS calls are not held behind the 20 sessions (each of which lasts 2 s and more).
    ok(ecs_time < 10.0, f"ECS calls are answered while the sessions run ({ecs_time:.3f} s)")
    sts = [session_state(x["sessionId"]) for x in sessions]
    ok(all(x["status"] == "closed" and x["exitCode"] == 0 for x in sts),
       "state: all concurrent sessions closed with exit code 0", [x["status"] for x in sts])
    for c in clients:
        if c:
            c.close()

    # ---------------- SIGTERM cleanup
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    code, _ = docker("GET", f"/containers/{container_id}/json")
    ok(rc == 0 and code == 404, f"SIGTERM: stand-in exits ({rc}) and removes the task container (inspect -> {code})")
    proc = None

    # ---------------- the same switches as command-line flags, and the agent's read delay
    start_standin("--agent-read-delay", "1", "--handshake", "session_type", "--dup-frames", "--drop-acks", "1")
    f = http_json("GET", "/_standin/faults")
    ok(f["handshake"] == "session_type" and f["dup_frames"] is True and f["drop_acks"] == 1,
       "CLI flags set the fault switches", f)
    setup()
    task_arn, _ = run_task()
    s = exec_cmd("sh -c 'echo one; echo two'")
    c = Client(s)
    c.wait(lambda: len(c.delivered) >= 1, 10)
    c.send_input(json.dumps({"ClientVersion": "x", "ProcessedClientActions": [
        {"ActionType": "SessionType", "ActionStatus": 1}], "Errors": None}).encode(), ptype=6)
    c.wait(lambda: len(c.delivered) >= 2, 10)
    t_complete = c.now()
    c.wait_end()
    out = [(t, m) for t, m in c.arrivals if m["payload_type"] == 1]
    st = wait_state(s["sessionId"], lambda x: x["status"] == "closed")
    ok(c.text() == b"one\r\ntwo\r\n" and out and out[0][0] - t_complete >= 0.9 and st["outputMessages"] == 3,
       f"--agent-read-delay 1: the PTY is read 1 s after the start, both lines in one message "
       f"({out and round(out[0][0] - t_complete, 2)} s)", st)
    # the ack of the first copy is ignored, the ack of the duplicate counts
    ok(st["acksDropped"] == 1 and st["framesSent"] == 2 * (st["outputMessages"] + st["resends"])
       and c.seqs().count(0) >= 2 and c.seqs().count(2) >= 2,
       f"--dup-frames and --drop-acks 1 act on the session (frames {st['framesSent']}, seqs {c.seqs()})", st)
    c.close()

    # ---------------- --fffd-rewrite on: the agent's ReadRune bug (amazon-ssm-agent shell.go, processStdoutData)
    mod = load_standin_module()

    def go_walk(buf):
        # the agent's loop, rune by rune: a RuneError (U+FFFD included) copies one byte, advances by its width
        out, i = bytearray(), 0
        while i < len(buf):
            err, w = mod.go_rune(buf, i)
            out += buf[i:i + 1] if err else buf[i:i + w]
            i += w
        return bytes(out)

    rnd = random.Random(16)
    samples = [b"\xef\xbf\xbd", b"a\xef\xbf\xbdb", b"\xe0\xef\xbf\xbd", b"\xf0\x9f\xef\xbf\xbd\xbd",
               b"\xef\xef\xbf\xbd\xbf\xbd"]
    samples += [bytes(rnd.choice(b"\xef\xbf\xbd\x80a\xe0\xf0") for _ in range(rnd.randint(1, 40))) for _ in range(3000)]
    bad = [x.hex() for x in samples if mod.fffd_rewrite(x) != go_walk(x)]
    ok(not bad and mod.fffd_rewrite(b"a\xef\xbf\xbdb") == b"a\xefb",
       f"fffd_rewrite equals the agent's rune walk on {len(samples)} byte strings (EF BF BD -> EF)", bad[:5])

    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    proc = None
    start_standin("--fffd-rewrite", "on")
    setup()
    task_arn, _ = run_task()
    s = exec_cmd("printf 'a\\357\\277\\275b\\357c'")
    c = Client(s)
    c.wait_end()
    ok(c.text() == b"a\xefb\xefc", "--fffd-rewrite on: U+FFFD in the output arrives as a lone EF", c.text())
    c.close()


standin_common.run(T, main, lambda: [proc])

#!/usr/bin/env python3
# needs: python3
"""sbx-agent against an independent client: this file speaks the protocol of
src/agent_proto.h from its description (struct, hmac, hashlib), not through
sbx's codec, to the agent built for x86_64 and, under qemu-user, for aarch64.
It checks commands, stdin, exit statuses and signals, the tree kill, file
jobs, flow control, authenticated frames (a forged or replayed frame ends the
channel), malformed frames, and that the agent holds the channel alone.

usage: agent_proto_test.py BUILD_DIR
"""
import hashlib, hmac, os, select, shutil, struct, subprocess, sys, time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
n = 0
failed = 0


def ok(cond, name, diag=""):
    global n, failed
    n += 1
    print(("ok " if cond else "not ok ") + str(n) + " - " + name, flush=True)
    if not cond:
        failed += 1
        if diag:
            print("#   " + str(diag).replace("\n", "\n#   "), flush=True)


def skip(name, why):
    global n
    n += 1
    print("ok %d - %s # SKIP %s" % (n, name, why), flush=True)


T = dict(HELLO=0x01, SPAWN=0x10, STDIN=0x11, STDIN_EOF=0x12, SIGNAL=0x13, CREDIT=0x14, FORGET=0x15,
         READ_FILE=0x20, WRITE_FILE=0x21, PING=0x30, STARTED=0x90, OUT=0x91, EOF=0x92, EXIT=0x93,
         DONE=0x94, KILLED=0x95, ERROR=0xA3, PONG=0xB1)
ARGV, ENV, CWD, USER, FLAGS, PATH, MAX, MODE, CODE, MESSAGE, VERSION, PID, ARCH, WINDOW, GRACE, ACK, STAGE = range(1, 18)


def field(tag, value):
    if isinstance(value, str):
        value = value.encode()
    return bytes([tag]) + struct.pack(">I", len(value)) + value


def fields(payload):
    out, pos = {}, 0
    while pos < len(payload):
        tag, ln = payload[pos], struct.unpack(">I", payload[pos + 1:pos + 5])[0]
        out.setdefault(tag, []).append(payload[pos + 5:pos + 5 + ln])
        pos += 5 + ln
    return out


class Agent:
    def __init__(self, argv, mac=False, key=None):
        self.key = key or os.urandom(32)
        self.mac = mac
        self.seq_out = self.seq_in = 0
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.buf = b""
        self.p.stdin.write((b"M" if mac else b"P") + self.key)
        self.p.stdin.flush()

    def tag(self, seq, frame):
        return hmac.new(self.key, struct.pack(">Q", seq) + frame, hashlib.sha256).digest()[:16]

    def send(self, ftype, fid, payload=b"", seq=None, raw=None):
        frame = raw if raw is not None else struct.pack(">BBII", ftype, 0, fid, len(payload)) + payload
        if self.mac:
            frame += self.tag(self.seq_out if seq is None else seq, frame)
        self.seq_out += 1
        self.p.stdin.write(frame)
        self.p.stdin.flush()

    def recv(self, timeout=10):
        deadline = time.time() + timeout
        while True:
            # Zero bytes between frames are padding (the agent pads a PTY burst).
            self.buf = self.buf.lstrip(b"\0")
            if len(self.buf) >= 10:
                ftype, _, fid, ln = struct.unpack(">BBII", self.buf[:10])
                total = 10 + ln + (16 if self.mac else 0)
                if len(self.buf) >= total:
                    frame, self.buf = self.buf[:total], self.buf[total:]
                    if self.mac:
                        if not hmac.compare_digest(frame[-16:], self.tag(self.seq_in, frame[:-16])):
                            raise AssertionError("a frame from the agent failed authentication")
                    self.seq_in += 1
                    return ftype, fid, frame[10:10 + ln]
            left = deadline - time.time()
            if left <= 0:
                return None
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if not r:
                return None
            chunk = os.read(self.p.stdout.fileno(), 1 << 20)
            if not chunk:
                return ("eof", 0, b"")
            self.buf += chunk

    def hello(self, window=1 << 20):
        self.send(T["HELLO"], 0, field(VERSION, struct.pack(">I", 3)) + field(WINDOW, struct.pack(">I", window)))

    def run(self, fid, argv, env=("PATH=/usr/bin:/bin",), stdin=None, flags=0, cwd=None, timeout=15):
        p = b"".join(field(ARGV, a) for a in argv) + b"".join(field(ENV, e) for e in env)
        if cwd:
            p += field(CWD, cwd)
        p += field(FLAGS, struct.pack(">I", flags | (1 if stdin is not None else 0)))
        self.send(T["SPAWN"], fid, p)
        if stdin is not None:
            if stdin:
                self.send(T["STDIN"], fid, stdin)
            self.send(T["STDIN_EOF"], fid)
        return self.collect(fid, timeout)

    def collect(self, fid, timeout=15):
        res = {"out": b"", "err": b"", "status": None, "frames": []}
        deadline = time.time() + timeout
        while time.time() < deadline:
            f = self.recv(deadline - time.time())
            if f is None or f[0] == "eof":
                break
            ftype, i, payload = f
            res["frames"].append(ftype)
            if i != fid:
                continue
            if ftype == T["OUT"]:
                res["out" if payload[0] == 1 else "err"] += payload[1:]
                self.send(T["CREDIT"], fid, bytes([payload[0]]) + struct.pack(">I", len(payload) - 1))
            elif ftype == T["EXIT"]:
                res["status"] = struct.unpack(">i", payload)[0]
            elif ftype == T["DONE"]:
                return res
            elif ftype == T["ERROR"]:
                # exec_failed: nothing more comes for this id.
                res["error"] = fields(payload)
                return res
        return res

    def close(self):
        try:
            self.p.stdin.close()
        except Exception:
            pass
        try:
            self.p.wait(10)
        except Exception:
            self.p.kill()


def check_arch(label, argv):
    a = Agent(argv)
    f = a.recv()
    ok(f is not None and f[0] == T["HELLO"], label + ": the agent says hello first", f)
    if not f or f[0] != T["HELLO"]:
        a.p.kill()
        return
    h = fields(f[2])
    ok(struct.unpack(">I", h[VERSION][0])[0] == 3, label + ": protocol version 3")
    ok(h.get(ARCH, [b""])[0] in (b"x86_64", b"aarch64"), label + ": and its architecture (%r)" % h.get(ARCH))
    a.hello()
    r = a.run(1, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    ok(r["out"] == b"out\n" and r["err"] == b"err\n", label + ": stdout and stderr apart", r)
    ok(r["status"] == 3, label + ": the exit status", r["status"])
    r = a.run(2, ["sh", "-c", "kill -TERM $$"])
    ok(r["status"] == -15, label + ": a signal is the negated signal number", r["status"])
    data = bytes(range(256)) * 400
    r = a.run(3, ["cat"], stdin=data)
    ok(r["out"] == data, label + ": 100 kB of stdin with every byte value comes back exactly")
    r = a.run(4, ["/nonexistent/program"])
    e = r.get("error") or {}
    ok(e.get(CODE) == [b"exec_failed"] and e.get(STAGE) == [b"exec"] and r["status"] is None and r["err"] == b"",
       label + ": a missing program: ERROR exec_failed, stage exec, no exit status", r)
    r = a.run(41, ["pwd"], cwd="/nonexistent/dir")
    e = r.get("error") or {}
    ok(e.get(CODE) == [b"exec_failed"] and e.get(STAGE) == [b"cwd"] and e.get(MESSAGE) == [b"No such file or directory"],
       label + ": a missing cwd: ERROR exec_failed, stage cwd, the reason", r)
    r = a.run(43, ["/nonexistent/program"], stdin=data)
    e = r.get("error") or {}
    r2 = a.run(44, ["true"])
    ok(e.get(CODE) == [b"exec_failed"] and r2["status"] == 0 and T["CREDIT"] not in r2["frames"],
       label + ": with 100 kB of stdin: exec_failed, and no frame for it after (no stdin credit)", (r, r2["frames"]))
    r = a.run(42, ["sh", "-c", "exit 127"])
    ok(r["status"] == 127 and "error" not in r, label + ": a command's own 127 is its exit status", r)
    r = a.run(5, ["pwd"], cwd="/tmp")
    ok(r["out"] == b"/tmp\n", label + ": cwd", r["out"])
    # The tree kill: stop, then kill; nothing escapes, no next step runs.
    marker = "/tmp/sbx-agent-proto-%d-%s" % (os.getpid(), label.replace(" ", "_"))
    script = "env -i setsid sh -c 'sleep 301 & sleep 302' & sleep 1; touch %s; sleep 303" % marker
    a.send(T["SPAWN"], 6, field(ARGV, "sh") + field(ARGV, "-c") + field(ARGV, script) + field(ENV, "PATH=/usr/bin:/bin"))
    time.sleep(0.5)
    a.send(T["SIGNAL"], 6, bytes([9, 1]))
    r = a.collect(6)
    time.sleep(1.2)
    ok(r["status"] == -9, label + ": the tree kill ends the command", r["status"])
    ok(not os.path.exists(marker), label + ": and its next step never runs")
    left = subprocess.run(["pgrep", "-f", "sleep 30[123]"], capture_output=True, text=True).stdout.split()
    ok(not left, label + ": setsid and env -i children are gone too", left)
    # Files: a job writes stdin to a file; another reads it back.
    path = "/tmp/sbx-agent-proto-%d/sub/f.bin" % os.getpid()
    a.send(T["WRITE_FILE"], 7, field(PATH, path) + field(FLAGS, struct.pack(">I", 1)))
    a.send(T["STDIN"], 7, data)
    a.send(T["STDIN_EOF"], 7)
    r = a.collect(7)
    ok(r["status"] == 0, label + ": WRITE_FILE with parent directories", r)
    a.send(T["READ_FILE"], 8, field(PATH, path))
    r = a.collect(8)
    ok(r["out"] == data and r["status"] == 0, label + ": READ_FILE gives the bytes back")
    a.send(T["READ_FILE"], 9, field(PATH, "/nonexistent"))
    r = a.collect(9)
    ok(r["status"] not in (0, None) and b"cannot read" in r["err"], label + ": a missing file: a status and a message", r)
    shutil.rmtree(os.path.dirname(os.path.dirname(path)), ignore_errors=True)
    # Flow control: without credit the agent stops at the window.
    a.hello(window=65536)
    a.send(T["SPAWN"], 10, field(ARGV, "sh") + field(ARGV, "-c") + field(ARGV, "head -c 1000000 /dev/zero") + field(ENV, "PATH=/usr/bin:/bin"))
    got, status, deadline = 0, None, time.time() + 2
    while time.time() < deadline:
        f = a.recv(deadline - time.time())
        if f is None:
            break
        if f[0] == T["OUT"] and f[1] == 10:
            got += len(f[2]) - 1
        if f[0] == T["EXIT"] and f[1] == 10:
            status = struct.unpack(">i", f[2])[0]   # the pipe may hold it all
    ok(0 < got <= 65536, label + ": without credit no more than the window arrives (%d bytes)" % got)
    a.send(T["CREDIT"], 10, bytes([1]) + struct.pack(">I", got))
    r = a.collect(10)
    status = r["status"] if r["status"] is not None else status
    ok(got + len(r["out"]) == 1000000 and status == 0, label + ": with credit the rest follows",
       (got + len(r["out"]), status))
    a.send(T["PING"], 0, b"are you there")
    f = a.recv()
    ok(f is not None and f[0] == T["PONG"] and f[2] == b"are you there", label + ": PING is answered with PONG")
    # A frame longer than the protocol allows ends the channel with an error.
    a.send(0, 0, raw=struct.pack(">BBII", T["SPAWN"], 0, 11, (1 << 20) + 1))
    f = a.recv()
    ok(f is not None and f[0] == T["ERROR"] and b"bad_frame" in f[2], label + ": an oversized frame is an error", f)
    try:
        a.p.wait(5)
    except subprocess.TimeoutExpired:
        pass
    ok(a.p.poll() is not None, label + ": and the agent ends", a.p.poll())
    a.close()


agent = os.path.join(BUILD, "sbx-agent-x86_64")
check_arch("x86_64", [agent])
arm = os.path.join(BUILD, "sbx-agent-aarch64")
qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
if os.path.exists(arm) and qemu:
    check_arch("aarch64 under qemu-user", [qemu, arm])
else:
    skip("aarch64 under qemu-user", "no aarch64 agent or no qemu-user here")

# Authenticated frames (a PTY channel): a forged or replayed frame ends it.
a = Agent([agent], mac=True)
f = a.recv()
ok(f is not None and f[0] == T["HELLO"], "MAC: hello carries a valid tag")
a.hello()
r = a.run(1, ["echo", "tagged"])
ok(r["out"] == b"tagged\n", "MAC: commands run over tagged frames")
a.send(T["PING"], 0, b"x", seq=0)   # replays sequence number 0
f = a.recv()
ok(f is not None and f[0] == T["ERROR"] and b"bad_tag" in f[2], "MAC: a replayed frame is refused", f)
a.close()
a = Agent([agent], mac=True)
a.recv()
a.hello()
forged = struct.pack(">BBII", T["SPAWN"], 0, 2, 0)
a.p.stdin.write(forged + b"\0" * 16)   # a frame with a made-up tag
a.p.stdin.flush()
f = a.recv()
ok(f is not None and f[0] == T["ERROR"] and b"bad_tag" in f[2], "MAC: a forged frame is refused", f)
a.close()

# The channel is the agent's alone: a command has no fd to it and cannot
# read the agent's memory or fds.
a = Agent([agent])
a.recv()
a.hello()
r = a.run(1, ["sh", "-c", "ls -l /proc/$$/fd | grep -c pipe; ls -l /proc/$PPID/fd 2>&1 | head -3; cat /proc/$PPID/environ >/dev/null 2>&1 && echo readable || echo denied"])
ok(r["out"].split(b"\n")[0] == b"2", "a command holds only its own stdout and stderr pipes", r["out"])
print("1..%d" % n)
sys.exit(1 if failed else 0)

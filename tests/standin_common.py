"""What the Python tests of scripts/aws-standin share: TAP output, the
stand-in's unsigned test endpoints, the Docker Engine API (to check what the
stand-in did, independently of it), and running a test's main with cleanup."""

import http.client
import json
import socket
import subprocess
import sys
import traceback
import urllib.request


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, name, diag=None):
        self.n += 1
        if cond:
            print(f"ok {self.n} - {name}", flush=True)
        else:
            self.failed += 1
            print(f"not ok {self.n} - {name}", flush=True)
            if diag is not None:
                self.diag(diag)
        return bool(cond)

    def diag(self, msg):
        for line in str(msg).splitlines():
            print(f"# {line}", flush=True)


def http_json(url, method, path, obj=None):
    data = json.dumps(obj).encode() if obj is not None else None
    rq = urllib.request.Request(url + path, data=data, method=method,
                                headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(rq, timeout=10) as r:
        return json.loads(r.read())


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.unix_path)
        self.sock = s


def docker(method, path):
    c = UnixHTTPConnection("/var/run/docker.sock")
    try:
        c.request(method, path, headers={"Host": "docker"})
        r = c.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw)
    finally:
        c.close()


def run(tap, main, procs):
    """Runs main(); an exception is one more failure. Then terminates every
    process procs() returns, prints the plan and exits 1 on any failure."""
    try:
        main()
    except Exception:
        tap.failed += 1
        tap.n += 1
        print(f"not ok {tap.n} - unexpected exception")
        tap.diag(traceback.format_exc())
    finally:
        for p in procs():
            if p is None:
                continue
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        print(f"1..{tap.n}")
        sys.exit(1 if tap.failed else 0)

#!/usr/bin/python3
"""The image tests' registry: Debian's docker-registry (the distribution
server) on loopback with Docker Hub style token auth, the token issuer it
trusts, and a proxy in front of it that can misbehave on request.

  images_registry.py fixtures DIR
      Builds the fixtures once (under DIR, guarded by DIR.lock; kept while
      the local images and this script stay the same): a signing key and
      its certificate, a registry storage with images pushed by skopeo,
      OCI layouts and archives. Prints DIR.
  images_registry.py layout DIR SPEC
      Writes an OCI layout at DIR holding one image: SPEC is JSON
      {"layers": [[entry, ...], ...], "tag", "arch"}, an entry {"name",
      "type": file|dir|symlink|link|chr, "data", "linkname", "mode"}.
  images_registry.py serve DIR PARENT_PID
      Serves DIR's storage: prints one JSON line {"registry": port,
      "proxy": port} and runs until PARENT_PID is gone.

The issuer (/token on the proxy's port) signs ES256 JWTs as the
distribution server's token auth expects: header kid = the libtrust
fingerprint of the key, claims iss, sub, aud (the service), exp, nbf, iat,
jti and access. Users: pusher/pushpass (pull and push anywhere),
reader/readpass (pull anywhere); anonymous pulls anything but private/*.

The proxy forwards /v2/ to the registry. POST /_faults with a JSON list of
faults, each {"match": substring of the path, "count": n, and one of
"status": code (with optional "retry_after"), "stall": bytes to send
before stalling for "seconds", "corrupt": true (flip a byte of the body),
"redirect": true (307 to localhost:PORT/_redirect/..., served without
needing auth), "strip_challenge": true (a 401 without WWW-Authenticate)}. GET /_stats gives per-kind request counts and the
Authorization headers the redirect target saw.
"""
import base64, fcntl, hashlib, http.client, io, json, os, shutil, socket, subprocess, sys, tarfile
import signal, threading, time, gzip, uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VERSION = "4"   # of the fixtures' recipe: a change here rebuilds fixtures a build directory kept
ISSUER, SERVICE = "sbx-test-issuer", "sbx-test-registry"
USERS = {"pusher": "pushpass", "reader": "readpass"}
BUSYBOX = os.environ.get("SBX_TEST_BUSYBOX", "sbx-busybox:latest")
DEBIAN = os.environ.get("SBX_TEST_IMAGE", "sbx-debian:12")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def kid_of(pub):
    der = pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    b = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
    return ":".join(b[i:i + 4] for i in range(0, 48, 4))


def make_key(d):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
    now = time.time()
    import datetime
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(datetime.datetime.utcfromtimestamp(now - 86400))
            .not_valid_after(datetime.datetime.utcfromtimestamp(now + 3650 * 86400))
            .sign(key, hashes.SHA256()))
    open(os.path.join(d, "key.pem"), "wb").write(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    open(os.path.join(d, "cert.pem"), "wb").write(cert.public_bytes(serialization.Encoding.PEM))


def registry_config(d, storage, port, realm):
    cfg = os.path.join(d, "registry-%d.yml" % port)
    open(cfg, "w").write(f"""version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
auth:
  token:
    realm: {realm}
    service: {SERVICE}
    issuer: {ISSUER}
    rootcertbundle: {os.path.join(d, "cert.pem")}
""")
    return cfg


class State:
    def __init__(self, d, upstream):
        self.key = serialization.load_pem_private_key(open(os.path.join(d, "key.pem"), "rb").read(), None)
        self.kid = kid_of(self.key.public_key())
        self.upstream = upstream
        self.faults = []
        self.stats = {"token": 0, "token_auth": 0, "manifests": 0, "blobs": 0, "redirected": 0,
                      "redirect_auth": [], "faults_fired": 0}
        self.redirects = {}
        self.lock = threading.Lock()

    def token(self, user, scopes):
        access = []
        for sc in scopes:
            parts = sc.split(":")
            if len(parts) < 3 or parts[0] != "repository":
                continue
            name, actions = ":".join(parts[1:-1]), parts[-1].split(",")
            if user == "pusher":
                granted = [a for a in actions if a in ("pull", "push", "delete", "*")]
            elif user == "reader" or not name.startswith("private/"):
                granted = [a for a in actions if a == "pull"]
            else:
                granted = []
            access.append({"type": "repository", "name": name, "actions": granted})
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": user or "", "aud": SERVICE, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": self.kid})

    def take_fault(self, path):
        with self.lock:
            for f in self.faults:
                if f.get("count", 0) > 0 and f.get("match", "") in path:
                    f["count"] -= 1
                    self.stats["faults_fired"] += 1
                    return dict(f)
        return None


def handler_for(state):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n)
            if self.path == "/_faults":
                with state.lock:
                    state.faults = json.loads(body or b"[]")
                return self.reply(200, b"{}")
            return self.reply(404)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            from urllib.parse import urlparse, parse_qs
            u = urlparse(self.path)
            if u.path == "/token":
                return self.token(parse_qs(u.query))
            if u.path == "/_stats":
                with state.lock:
                    return self.reply(200, json.dumps(state.stats).encode())
            if u.path.startswith("/_redirect/"):
                rid = u.path.split("/")[2]
                with state.lock:
                    state.stats["redirected"] += 1
                    state.stats["redirect_auth"].append(self.headers.get("Authorization"))
                    target = state.redirects.get(rid)
                if not target:
                    return self.reply(404)
                r, body = self.forward(target[0], target[1])
                return self.reply(r.status, body, [(k, v) for k, v in r.getheaders()
                                                    if k.lower() in ("content-type", "docker-content-digest")])
            return self.proxy()

        def token(self, q):
            user = None
            auth = self.headers.get("Authorization")
            with state.lock:
                state.stats["token"] += 1
            if auth:
                try:
                    kind, val = auth.split(" ", 1)
                    u, p = base64.b64decode(val).decode().split(":", 1)
                except Exception:
                    return self.reply(400)
                if kind != "Basic" or USERS.get(u) != p:
                    return self.reply(401, b'{"details":"bad credentials"}', [("Content-Type", "application/json")])
                user = u
                with state.lock:
                    state.stats["token_auth"] += 1
            tok = state.token(user, q.get("scope", []))
            self.reply(200, json.dumps({"token": tok, "access_token": tok, "expires_in": 300}).encode(),
                       [("Content-Type", "application/json")])

        def forward(self, path, auth):
            c = http.client.HTTPConnection("127.0.0.1", state.upstream, timeout=60)
            hdrs = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "authorization")}
            if auth:
                hdrs["Authorization"] = auth
            c.request(self.command, path, headers=hdrs)
            r = c.getresponse()
            body = r.read()
            c.close()
            return r, body

        def proxy(self):
            kind = "manifests" if "/manifests/" in self.path else "blobs" if "/blobs/" in self.path else "other"
            with state.lock:
                if kind in state.stats:
                    state.stats[kind] += 1
            f = state.take_fault(self.path)
            if f and "status" in f:
                h = [("Content-Type", "application/json")]
                if "retry_after" in f:
                    h.append(("Retry-After", str(f["retry_after"])))
                return self.reply(f["status"], b'{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}', h)
            if f and f.get("redirect") and self.headers.get("Authorization"):
                rid = uuid.uuid4().hex
                with state.lock:
                    state.redirects[rid] = (self.path, self.headers.get("Authorization"))
                port = self.server.server_address[1]
                return self.reply(307, b"", [("Location", "http://localhost:%d/_redirect/%s" % (port, rid))])
            r, body = self.forward(self.path, None)
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() in ("content-length", "connection", "transfer-encoding", "date"):
                    continue
                if f and f.get("strip_challenge") and k.lower() == "www-authenticate":
                    continue
                self.send_header(k, v)
            if f and f.get("corrupt") and r.status == 200 and body:
                b = bytearray(body)
                b[len(b) // 2] ^= 0xFF
                body = bytes(b)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if f and "stall" in f and r.status == 200:
                self.wfile.write(body[: f["stall"]])
                self.wfile.flush()
                time.sleep(f.get("seconds", 30))
                self.close_connection = True
                return
            self.wfile.write(body)

    return H


def die_with_parent():
    """In the registry's process: SIGTERM when this script ends, however it ends."""
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start(d, storage):
    rport, pport = free_port(), free_port()
    cfg = registry_config(d, storage, rport, "http://127.0.0.1:%d/token" % pport)
    reg = subprocess.Popen(["docker-registry", "serve", cfg], stdout=subprocess.DEVNULL,
                           stderr=open(os.path.join(d, "registry.log"), "ab"), preexec_fn=die_with_parent)
    state = State(d, rport)
    srv = ThreadingHTTPServer(("127.0.0.1", pport), handler_for(state))
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", rport), timeout=0.2).close()
            break
        except OSError:
            if reg.poll() is not None:
                raise SystemExit("docker-registry exited: see " + os.path.join(d, "registry.log"))
            time.sleep(0.05)
    return reg, srv, rport, pport


def sh(*cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SystemExit("%s failed: %s" % (" ".join(cmd), r.stdout.decode(errors="replace")))
    return r.stdout.decode()


# skopeo's docker-daemon: transport asks the daemon the tests use (DOCKER_HOST,
# which make test-podman points at Podman), as the docker CLI does.
SRC_DAEMON = ["--src-daemon-host", os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST") else []


def image_id(name):
    return sh("docker", "image", "inspect", "-f", "{{.Id}}", name).strip()


def blob_put(layout, data):
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    open(os.path.join(layout, "blobs", "sha256", d[7:]), "wb").write(data)
    return {"digest": d, "size": len(data)}


def tar_of(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o755, 1700000000
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def tar_spec(entries):
    """A tar from [{"name", "type": file|dir|symlink|link|chr, "data", "linkname", "mode", "size"}]."""
    types = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
             "link": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e["name"])
            ti.type = types[e.get("type", "file")]
            ti.mode = e.get("mode", 0o755 if ti.type == tarfile.DIRTYPE else 0o644)
            ti.mtime = 1700000000
            ti.linkname = e.get("linkname", "")
            data = e.get("data", "").encode()
            if ti.type == tarfile.REGTYPE:
                ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data) if ti.type == tarfile.REGTYPE else None)
    return buf.getvalue()


def layout(d, spec):
    """An OCI layout at d holding one image made of spec's layers, tagged spec's tag."""
    new_layout(d)
    md = add_image(d, [tar_spec(l) for l in spec["layers"]], spec.get("arch", "amd64"),
                   {"org.opencontainers.image.ref.name": spec.get("tag", "latest")})
    del md["platform"]
    open(os.path.join(d, "index.json"), "w").write(json.dumps({"schemaVersion": 2, "manifests": [md]}))


def add_image(layout, layers, arch, annotations=None):
    """A manifest in layout for the given uncompressed layer tars; returns its descriptor."""
    descs, diff_ids = [], []
    for t in layers:
        g = gzip.compress(t, compresslevel=1, mtime=0)
        d = blob_put(layout, g)
        d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
        descs.append(d)
        diff_ids.append("sha256:" + hashlib.sha256(t).hexdigest())
    cfg = {"architecture": arch, "os": "linux", "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"]},
           "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    if arch == "arm64":
        cfg["variant"] = "v8"
    c = blob_put(layout, json.dumps(cfg).encode())
    c["mediaType"] = "application/vnd.oci.image.config.v1+json"
    m = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": c, "layers": descs}
    md = blob_put(layout, json.dumps(m).encode())
    md["mediaType"] = m["mediaType"]
    md["platform"] = {"architecture": arch, "os": "linux"}
    if arch == "arm64":
        md["platform"]["variant"] = "v8"
    if annotations:
        md["annotations"] = annotations
    return md


def new_layout(path):
    os.makedirs(os.path.join(path, "blobs", "sha256"))
    open(os.path.join(path, "oci-layout"), "w").write('{"imageLayoutVersion":"1.0.0"}')


def host_files(limit):
    """(name, bytes) of host library files until about limit bytes."""
    out, total = [], 0
    for root in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/share"):
        for dp, dn, fn in os.walk(root):
            dn.sort()
            for f in sorted(fn):
                p = os.path.join(dp, f)
                if os.path.islink(p) or not os.path.isfile(p):
                    continue
                try:
                    data = open(p, "rb").read()
                except OSError:
                    continue
                out.append(("big" + p, data))
                total += len(data)
                if total >= limit:
                    return out
    return out


def fixtures(d):
    stamp_want = json.dumps({"version": VERSION, "busybox": image_id(BUSYBOX), "debian": image_id(DEBIAN)})
    os.makedirs(os.path.dirname(os.path.abspath(d)), exist_ok=True)
    lockf = open(d + ".lock", "a")
    fcntl.flock(lockf, fcntl.LOCK_EX)
    try:
        if os.path.exists(os.path.join(d, "stamp")) and open(os.path.join(d, "stamp")).read() == stamp_want:
            print(d)
            return
        shutil.rmtree(d, ignore_errors=True)
        tmp = d + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        make_key(tmp)
        storage = os.path.join(tmp, "storage")
        reg, srv, rport, pport = start(tmp, storage)
        try:
            dest = "docker://127.0.0.1:%d/" % rport
            creds = ["--dest-creds", "pusher:pushpass", "--dest-tls-verify=false"]
            sh("skopeo", "copy", "-q", *SRC_DAEMON, *creds, "docker-daemon:" + BUSYBOX, dest + "library/busybox:latest")
            sh("skopeo", "copy", "-q", *SRC_DAEMON, *creds, "docker-daemon:" + BUSYBOX, dest + "private/busybox:latest")
            sh("skopeo", "copy", "-q", *SRC_DAEMON, *creds, "docker-daemon:" + DEBIAN, dest + "library/debian:12")
            sh("skopeo", "copy", "-q", *SRC_DAEMON, "docker-daemon:" + BUSYBOX, "oci:" + os.path.join(tmp, "oci-busybox") + ":latest")
            sh("skopeo", "copy", "-q", *SRC_DAEMON, "docker-daemon:" + BUSYBOX, "oci-archive:" + os.path.join(tmp, "busybox-oci.tar") + ":latest")
            sh("skopeo", "copy", "-q", *SRC_DAEMON, "docker-daemon:" + BUSYBOX, "docker-archive:" + os.path.join(tmp, "busybox-docker.tar") + ":" + BUSYBOX)
            # A multi-platform index: two one-file images, linux/arm64/v8 and linux/amd64.
            multi = os.path.join(tmp, "oci-multi")
            new_layout(multi)
            arm = add_image(multi, [tar_of([("arch", b"arm64\n")])], "arm64")
            amd = add_image(multi, [tar_of([("arch", b"amd64\n")])], "amd64")
            idx = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": [arm, amd]}
            ib = json.dumps(idx).encode()
            ide = blob_put(multi, ib)
            ide["mediaType"] = idx["mediaType"]
            ide["annotations"] = {"org.opencontainers.image.ref.name": "latest"}
            open(os.path.join(multi, "index.json"), "w").write(json.dumps(
                {"schemaVersion": 2, "mediaType": idx["mediaType"], "manifests": [ide]}))
            sh("skopeo", "copy", "-q", "--all", *creds, "oci:" + multi + ":latest", dest + "library/multi:latest")
            # About 30 MB compressed: host library files in one gzip layer.
            big = os.path.join(tmp, "oci-big")
            new_layout(big)
            bd = add_image(big, [tar_of(host_files(64 * 1000 * 1000))], "amd64", {"org.opencontainers.image.ref.name": "latest"})
            del bd["platform"]
            open(os.path.join(big, "index.json"), "w").write(json.dumps({"schemaVersion": 2, "manifests": [bd]}))
            sh("skopeo", "copy", "-q", *creds, "oci:" + big + ":latest", dest + "library/big:latest")
        finally:
            reg.terminate()
            reg.wait()
            srv.shutdown()
        open(os.path.join(tmp, "stamp"), "w").write(stamp_want)
        os.rename(tmp, d)
        print(d)
    finally:
        fcntl.flock(lockf, fcntl.LOCK_UN)


def serve(d, parent):
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))  # so the finally below runs
    run = os.path.join(d, "run-%d" % os.getpid())
    os.makedirs(run)
    shutil.copy(os.path.join(d, "cert.pem"), run)
    shutil.copy(os.path.join(d, "key.pem"), run)
    reg, srv, rport, pport = start(run, os.path.join(d, "storage"))
    print(json.dumps({"registry": rport, "proxy": pport}), flush=True)
    try:
        while True:
            time.sleep(0.3)
            try:
                os.kill(parent, 0)
            except OSError:
                break
            if reg.poll() is not None:
                break
    finally:
        reg.terminate()
        try:
            reg.wait(5)
        except subprocess.TimeoutExpired:
            reg.kill()
        shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "fixtures":
        fixtures(sys.argv[2])
    elif sys.argv[1] == "layout":
        layout(sys.argv[2], json.loads(sys.argv[3]))
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))

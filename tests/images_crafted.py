#!/usr/bin/python3
"""Crafted `docker save` archives for the image import tests.

  images_crafted.py OUT.tar SPEC_JSON

SPEC: {"tag": "name:tag", "layers": [[entry, ...], ...], "config": {...}
(merged over the config's "config" section), "config_raw": "text" (the
config's bytes as given), "manifest_raw": "text" (manifest.json as given),
"gzip": true (layers gzip-compressed)}.
entry: {"name", "type": file|dir|symlink|link, "data", "zeros": N (a file
of N zero bytes, streamed: a gzip bomb), "linkname", "mode"}.
"""
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile


class Zeros(io.RawIOBase):
    def __init__(self, n):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


def layer_tar(entries, path):
    types = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
             "link": tarfile.LNKTYPE}
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e["name"])
            ti.type = types[e.get("type", "file")]
            ti.mode = e.get("mode", 0o755 if ti.type == tarfile.DIRTYPE else 0o644)
            ti.mtime = 1700000000
            ti.linkname = e.get("linkname", "")
            src = None
            if ti.type == tarfile.REGTYPE:
                if "zeros" in e:
                    ti.size = e["zeros"]
                    src = io.BufferedReader(Zeros(e["zeros"]), 1 << 20)
                else:
                    data = e.get("data", "").encode()
                    ti.size = len(data)
                    src = io.BytesIO(data)
            tf.addfile(ti, src)


def sha_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def main(out, spec):
    work = tempfile.mkdtemp(prefix="sbx-crafted-")
    try:
        names, diff_ids = [], []
        for i, entries in enumerate(spec["layers"]):
            raw = os.path.join(work, "l%d.tar" % i)
            if isinstance(entries, dict):
                # {"from_archive": a docker save tar, "index": N}: its layer N as it is.
                with tarfile.open(entries["from_archive"]) as src:
                    man = json.load(src.extractfile("manifest.json"))
                    member = src.extractfile(man[0]["Layers"][entries.get("index", 0)])
                    with open(raw, "wb") as dst:
                        shutil.copyfileobj(member, dst, 1 << 20)
            else:
                layer_tar(entries, raw)
            diff_ids.append("sha256:" + sha_file(raw))
            name = "l%d/layer.tar" % i
            if spec.get("gzip"):
                with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb", compresslevel=9) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(raw + ".gz", raw)
            names.append((name, raw))
        if "config_raw" in spec:
            cfg = spec["config_raw"].encode()
        else:
            c = {"Env": ["PATH=/bin"], "Cmd": ["sh"]}
            c.update(spec.get("config", {}))
            cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": c,
                              "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
        cname = hashlib.sha256(cfg).hexdigest() + ".json"
        manifest = spec.get("manifest_raw")
        if manifest is None:
            manifest = json.dumps([{"Config": cname, "RepoTags": [spec.get("tag", "crafted:1")],
                                    "Layers": [n for n, _ in names]}])
        with tarfile.open(out, "w") as tf:
            def add(n, data):
                ti = tarfile.TarInfo(n)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            add(cname, cfg)
            for n, p in names:
                tf.add(p, arcname=n)
            add("manifest.json", manifest.encode())
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))

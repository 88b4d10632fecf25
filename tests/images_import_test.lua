-- needs: docker, local, root, python3
-- Importing images a stranger made: pull = "never" never reaches a
-- registry (a loopback listener counts every connection); an image config
-- with mistyped fields and a garbage manifest.json fail at import, naming
-- what is wrong; gzip bombs stop at policy.images.max_image_bytes and the
-- cache's max_bytes while they unpack, leaving nothing half made; a hard
-- link to a file of a lower layer works. Run as root, then as each
-- unprivileged test user (tests/lib/local_helper.lua).
local sbx = require "sbx"
local t = require "tap"
local H = require "helper"
local IH = require "images_helper"
local images = require "sbx.images"
local L = require "local_helper"

local layer = sbx.core.layer
local q = IH.q

-- A docker save archive from a spec (tests/images_crafted.py).
local function crafted(spec)
  local path = IH.tmpdir("crafted") .. "/image.tar"
  local out, rc = H.sh(string.format("%s tests/images_crafted.py %s %s", IH.python, q(path), q(sbx.json.encode(spec))))
  assert(rc == 0, out)
  return path
end

local BASE = { { name = "bin", type = "dir" }, { name = "bin/hello", data = "hello\n" } }

-- pull = "never" ---------------------------------------------------------------------------

do
  -- A listener that writes a line for every connection it accepts.
  local log = os.tmpname()
  -- It ends with this process (it looks every half second).
  local p = io.popen(string.format([[%s -c '
import socket, sys, os
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64); s.settimeout(0.5)
print(s.getsockname()[1], os.getpid(), flush=True)
while True:
    try:
        os.kill(int(sys.argv[2]), 0)
    except OSError:
        break
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    with open(sys.argv[1], "a") as f: f.write("x\n")
    c.close()
' %s %d > %s.port &]], IH.python, q(log), sbx.core.pid(), q(log)))
  p:close()
  local port, pid
  for _ = 1, 200 do
    local f = io.open(log .. ".port")
    local line = f and f:read("l")
    if f then f:close() end
    if line then port, pid = line:match("^(%d+) (%d+)") end
    if port then break end
    sbx.sleep(0.05)
  end
  port, pid = tonumber(port), tonumber(pid)
  os.remove(log .. ".port")
  assert(port and pid, "the listener did not start")
  local function connections()
    local f = io.open(log)
    local n = 0
    if f then for _ in f:lines() do n = n + 1 end f:close() end
    return n
  end
  local function pol()
    return { images = { dir = IH.tmpdir("never") .. "/images", archives = {}, daemon = false, max_attempts = 1,
                        hub = { registry = "http://127.0.0.1:" .. port } } }
  end
  local name = "127.0.0.1:" .. port .. "/nothing/here:1"
  -- The local backend, as a box option and as the policy's box.pull.
  local box, err, code = sbx.box { backend = "local", image = name, pull = "never", policy = pol() }
  t.ok(not box and code == "image_unavailable" and err:find("not_cached") and err:find("never"),
    "local box, pull = \"never\", an image the cache lacks: refused", tostring(err))
  local p2 = pol()
  p2.box = { pull = "never" }
  box, err = sbx.box { backend = "local", image = "nothing-here-" .. sbx.core.pid() .. ":1", policy = p2 }
  t.ok(not box and err:find("never"), "policy.box.pull = \"never\", a bare name: refused", tostring(err))
  local r, rerr, rcode = images.resolve("docker://" .. name, { policy = IH.policy(pol()), pull = "never" })
  t.ok(not r and rcode == "not_cached", "images.resolve docker:// with pull = \"never\": not_cached", tostring(rerr))
  t.is(connections(), 0, "no connection reached the registry")
  -- The control: the listener does count what pull = "missing" sends.
  box = sbx.box { backend = "local", image = name, pull = "missing", policy = pol() }
  t.ok(not box and connections() >= 1, "with pull = \"missing\" the registry is asked (the listener counts it)")
  os.execute("kill " .. pid)
  os.remove(log)
end

-- Image configs and manifests ---------------------------------------------------------------

local function import(path, extra)
  local overlay = { dir = IH.tmpdir("import") .. "/images" }
  for k, v in pairs(extra or {}) do overlay[k] = v end
  local pol = IH.cache_policy(overlay)
  local img, err, code = images.resolve("docker-archive:" .. path, { policy = pol })
  return img, err, code, pol.images.dir
end

for _, case in ipairs {
  { { User = { 0 } }, "User is an array" },
  { { User = { name = "x" } }, "User is an object" },
  { { WorkingDir = 7 }, "WorkingDir is a number" },
  { { Env = { "A=1", 2 } }, "Env[2] is a number" },
  { { Env = "PATH=/bin" }, "Env is a string" },
  { { Cmd = { true } }, "Cmd[1] is a boolean" },
  { { Entrypoint = 5 }, "Entrypoint is a number" },
  { { Labels = { a = 1 } }, "label a is a number" },
} do
  local img, err, code, dir = import(crafted { layers = { BASE }, config = case[1] })
  t.ok(not img and code == "bad_image" and err:find(case[2], 1, true),
    "a config whose " .. case[2] .. ": refused at import", tostring(err))
  t.is(#IH.ls(dir .. "/images"), 0, "  and nothing recorded")
end
do
  -- Through a local box: the error names the field at create, not at the
  -- first command.
  local path = crafted { layers = { BASE }, config = { User = { 0 } } }
  local box, err = sbx.box { backend = "local", image = "docker-archive:" .. path,
    policy = { images = { dir = IH.tmpdir("box") .. "/images" } } }
  t.ok(not box and err:find("User is an array", 1, true), "a local box from it fails at create naming User", tostring(err))
  local img = import(crafted { layers = { BASE }, config = { User = "1000:1000", WorkingDir = "/bin" } })
  t.ok(img and img.config.User == "1000:1000" and img.config.WorkingDir == "/bin", "well-typed fields import")
end
for _, case in ipairs {
  { "{not json", "manifest.json is malformed" },
  { "\0\1\2garbage", "manifest.json is malformed" },
  { "", "manifest.json is malformed" },
  { "{}", "manifest.json is an object, not a list" },
  { "[]", "an empty array" },
  { "[1]", "entry 1 is a number" },
  { '[{"Config": 5, "Layers": []}]', "Config is a number" },
  { '[{"Config": "c.json", "Layers": [1]}]', "Layers[1] is a number" },
} do
  local img, err, code = import(crafted { layers = { BASE }, manifest_raw = case[1] })
  t.ok(not img and code == "bad_image" and err:find(case[2], 1, true) and not err:find("no manifest"),
    string.format("manifest.json %q: %s", case[1]:sub(1, 20), case[2]), tostring(err))
end
do
  local img, err, code = import(crafted { layers = { BASE }, config_raw = "{\"rootfs\": " })
  t.ok(not img and code == "bad_image" and err:find("image config is malformed", 1, true), "a garbage config: malformed", tostring(err))
end

-- Gzip bombs ---------------------------------------------------------------------------------

local MiB = 1024 * 1024

-- An image of n layers, each a file of mib MiB of zeros (a few KiB gzipped).
local function bombs(n, mib, tag)
  local layers = {}
  for i = 1, n do
    layers[i] = { { name = "z" .. i, type = "dir" }, { name = string.format("z%d/%s-%d", i, tag or "bomb", i), zeros = mib * MiB } }
  end
  return crafted { layers = layers, gzip = true }
end

-- Nothing of a failed import: no layer, no record, no scratch space.
local function empty(dir)
  return #IH.ls(dir .. "/layers/sha256") == 0 and #IH.ls(dir .. "/images") == 0 and #IH.ls(dir .. "/tmp") == 0
end

local function cache_size(dir)
  local n = 0
  for _, h in ipairs(IH.ls(dir .. "/layers/sha256")) do
    local out = H.sh("du -sb --apparent-size " .. q(dir .. "/layers/sha256/" .. h .. "/root"))
    n = n + (tonumber(out:match("^(%d+)")) or 0)
  end
  return n
end

do
  local path = bombs(4, 8)
  local st = layer.stat(path)
  t.ok(st.size < 1 * MiB, string.format("four 8 MiB layers in a %d-byte archive", st.size))
  local img, err, code, dir = import(path, { max_image_bytes = 20 * MiB, max_layer_bytes = 64 * MiB, parallel = 1 })
  t.ok(not img and code == "too_large" and err:find("policy.images.max_image_bytes", 1, true),
    "the image stops at max_image_bytes", tostring(err))
  t.ok(empty(dir), "and the cache holds nothing of it", table.concat(IH.ls(dir .. "/layers/sha256"), " "))
  -- All layers at once share the one budget.
  img, err, code, dir = import(path, { max_image_bytes = 20 * MiB, max_layer_bytes = 64 * MiB, parallel = 4 })
  t.ok(not img and code == "too_large" and err:find("max_image_bytes", 1, true), "unpacked in parallel too", tostring(err))
  t.ok(empty(dir), "  nothing left")
  -- One layer past the image's limit is stopped while it unpacks (its
  -- file is refused before a byte of it is written).
  img, err, code, dir = import(bombs(1, 48), { max_image_bytes = 20 * MiB, max_layer_bytes = 64 * MiB })
  t.ok(not img and code == "too_large" and err:find("max_image_bytes", 1, true), "one 48 MiB layer, a 20 MiB image limit", tostring(err))
  t.ok(empty(dir), "  nothing left")
  img = import(path, { max_image_bytes = 40 * MiB, max_layer_bytes = 64 * MiB })
  t.ok(img and #img.layers == 4, "under a larger limit the same image imports")
end

do
  -- The cache's own limit, counted while importing: an image bigger than
  -- the whole cache stops at max_bytes.
  local img, err, code, dir = import(bombs(3, 8), { max_bytes = 12 * MiB })
  t.ok(not img and code == "too_large" and err:find("policy.images.max_bytes", 1, true),
    "an image larger than the cache stops at max_bytes", tostring(err))
  t.ok(empty(dir), "  nothing left")
  -- An older image nobody holds makes room; one a box holds does not.
  local pol = IH.cache_policy { max_bytes = 20 * MiB }
  local a = assert(images.resolve("docker-archive:" .. bombs(1, 12, "a"), { policy = pol, hold = true }))
  local b, berr = images.resolve("docker-archive:" .. bombs(1, 12, "b"), { policy = pol })
  t.ok(not b and berr:find("max_bytes", 1, true), "a held 12 MiB image + another 12 MiB in 20 MiB: refused", tostring(berr))
  t.ok(layer.stat(a.layers[1]), "  the held image stays")
  t.ok(cache_size(pol.images.dir) <= 20 * MiB, "  and the cache stayed under max_bytes")
  a.lease:close()
  b, berr = images.resolve("docker-archive:" .. bombs(1, 12, "b"), { policy = pol })
  t.ok(b, "released, the older image makes room for the new one", tostring(berr))
  t.ok(not layer.stat(a.layers[1]), "  (the older one is gone)")
  t.ok(cache_size(pol.images.dir) <= 20 * MiB, string.format("  the cache holds %d bytes <= max_bytes", cache_size(pol.images.dir)))
end

-- Hard links to files of lower layers ----------------------------------------------------------

do
  -- (The users' runs read the fixtures the root run built.)
  local fx = L.role == "root" and IH.fixtures() or ((H.sbx_bin:match("^(.*)/[^/]+$") or "build") .. "/images-fixtures")
  local busybox = { from_archive = fx .. "/busybox-docker.tar", index = 0 }
  local top = { { name = "data", type = "dir" }, { name = "data/passwd", type = "link", linkname = "etc/passwd" },
                { name = "data/own", data = "mine\n" }, { name = "data/own-link", type = "link", linkname = "data/own" } }
  local img, err = import(crafted { layers = { busybox, top } })
  t.ok(img, "a layer with a hard link to a file of the layer below imports", tostring(err))
  if img then
    local a, b = layer.stat(img.layers[1] .. "/etc/passwd"), layer.stat(img.layers[2] .. "/data/passwd")
    t.ok(a and b and a.ino == b.ino, "  the link is the lower file itself (one inode, no copy)")
    t.ok(layer.stat(img.layers[2] .. "/data/own-link"), "  a link within the layer still works")
  end
  -- Through a local box: the linked file reads as the original.
  local path = crafted { layers = { busybox, top } }
  local box, berr = sbx.box { backend = "local", image = "docker-archive:" .. path,
    policy = { images = { dir = IH.tmpdir("hlbox") .. "/images" } } }
  t.ok(box, "a local box from it starts", tostring(berr))
  if box then
    local r = box:exec { "sh", "-c", "cmp /etc/passwd /data/passwd && echo same" }
    t.is(r and r.stdout, "same\n", "  and /data/passwd is /etc/passwd")
    box:close()
  end
  -- The same layer over another base is another directory (its links
  -- depend on what is below it).
  local other = { { name = "etc", type = "dir" }, { name = "etc/passwd", data = "other\n" } }
  local p1 = IH.cache_policy()
  local i1 = assert(images.resolve("docker-archive:" .. crafted { layers = { busybox, top } }, { policy = p1 }))
  local i2, e2 = images.resolve("docker-archive:" .. crafted { layers = { other, top } }, { policy = p1 })
  t.ok(i2 and i2.diff_ids[2] == i1.diff_ids[2] and i2.layers[2] ~= i1.layers[2],
    "one diff id over two bases: two directories", tostring(e2))
  t.is(i2 and IH.read(i2.layers[2] .. "/data/passwd"), "other\n", "  each linked to its own base")
  -- What a box would not see cannot be linked: a whiteout hides it, a
  -- symlink on the way is never followed, and a first layer has nothing below.
  for _, case in ipairs {
    { { busybox, { { name = "etc", type = "dir" }, { name = "etc/.wh.passwd" } }, top }, "whited out" },
    { { { { name = "lnk", type = "symlink", linkname = "/etc" } }, { { name = "x", type = "link", linkname = "lnk/passwd" } } },
      "through a symlink" },
    { { { { name = "x", type = "link", linkname = "etc/passwd" } } }, "in the first layer" },
    { { busybox, { { name = "x", type = "link", linkname = "no/such/file" } } }, "to nothing" },
    { { busybox, { { name = "x", type = "link", linkname = "etc" } } }, "to a directory" },
  } do
    local r, e, c = import(crafted { layers = case[1] })
    t.ok(not r and c == "unsafe_entry", "a hard link " .. case[2] .. ": refused", tostring(e))
  end
  t.ok(layer.stat("/etc/passwd").ino ~= nil, "(the host's /etc/passwd is untouched)")
end

-- The knob is checked like the others.
do
  local ok, perr = sbx.policy_check.policy { images = { max_image_bytes = 0 } }
  t.ok(not ok and tostring(perr):find("max_image_bytes"), "policy.images.max_image_bytes must be > 0", tostring(perr))
end

IH.cleanup()
L.relay_users(t, "tests/images_import_test.lua", H.busybox)
t.done()

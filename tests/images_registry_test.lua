-- needs: docker, python3, docker-registry
-- Pulls from Debian's docker-registry (the distribution server) on
-- loopback, with Docker Hub style token auth from an issuer beside it and
-- a proxy that misbehaves on request (tests/images_registry.py): digests,
-- platform indexes, 401 without and with credentials, 404, 429 and 5xx
-- retried, stalls timed out, corrupted blobs refused with nothing cached,
-- redirects without credentials, two processes pulling at once, and how
-- long a first pull and a cached resolve take.
local sbx = require "sbx"
local t = require "tap"
local H = require "helper"
local IH = require "images_helper"
local images = require "sbx.images"
local registry = require "sbx.images.registry"

local layer = sbx.core.layer
local q = IH.q

local reg = IH.registry()
local R, P = reg.registry, reg.proxy
local busybox_id = IH.image_id(H.busybox)

-- A first pull, anonymous, from the real server -----------------------------------

local pol = IH.cache_policy()
local cache = pol.images.dir
local img, err, code = images.resolve("docker://" .. R .. "/library/busybox:latest", { policy = pol })
t.ok(img, "anonymous pull of busybox", tostring(err) .. " " .. tostring(code))
t.is(img and img.digest, busybox_id, "the image id is the config's digest, as the daemon's")
t.ok(img and img.manifest and img.manifest:match("^sha256:%x+$"), "the manifest's digest")
t.ok(img and #img.layers == 1 and layer.stat(img.layers[1] .. "/bin/busybox"), "the layer is unpacked: bin/busybox")
t.is(img and img.source, "docker", "source docker")
t.is(img and img.name, R .. "/library/busybox:latest", "name")
t.ok(img and img.config.Cmd and img.config.Cmd[1] == "sh" and img.config.Architecture, "config: Cmd, Architecture")
do
  -- The manifest digest is the registry's own.
  local out = H.sh(string.format("skopeo inspect --tls-verify=false --creds pusher:pushpass --raw docker://%s/library/busybox:latest | sha256sum", R))
  t.is(img and img.manifest, "sha256:" .. out:match("^(%x+)"), "the manifest digest matches what the registry serves")
end

-- Cached: no registry contact ----------------------------------------------------------

do
  local ppol = IH.cache_policy()
  local ref = "docker://" .. P .. "/library/busybox:latest"
  assert(images.resolve(ref, { policy = ppol }))
  local before = reg:stats()
  local times = {}
  for i = 1, 30 do
    local t0 = sbx.now()
    local again = images.resolve(ref, { policy = ppol, pull = "missing" })
    times[i] = sbx.now() - t0
    assert(again and again.digest == busybox_id)
  end
  local after = reg:stats()
  t.ok(after.manifests == before.manifests and after.blobs == before.blobs and after.token == before.token,
    "pull = missing: a cached image asks the registry nothing")
  local med = IH.median(times)
  t.diag(string.format("resolve of a cached image: median %.3f ms, max %.3f ms (30 runs)", med * 1000,
    math.max(table.unpack(times)) * 1000))
  -- The time is reported (diag), never asserted: a test does not time.
  -- pull = always asks again, but fetches no layer it has.
  local again = assert(images.resolve(ref, { policy = ppol, pull = "always" }))
  local later = reg:stats()
  t.ok(again.digest == busybox_id and later.manifests > after.manifests and later.blobs - after.blobs <= 1,
    "pull = always: the manifest again, no layer again", sbx.json.encode(later))
  t.ok(later.token - after.token <= 1, "one token per scope and client")
end

-- Platform indexes ------------------------------------------------------------------------

do
  local ref = "docker://" .. R .. "/library/multi:latest"
  local mine = images.platform()
  local want = mine:match("^linux/arm64") and "arm64\n" or "amd64\n"
  local m = images.resolve(ref, { policy = IH.cache_policy() })
  t.is(m and IH.read(m.layers[1] .. "/arch"), want, "an index resolves to this machine's platform (" .. mine .. ")")
  local arm = images.resolve(ref, { policy = IH.cache_policy { platform = "linux/arm64/v8" } })
  t.ok(arm and IH.read(arm.layers[1] .. "/arch") == "arm64\n" and arm.config.Architecture == "arm64" and arm.config.Variant == "v8",
    "policy.images.platform picks linux/arm64/v8")
  local arm2 = images.resolve(ref, { policy = IH.cache_policy { platform = "linux/arm64" } })
  t.ok(arm2 and arm2.digest == arm.digest, "linux/arm64 without a variant matches v8")
  local none, nerr, ncode = images.resolve(ref, { policy = IH.cache_policy { platform = "linux/s390x" } })
  t.ok(none == nil and ncode == "no_platform" and nerr:find("linux/arm64/v8") and nerr:find("linux/amd64"),
    "no image for the platform: the index's platforms are listed", tostring(nerr))
end

-- Answers that are errors --------------------------------------------------------------------

do
  local p2 = IH.cache_policy()
  local r, e, c = images.resolve("docker://" .. R .. "/library/nope:latest", { policy = p2 })
  t.ok(r == nil and c == "not_found" and e:find("MANIFEST_UNKNOWN") or e:find("NAME_UNKNOWN"), "404: not_found with the registry's words", tostring(e))
  r, e, c = images.resolve("docker://" .. R .. "/library/busybox:nosuchtag", { policy = p2 })
  t.ok(r == nil and c == "not_found", "a missing tag: not_found", tostring(e))
  r, e, c = images.resolve("docker://" .. R .. "/private/busybox:latest", { policy = p2 })
  t.ok(r == nil and c == "unauthorized" and e:find("no credentials for " .. R, 1, true), "401 without credentials says so", tostring(e))
  t.is(#IH.ls(p2.images.dir .. "/layers/sha256"), 0, "nothing cached by failures")

  local conf = IH.tmpdir("dockerconf")
  local function config(user, pass)
    local f = assert(io.open(conf .. "/config.json", "w"))
    f:write(sbx.json.encode { auths = { [R] = { auth = require("sbx.images.credentials").base64(user .. ":" .. pass) } } })
    f:close()
  end
  config("reader", "readpass")
  local before = reg:stats()
  r, e, c = images.resolve("docker://" .. R .. "/private/busybox:latest", { policy = IH.cache_policy { docker_config = conf } })
  t.ok(r and r.digest == busybox_id, "401 with credentials from config.json: pulled", tostring(e))
  t.ok(reg:stats().token_auth > before.token_auth, "the token was asked for with the credentials")
  config("reader", "wrong")
  r, e, c = images.resolve("docker://" .. R .. "/private/busybox:latest", { policy = IH.cache_policy { docker_config = conf } })
  t.ok(r == nil and c == "unauthorized" and e:find("refused") and not e:find("wrong"), "wrong credentials: refused, and never echoed", tostring(e))

  -- A credential helper, as the docker CLI runs it (through the CLI here,
  -- with the helper on PATH).
  local bin = IH.tmpdir("helper")
  local hf = assert(io.open(bin .. "/docker-credential-sbxtest", "w"))
  hf:write([[#!/bin/sh
[ "$1" = get ] || exit 1
read server
echo "$server" > "$(dirname "$0")/asked"
printf '{"ServerURL":"%s","Username":"reader","Secret":"readpass"}' "$server"
]])
  hf:close()
  os.execute("chmod +x " .. q(bin .. "/docker-credential-sbxtest"))
  local hconf = IH.tmpdir("helperconf")
  local cf = assert(io.open(hconf .. "/config.json", "w"))
  cf:write(sbx.json.encode { credHelpers = { [R] = "sbxtest" } })
  cf:close()
  local xdg = IH.tmpdir("xdg")
  local out, rc = H.sh(string.format("env PATH=%s:$PATH DOCKER_CONFIG=%s XDG_CACHE_HOME=%s %s images pull docker://%s/private/busybox:latest",
    q(bin), q(hconf), q(xdg), q(H.sbx_bin), R))
  t.ok(rc == 0 and out:find(busybox_id, 1, true), "credHelpers: docker-credential-<name> get gives the login", out)
  t.is(IH.read(bin .. "/asked"), R .. "\n", "the helper was asked for this registry")
end

-- Retries: 429 and 5xx as the AWS client retries them ----------------------------------------

do
  local ref = "docker://" .. P .. "/library/busybox:latest"
  reg:faults { { match = "/manifests/", status = 429, retry_after = 0, count = 2 } }
  local before = reg:stats()
  local r, e = images.resolve(ref, { policy = IH.cache_policy() })
  t.ok(r and r.digest == busybox_id and reg:stats().faults_fired - before.faults_fired == 2,
    "two 429s (Retry-After: 0) are retried", tostring(e))
  reg:faults { { match = "/blobs/", status = 503, count = 2 } }
  r, e = images.resolve(ref, { policy = IH.cache_policy { backoff_base = 0.01 } })
  t.ok(r and r.digest == busybox_id, "503s on blobs are retried", tostring(e))
  reg:faults { { match = "/manifests/", status = 429, retry_after = 0, count = 100 } }
  local c
  r, e, c = images.resolve(ref, { policy = IH.cache_policy { max_attempts = 3 } })
  t.ok(r == nil and c == "throttled" and e:find("(3 attempts)", 1, true), "429 past max_attempts: throttled, attempts said", tostring(e))
  reg:faults { { match = "/manifests/", status = 500, count = 100 } }
  r, e, c = images.resolve(ref, { policy = IH.cache_policy { max_attempts = 2, backoff_base = 0.01 } })
  t.ok(r == nil and c == "registry_error", "500 past max_attempts: registry_error", tostring(e))
  reg:faults {}
end

-- A stall is bounded by stall_timeout, then retried ----------------------------------------------

do
  local ref = "docker://" .. P .. "/library/busybox:latest"
  local blob = img and sbx.json.decode(IH.read(cache .. "/blobs/sha256/" .. img.manifest:sub(8))).layers[1].digest
  reg:faults { { match = blob, stall = 1000, seconds = 20, count = 1 } }
  local t0 = sbx.now()
  local r, e = images.resolve(ref, { policy = IH.cache_policy { stall_timeout = 1, backoff_base = 0.01 } })
  local dt = sbx.now() - t0
  t.ok(r and r.digest == busybox_id and dt < 5, string.format("a blob that stalls is fetched again after stall_timeout (%.1f s)", dt), tostring(e))
  reg:faults { { match = blob, stall = 1000, seconds = 20, count = 100 } }
  t0 = sbx.now()
  local p3 = IH.cache_policy { stall_timeout = 0.5, max_attempts = 2, backoff_base = 0.01 }
  local c
  r, e, c = images.resolve(ref, { policy = p3 })
  dt = sbx.now() - t0
  t.ok(r == nil and c == "timeout" and dt < 4, string.format("a registry that keeps stalling: timeout in %.1f s", dt), tostring(e) .. " " .. tostring(c))
  t.ok(#IH.ls(p3.images.dir .. "/layers/sha256") == 0 and #IH.ls(p3.images.dir .. "/images") == 0
    and #IH.ls(p3.images.dir .. "/tmp") == 0, "a stalled pull leaves nothing behind")
  -- A manifest request that stalls is bounded by policy.images.timeout.
  reg:faults { { match = "/manifests/", stall = 10, seconds = 20, count = 100 } }
  t0 = sbx.now()
  r, e, c = images.resolve(ref, { policy = IH.cache_policy { timeout = 0.5, max_attempts = 2, backoff_base = 0.01 } })
  t.ok(r == nil and c == "timeout" and sbx.now() - t0 < 4, "a stalled manifest: timeout", tostring(e))
  reg:faults {}
end

-- A corrupted blob is refused, and nothing is cached --------------------------------------------

do
  local ref = "docker://" .. P .. "/library/busybox:latest"
  local manifest = sbx.json.decode(IH.read(cache .. "/blobs/sha256/" .. img.manifest:sub(8)))
  local blob = manifest.layers[1].digest
  reg:faults { { match = blob, corrupt = true, count = 100 } }
  local p4 = IH.cache_policy()
  local r, e, c = images.resolve(ref, { policy = p4 })
  t.ok(r == nil and c == "digest_mismatch" and e:find(blob, 1, true), "a corrupted layer blob: digest_mismatch", tostring(e))
  local d = p4.images.dir
  t.ok(#IH.ls(d .. "/layers/sha256") == 0 and #IH.ls(d .. "/images") == 0 and #IH.ls(d .. "/tmp") == 0
    and not IH.read(d .. "/names.json"), "nothing of it is cached", table.concat(IH.ls(d .. "/tmp"), ","))
  reg:faults { { match = manifest.config.digest, corrupt = true, count = 100 } }
  r, e, c = images.resolve(ref, { policy = p4 })
  t.ok(r == nil and c == "digest_mismatch", "a corrupted config: digest_mismatch", tostring(e))
  reg:faults {}
  r = images.resolve(ref, { policy = p4 })
  t.ok(r and r.digest == busybox_id, "the same cache pulls it once the registry behaves")
end

-- Redirects: followed, without the token to another host -------------------------------------------

do
  reg:faults { { match = "/blobs/", redirect = true, count = 100 } }
  local before = reg:stats()
  local r, e = images.resolve("docker://" .. P .. "/library/busybox:latest", { policy = IH.cache_policy() })
  local after = reg:stats()
  local leaked = false
  for _, a in ipairs(after.redirect_auth) do if a ~= sbx.json.null then leaked = true end end
  t.ok(r and r.digest == busybox_id and after.redirected > before.redirected, "blob redirects are followed", tostring(e))
  t.ok(not leaked, "the token is not sent to the redirect's host")
  reg:faults {}
end

-- A 401 without a challenge: GET /v2/ tells how to log in.
do
  reg:faults { { match = "/manifests/", strip_challenge = true, count = 1 } }
  local r, e = images.resolve("docker://" .. P .. "/library/busybox:latest", { policy = IH.cache_policy() })
  t.ok(r and r.digest == busybox_id and reg:stats().faults_fired > 0, "a 401 without a challenge: the one of GET /v2/ is used", tostring(e))
  reg:faults {}
end

-- Plain HTTP ---------------------------------------------------------------------------------------

do
  local ipol = IH.policy().images
  t.ok(registry.plain_http_allowed("127.0.0.1:5000", ipol) and registry.plain_http_allowed("localhost", ipol)
    and registry.plain_http_allowed("[::1]:5000", ipol), "loopback registries may be plain HTTP")
  t.ok(not registry.plain_http_allowed("registry.internal:5000", ipol), "others may not")
  t.is(registry.client("registry.internal:5000", ipol).base, "https://registry.internal:5000", "so they are reached over HTTPS")
  local ins = IH.policy { images = { insecure_registries = { "registry.internal:5000" } } }.images
  t.is(registry.client("registry.internal:5000", ins).base, "http://registry.internal:5000", "unless policy.images.insecure_registries lists them")
  t.is(registry.client(ipol.hub.name, ipol).base, ipol.hub.registry, "Docker Hub's registry comes from policy.images.hub")
end

-- Two processes pulling the same image at once ---------------------------------------------------------

do
  local xdg = IH.tmpdir("concurrent")
  local before = reg:stats()
  local ref = "docker://" .. P .. "/library/big:latest"
  local cmd = string.format("XDG_CACHE_HOME=%s %s images pull %s", q(xdg), q(H.sbx_bin), ref)
  local out, rc = H.sh(string.format("(%s > %s/a.out 2>&1; echo $? >> %s/a.out) & (%s > %s/b.out 2>&1; echo $? >> %s/b.out) & wait",
    cmd, q(xdg), q(xdg), cmd, q(xdg), q(xdg)))
  local a, b = IH.read(xdg .. "/a.out") or "", IH.read(xdg .. "/b.out") or ""
  local after = reg:stats()
  t.ok(rc == 0 and a:match("\n0\n$") and b:match("\n0\n$"), "two processes pulling at once both succeed", a .. b .. out)
  local ida, idb = a:match("(sha256:%x+)"), b:match("(sha256:%x+)")
  t.ok(ida and ida == idb, "and get the same image")
  -- Config and manifest may be fetched twice; the layer blob only once.
  local layers = IH.ls(xdg .. "/sbx/images/layers/sha256")
  t.ok(#layers == 1 and after.blobs - before.blobs <= 3, string.format("the layer was downloaded and unpacked once (%d blob requests)",
    after.blobs - before.blobs))
end

-- How long a first pull takes ---------------------------------------------------------------------------

do
  local function timed(ref, label)
    local p5 = IH.cache_policy()
    local t0 = sbx.now()
    local r, e = images.resolve(ref, { policy = p5 })
    local dt = sbx.now() - t0
    local m = r and sbx.json.decode(IH.read(p5.images.dir .. "/blobs/sha256/" .. r.manifest:sub(8)))
    local bytes = 0
    for _, l in ipairs(m and m.layers or {}) do bytes = bytes + l.size end
    t.diag(string.format("first pull of %s: %.2f s (%.1f MB compressed, %.1f MB unpacked)", label, dt, bytes / 1e6,
      (r and r.size or 0) / 1e6))
    return r, dt, e, bytes
  end
  local r, dt, e, bytes = timed("docker://" .. R .. "/library/big:latest", "a 30 MB image")
  t.ok(r and bytes > 25e6, "the big image is about 30 MB compressed", tostring(e) .. " " .. tostring(bytes))
  t.ok(r and r.size > bytes, "and unpacked (" .. tostring(r and r.size) .. " bytes)")
  local d = timed("docker://" .. R .. "/library/debian:12", "debian:12")
  t.ok(d and layer.stat(d.layers[1] .. "/usr/bin/apt"), "debian:12 pulled and unpacked")
end

reg:stop()
IH.cleanup()
t.done()

-- needs: docker, local
-- sbx.images without a registry: docker save and OCI archives, OCI layout
-- directories, a local daemon, bare names, rootfs: and host; the cache
-- (one layer for one diff id whatever the source, names, archives that
-- change, holds, rm and prune, LRU under max_bytes); a hostile image end
-- to end; the layers as overlayfs lowerdirs (whiteouts, opaque
-- directories) in a user namespace; and `sbx images`.
local sbx = require "sbx"
local t = require "tap"
local H = require "helper"
local IH = require "images_helper"
local images = require "sbx.images"

local layer = sbx.core.layer
local q = IH.q
local fx = IH.fixtures()
local busybox_id = IH.image_id(H.busybox)

local function layout(spec)
  local dir = IH.tmpdir("layout") .. "/oci"
  local out, rc = H.sh(string.format("%s %s layout %s %s", IH.python, IH.script, q(dir), q(sbx.json.encode(spec))))
  assert(rc == 0, out)
  return dir
end

-- Contract --------------------------------------------------------------------------

t.checkerr("ref must be a string", images.resolve, 42)
t.checkerr("pull must be", images.resolve, "host", { pull = "sometimes" })
t.checkerr("opts must be a table", images.resolve, "host", "always")
t.checkerr("whole policy", images.resolve, "host", { policy = { box = {} } })
for _, bad in ipairs { "", "docker://", "docker://Busybox", "docker://busybox:bad tag", "oci:", "docker-daemon:",
                       "docker://busybox@sha256:123", "docker://a/UPPER" } do
  local r, e, c = images.resolve(bad, { policy = IH.cache_policy() })
  t.ok(r == nil and c == "bad_reference", string.format("%q: bad_reference", bad), tostring(e))
end
t.like(select(2, images.resolve("nope::", { policy = IH.cache_policy() })), "references: docker://NAME",
  "a bad reference lists the forms")

-- Names, normalised as docker normalises them.
do
  local refs = require "sbx.images.ref"
  local hub = sbx.policy.images.hub
  local D = string.rep("a", 64)
  for _, case in ipairs {
    { "busybox", hub.name .. "/library/busybox:latest" },
    { "team/tool:1.2", hub.name .. "/team/tool:1.2" },
    { hub.aliases[1] .. "/busybox", hub.name .. "/library/busybox:latest" },
    { "127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b:latest" },
    { "localhost/x:y", "localhost/x:y" },
    { "r.internal/x@sha256:" .. D, "r.internal/x@sha256:" .. D },
    { "x:1@sha256:" .. D, hub.name .. "/library/x@sha256:" .. D },
  } do
    local d, derr = refs.docker_name(case[1], hub)
    t.is(d and d.canonical, case[2], "name " .. case[1] .. (derr and (": " .. derr) or ""))
  end
end

-- policy.images is checked when a policy is loaded.
for _, case in ipairs {
  { { platform = "amd64" }, "os/arch" }, { { device_nodes = "keep" }, '"refuse", "skip"' },
  { { max_bytes = -1 }, "> 0" }, { { insecure_registries = "host:5000" }, "a list" },
  { { retry_statuses = { x = true } }, "integers" }, { { max_atempts = 3 }, "did you mean images.max_attempts" },
  { { hub = { registry = 5 } }, "images.hub.registry must be a string" },
} do
  local ok, perr = sbx.policy_check.policy { images = case[1] }
  t.ok(not ok and tostring(perr):find(case[2], 1, true), "policy.images: " .. tostring(perr), tostring(perr))
end
t.ok(sbx.policy_check.policy { images = { platform = "linux/arm64/v8", insecure_registries = { "r.internal:5000" } } },
  "policy.images: a platform and insecure registries")

-- Local sources ---------------------------------------------------------------------

local pol = IH.cache_policy()
local cdir = pol.images.dir

local da = images.resolve("docker-archive:" .. fx .. "/busybox-docker.tar", { policy = pol })
t.ok(da and da.digest == busybox_id and da.source == "docker-archive", "docker-archive: the daemon's image id")
t.ok(da and layer.stat(da.layers[1] .. "/bin/busybox") and da.config.Cmd[1] == "sh", "docker-archive: layer and config")
local named = images.resolve("docker-archive:" .. fx .. "/busybox-docker.tar:" .. H.busybox, { policy = pol })
t.ok(named and named.digest == busybox_id, "docker-archive:PATH:NAME")
local r, e, c = images.resolve("docker-archive:" .. fx .. "/busybox-docker.tar:other:tag", { policy = pol })
t.ok(r == nil and c == "not_found" and e:find("sbx%-busybox"), "docker-archive with a name it lacks: the names it has", tostring(e))

-- skopeo writes an OCI config over the same layer: another digest than
-- Docker's config, the same as Podman's (whose images are OCI already).
local daemon_is_oci = H.daemon().podman
local oa = images.resolve("oci-archive:" .. fx .. "/busybox-oci.tar:latest", { policy = pol })
t.ok(oa and (daemon_is_oci or oa.digest ~= busybox_id) and oa.source == "oci-archive" and oa.diff_ids[1] == da.diff_ids[1],
  "oci-archive:PATH:TAG: the same layer")
local od = images.resolve("oci:" .. fx .. "/oci-busybox:latest", { policy = pol })
t.ok(od and od.digest == oa.digest and od.manifest and od.source == "oci", "oci:DIR:TAG: the oci-archive's image")
local od2 = images.resolve("oci:" .. fx .. "/oci-busybox", { policy = pol })
t.ok(od2 and od2.digest == oa.digest, "oci:DIR with one image needs no tag")
r, e, c = images.resolve("oci:" .. fx .. "/oci-busybox:nope", { policy = pol })
t.ok(r == nil and c == "not_found" and e:find('"nope"') and e:find("latest"), "oci:DIR:TAG it lacks: its tags", tostring(e))
t.is(#IH.ls(cdir .. "/layers/sha256"), 1, "four sources, one layer on disk (stored by diff id)")
t.is(#IH.ls(cdir .. "/images"), daemon_is_oci and 1 or 2,
  "image records: Docker's config and skopeo's OCI one (one under Podman: the same config)")
r, e, c = images.resolve("oci:/nonexistent/dir", { policy = pol })
t.is(c, "not_found", "oci: a missing directory")
r, e, c = images.resolve("docker-archive:/nonexistent.tar", { policy = pol })
t.is(c, "not_found", "docker-archive: a missing file")

-- A daemon, and bare names --------------------------------------------------------------

do
  local p2 = IH.cache_policy()
  local dd = images.resolve("docker-daemon:" .. H.busybox, { policy = p2 })
  t.ok(dd and dd.digest == busybox_id and dd.source == "docker-daemon", "docker-daemon:NAME exports the daemon's image")
  r, e, c = images.resolve("docker-daemon:no-such-image:1", { policy = p2 })
  t.ok(r == nil and c == "not_found", "docker-daemon: an image it lacks", tostring(e))
  -- A bare name the cache lacks comes from the daemon, before an archive
  -- of it in policy.images.archives...
  local adir = IH.tmpdir("archives")
  local cp_out, cp_rc = H.sh(string.format("cp %s %s", q(fx .. "/busybox-docker.tar"),
    q(adir .. "/" .. H.busybox:gsub("/", "_") .. ".tar")))
  assert(cp_rc == 0, cp_out)
  local p3 = IH.cache_policy { archives = { "/nonexistent/archives", adir } }
  local bare = images.resolve(H.busybox, { policy = p3 })
  t.ok(bare and bare.source == "docker-daemon" and bare.digest == busybox_id,
    "a bare name: the daemon's image when the cache lacks it (before its archive)", bare and bare.source)
  -- ...and then from the cache, with no daemon at all (another process
  -- whose DOCKER_HOST leads nowhere, and no archives).
  local prog = IH.tmpdir("prog") .. "/p.lua"
  local f = assert(io.open(prog, "w"))
  f:write(string.format([[
    local sbx = require "sbx"
    sbx.use_policy { images = { dir = %q, archives = {} } }
    local t0 = sbx.now()
    local img, err = require("sbx.images").resolve(%q, { pull = "missing" })
    print(img and img.digest or err, sbx.now() - t0)
  ]], p3.images.dir, H.busybox))
  f:close()
  local out = H.sh(string.format("DOCKER_HOST=unix:///nonexistent/docker.sock %s run %s", q(H.sbx_bin), q(prog)))
  t.like(out, "^" .. busybox_id, "a bare name in the cache needs no daemon (pull = missing)")
  -- Where no daemon answers (here: policy.images.daemon = false), a bare
  -- name the cache lacks is its archive, and is known by that name after.
  local p4 = IH.cache_policy { archives = { "/nonexistent/archives", adir }, daemon = false }
  local arch = images.resolve(H.busybox, { policy = p4 })
  t.ok(arch and arch.source == "docker-archive" and arch.digest == busybox_id,
    "no daemon: a bare name is its archive in policy.images.archives", arch and arch.source)
  os.remove(adir .. "/" .. H.busybox:gsub("/", "_") .. ".tar")
  local again = images.resolve(H.busybox, { policy = p4, pull = "never" })
  t.ok(again and again.digest == busybox_id, "then the cache has it by name (the archive gone)")
  r, e, c = images.resolve(H.busybox:gsub(":[^:/]*$", "") .. ":other-tag", { policy = p4, pull = "never" })
  t.ok(r == nil and c == "not_cached", "another tag of that name is not the archive", tostring(e))
  r, e, c = images.resolve("never-seen-anywhere:1", { policy = p3, pull = "never" })
  t.ok(r == nil and c == "not_cached" and e:find("never"), "pull = never: a name the cache and the daemon lack", tostring(e))
  r, e, c = images.resolve("docker://127.0.0.1:9/x:1", { policy = p3, pull = "never" })
  t.is(c, "not_cached", "pull = never: docker:// is not asked")
end

do
  local root = IH.tmpdir("rootfs")
  local rf = images.resolve("rootfs:" .. root, { policy = pol })
  t.ok(rf and rf.rootfs == root and rf.layers == nil and rf.source == "rootfs" and rf.config.Env, "rootfs:DIR")
  r, e, c = images.resolve("rootfs:" .. root .. "/missing", { policy = pol })
  t.is(c, "not_found", "rootfs: a missing directory")
  local h = images.resolve("host", { policy = pol })
  t.ok(h and h.host and h.rootfs == "/" and h.source == "host", "host: the host's root")
end

-- Archives that change are read again ---------------------------------------------------

do
  local copy = IH.tmpdir("archive") .. "/image.tar"
  os.execute(string.format("cp %s %s", q(fx .. "/busybox-docker.tar"), q(copy)))
  local p4 = IH.cache_policy()
  local a = assert(images.resolve("docker-archive:" .. copy, { policy = p4 }))
  t.ok(images.resolve("docker-archive:" .. copy, { policy = p4 }), "an archive the cache has")
  os.execute(string.format("cp %s %s", q(fx .. "/busybox-oci.tar"), q(copy)))
  r, e, c = images.resolve("docker-archive:" .. copy, { policy = p4 })
  t.ok(r == nil and c == "bad_image", "an archive that changed is read again (now it is no docker save)", tostring(e))
  os.execute(string.format("head -c 300000 %s > %s", q(fx .. "/busybox-docker.tar"), q(copy)))
  r, e, c = images.resolve("docker-archive:" .. copy, { policy = IH.cache_policy() })
  t.ok(r == nil and (c == "bad_image" or c == "bad_layer"), "a truncated docker save: an error", tostring(e) .. " " .. tostring(c))
  t.is(a.digest, busybox_id, "the archive's first reading was the daemon's image")
end

-- A hostile image end to end: refused, nothing cached, nothing outside ----------------------

do
  local outside = IH.tmpdir("outside")
  local cases = {
    { "../ entry", { { name = "../../../../../../" .. outside:sub(2) .. "/escaped", data = "x" } }, "unsafe_entry" },
    { "absolute symlink, then a file through it", { { name = "l", type = "symlink", linkname = outside },
      { name = "l/escaped", data = "x" } }, "unsafe_entry" },
    { "hard link out of the tree", { { name = "h", type = "link", linkname = "../../../../etc/passwd" } }, "unsafe_entry" },
    { "device node", { { name = "dev/sda", type = "chr" } }, "device" },
  }
  for _, case in ipairs(cases) do
    local dir = layout { layers = { { { name = "ok", data = "fine" } }, case[2] } }
    local p5 = IH.cache_policy()
    r, e, c = images.resolve("oci:" .. dir, { policy = p5 })
    local d = p5.images.dir
    t.ok(r == nil and c == case[3], "oci image with a " .. case[1] .. ": " .. case[3], tostring(e))
    -- The good lower layer may stay (it is whole and checked); the bad one,
    -- the image and its name never appear.
    t.ok(#IH.ls(d .. "/layers/sha256") <= 1 and #IH.ls(d .. "/images") == 0 and #IH.ls(d .. "/tmp") == 0
      and not IH.read(d .. "/names.json") and #IH.ls(outside) == 0,
      case[1] .. ": no image, no half layer, nothing outside the cache")
  end
  local dir = layout { layers = { { { name = "big", data = string.rep("x", 5000) } } } }
  r, e, c = images.resolve("oci:" .. dir, { policy = IH.cache_policy { max_layer_bytes = 4096 } })
  t.ok(r == nil and c == "too_large" and e:find("max_layer_bytes"), "a layer larger than max_layer_bytes", tostring(e))
  r, e, c = images.resolve("oci:" .. dir, { policy = IH.cache_policy { max_layer_entries = 0 + 1 } })
  t.ok(r, "max_layer_entries 1 holds a one-file layer", tostring(e))
end

-- Layers as overlayfs lowerdirs -----------------------------------------------------------

do
  local dir = layout { layers = {
    { { name = "a/x", data = "x" }, { name = "a/y", data = "y" }, { name = "d/z", data = "z" }, { name = "keep", data = "k" } },
    { { name = "a/.wh.x" }, { name = "d/.wh..wh..opq" }, { name = "d/new", data = "n" } },
  } }
  local p6 = IH.cache_policy()
  local img = images.resolve("oci:" .. dir, { policy = p6 })
  t.ok(img and #img.layers == 2, "a two-layer image with whiteouts")
  if img then
    local lower = img.layers[2] .. ":" .. img.layers[1]    -- highest first
    local mnt = IH.tmpdir("mnt")
    local script = string.format("mount -t overlay overlay -o userxattr,lowerdir=%s %s && cd %s && find . | sort | tr '\\n' ' '",
      lower, mnt, mnt)
    local out, rc = H.sh("unshare --user --map-root-user --mount sh -c " .. q(script))
    t.ok(rc == 0 and out:find("./a/y") and not out:find("./a/x") and out:find("./d/new") and not out:find("./d/z")
      and out:find("./keep"), "mounted with userxattr in a user namespace: whiteouts hide, opaque directories cover", out)
    if layer.euid() == 0 then
      out, rc = H.sh(string.format("unshare --mount sh -c %s", q(script:gsub("userxattr,", ""))))
      t.ok(rc == 0 and not out:find("./a/x") and not out:find("./d/z") and out:find("./d/new"),
        "as root without userxattr too (trusted.overlay.opaque)", out)
    else
      t.skip("overlay as root", "not root")
    end
  end
end

-- Another user: a cache of its own, files of its own, layers it can mount ---------------

do
  if layer.euid() == 0 and os.execute("command -v setpriv >/dev/null 2>&1") then
    local home = IH.tmpdir("user")
    local wh = layout { layers = {
      { { name = "a/x", data = "x" }, { name = "a/y", data = "y" } },
      { { name = "a/.wh.x" }, { name = "n", data = "n" } },
    } }
    os.execute(string.format("cp -r %s %s/oci && cp -r %s %s/wh && chown -R 65534:65534 %s",
      q(fx .. "/oci-busybox"), q(home), q(wh), q(home), q(home)))
    local prog = home .. "/p.lua"
    local f = assert(io.open(prog, "w"))
    f:write(string.format([[
      local images = require "sbx.images"
      local a, err = images.resolve("oci:%s/oci")
      local b, err2 = images.resolve("oci:%s/wh")
      if not a or not b then print("fail", err, err2) return end
      print(a.digest, b.layers[2] .. ":" .. b.layers[1], images.dir())
    ]], home, home))
    f:close()
    os.execute("chown 65534:65534 " .. q(prog))
    local as_user = string.format("setpriv --reuid=65534 --regid=65534 --clear-groups env -u XDG_CACHE_HOME HOME=%s ", q(home))
    local out, rc = H.sh(as_user .. q(H.sbx_bin) .. " run " .. q(prog))
    local id, lower, dir = out:match("^(sha256:%x+)	(%S+)	(%S+)")
    t.ok(rc == 0 and id, "another user pulls into its own cache", out)
    t.is(dir, home .. "/.cache/sbx/images", "under its HOME's .cache")
    local st = lower and layer.stat(lower:match("^([^:]+)") .. "/n")
    t.ok(st and st.uid == 65534, "the files are that user's")
    local mnt = home .. "/mnt"
    os.execute("mkdir " .. q(mnt) .. " && chown 65534 " .. q(mnt))
    out, rc = H.sh(as_user .. "unshare --user --map-root-user --mount sh -c " ..
      q(string.format("mount -t overlay overlay -o userxattr,lowerdir=%s %s && cd %s && find . | sort | tr '\\n' ' ' && stat -c %%u n",
        tostring(lower), mnt, mnt)))
    t.ok(rc == 0 and out:find("./a/y") and not out:find("./a/x") and out:find("./n") and out:match("0%s*$"),
      "it mounts them as overlayfs lowerdirs in its user namespace: whiteouts hide, its files are root's there", out)
  else
    for _ = 1, 4 do t.skip("another user's cache", "needs root and setpriv") end
  end
end

-- Holds, rm, prune ------------------------------------------------------------------------

do
  local p7 = IH.cache_policy()
  local d = p7.images.dir
  local a = assert(images.resolve("docker-archive:" .. fx .. "/busybox-docker.tar", { policy = p7, hold = true }))
  t.ok(a.lease and a.lease:held(), "hold = true: the image comes with a lease")
  local small = layout { layers = { { { name = "only", data = "1" } } } }
  local b = assert(images.resolve("oci:" .. small, { policy = p7 }))
  r, e, c = images.remove("docker-archive:" .. fx .. "/busybox-docker.tar", { policy = p7 })
  t.ok(r == nil and c == "busy", "rm of an image a box holds: busy", tostring(e))
  local pr = assert(images.prune { policy = p7, max_bytes = 1 })
  t.ok(#pr.held == 1 and pr.held[1] == a.digest and layer.stat(a.layers[1]) and not layer.stat(b.layers[1]),
    "prune past max_bytes removes what is not held, and keeps what is", sbx.json.encode(pr))
  a.lease:close()
  local rm = assert(images.remove("docker-archive:" .. fx .. "/busybox-docker.tar", { policy = p7 }))
  t.ok(#rm.names == 1 and #rm.images == 1 and rm.layers == 1 and not layer.stat(a.layers[1]), "rm after the lease closed: name, image, layer gone")
  r, e, c = images.remove("docker-archive:" .. fx .. "/busybox-docker.tar", { policy = p7 })
  t.is(c, "not_found", "rm of what is not there")
  t.is(#IH.ls(d .. "/layers/sha256") + #IH.ls(d .. "/images"), 0, "the cache is empty")

  -- LRU: the image used last stays.
  local p8 = IH.cache_policy()
  local first = assert(images.resolve("oci:" .. fx .. "/oci-busybox", { policy = p8 }))
  local second = assert(images.resolve("oci:" .. small, { policy = p8 }))
  sbx.sleep(0.05)
  assert(images.resolve("oci:" .. fx .. "/oci-busybox", { policy = p8 }))     -- used again: now the newest
  local keep_bytes = first.size
  pr = assert(images.prune { policy = p8, max_bytes = keep_bytes })
  t.ok(#pr.images == 1 and pr.images[1] == second.digest and layer.stat(first.layers[1]),
    "prune to max_bytes removes the least recently used first", sbx.json.encode(pr))
  -- By id prefix.
  rm = assert(images.remove(first.digest:sub(8, 19), { policy = p8 }))
  t.ok(#rm.images == 1 and rm.images[1] == first.digest, "rm by an id prefix")
  -- A pull that would pass max_bytes makes room first (the cache never
  -- passes it: tests/images_import_test.lua counts that while unpacking).
  local p9 = IH.cache_policy { max_bytes = keep_bytes + 64 * 1024 }
  assert(images.resolve("oci:" .. small, { policy = p9 }))
  local latest = assert(images.resolve("oci:" .. fx .. "/oci-busybox", { policy = p9 }))
  local l = images.list { policy = p9 }
  t.ok(#l == 1 and l[1].digest == latest.digest, "a pull past max_bytes makes room in the cache, keeping what it pulled")
end

-- sbx images ---------------------------------------------------------------------------------

do
  local xdg = IH.tmpdir("cli")
  local function cli(args)
    return H.sh(string.format("XDG_CACHE_HOME=%s %s images %s", q(xdg), q(H.sbx_bin), args))
  end
  local out, rc = cli("pull docker-archive:" .. q(fx .. "/busybox-docker.tar"))
  t.ok(rc == 0 and out:find(busybox_id, 1, true), "sbx images pull", out)
  t.ok(layer.stat(xdg .. "/sbx/images/layers/sha256"), "the cache is under XDG_CACHE_HOME/sbx/images")
  t.is(layer.stat(xdg .. "/sbx/images").mode, tonumber("700", 8), "and only its user may enter it")
  out, rc = cli("ls")
  t.ok(rc == 0 and out:find("NAME") and out:find("docker%-archive:") and out:find(busybox_id:sub(8, 19), 1, true), "sbx images ls", out)
  out, rc = cli("rm " .. busybox_id:sub(8, 19))
  t.ok(rc == 0 and out:find("deleted " .. busybox_id, 1, true), "sbx images rm ID", out)
  out, rc = cli("prune")
  t.ok(rc == 0 and out:find("removed 0 image"), "sbx images prune", out)
  out, rc = cli("pull")
  t.ok(rc == 2 and out:find("needs one reference"), "sbx images pull without a reference: usage, exit 2", out)
  out, rc = cli("pull docker://UPPER")
  t.is(rc, 2, "a bad reference: exit 2")
  out, rc = cli("frobnicate")
  t.ok(rc == 2 and out:find("unknown subcommand"), "an unknown subcommand: exit 2")
  out, rc = cli("rm docker-archive:/nonexistent.tar")
  t.is(rc, 1, "rm of an image the cache lacks: exit 1")
end

IH.cleanup()
t.done()

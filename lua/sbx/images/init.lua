--[[
sbx.images: images for the daemon-free backends, unpacked once into a cache
shared by boxes and by concurrent sbx processes (layout: sbx.images.cache).

  images.resolve(ref, opts) -> image | nil, message, code
  images.pull(ref, opts)    -> image | nil, message, code   (resolve, pull = "always")
  images.list(opts)         -> { entry, ... }
  images.remove(ref, opts)  -> report | nil, message, code
  images.prune(opts)        -> report | nil, message, code
  images.hold(image, opts)  -> lease | nil, message, code

ref: docker://NAME[:TAG|@DIGEST], docker-archive:PATH[:NAME],
oci-archive:PATH[:TAG], oci:DIR[:TAG], docker-daemon:NAME, rootfs:DIR, host,
or a bare NAME (the cache by name, then docker-daemon: when a daemon
answers and policy.images.daemon, then NAME:TAG.tar in one of
policy.images.archives, then docker:// as pull allows).

opts (all optional): policy (a whole policy, such as box:policy(); default
the live one; its images and box.pull sections are read), pull ("missing":
use what the cache has under that name; "always": ask the source again,
reusing every layer the cache has; "never": never contact a registry),
hold (true: image.lease keeps the image from rm and prune until closed).

image (a plain table):
  digest    "sha256:..." the image id: its config's digest, as docker's
            IMAGE ID (the same image from a registry, an archive or a
            daemon is one cache entry); nil for rootfs and host
  manifest  the manifest's digest (what NAME@sha256:... pins), when the
            source has one
  layers    { dir, ... } lowest first: unpacked read-only directories in
            the cache, to be overlayfs lowerdirs (lowerdir= takes them
            highest first: reverse the list). Whiteouts are 0/0 character
            devices and opaque directories carry user.overlay.opaque=y
            (and trusted.overlay.opaque=y when unpacked as root): mount
            with userxattr in a user namespace
  rootfs    rootfs:DIR and host: the one directory (layers is nil)
  host      true for host: the host's root, to be mounted read-only
  config    { Env, Cmd, Entrypoint, WorkingDir, User, Labels, ExposedPorts,
            Volumes, StopSignal, Architecture, Os, Variant } from the
            image config (absent fields absent)
  name      the cache's name for it ("docker.io/library/busybox:latest",
            "docker-daemon:...", "oci:/dir:tag", ...)
  source    "docker", "docker-archive", "oci-archive", "oci",
            "docker-daemon", "rootfs" or "host"
  size      bytes the layers use on disk
  lease     with opts.hold: the lease (lease:close(); <close> works)

Ownership: unpacked as root, files keep the tar's owners; unpacked by
another user they all belong to that user (the kernel lets nobody else
chown), so a box in a user namespace that maps the user to 0 sees them as
root's. Modes (setuid included) are kept; the cache directory is 0700.

Codes: "not_found" (no such image, tag or file), "unauthorized",
"denied", "throttled", "registry_error", "insecure", "digest_mismatch",
"bad_image" (not an image sbx can use), "bad_layer", "unsafe_entry",
"device", "too_large", "no_platform", "not_cached" (pull = "never" and the
cache lacks it), "busy" (the cache is locked past lock_timeout; an image in
use for rm), "daemon_unavailable", "io", or a transport code ("timeout",
"ECONNREFUSED", "closed", "tls"). A ref or an option of the wrong type
raises.
]]
local core = require "sbx.core"
local refs = require "sbx.images.ref"
local cache_mod = require "sbx.images.cache"
local sources = require "sbx.images.sources"
local registry = require "sbx.images.registry"
local progress = require "sbx.progress"
local validate = require "sbx.images.validate"

local layer = core.layer

local M = {}

local PULL = { missing = true, always = true, never = true }

local function policy_of(opts)
  local pol = opts.policy or require("sbx.config").policy
  if type(pol) ~= "table" or type(pol.images) ~= "table" then
    error("images: opts.policy must be a whole policy (with an images section)", 3)
  end
  return pol
end

local function check_opts(opts, fname)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(string.format("images.%s: opts must be a table", fname), 3) end
  if opts.pull ~= nil and not PULL[opts.pull] then
    error(string.format("images.%s: pull must be \"missing\", \"always\" or \"never\", not %s", fname, tostring(opts.pull)), 3)
  end
  return opts
end

local function exists(path) return layer.stat(path) ~= nil end

--[[
What this process did to the cache since it started (what tests and
benchmarks count): { fetches = registry images fetched, exports = images
exported from a daemon, archives = archives read, unpacks = layers
unpacked }. images.stats() returns a copy.
]]
local stats = cache_mod.stats

--[[
fetch_turn(cache, key) -> turn, waited | nil, message, code
  One fetch of an image name at a time: within this process the tasks that
  need key wait for the one fetching it (an event each), across processes
  a flock (locks/fetch-<hash>) does the same. waited: another fetched it
  meanwhile, so the cache is to be looked at again before fetching. The
  turn is a to-be-closed value: <close> ends it.
]]
local turns = {}
local function fetch_turn(cache, key)
  local k = cache.dir .. "\0" .. key
  local waited = false
  while turns[k] do
    waited = true
    turns[k]:wait()
  end
  local ev = core.event()
  turns[k] = ev
  local function over()
    if turns[k] == ev then turns[k] = nil end
    ev:set()
  end
  local name = "fetch-" .. layer.sha256(key):sub(8, 39)
  local lock = layer.lock(cache.dir .. "/locks/" .. name .. ".lock", "ex")
  if not lock then
    waited = true
    local err, code
    lock, err, code = cache:lock(name, "ex")
    if not lock then over() return nil, err, code end
  end
  return setmetatable({}, { __close = function() lock:close() over() end }), waited
end

local DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

-- The image table a caller gets from a record.
local function image_of(cache, rec, key)
  local layers = {}
  for i, d in ipairs(cache_mod.dirs_of(rec)) do layers[i] = cache:layer_dir(d) .. "/root" end
  return {
    digest = rec.id, manifest = rec.manifest, layers = layers, diff_ids = rec.layers,
    config = rec.config, name = key, source = rec.source, size = rec.size,
    platform = rec.platform,
  }
end

-- Runs fns at most n at a time; -> the first failure (message, code) or nil.
local unpack_layers
local function run_bounded(fns, n)
  local tasks = require "sbx.tasks"
  local sem = tasks.semaphore(n)
  local running = {}
  for i, fn in ipairs(fns) do
    running[i] = tasks.spawn(function()
      sem:acquire()
      local ok, a, b, c = pcall(fn)
      sem:release()
      if not ok then return nil, tostring(a), "io" end
      return a, b, c
    end)
  end
  local failure
  for _, t in ipairs(running) do
    local a, b, c = tasks.wait(t)
    if not a and not failure then failure = { b, c } end
  end
  if failure then return failure[1], failure[2] end
  return nil
end

local MiB = 1024 * 1024

-- A guess of the disk the layers the cache lacks will take: what they
-- weigh (4x when compressed; an uncompressed docker save layer as it is).
local function estimate(cache, desc, diff_ids)
  local n = 0
  for i, l in ipairs(desc.layers) do
    if not cache:layer_root(diff_ids[i]) and l.size then
      local compressed = not l.media_type or l.media_type:find("gzip") or l.media_type:find("zstd")
      if l.uncompressed then compressed = false end
      n = n + l.size * (compressed and 4 or 1)
    end
  end
  return n
end

--[[
unpack_layers(cache, ipol, desc, diff_ids, chains, meter) -> gc lock, keys | nil, message, code
  Unpacks the layers of desc the cache lacks, policy.images.parallel at a
  time, under two budgets every file and directory is charged to before
  it is written (core.layer.budget): the image's (max_image_bytes less
  the layers it already has in the cache) and the cache's room
  (max_bytes less what the cache holds). Before, the least recently used
  images no box holds go until the likely size fits; when the cache's
  budget still runs out, every image no box holds goes and it is tried
  once more. A failure leaves no layer of this import behind (a collect,
  when no other import is under way). Success: the gc lock (shared) that
  keeps the new layers until the image is recorded, and where each layer
  is (its diff id, or its chain id: cache:finish_layer).
]]
function unpack_layers(cache, ipol, desc, diff_ids, chains, meter)
  local have = 0
  for i, d in ipairs(diff_ids) do
    local key = cache:layer_root(d) and d or (i > 1 and cache:layer_root(chains[i]) and chains[i])
    local m = key and cache:layer_meta(key)
    if m then have = have + (tonumber(m.disk) or 0) end
  end
  if have > ipol.max_image_bytes then
    return nil, string.format("the image's layers take %d bytes: more than policy.images.max_image_bytes (%d)",
      have, ipol.max_image_bytes), "too_large"
  end
  local want = math.min(estimate(cache, desc, diff_ids), ipol.max_image_bytes - have)
  if cache:size() + want > ipol.max_bytes then
    cache:collect { max_bytes = math.max(0, ipol.max_bytes - want), keep = { [desc.id] = true }, wait = 0 }
  end
  local function attempt()
    local gc, gerr, gcode = cache:lock("gc", "sh")
    if not gc then return nil, gerr, gcode end
    local image = layer.budget(ipol.max_image_bytes - have,
      string.format("the image unpacks to more than %d bytes (%.0f MiB, policy.images.max_image_bytes)",
        ipol.max_image_bytes, ipol.max_image_bytes / MiB))
    local used = cache:size()
    local room = layer.budget(math.max(0, ipol.max_bytes - used),
      string.format("the image cache would pass %d bytes (%.0f MiB, policy.images.max_bytes; %d in use)",
        ipol.max_bytes, ipol.max_bytes / MiB, used))
    local jobs, got = {}, {}
    for i, l in ipairs(desc.layers) do
      jobs[#jobs + 1] = function()
        local root, key, code = cache:ensure_layer(diff_ids[i], l.input, { image, room }, i > 1 and chains[i] or nil)
        if not root then return nil, key, code end
        got[i] = type(root) == "table" and root or key
        local m = type(key) == "string" and cache:layer_meta(key)
        meter:step(m and tonumber(m.bytes) or 0)
        return true
      end
    end
    local err, code = run_bounded(jobs, ipol.parallel)
    -- Layers with links into lower ones, lowest first, once those are in.
    local keys = {}
    for i = 1, #desc.layers do
      local g = got[i]
      if type(g) == "table" then
        if err then
          layer.remove(g.tmp)
        else
          local lowers = {}
          for j = i - 1, 1, -1 do lowers[#lowers + 1] = cache:layer_dir(keys[j]) .. "/root" end
          local root, key, fcode = cache:finish_layer(g, chains[i], lowers)
          if not root then err, code = key, fcode else keys[i] = key end
        end
      else
        keys[i] = g
      end
    end
    if err then
      gc:close()
      return nil, err, code, room:over() and not image:over()
    end
    return gc, keys
  end
  -- On success the second value is the layers' keys, else the message.
  local gc, keys, code, full = attempt()
  if not gc and full then
    -- The cache was full of images nobody holds: they go, and once more.
    local report = cache:collect { max_bytes = 0, keep = { [desc.id] = true }, wait = 0 }
    if report and #report.images > 0 then gc, keys, code = attempt() end
  end
  if not gc then
    -- Layers this import finished are no image's: gone, unless another
    -- import (which may share them) is under way.
    cache:collect { wait = 0 }
    return nil, keys, code
  end
  return gc, keys
end

--[[
install(cache, pol, desc, source, names) -> record | nil, message, code
  Puts what desc describes into the cache: every layer it lacks (checked),
  the blobs, the record, and names -> id.
]]
local function install(cache, pol, desc, source, names, stamp)
  -- Every field a backend reads is checked here, at import.
  local doc, flat, vcode = validate.config(desc.config_bytes)
  if not doc then return nil, flat, vcode end
  local diff_ids = doc.rootfs.diff_ids
  if #diff_ids ~= #desc.layers then
    return nil, string.format("the config lists %d layers, the manifest %d", #diff_ids, #desc.layers), "bad_image"
  end
  cache:clean_tmp()
  local ipol = pol.images
  local old = cache:image(desc.id)
  -- OCI chain ids: where a layer whose links reach into lower ones is kept.
  local chains = { diff_ids[1] }
  for i = 2, #diff_ids do chains[i] = layer.sha256(chains[i - 1] .. " " .. diff_ids[i]) end
  local function lock_or_unpack()
    if old and cache:complete(old) then
      local l, lerr, lcode = cache:lock("gc", "sh")
      return l, l and cache_mod.dirs_of(old) or lerr, lcode
    end
    local meter = progress.start("unpacking " .. tostring(names[1] or desc.id), { of = #desc.layers, pol = pol })
    local l, lkeys, lcode = unpack_layers(cache, ipol, desc, diff_ids, chains, meter)
    if l then meter:finish() end
    return l, lkeys, lcode
  end
  local gc <close>, keys, gcode = lock_or_unpack()
  if not gc then return nil, keys, gcode end
  local dirs
  for i, k in ipairs(keys) do
    if k ~= diff_ids[i] then dirs = keys end
  end
  local size = 0
  for _, d in ipairs(keys) do
    local m = cache:layer_meta(d)
    size = size + (m and tonumber(m.disk) or 0)
  end
  local arch = doc.architecture and (tostring(doc.os or "linux") .. "/" .. doc.architecture .. (doc.variant and ("/" .. doc.variant) or "")) or nil
  local rec = {
    id = desc.id, manifest = desc.manifest, index = desc.index, source = source,
    layers = diff_ids, dirs = dirs, config = flat, size = size, platform = arch,
    created = doc.created, pulled = os.time(),
  }
  cache:put_blob(desc.id, desc.config_bytes)
  if desc.manifest and desc.manifest_bytes then cache:put_blob(desc.manifest, desc.manifest_bytes) end
  local ok, err, code = cache:put_image(rec)
  if not ok then return nil, err, code end
  ok, err, code = cache:update_names(function(t)
    for _, n in ipairs(names) do
      t[n] = { id = desc.id, source = source, manifest = desc.manifest, stamp = stamp, time = os.time() }
    end
  end)
  if not ok then return nil, err, code end
  return rec
end

-- After a pull, back under max_bytes if another process is not busy.
local function trim(cache, pol, keep)
  if cache:size() <= pol.images.max_bytes then return end
  cache:collect { max_bytes = pol.images.max_bytes, keep = { [keep] = true }, wait = 0 }
end

-- A cached name's record, when every layer is there.
local function cached(cache, key)
  local entry = cache:names()[key]
  if not entry then return nil end
  local rec = cache:image(entry.id)
  if not rec or not cache:complete(rec) then return nil end
  return rec, entry
end

-- The stamp of a local file or directory source: it changed when this did.
local function stamp_of(path, sub)
  local st = layer.stat(sub and (path .. "/" .. sub) or path)
  if not st then return nil end
  return string.format("%d:%.6f:%d", st.size, st.mtime, st.ino)
end

local function daemon_connect()
  local docker = require "sbx.backends.docker"
  return docker.connect()
end

--[[
The image a daemon has as name (a parsed docker name): its id first (a
cache hit needs no export), else `docker save` through the Engine API
into the cache's scratch space. -> record | nil, message, code
]]
local function from_daemon(cache, pol, d)
  local docker = require "sbx.backends.docker"
  local dm, err, code = daemon_connect()
  if not dm then return nil, err, code end
  local path = "/images/" .. core.http.escape(d.canonical)
  local st, info, icode = docker.call(dm, "GET", path .. "/json", nil, { ok = { [404] = true } })
  if not st then return nil, info, icode end
  if st == 404 then
    return nil, string.format("the Docker daemon at %s has no image %s", dm.endpoint, d.canonical), "not_found"
  end
  local key = "docker-daemon:" .. d.canonical
  local id = type(info) == "table" and info.Id
  if type(id) == "string" then
    local rec = cache:image(id)
    if rec and cache:complete(rec) then
      local ok, uerr, ucode = cache:update_names(function(t)
        t[key] = { id = id, source = "docker-daemon", time = os.time() }
      end)
      if not ok then return nil, uerr, ucode end
      return rec
    end
  end
  local tmp, terr, tcode = cache:tmpdir()
  if not tmp then return nil, terr, tcode end
  stats.exports = stats.exports + 1
  local file = tmp .. "/image.tar"
  local r, herr, hcode = require("sbx.http").request {
    url = dm.prefix .. path .. "/get", unix_socket = dm.unix_socket, stream = true,
    timeout = pol.docker and pol.docker.pull_timeout or pol.images.blob_timeout,
  }
  if not r or r.status ~= 200 then
    layer.remove(tmp)
    return nil, string.format("docker-daemon:%s: export failed: %s", d.canonical, r and ("HTTP " .. r.status) or herr),
      r and "daemon_unavailable" or hcode
  end
  local body <close> = r.body_stream
  -- No total: the image's Size is its files, not the export's tar.
  local meter = progress.start("exporting " .. d.canonical .. " from the Docker daemon", { pol = pol })
  local f, ferr = io.open(file, "wb")
  if not f then
    layer.remove(tmp)
    return nil, "cannot write " .. file .. ": " .. tostring(ferr), "io"
  end
  while true do
    local chunk, rerr, rcode = body:read(pol.images.stall_timeout)
    if not chunk then
      f:close()
      if rerr ~= "eof" then
        layer.remove(tmp)
        return nil, string.format("docker-daemon:%s: export: %s", d.canonical, rerr), rcode
      end
      break
    end
    local ok, werr = f:write(chunk)
    if not ok then
      f:close()
      layer.remove(tmp)
      return nil, "cannot write " .. file .. ": " .. tostring(werr), "io"
    end
    meter:add(#chunk)
  end
  meter:finish()
  local desc, derr, dcode = sources.docker_archive(file, d, pol.images, "docker-daemon:" .. d.canonical)
  if not desc then
    layer.remove(tmp)
    return nil, derr, dcode
  end
  local rec, ierr, icode = install(cache, pol, desc, "docker-daemon", { key })
  layer.remove(tmp)
  return rec, ierr, icode
end

local function from_registry(cache, pol, d, pull)
  local key = d.canonical
  stats.fetches = stats.fetches + 1
  local desc, err, code = sources.docker(d, pol.images)
  if not desc then return nil, err, code end
  local old = cache:image(desc.id)
  if old and cache:complete(old) and pull ~= "always" then
    -- Only the name is new.
    cache:update_names(function(t)
      t[key] = { id = desc.id, source = "docker", manifest = desc.manifest, time = os.time() }
    end)
    return old
  end
  local total = 0
  for _, l in ipairs(desc.layers) do total = total + (l.size or 0) end
  local meter = progress.start("downloading " .. key, { total = total > 0 and total or nil, pol = pol })
  desc.on_bytes = function(n) meter:add(n) end
  local rec, ierr, icode = install(cache, pol, desc, "docker", { key })
  meter:finish()
  return rec, ierr, icode
end

local function describe(r)
  return r.input
end

--[[
images.resolve(ref, opts) -> image | nil, message, code
  See the top of this file. With pull = "missing", an image the cache holds
  under its name costs a few file reads and no network.
]]
-- The archive in policy.images.archives for a bare docker name, or nil.
local function archive_for(ipol, d)
  local hub = (ipol.hub and ipol.hub.name or "docker.io"):gsub("%p", "%%%0")
  -- The name as people write it: docker.io/library/x:t is x:t.
  local familiar = d.canonical:gsub("^" .. hub .. "/library/", ""):gsub("^" .. hub .. "/", "")
  for _, dir in ipairs(ipol.archives or {}) do
    for _, n in ipairs { familiar, d.canonical } do
      local file = dir .. "/" .. n:gsub("/", "_") .. ".tar"
      local st = layer.stat(file)
      if st and st.type == "file" then return file end
    end
  end
end

function M.resolve(ref, opts)
  if type(ref) ~= "string" then error("images.resolve: ref must be a string", 2) end
  opts = check_opts(opts, "resolve")
  local pol = policy_of(opts)
  local ipol = pol.images
  local pull = opts.pull or (pol.box and pol.box.pull) or "missing"
  local r, perr = refs.parse(ref, { hub = ipol.hub, exists = exists })
  if not r then return nil, perr, "bad_reference" end

  if r.transport == "host" then
    return { source = "host", host = true, rootfs = "/", name = "host",
             config = { Env = { "PATH=" .. (os.getenv("PATH") or DEFAULT_PATH:sub(6)) }, WorkingDir = "/" } }
  end
  if r.transport == "rootfs" then
    local st = layer.stat(r.path)
    if not st or st.type ~= "dir" then return nil, string.format("rootfs:%s: no such directory", r.path), "not_found" end
    return { source = "rootfs", rootfs = r.path, name = r.key, config = { Env = { DEFAULT_PATH }, WorkingDir = "/" } }
  end

  local cache, cerr, ccode = cache_mod.open(ipol)
  if not cache then return nil, cerr, ccode end
  local rec, err, code, key

  local function done(found, k)
    layer.touch(cache:image_path(found.id))
    local img = image_of(cache, found, k)
    if opts.hold then
      local lease, lerr, lcode = M.hold(img, opts)
      if not lease then return nil, lerr, lcode end
      img.lease = lease
    end
    return img
  end

  if r.transport == "name" then
    local d = r.docker
    local function lookup()
      local best, bkey
      for _, k in ipairs { "docker-daemon:" .. d.canonical, d.canonical } do
        local found, entry = cached(cache, k)
        if found and (not best or (entry.time or 0) > best[2]) then best, bkey = { found, entry.time or 0 }, k end
      end
      if best then return best[1], bkey end
    end
    if pull ~= "always" then
      local found, k = lookup()
      if found then return done(found, k) end
    end
    local turn <close>, waited, tcode = fetch_turn(cache, d.canonical)
    if not turn then return nil, waited, tcode end
    if waited then
      -- Another task or process fetched it just now: that is the fetch
      -- this one asked for, pull = "always" included.
      local found, k = lookup()
      if found then return done(found, k) end
    end
    local why = {}
    if ipol.daemon then
      rec, err, code = from_daemon(cache, pol, d)
      if rec then return done(rec, "docker-daemon:" .. d.canonical) end
      if code ~= "not_found" and code ~= "daemon_unavailable" then return nil, err, code end
      why[#why + 1] = err
    end
    -- Then a `docker save` tarball in one of policy.images.archives (named
    -- NAME:TAG.tar, '/' in the name as '_'; what scripts/build-images.sh
    -- writes, the daemon's own image where one runs): loaded once and known
    -- by the bare name afterwards.
    local file = archive_for(ipol, d)
    if file then
      stats.archives = stats.archives + 1
      local desc, aerr, acode = sources.docker_archive(file, d, ipol)
      if not desc then return nil, aerr, acode end
      local akey = "docker-archive:" .. file .. ":" .. d.canonical
      rec, err, code = install(cache, pol, desc, "docker-archive", { akey, d.canonical }, stamp_of(file))
      if not rec then return nil, err, code end
      trim(cache, pol, rec.id)
      return done(rec, d.canonical)
    end
    if pull == "never" then
      why[#why + 1] = "pull = \"never\" forbids asking its registry"
      return nil, string.format("image %s is not in the cache (%s)", d.canonical, table.concat(why, "; ")), "not_cached"
    end
    rec, err, code = from_registry(cache, pol, d, pull)
    if rec then
      trim(cache, pol, rec.id)
      return done(rec, d.canonical)
    end
    return nil, err, code
  end

  key = r.key
  local function lookup()
    local found, entry = cached(cache, key)
    local stamp_ok = true
    if found and (r.transport == "docker-archive" or r.transport == "oci-archive") then
      stamp_ok = entry.stamp == stamp_of(r.path)
    elseif found and r.transport == "oci" then
      stamp_ok = entry.stamp == stamp_of(r.path, "index.json")
    end
    if found and stamp_ok then return found end
  end
  if pull ~= "always" then
    local found = lookup()
    if found then return done(found, key) end
  end
  if r.transport == "docker" and pull == "never" then
    return nil, string.format("image %s is not in the cache and pull = \"never\"", r.docker.canonical), "not_cached"
  end
  local turn <close>, waited, tcode = fetch_turn(cache, key)
  if not turn then return nil, waited, tcode end
  if waited then
    local found = lookup()
    if found then return done(found, key) end
  end

  if r.transport == "docker" then
    rec, err, code = from_registry(cache, pol, r.docker, pull)
  elseif r.transport == "docker-daemon" then
    rec, err, code = from_daemon(cache, pol, r.docker)
  else
    local desc
    local stamp
    if r.transport == "docker-archive" then
      stamp = stamp_of(r.path)
      if not stamp then return nil, string.format("%s: no such file", describe(r)), "not_found" end
      stats.archives = stats.archives + 1
      desc, err, code = sources.docker_archive(r.path, r.name, ipol)
    elseif r.transport == "oci-archive" then
      stamp = stamp_of(r.path)
      if not stamp then return nil, string.format("%s: no such file", describe(r)), "not_found" end
      stats.archives = stats.archives + 1
      desc, err, code = sources.oci_archive(r, ipol)
    else
      stamp = stamp_of(r.path, "index.json")
      desc, err, code = sources.oci_dir(r, ipol)
    end
    if desc then rec, err, code = install(cache, pol, desc, r.transport, { key }, stamp) end
  end
  if not rec then return nil, err, code end
  trim(cache, pol, rec.id)
  return done(rec, key)
end

-- images.available(ref, opts) -> true | false, why: whether resolve would
-- find ref here without asking a registry or a daemon (what backend =
-- "auto" asks of the local backend): host, a rootfs directory, a local
-- archive or OCI layout, a name the cache holds, or a name with an archive
-- in policy.images.archives. A few file reads; nothing is imported.
function M.available(ref, opts)
  if type(ref) ~= "string" then error("images.available: ref must be a string", 2) end
  opts = check_opts(opts, "available")
  local ipol = policy_of(opts).images
  local r, perr = refs.parse(ref, { hub = ipol.hub, exists = exists })
  if not r then return false, perr end
  if r.transport == "host" then return true end
  if r.transport == "rootfs" or r.transport == "docker-archive" or r.transport == "oci-archive" or r.transport == "oci" then
    if exists(r.path) then return true end
    return false, tostring(r.path) .. " does not exist"
  end
  local cache = cache_mod.open(ipol)
  local keys = { r.key }
  if r.transport == "name" then
    keys = { "docker-daemon:" .. r.docker.canonical, r.docker.canonical }
    if archive_for(ipol, r.docker) then return true end
  end
  for _, k in ipairs(keys) do
    if k and cache and cached(cache, k) then return true end
  end
  return false, "the image cache does not hold " .. ref .. " and no archive in policy.images.archives has it"
end

-- images.pull(ref, opts) -> image | nil, message, code: resolve with
-- pull = "always" (layers the cache has are never fetched again).
function M.pull(ref, opts)
  if type(ref) ~= "string" then error("images.pull: ref must be a string", 2) end
  opts = check_opts(opts, "pull")
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.pull = "always"
  return M.resolve(ref, o)
end

--[[
images.hold(image, opts) -> lease | nil, message, code
  Keeps a cached image (and so its layers) from images.remove and prune
  while the lease is open: lease:close(), or <close>, or the process's
  end. rootfs and host images need none (a lease that holds nothing).
]]
function M.hold(image, opts)
  if type(image) ~= "table" then error("images.hold: an image from images.resolve", 2) end
  opts = check_opts(opts, "hold")
  if not image.digest then
    return setmetatable({}, { __index = { close = function() end, held = function() return false end }, __close = function() end })
  end
  local cache, err, code = cache_mod.open(policy_of(opts).images)
  if not cache then return nil, err, code end
  local lease, lerr, lcode = cache:lock("image-" .. image.digest:match("^sha256:(%x+)$"), "sh")
  if not lease then return nil, lerr, lcode end
  -- A prune may have taken it between resolve and now.
  local rec = cache:image(image.digest)
  if not rec or not cache:complete(rec) then
    lease:close()
    return nil, string.format("image %s was removed from the cache before it could be held", image.digest), "not_found"
  end
  return lease
end

--[[
images.list(opts) -> { { name, digest, manifest, source, size, platform,
  used (epoch seconds), layers (count), names = { every name of it } }, ... }
  One entry per name (an image under no name appears once with name nil),
  newest use first.
]]
function M.list(opts)
  opts = check_opts(opts, "list")
  local cache, err, code = cache_mod.open(policy_of(opts).images)
  if not cache then return nil, err, code end
  local by_id = {}
  for _, rec in ipairs(cache:images()) do by_id[rec.id] = rec end
  local names_of = {}
  for n, v in pairs(cache:names()) do
    names_of[v.id] = names_of[v.id] or {}
    table.insert(names_of[v.id], n)
  end
  local out = {}
  for id, rec in pairs(by_id) do
    local names = names_of[id] or { false }
    table.sort(names, function(a, b) return tostring(a) < tostring(b) end)
    for _, n in ipairs(names) do
      out[#out + 1] = { name = n or nil, digest = id, manifest = rec.manifest, source = rec.source, size = rec.size,
                        platform = rec.platform, used = rec.used, layers = #rec.layers,
                        names = names_of[id] or {}, complete = cache:complete(rec) }
    end
  end
  table.sort(out, function(a, b)
    if (a.used or 0) ~= (b.used or 0) then return (a.used or 0) > (b.used or 0) end
    return tostring(a.name) < tostring(b.name)
  end)
  return out
end

-- The cache names ref stands for: its own key, and for a bare name the
-- keys it may be cached under; a digest (or an unambiguous prefix of
-- one) names every name of that image.
local function names_for(cache, ref, ipol)
  local names = cache:names()
  local hexp = ref:match("^sha256:(%x+)$") or ref:match("^(%x%x%x%x%x%x+)$")
  -- A name that is also hex ("beef01") is a name when the cache has it.
  if hexp and not ref:find(":") then
    local d = refs.docker_name(ref, ipol.hub)
    if d and (names[d.canonical] or names["docker-daemon:" .. d.canonical]) then hexp = nil end
  end
  if hexp then
    local out, ids = {}, {}
    for n, v in pairs(names) do
      if v.id:sub(8, 7 + #hexp) == hexp then out[#out + 1] = n; ids[v.id] = true end
    end
    for _, rec in ipairs(cache:images()) do
      if rec.id:sub(8, 7 + #hexp) == hexp then ids[rec.id] = true end
    end
    local n = 0
    for _ in pairs(ids) do n = n + 1 end
    if n > 1 then return nil, string.format("%s is the start of %d image ids: give more of it", ref, n) end
    local id = next(ids)
    return out, nil, id
  end
  local r, err = refs.parse(ref, { hub = ipol.hub, exists = exists })
  if not r then return nil, err end
  if r.transport == "name" then
    local out = {}
    for _, k in ipairs { r.docker.canonical, "docker-daemon:" .. r.docker.canonical } do
      if names[k] then out[#out + 1] = k end
    end
    return out
  end
  return names[r.key] and { r.key } or {}
end

--[[
images.remove(ref, opts) -> { names = { removed }, images = { ids },
  layers = n, freed = bytes } | nil, message, code
  Removes the names ref stands for (a reference as resolve takes it, or an
  image id, "sha256:..." or its first 6+ hex digits: every name of it);
  an image left under no name goes, with the layers no other image needs.
  An image a box holds (images.hold) keeps: "busy". Nothing matching is
  "not_found".
]]
function M.remove(ref, opts)
  if type(ref) ~= "string" then error("images.remove: ref must be a string", 2) end
  opts = check_opts(opts, "remove")
  local pol = policy_of(opts)
  local cache, err, code = cache_mod.open(pol.images)
  if not cache then return nil, err, code end
  local keys, kerr, id = names_for(cache, ref, pol.images)
  if not keys then return nil, kerr, "bad_reference" end
  if #keys == 0 and not (id and cache:image(id)) then
    return nil, string.format("no image %s in the cache (%s)", ref, cache.dir), "not_found"
  end
  local ids = {}
  if id then ids[id] = true end
  local names = cache:names()
  for _, k in ipairs(keys) do ids[names[k].id] = true end
  -- An image in use keeps its names: refuse before changing anything.
  for i in pairs(ids) do
    local probe = layer.lock(cache.dir .. "/locks/image-" .. i:sub(8) .. ".lock", "ex")
    if not probe then
      return nil, string.format("image %s is in use by a box (it holds the image); close it first", i:sub(8, 19)), "busy"
    end
    probe:close()
  end
  local ok, uerr, ucode = cache:update_names(function(t) for _, k in ipairs(keys) do t[k] = nil end end)
  if not ok then return nil, uerr, ucode end
  local report, cerr, ccode = cache:collect { wait = pol.images.lock_timeout }
  if not report then return nil, cerr, ccode end
  report.names = keys
  return report
end

--[[
images.prune(opts) -> { images = { ids }, layers = n, freed = bytes, size =
  bytes after, held = { ids } } | nil, message, code
  Removes images no name points to, layers no image needs, scratch space
  of dead processes, and then the least recently used images (not held)
  until the cache fits policy.images.max_bytes (opts.max_bytes wins).
]]
function M.prune(opts)
  opts = check_opts(opts, "prune")
  local pol = policy_of(opts)
  local cache, err, code = cache_mod.open(pol.images)
  if not cache then return nil, err, code end
  return cache:collect { max_bytes = opts.max_bytes or pol.images.max_bytes, wait = pol.images.lock_timeout }
end

-- images.stats() -> { fetches, exports, archives, unpacks }: this process's
-- work on the cache so far (see `stats` above).
function M.stats()
  local c = {}
  for k, v in pairs(stats) do c[k] = v end
  return c
end

-- The cache's directory (policy.images.dir or the XDG default).
function M.dir(opts)
  opts = check_opts(opts, "dir")
  return policy_of(opts).images.dir or cache_mod.default_dir()
end

M.platform = function(opts)
  return registry.platform_string(registry.platform(policy_of(check_opts(opts, "platform")).images))
end

return M

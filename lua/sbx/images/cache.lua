-- The image cache on disk. Content-addressed, shared by every box and by
-- every sbx process of the user, safe against them running at once:
--
--   <dir>/layers/sha256/<diff id>/root       an unpacked layer (a lowerdir), read-only;
--                                            a layer with hard links to files of
--                                            lower ones is under its chain id instead
--   <dir>/layers/sha256/<diff id>/meta.json  its blob digest, sizes, entries
--   <dir>/blobs/sha256/<digest>              manifests and configs, as fetched
--   <dir>/images/<config digest>.json        an image: its layers (diff ids,
--                                            lowest first), config, source;
--                                            its mtime is when it was last used
--   <dir>/names.json                         name -> image (docker.io/library/x:tag,
--                                            docker-daemon:..., oci:/dir:tag, ...)
--   <dir>/locks/                             flock files
--   <dir>/tmp/<pid>-XXXXXX                   downloads and unpacks under way
--
-- Layers are stored once by diff id (the digest of the uncompressed tar),
-- so images that share base layers share them on disk, whatever source
-- they came from. A layer is unpacked into tmp/ and renamed into place
-- once complete and checked: a layer directory that exists is whole.
--
-- Locks (flock: released by the kernel when a process dies):
--   layer-<hex>  exclusive while that layer is unpacked: one process
--                unpacks it, the others wait and then find it there;
--   names        exclusive while names.json is rewritten;
--   gc           shared by every pull from its first look at a layer until
--                its image is recorded; exclusive while images and layers
--                are removed (rm, prune), so nothing a pull relies on goes;
--   image-<hex>  shared by whoever uses an image (images.hold); rm and
--                prune leave held images alone.
-- Lock files are never removed (an unlinked one would split its holders).
local core = require "sbx.core"

local json, layer = core.json, core.layer

local M = {}

-- Work this process did (sbx.images.stats()); kept across cache objects.
M.stats = { fetches = 0, exports = 0, archives = 0, unpacks = 0 }

local Cache = {}
Cache.__index = Cache

-- The default directory: ${XDG_CACHE_HOME:-~/.cache}/sbx/images.
function M.default_dir()
  local xdg = os.getenv("XDG_CACHE_HOME")
  if xdg and xdg:sub(1, 1) == "/" then return xdg .. "/sbx/images" end
  return (os.getenv("HOME") or "/root") .. "/.cache/sbx/images"
end

--[[
cache.open(pol) -> cache | nil, message, code
  pol: policy.images. Makes the directories (the cache's own 0700: files
  unpacked as root keep their owners and modes, setuid ones included, and
  must not be reachable by other users).
]]
function M.open(pol)
  local dir = pol.dir or M.default_dir()
  local c = setmetatable({ dir = dir, pol = pol }, Cache)
  if not layer.stat(dir .. "/tmp") then
    local parent = dir:match("^(.*)/[^/]+$")
    if parent and parent ~= "" then
      local ok, err, code = layer.mkdirs(parent, tonumber("755", 8))
      if not ok then return nil, err, code end
    end
    for _, sub in ipairs { "", "/layers/sha256", "/blobs/sha256", "/images", "/locks", "/tmp" } do
      local ok, err, code = layer.mkdirs(dir .. sub, tonumber("700", 8))
      if not ok then return nil, err, code end
    end
  end
  return c
end

-- Files ---------------------------------------------------------------------------

local function read_file(path, max)
  return layer.read(path, max or 64 * 1024 * 1024)
end

function Cache:read_json(path)
  local s = read_file(path)
  if not s then return nil end
  local v = json.decode(s)
  if type(v) ~= "table" then return nil end
  return v
end

-- Writes data to path through a temporary file and a rename: a reader
-- sees the old file or the new one, never half of one.
function Cache:write_atomic(path, data)
  local tmp = string.format("%s/tmp/%d-%s", self.dir, core.pid(), path:match("[^/]+$"))
  local f, err = io.open(tmp, "wb")
  if not f then return nil, "cannot write " .. tmp .. ": " .. tostring(err), "io" end
  local ok, werr = f:write(data)
  local cok, cerr = f:close()
  if not ok or not cok then
    os.remove(tmp)
    return nil, "cannot write " .. tmp .. ": " .. tostring(werr or cerr), "io"
  end
  local rok, rerr = os.rename(tmp, path)
  if not rok then
    os.remove(tmp)
    return nil, "cannot rename " .. tmp .. ": " .. tostring(rerr), "io"
  end
  return true
end

function Cache:write_json(path, v)
  return self:write_atomic(path, json.encode(v))
end

-- Locks ---------------------------------------------------------------------------

--[[
cache:lock(name, mode, timeout) -> lock | nil, message, "busy"
  Takes locks/<name>.lock ("ex" or "sh"), polling every few milliseconds
  (yielding: other tasks run meanwhile) for at most timeout seconds (0:
  one try; nil: policy.images.lock_timeout).
]]
function Cache:lock(name, mode, timeout)
  timeout = timeout or self.pol.lock_timeout
  local path = self.dir .. "/locks/" .. name .. ".lock"
  local deadline = core.now() + timeout
  local delay = 0.005
  while true do
    local l, err, code = layer.lock(path, mode)
    if l then return l end
    if code ~= "busy" then return nil, err, code end
    if core.now() >= deadline then
      return nil, string.format("the image cache is busy: another process holds %s (%s)", path,
        mode == "ex" and "exclusive" or "shared"), "busy"
    end
    core.sleep(math.min(delay, math.max(0, deadline - core.now())))
    delay = math.min(delay * 2, 0.1)
  end
end

-- Layers --------------------------------------------------------------------------

local function hex(digest) return digest:match("^sha256:(%x+)$") end

function Cache:layer_dir(diff_id)
  return self.dir .. "/layers/sha256/" .. hex(diff_id)
end

-- The lowerdir of a layer when it is in the cache, else nil.
function Cache:layer_root(diff_id)
  local d = self:layer_dir(diff_id)
  if layer.stat(d .. "/root") then return d .. "/root" end
  return nil
end

function Cache:tmpdir()
  return layer.mkdtemp(string.format("%s/tmp/%d-", self.dir, core.pid()))
end

--[[
cache:ensure_layer(diff_id, fetch) -> root, meta | nil, message, code
  The layer's directory, unpacked first when the cache lacks it. fetch(tmp)
  -> input | nil, message, code gives what to unpack: { file, member, root,
  digest, cleanup } (core.layer.unpack's options, cleanup called after);
  budgets: core.layer.budget values the unpack is charged to;
  tmp is a scratch directory for a download. Only one process unpacks a
  layer; the others wait for it (policy.images.lock_timeout).
]]
function Cache:ensure_layer(diff_id, fetch, budgets, chain)
  local function present()
    if self:layer_root(diff_id) then return self:layer_root(diff_id), diff_id end
    if chain and self:layer_root(chain) then return self:layer_root(chain), chain end
  end
  local have, key = present()
  if have then return have, key end
  local lock <close>, lerr, lcode = self:lock("layer-" .. hex(diff_id), "ex")
  if not lock then return nil, lerr, lcode end
  have, key = present()
  if have then return have, key end
  local tmp, terr, tcode = self:tmpdir()
  if not tmp then return nil, terr, tcode end
  local input, ferr, fcode = fetch(tmp)
  if not input then
    layer.remove(tmp)
    return nil, ferr, fcode
  end
  layer.mkdirs(tmp .. "/root", tonumber("755", 8))
  M.stats.unpacks = M.stats.unpacks + 1
  local pol = self.pol
  local r, uerr, ucode = layer.unpack {
    file = input.file, root = input.root, member = input.member, dest = tmp .. "/root",
    digest = input.digest, diff_id = diff_id,
    max_bytes = pol.max_layer_bytes, max_entries = pol.max_layer_entries,
    devices = pol.device_nodes, budgets = budgets, defer_links = chain ~= nil,
  }
  if input.cleanup then input.cleanup() end
  if not r then
    layer.remove(tmp)
    return nil, string.format("layer %s: %s", diff_id, uerr), ucode
  end
  local meta = { diff_id = diff_id, digest = input.digest or r.digest, bytes = r.bytes, disk = r.disk,
                 entries = r.entries, whiteouts = r.whiteouts, skipped = r.skipped, unpacked = os.time() }
  if r.deferred then
    -- Hard links to files of lower layers: the layer is whole once those
    -- are there (finish_layer), and then it belongs to this chain only.
    return { pending = true, tmp = tmp, meta = meta, links = r.deferred }
  end
  return self:put_layer(tmp, diff_id, meta)
end

-- Renames the unpacked layer at tmp into place as key, with meta.
-- -> root, key | nil, message, code
function Cache:put_layer(tmp, key, meta)
  local ok, werr, wcode = self:write_atomic(tmp .. "/meta.json", json.encode(meta))
  if ok then
    ok, werr = os.rename(tmp, self:layer_dir(key))
    wcode = "io"
  end
  if not ok then
    layer.remove(tmp)
    -- Another process got there first (it can only have put a whole layer).
    if self:layer_root(key) then return self:layer_root(key), key end
    return nil, string.format("layer %s: %s", key, tostring(werr)), wcode
  end
  return self:layer_dir(key) .. "/root", key
end

--[[
cache:finish_layer(pending, chain, lowers) -> root, key | nil, message, code
  A layer ensure_layer left pending (hard links to files of the layers
  below, which Docker's and containerd's unpackers accept): the links are
  made to those files (lowers: the lower layers' roots, top first; the
  same inode, no copy) and the layer goes into place under its chain id
  (the OCI ChainID of the layers up to it), since what it holds depends
  on them.
]]
function Cache:finish_layer(pending, chain, lowers)
  local ok, err, code = layer.link_lower(pending.tmp .. "/root", lowers, pending.links)
  if not ok then
    layer.remove(pending.tmp)
    return nil, string.format("layer %s: %s", pending.meta.diff_id, err), code
  end
  pending.meta.chain = chain
  pending.meta.lower_links = #pending.links
  return self:put_layer(pending.tmp, chain, pending.meta)
end

function Cache:layer_meta(diff_id)
  return self:read_json(self:layer_dir(diff_id) .. "/meta.json")
end

-- Blobs, images, names ------------------------------------------------------------------

function Cache:put_blob(digest, data)
  local path = self.dir .. "/blobs/sha256/" .. hex(digest)
  if layer.stat(path) then return true end
  return self:write_atomic(path, data)
end

function Cache:blob(digest)
  return read_file(self.dir .. "/blobs/sha256/" .. hex(digest), self.pol.max_manifest_bytes)
end

function Cache:image_path(id)
  return self.dir .. "/images/" .. hex(id) .. ".json"
end

function Cache:image(id)
  return self:read_json(self:image_path(id))
end

function Cache:put_image(rec)
  return self:write_json(self:image_path(rec.id), rec)
end

-- Where a record's layers are: their diff ids, or rec.dirs (a layer with
-- links into lower ones is stored under its chain id).
function M.dirs_of(rec)
  return rec.dirs or rec.layers or {}
end

-- Every layer of the record is there.
function Cache:complete(rec)
  for _, d in ipairs(M.dirs_of(rec)) do
    if not self:layer_root(d) then return false end
  end
  return true
end

function Cache:names()
  local t = self:read_json(self.dir .. "/names.json")
  return t and t.names or {}
end

-- Rewrites names.json under its lock: fn(names) changes the table.
function Cache:update_names(fn)
  local lock <close>, err, code = self:lock("names", "ex")
  if not lock then return nil, err, code end
  local names = self:names()
  fn(names)
  return self:write_json(self.dir .. "/names.json", { version = 1, names = json.object(names) })
end

function Cache:images()
  local out = {}
  for _, f in ipairs(layer.list(self.dir .. "/images") or {}) do
    local h = f:match("^(%x+)%.json$")
    if h then
      local rec = self:read_json(self.dir .. "/images/" .. f)
      local st = layer.stat(self.dir .. "/images/" .. f)
      if rec and st then
        rec.used = st.mtime
        out[#out + 1] = rec
      end
    end
  end
  return out
end

-- Every complete layer: { diff_id = meta }.
function Cache:layers()
  local out = {}
  for _, h in ipairs(layer.list(self.dir .. "/layers/sha256") or {}) do
    if h:match("^%x+$") then
      local d = "sha256:" .. h
      out[d] = self:layer_meta(d) or { diff_id = d, disk = 0 }
    end
  end
  return out
end

-- Bytes the cache uses (layers as unpacked, blobs and records besides).
function Cache:size()
  local total = 0
  for _, m in pairs(self:layers()) do total = total + (tonumber(m.disk) or 0) end
  return total
end

-- Removal -----------------------------------------------------------------------

-- Leftovers of processes that died while unpacking or downloading:
-- removed (dry_run: only listed) -> count, { names }.
function Cache:clean_tmp(dry_run)
  local freed, names = 0, {}
  for _, name in ipairs(layer.list(self.dir .. "/tmp") or {}) do
    local pid = tonumber(name:match("^(%d+)%-"))
    local alive = pid and layer.stat("/proc/" .. pid) ~= nil
    if not alive then
      if dry_run or layer.remove(self.dir .. "/tmp/" .. name) then
        freed = freed + 1
        names[#names + 1] = name
      end
    end
  end
  return freed, names
end

--[[
cache:collect(opts) -> report | nil, message, code
  Under the gc lock (exclusive): removes image records no name points to
  (opts.keep: ids to keep) unless held, then layers no image needs, then,
  while the cache is larger than opts.max_bytes, the least recently used
  images that are not held (and not in opts.keep) and their layers.
  report = { images = { ids removed }, layers = n, freed = bytes, size =
  bytes after, held = { ids skipped } }. opts.wait: seconds to wait for
  the gc lock (0: give up at once with "busy").
]]
function Cache:collect(opts)
  opts = opts or {}
  local gc <close>, err, code = self:lock("gc", "ex", opts.wait)
  if not gc then return nil, err, code end
  self:clean_tmp()
  local report = { images = {}, layers = 0, freed = 0, held = {} }
  local named = {}
  for _, v in pairs(self:names()) do named[v.id] = true end
  local keep = opts.keep or {}
  local images = self:images()

  local function drop(rec)
    local hold = layer.lock(self.dir .. "/locks/image-" .. hex(rec.id) .. ".lock", "ex")
    if not hold then
      report.held[#report.held + 1] = rec.id
      return false
    end
    -- The lock file stays: one unlinked under a waiting holder would let
    -- a later holder and a later prune miss each other.
    os.remove(self:image_path(rec.id))
    hold:close()
    report.images[#report.images + 1] = rec.id
    return true
  end

  local live = {}
  for _, rec in ipairs(images) do
    if named[rec.id] or keep[rec.id] or not drop(rec) then live[#live + 1] = rec end
  end

  local function sweep_layers()
    local needed = {}
    for _, rec in ipairs(live) do
      for _, d in ipairs(M.dirs_of(rec)) do needed[d] = true end
    end
    local size = 0
    for d, meta in pairs(self:layers()) do
      if needed[d] then
        size = size + (tonumber(meta.disk) or 0)
      else
        -- Renamed away first, so no reader ever sees half of it.
        local trash = self:tmpdir()
        if trash and os.rename(self:layer_dir(d), trash .. "/layer") then
          layer.remove(trash)
          report.layers = report.layers + 1
          report.freed = report.freed + (tonumber(meta.disk) or 0)
        elseif trash then
          layer.remove(trash)
        end
      end
    end
    return size
  end

  local size = sweep_layers()
  if opts.max_bytes and size > opts.max_bytes then
    table.sort(live, function(a, b) return (a.used or 0) < (b.used or 0) end)
    local still = {}
    for i, rec in ipairs(live) do
      if size > opts.max_bytes and not keep[rec.id] and drop(rec) then
        self:update_names(function(names)
          for n, v in pairs(names) do if v.id == rec.id then names[n] = nil end end
        end)
        -- Sizes only fall once the layers go: count this image's own.
        local others = {}
        for j = i + 1, #live do for _, d in ipairs(M.dirs_of(live[j])) do others[d] = true end end
        for _, r2 in ipairs(still) do for _, d in ipairs(M.dirs_of(r2)) do others[d] = true end end
        for _, d in ipairs(M.dirs_of(rec)) do
          if not others[d] then
            local m = self:layer_meta(d)
            size = size - (m and tonumber(m.disk) or 0)
          end
        end
      else
        still[#still + 1] = rec
      end
    end
    live = still
    size = sweep_layers()
  end
  report.size = size
  return report
end

return M

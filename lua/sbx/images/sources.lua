-- Where images come from. Each source turns a parsed reference (sbx.images.ref)
-- into a description the cache installs:
--
--   { id = config digest, config_bytes, manifest = digest | nil,
--     manifest_bytes, platform = "os/arch[/variant]",
--     layers = { { digest = blob digest | nil, size = bytes | nil,
--                  media_type, input = function(tmp) -> unpack input }, ... } }
--
-- lowest layer first; diff ids come from the config. An input is what
-- core.layer.unpack reads: { file, member, root, digest, cleanup }.
-- Every JSON blob is checked against its digest here; layers are checked
-- while they unpack.
local core = require "sbx.core"
local registry = require "sbx.images.registry"
local refs = require "sbx.images.ref"
local validate = require "sbx.images.validate"

local json, layer = core.json, core.layer

local M = {}

local LAYER_TYPES = {
  ["application/vnd.oci.image.layer.v1.tar"] = true,
  ["application/vnd.oci.image.layer.v1.tar+gzip"] = true,
  ["application/vnd.oci.image.layer.v1.tar+zstd"] = true,
  ["application/vnd.oci.image.layer.nondistributable.v1.tar"] = true,
  ["application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"] = true,
  ["application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"] = true,
  ["application/vnd.docker.image.rootfs.diff.tar.gzip"] = true,
  ["application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"] = true,
}
local CONFIG_TYPES = {
  ["application/vnd.oci.image.config.v1+json"] = true,
  ["application/vnd.docker.container.image.v1+json"] = true,
}

local function is_digest(d) return type(d) == "string" and d:match("^sha256:%x+$") ~= nil and #d == 71 end

-- Checks a blob against its digest. -> true | nil, message, code
local function verify(what, bytes, digest)
  local got = layer.sha256(bytes)
  if got ~= digest then
    return nil, string.format("%s has the digest %s, not %s", what, got, digest), "digest_mismatch"
  end
  return true
end

--[[
sources.from_manifest(doc, get_blob, input_of, extra) -> description | nil, message, code
  doc: an image manifest (OCI or Docker schema 2), decoded. get_blob(digest,
  what) -> bytes | nil, message, code (already verified). input_of(layer
  descriptor) -> an input function.
]]
function M.from_manifest(doc, get_blob, input_of)
  if doc.schemaVersion == 1 then
    return nil, "Docker schema 1 manifests are not supported (push the image again with a current client)", "bad_image"
  end
  local cfg = type(doc.config) == "table" and doc.config or nil
  if not cfg or not is_digest(cfg.digest) or type(doc.layers) ~= "table" then
    return nil, "the manifest has no config or no layers: not an image manifest", "bad_image"
  end
  if cfg.mediaType and not CONFIG_TYPES[cfg.mediaType] then
    return nil, string.format("the manifest's config is %s: not a container image", tostring(cfg.mediaType)), "bad_image"
  end
  local config_bytes, err, code = get_blob(cfg.digest, "the image config")
  if not config_bytes then return nil, err, code end
  local desc = { id = cfg.digest, config_bytes = config_bytes, layers = {} }
  for i, l in ipairs(doc.layers) do
    if type(l) ~= "table" or not is_digest(l.digest) then
      return nil, string.format("layer %d of the manifest has no sha256 digest", i), "bad_image"
    end
    if l.mediaType and not LAYER_TYPES[l.mediaType] then
      return nil, string.format("layer %d is %s, which sbx cannot unpack%s", i, tostring(l.mediaType),
        tostring(l.mediaType):find("encrypted") and " (encrypted layers are not supported)" or ""), "bad_image"
    end
    desc.layers[i] = { digest = l.digest, size = math.tointeger(l.size), media_type = l.mediaType, input = input_of(l) }
  end
  return desc
end

-- Registries ----------------------------------------------------------------

--[[
sources.docker(d, pol, opts) -> description | nil, message, code
  d: a parsed docker name (ref.docker_name). Fetches the manifest (an index
  is resolved to pol.platform or this machine's), the config, and gives
  layer inputs that download the blob into the scratch directory.
  opts.config_only: stop after the config (the cache may hold the layers).
]]
function M.docker(d, pol)
  local c = M.client(d.domain, pol)
  local repo = d.path
  local m, err, code = c:manifest(repo, d.digest or d.tag)
  if not m then return nil, err, code end
  local index_digest
  if registry.INDEX[m.media_type] or (m.doc.manifests and not m.doc.layers) then
    local want = registry.platform(pol)
    local pick, perr = registry.select(m.doc, want)
    if not pick then return nil, string.format("%s: %s", d.canonical, perr), "no_platform" end
    index_digest = m.digest
    m, err, code = c:manifest(repo, pick.digest)
    if not m then return nil, err, code end
    if registry.INDEX[m.media_type] then
      return nil, string.format("%s: an index inside an index", d.canonical), "bad_image"
    end
  end
  local function get_blob(digest, what)
    local r, gerr, gcode = c:get("/v2/" .. repo .. "/blobs/" .. digest, { repo = repo, max_body = pol.max_manifest_bytes + 1 })
    if not r then return nil, gerr, gcode end
    if #r.body > pol.max_manifest_bytes then
      return nil, string.format("%s %s is larger than %d bytes", what, digest, pol.max_manifest_bytes), "too_large"
    end
    local ok, verr, vcode = verify(what .. " " .. digest, r.body, digest)
    if not ok then return nil, string.format("registry %s: %s", d.domain, verr), vcode end
    return r.body
  end
  local desc
  local function input_of(l)
    return function(tmp)
      local path = tmp .. "/blob"
      -- desc.on_bytes: whoever installs the image may count the bytes.
      local n, berr, bcode = c:blob_to_file(repo, l.digest, math.tointeger(l.size), path,
        function(k) if desc.on_bytes then desc.on_bytes(k) end end)
      if not n then return nil, berr, bcode end
      return { file = path, digest = l.digest, cleanup = function() os.remove(path) end }
    end
  end
  local derr, dcode
  desc, derr, dcode = M.from_manifest(m.doc, get_blob, input_of)
  if not desc then return nil, string.format("%s: %s", d.canonical, derr), dcode end
  desc.manifest, desc.manifest_bytes, desc.index = m.digest, m.body, index_digest
  return desc
end

-- One client per registry and policy table, so tokens are reused.
local clients = setmetatable({}, { __mode = "k" })
function M.client(domain, pol)
  local per = clients[pol]
  if not per then per = {}; clients[pol] = per end
  per[domain] = per[domain] or registry.client(domain, pol)
  return per[domain]
end

-- OCI layouts ----------------------------------------------------------------------

--[[
sources.oci_layout(read, input_of, tag, pol, where) -> description | nil, message, code
  read(name, max) -> bytes | nil, message, code: a file of the layout
  ("index.json", "blobs/sha256/<hex>"). The manifest is the one whose
  org.opencontainers.image.ref.name is tag, or the only one.
]]
function M.oci_layout(read, input_of, tag, pol, where)
  local raw, err, code = read("index.json", pol.max_manifest_bytes)
  if not raw then return nil, string.format("%s: no index.json (%s): not an OCI layout", where, err), code == "too_large" and code or "bad_image" end
  local index = json.decode(raw)
  if type(index) ~= "table" or type(index.manifests) ~= "table" then
    return nil, where .. ": index.json is not an OCI index", "bad_image"
  end
  local function blob(digest, what)
    if not is_digest(digest) then return nil, string.format("%s: %s has no sha256 digest", where, what), "bad_image" end
    local b, berr, bcode = read("blobs/sha256/" .. digest:sub(8), pol.max_manifest_bytes)
    if not b then return nil, string.format("%s: %s %s: %s", where, what, digest, berr), bcode end
    local ok, verr, vcode = verify(what .. " " .. digest, b, digest)
    if not ok then return nil, where .. ": " .. verr, vcode end
    return b
  end
  local pick
  local names = {}
  for _, d in ipairs(index.manifests) do
    local n = type(d) == "table" and type(d.annotations) == "table" and d.annotations["org.opencontainers.image.ref.name"]
    if type(n) ~= "string" then n = nil end
    if n then names[#names + 1] = n end
    if tag and n == tag then pick = d end
  end
  if tag and not pick then
    return nil, string.format("%s has no image tagged %q (it has: %s)", where, tag, #names > 0 and table.concat(names, ", ") or "none"), "not_found"
  end
  if not pick then
    if #index.manifests ~= 1 then
      return nil, string.format("%s holds %d images: name one as %s:TAG (tags: %s)", where, #index.manifests, where,
        #names > 0 and table.concat(names, ", ") or "none"), "not_found"
    end
    pick = index.manifests[1]
  end
  if type(pick) ~= "table" then return nil, where .. ": index.json lists a manifest that is not a descriptor", "bad_image" end
  local mbytes, merr, mcode = blob(pick.digest, "the manifest")
  if not mbytes then return nil, merr, mcode end
  local doc = json.decode(mbytes)
  if type(doc) ~= "table" then return nil, where .. ": the manifest is not JSON", "bad_image" end
  local index_digest
  if registry.INDEX[pick.mediaType] or registry.INDEX[doc.mediaType] or (doc.manifests and not doc.layers) then
    local want = registry.platform(pol)
    local inner, perr = registry.select(doc, want)
    if not inner then return nil, where .. ": " .. perr, "no_platform" end
    index_digest = pick.digest
    pick = inner
    mbytes, merr, mcode = blob(pick.digest, "the manifest")
    if not mbytes then return nil, merr, mcode end
    doc = json.decode(mbytes)
    if type(doc) ~= "table" then return nil, where .. ": the manifest is not JSON", "bad_image" end
  end
  local desc, derr, dcode = M.from_manifest(doc, blob, input_of)
  if not desc then return nil, where .. ": " .. derr, dcode end
  desc.manifest, desc.manifest_bytes, desc.index = pick.digest, mbytes, index_digest
  return desc
end

function M.oci_dir(r, pol)
  local dir = r.path
  local st = layer.stat(dir)
  if not st or st.type ~= "dir" then return nil, string.format("oci:%s: no such directory", dir), "not_found" end
  local function read(name, max) return layer.read(name, max, dir) end
  local function input_of(l)
    return function() return { file = "blobs/sha256/" .. l.digest:sub(8), root = dir, digest = l.digest } end
  end
  return M.oci_layout(read, input_of, r.tag, pol, "oci:" .. dir)
end

-- Tarballs --------------------------------------------------------------------------

-- The name a member's link leads to (symlinks relative to the member's
-- directory, hard links from the archive's root), or nil when it leaves.
local function clean(path)
  local parts = {}
  for c in path:gmatch("[^/]+") do
    if c == ".." then
      if #parts == 0 then return nil end
      parts[#parts] = nil
    elseif c ~= "." then
      parts[#parts + 1] = c
    end
  end
  return table.concat(parts, "/")
end

local function members(scan)
  local by = {}
  for _, e in ipairs(scan.entries) do by[clean(e.name) or e.name] = e end
  local function resolve(name)
    for _ = 1, 16 do
      local key = clean(name)
      local e = key and by[key]
      if not e then return nil end
      if e.type == "f" then return key end
      if e.type == "l" then
        name = (key:match("^(.*)/[^/]*$") or "") .. "/" .. e.link
      elseif e.type == "h" then
        name = e.link
      else
        return nil
      end
    end
    return nil
  end
  return by, resolve
end

function M.oci_archive(r, pol)
  local path = r.path
  local scan, err, code = layer.scan(path, { small = pol.max_manifest_bytes, total = 4 * pol.max_manifest_bytes })
  if not scan then return nil, string.format("oci-archive:%s: %s", path, err), code end
  local _, resolve = members(scan)
  local function read(name, max)
    local key = resolve(name)
    if not key then return nil, "no such member " .. name, "not_found" end
    local b = scan.files[key]
    if not b then return nil, string.format("%s is larger than %d bytes", name, max), "too_large" end
    return b
  end
  local function input_of(l)
    return function()
      local key = resolve("blobs/sha256/" .. l.digest:sub(8))
      if not key then return nil, string.format("oci-archive:%s has no blob %s", path, l.digest), "not_found" end
      return { file = path, member = key, digest = l.digest }
    end
  end
  return M.oci_layout(read, input_of, r.tag, pol, "oci-archive:" .. path)
end

--[[
sources.docker_archive(path, name, pol, label) -> description | nil, message, code
  A `docker save` tarball: manifest.json lists images ({ Config, RepoTags,
  Layers }); the image is the one tagged name (a parsed docker name), or
  the only one. Its id is the config's digest (docker's image id); each
  layer tar is checked against the config's diff ids.
]]
function M.docker_archive(path, name, pol, label)
  label = label or ("docker-archive:" .. path)
  local scan, err, code = layer.scan(path, { small = pol.max_manifest_bytes, total = 4 * pol.max_manifest_bytes })
  if not scan then return nil, string.format("%s: %s", label, err), code end
  local _, resolve = members(scan)
  local mkey = resolve("manifest.json")
  if not mkey then return nil, label .. ": no manifest.json: not a docker save archive", "bad_image" end
  if not scan.files[mkey] then
    return nil, string.format("%s: manifest.json is larger than %d bytes", label, pol.max_manifest_bytes), "too_large"
  end
  local manifest, merr, mcode = validate.docker_manifest(scan.files[mkey])
  if not manifest then return nil, label .. ": " .. merr, mcode end
  local pick, tags = nil, {}
  for _, m in ipairs(manifest) do
    for _, t in ipairs(type(m) == "table" and type(m.RepoTags) == "table" and m.RepoTags or {}) do
      tags[#tags + 1] = t
      local d = refs.docker_name(t, pol.hub)
      if name and d and d.canonical == name.canonical then pick = m end
    end
  end
  if name and not pick then
    return nil, string.format("%s has no image %s (it has: %s)", label, name.canonical, #tags > 0 and table.concat(tags, ", ") or "untagged images"), "not_found"
  end
  if not pick then
    if #manifest ~= 1 then
      return nil, string.format("%s holds %d images: name one as %s:NAME (tags: %s)", label, #manifest, label, table.concat(tags, ", ")), "not_found"
    end
    pick = manifest[1]
  end
  if type(pick) ~= "table" or type(pick.Config) ~= "string" or type(pick.Layers) ~= "table" then
    return nil, label .. ": manifest.json is not a docker save manifest", "bad_image"
  end
  local ckey = resolve(pick.Config)
  local config_bytes = ckey and scan.files[ckey]
  if not config_bytes then return nil, string.format("%s: no config %s", label, pick.Config), "bad_image" end
  local desc = { id = layer.sha256(config_bytes), config_bytes = config_bytes, layers = {} }
  local declared = pick.Config:match("(%x+)%.json$") or pick.Config:match("sha256/(%x+)$")
  if declared and #declared == 64 and "sha256:" .. declared ~= desc.id then
    return nil, string.format("%s: the config %s has the digest %s", label, pick.Config, desc.id), "digest_mismatch"
  end
  local by = members(scan)
  for i, lname in ipairs(pick.Layers) do
    local key = type(lname) == "string" and resolve(lname)
    if not key then return nil, string.format("%s: layer %d (%s) is not in the archive", label, i, tostring(lname)), "bad_image" end
    -- Its size guesses what it will take (docker save layers are plain tars).
    local size = by[key] and math.tointeger(by[key].size)
    desc.layers[i] = { size = size, uncompressed = true, input = function() return { file = path, member = key } end }
  end
  return desc
end

return M

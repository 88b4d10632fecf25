-- needs: nothing
-- The image parsers under hostile input (they are Lua, so a property test
-- stands where a C parser would have a fuzz target): image configs,
-- `docker save` manifest.json, OCI and Docker manifests, indexes and
-- index.json, as random bytes, truncated documents, random JSON and valid
-- documents with one field replaced by a random value. Properties: no
-- parser ever raises; each answers a result of the promised shape or
-- nil, a message (a string) and a code; an accepted config's runtime
-- fields have the types a backend relies on. A fixed seed per run, printed,
-- so a failure replays (SBX_PROPERTY_SEED=N).
local sbx = require "sbx"
local t = require "tap"
local validate = require "sbx.images.validate"
local sources = require "sbx.images.sources"
local registry = require "sbx.images.registry"

local json = sbx.json
local seed = tonumber(os.getenv("SBX_PROPERTY_SEED") or "") or os.time()
math.randomseed(seed)
t.diag("seed " .. seed)
local N = tonumber(os.getenv("SBX_PROPERTY_RUNS") or "") or 2000

local R = math.random
local D = "sha256:" .. string.rep("ab", 32)

local STRINGS = { "", "x", "sha256:", D, "root", "0", "/", "\0", "PATH=/bin", string.rep("a", 5000), "\xff\xfe",
  "application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.manifest.v1+json",
  "application/vnd.oci.image.index.v1+json", "linux", "amd64", "arm64", "v8", "../../etc/passwd" }

-- A random JSON value, depth at most d.
local function value(d)
  local k = R(1, d > 0 and 9 or 6)
  if k == 1 then return json.null
  elseif k == 2 then return R(0, 1) == 1
  elseif k == 3 then return ({ 0, -1, 1.5, 2 ^ 53, -2 ^ 63, 1e308, math.maxinteger })[R(1, 7)]
  elseif k <= 6 then return STRINGS[R(1, #STRINGS)]
  elseif k <= 8 then
    local a = {}
    for i = 1, R(0, 4) do a[i] = value(d - 1) end
    return json.array(a)
  else
    local o = {}
    for _ = 1, R(0, 4) do
      o[({ "config", "layers", "manifests", "mediaType", "digest", "size", "platform", "os", "architecture",
            "variant", "rootfs", "diff_ids", "User", "Env", "Config", "Layers", "RepoTags" })[R(1, 17)]] = value(d - 1)
    end
    return json.object(o)
  end
end

-- Valid documents to start from.
local function config_doc()
  return json.object { architecture = "amd64", os = "linux",
    config = json.object { Env = json.array { "PATH=/bin" }, Cmd = json.array { "sh" }, User = "root", WorkingDir = "/",
                           Labels = json.object { a = "b" } },
    rootfs = json.object { type = "layers", diff_ids = json.array { D, D } } }
end
local function manifest_doc()
  return json.object { schemaVersion = 2, mediaType = "application/vnd.oci.image.manifest.v1+json",
    config = json.object { mediaType = "application/vnd.oci.image.config.v1+json", digest = D, size = 10 },
    layers = json.array { json.object { mediaType = "application/vnd.oci.image.layer.v1.tar+gzip", digest = D, size = 5 } } }
end
local function index_doc()
  return json.object { schemaVersion = 2, manifests = json.array {
    json.object { digest = D, mediaType = "application/vnd.oci.image.manifest.v1+json",
                  platform = json.object { os = "linux", architecture = "amd64" },
                  annotations = json.object { ["org.opencontainers.image.ref.name"] = "latest" } } } }
end
local function save_doc()
  return json.array { json.object { Config = "c.json", RepoTags = json.array { "a:b" }, Layers = json.array { "l.tar" } } }
end

-- doc with one random place (a key of some table in it) set to a random value.
local function mutate(doc)
  local tables = {}
  local function walk(v, depth)
    if type(v) == "table" and depth < 6 then
      tables[#tables + 1] = v
      for _, x in pairs(v) do walk(x, depth + 1) end
    end
  end
  walk(doc, 0)
  local target = tables[R(1, #tables)]
  local keys = {}
  for k in pairs(target) do keys[#keys + 1] = k end
  local k = #keys > 0 and R(1, 4) > 1 and keys[R(1, #keys)] or (R(1, 2) == 1 and "User" or 1)
  target[k] = value(2)
  return doc
end

-- Bytes to feed a parser: valid, mutated, truncated, random JSON or noise.
local function input(make)
  local k = R(1, 6)
  if k == 1 then return json.encode(make()) end
  if k <= 3 then return json.encode(mutate(make())) end
  if k == 4 then
    local s = json.encode(make())
    return s:sub(1, R(0, #s))
  end
  if k == 5 then return json.encode(value(4)) end
  local b = {}
  for i = 1, R(0, 64) do b[i] = string.char(R(0, 255)) end
  return table.concat(b)
end

-- Runs f under pcall: a raise is a failure; else the answer's shape is checked.
local function never_raises(name, make, f, check, none_ok)
  local raised, badshape, accepted, first = 0, 0, 0, nil
  for _ = 1, N do
    local bytes = input(make)
    local ok, a, b, c = pcall(f, bytes)
    if not ok then
      raised = raised + 1
      first = first or string.format("%q raised %s", bytes:sub(1, 200), tostring(a))
    elseif a == nil then
      if type(b) ~= "string" or type(c) ~= "string" then
        badshape = badshape + 1
        first = first or string.format("%q: nil without a message and a code (%s, %s)", bytes:sub(1, 200), tostring(b), tostring(c))
      end
    else
      accepted = accepted + 1
      local why = check and check(a, b)
      if why then
        badshape = badshape + 1
        first = first or string.format("%q accepted, but %s", bytes:sub(1, 200), why)
      end
    end
  end
  t.ok(raised == 0, string.format("%s: never raises (%d did)", name, raised), first)
  t.ok(badshape == 0, string.format("%s: answers the promised shape (%d did not)", name, badshape), first)
  if not none_ok then
    t.ok(accepted > 0, string.format("%s: some inputs are accepted (%d of %d)", name, accepted, N))
  end
end

local ARRAY = getmetatable(json.array {})

never_raises("validate.config", config_doc, validate.config, function(doc, flat)
  if type(doc) ~= "table" or type(flat) ~= "table" then return "no doc and flat" end
  for _, k in ipairs { "User", "WorkingDir", "StopSignal", "Architecture", "Os", "Variant" } do
    if flat[k] ~= nil and type(flat[k]) ~= "string" then return k .. " is not a string" end
  end
  for _, k in ipairs { "Env", "Cmd", "Entrypoint" } do
    if flat[k] ~= nil then
      if getmetatable(flat[k]) ~= ARRAY then return k .. " is not an array" end
      for _, s in ipairs(flat[k]) do if type(s) ~= "string" then return k .. " holds a non-string" end end
    end
  end
  if flat.User and flat.User:find("\0", 1, true) then return "User holds a NUL" end
end)

never_raises("validate.docker_manifest", save_doc, validate.docker_manifest, function(list)
  for _, m in ipairs(list) do
    if type(m.Config) ~= "string" or getmetatable(m.Layers) ~= ARRAY then return "an entry without Config or Layers" end
  end
end)

-- OCI and Docker manifests: any decoded document.
local function blob() return json.encode(config_doc()) end
never_raises("sources.from_manifest", manifest_doc, function(bytes)
  local doc = json.decode(bytes)
  if type(doc) ~= "table" then return nil, "not JSON", "bad_image" end
  return sources.from_manifest(doc, function() return blob() end, function() return function() end end)
end, function(desc)
  if type(desc.layers) ~= "table" or type(desc.id) ~= "string" then return "no layers or id" end
end)

never_raises("registry.select", index_doc, function(bytes)
  local doc = json.decode(bytes)
  if type(doc) ~= "table" then return nil, "not JSON", "bad_image" end
  local d, err = registry.select(doc, { os = "linux", architecture = "amd64" })
  if not d then return nil, err, "no_platform" end
  return d
end)

-- An OCI layout whose index.json and blobs are hostile.
never_raises("sources.oci_layout", index_doc, function(bytes)
  local function read(name)
    if name == "index.json" then return bytes end
    local k = R(1, 3)
    if k == 1 then return input(manifest_doc) end
    if k == 2 then return input(index_doc) end
    return input(config_doc)
  end
  local function input_of() return function() end end
  return sources.oci_layout(read, input_of, R(1, 2) == 1 and "latest" or nil, sbx.policy.images, "oci:/x")
end, nil, true)   -- (its blobs never match their digests: all refused)

-- The same with digests that match, so the manifest (or an inner index)
-- and the config behind index.json are reached.
never_raises("sources.oci_layout, matching digests", index_doc, function(bytes)
  local blobs = {}
  local function put(b)
    local d = sbx.core.layer.sha256(b)
    blobs["blobs/sha256/" .. d:sub(8)] = b
    return d
  end
  local cfg = input(config_doc)
  local m = manifest_doc()
  if R(1, 4) > 1 then m.config.digest = put(cfg) end
  local mbytes = R(1, 3) > 1 and json.encode(R(1, 2) == 1 and m or mutate(m)) or input(index_doc)
  local idx = json.decode(bytes)
  if type(idx) == "table" and type(idx.manifests) == "table" and type(idx.manifests[1]) == "table" then
    idx.manifests[1].digest = put(mbytes)
    bytes = json.encode(idx)
  end
  local function read(name)
    if name == "index.json" then return bytes end
    return blobs[name] or nil, "no such blob", "not_found"
  end
  local function input_of() return function() end end
  return sources.oci_layout(read, input_of, R(1, 2) == 1 and "latest" or nil, sbx.policy.images, "oci:/x")
end, function(desc)
  if type(desc.layers) ~= "table" or type(desc.id) ~= "string" then return "no layers or id" end
end)

t.done()

-- The image documents sbx reads, checked at import: an image config and a
-- `docker save` manifest.json. A field of the wrong type is an error
-- naming the field here, never a surprise at a box's first command. Any
-- bytes may arrive (an archive or a registry is a stranger's): these never
-- raise, they answer nil, message, "bad_image".
--
--   validate.config(bytes) -> doc, flat | nil, message, code
--   validate.docker_manifest(bytes) -> list | nil, message, code
local core = require "sbx.core"

local json = core.json

local M = {}

local ARRAY = getmetatable(json.array {})

local function is_null(v) return v == nil or v == json.null end

-- What a JSON value is, as the error says it ("a number", "an object").
local function kind(v)
  if v == json.null then return "null" end
  if type(v) == "table" then
    if getmetatable(v) == ARRAY then return "an array" end
    return "an object"
  end
  if type(v) == "number" then return "a number" end
  if type(v) == "boolean" then return "a boolean" end
  if type(v) == "string" then return "a string" end
  return type(v)
end

local function is_array(v) return type(v) == "table" and getmetatable(v) == ARRAY end
local function is_object(v) return type(v) == "table" and getmetatable(v) ~= ARRAY end

local function bad(fmt, ...)
  return nil, string.format(fmt, ...), "bad_image"
end

-- The JSON text decoded: true, value | nil, why it is not JSON, code
-- (a value may be false).
local function decode(bytes, what)
  if type(bytes) ~= "string" then return bad("%s is missing", what) end
  local ok, doc, err = pcall(json.decode, bytes)
  if not ok then return bad("%s is malformed: %s", what, tostring(doc)) end
  if doc == nil then return bad("%s is malformed JSON (%s)", what, tostring(err)) end
  return true, doc
end

local function strings(v, name)
  if not is_array(v) then return bad("the image config's %s is %s, not an array of strings", name, kind(v)) end
  for i, s in ipairs(v) do
    if type(s) ~= "string" then return bad("the image config's %s[%d] is %s, not a string", name, i, kind(s)) end
  end
  return true
end

-- The runtime fields a backend uses, each with the check of its type.
local FIELDS = {
  Env = strings, Cmd = strings, Entrypoint = strings,
  WorkingDir = "string", User = "string", StopSignal = "string",
  Labels = "object", ExposedPorts = "object", Volumes = "object",
}
local ORDER = { "Env", "Cmd", "Entrypoint", "WorkingDir", "User", "Labels", "ExposedPorts", "Volumes", "StopSignal" }

--[[
validate.config(bytes) -> doc, flat | nil, message, "bad_image"
  bytes: an image config (OCI or Docker). doc: it decoded; flat: its
  runtime part for a backend ({ Env, Cmd, Entrypoint, WorkingDir, User,
  Labels, ExposedPorts, Volumes, StopSignal, Architecture, Os, Variant },
  absent and null fields absent). Checks rootfs.diff_ids (sha256 digests),
  the type of every runtime field, Labels' values, and architecture, os
  and variant.
]]
function M.config(bytes)
  local ok, doc, code = decode(bytes, "the image config")
  if not ok then return nil, doc, code end
  if not is_object(doc) then return bad("the image config is %s, not an object", kind(doc)) end
  if not is_object(doc.rootfs) or not is_array(doc.rootfs.diff_ids) then
    return bad("the image config has no rootfs.diff_ids: not a container image")
  end
  for i, d in ipairs(doc.rootfs.diff_ids) do
    if type(d) ~= "string" or not d:match("^sha256:%x+$") or #d ~= 71 then
      return bad("diff id %d of the config is not a sha256 digest", i)
    end
  end
  for _, k in ipairs { "architecture", "os", "variant" } do
    if not is_null(doc[k]) and type(doc[k]) ~= "string" then
      return bad("the image config's %s is %s, not a string", k, kind(doc[k]))
    end
  end
  local c = doc.config
  if is_null(c) then c = {} end
  if not is_object(c) then return bad("the image config's config is %s, not an object", kind(c)) end
  local flat = {}
  for _, k in ipairs(ORDER) do
    local v, want = c[k], FIELDS[k]
    if not is_null(v) then
      if type(want) == "function" then
        local ok, ferr, fcode = want(v, k)
        if not ok then return nil, ferr, fcode end
      elseif want == "string" and type(v) ~= "string" then
        return bad("the image config's %s is %s, not a string", k, kind(v))
      elseif want == "object" and not is_object(v) then
        return bad("the image config's %s is %s, not an object", k, kind(v))
      end
      flat[k] = v
    end
  end
  if flat.Labels then
    for lk, lv in pairs(flat.Labels) do
      if type(lk) ~= "string" or type(lv) ~= "string" then
        return bad("the image config's label %s is %s, not a string", tostring(lk), kind(lv))
      end
    end
  end
  -- A NUL would cut the user's name or the directory short in the agent.
  for _, k in ipairs { "User", "WorkingDir" } do
    if flat[k] and flat[k]:find("\0", 1, true) then return bad("the image config's %s holds a NUL byte", k) end
  end
  flat.Architecture = not is_null(doc.architecture) and doc.architecture or nil
  flat.Os = not is_null(doc.os) and doc.os or nil
  flat.Variant = not is_null(doc.variant) and doc.variant or nil
  return doc, flat
end

--[[
validate.docker_manifest(bytes) -> list | nil, message, "bad_image"
  bytes: a `docker save` manifest.json, a non-empty array of { Config =
  string, Layers = { strings }, RepoTags = { strings } | null }.
]]
function M.docker_manifest(bytes)
  local ok, doc, code = decode(bytes, "manifest.json")
  if not ok then return nil, doc, code end
  if not is_array(doc) or #doc == 0 then
    return bad("manifest.json is %s, not a list of images: not a docker save manifest",
      is_array(doc) and "an empty array" or kind(doc))
  end
  for i, m in ipairs(doc) do
    if not is_object(m) then return bad("manifest.json entry %d is %s, not an object", i, kind(m)) end
    if type(m.Config) ~= "string" then return bad("manifest.json entry %d: Config is %s, not a string", i, kind(m.Config)) end
    if not is_array(m.Layers) then return bad("manifest.json entry %d: Layers is %s, not an array", i, kind(m.Layers)) end
    for j, l in ipairs(m.Layers) do
      if type(l) ~= "string" then return bad("manifest.json entry %d: Layers[%d] is %s, not a string", i, j, kind(l)) end
    end
    if not is_null(m.RepoTags) then
      if not is_array(m.RepoTags) then return bad("manifest.json entry %d: RepoTags is %s, not an array", i, kind(m.RepoTags)) end
      for j, tg in ipairs(m.RepoTags) do
        if type(tg) ~= "string" then return bad("manifest.json entry %d: RepoTags[%d] is %s, not a string", i, j, kind(tg)) end
      end
    end
  end
  return doc
end

return M

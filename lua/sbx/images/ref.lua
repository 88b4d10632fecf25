-- Image references, as the containers tools (skopeo, podman, docker) write
-- them:
--
--   docker://NAME[:TAG|@DIGEST]   a registry (NAME as docker normalises it)
--   docker-archive:PATH[:NAME]    a `docker save` tarball
--   oci-archive:PATH[:TAG]        an OCI layout in a tarball
--   oci:DIR[:TAG]                 an OCI layout directory
--   docker-daemon:NAME            exported from a local Docker daemon
--   rootfs:DIR                    a plain directory (debootstrap, ...)
--   host                          the host's root, read-only
--   NAME                          a bare name: the cache, a daemon, a registry
--
-- ref.parse(s, opts) -> { transport, ... } | nil, message. opts.hub is
-- policy.images.hub: the name Docker Hub images carry and its aliases.
-- Pure: no I/O, except that a relative PATH is made absolute against the
-- current directory.
local M = {}

M.TRANSPORTS = {
  docker = true, ["docker-archive"] = true, ["oci-archive"] = true, oci = true,
  ["docker-daemon"] = true, rootfs = true,
}

-- A path component of a repository: lowercase alphanumerics joined by
-- one '.', one or two '_', or any number of '-' (distribution's grammar).
local function valid_component(c)
  if c == "" then return false end
  local rest = c
  local first = rest:match("^[a-z0-9]+")
  if not first then return false end
  rest = rest:sub(#first + 1)
  while rest ~= "" do
    local sep = rest:match("^%.") or rest:match("^__?") or rest:match("^%-+")
    if not sep then return false end
    rest = rest:sub(#sep + 1)
    local word = rest:match("^[a-z0-9]+")
    if not word then return false end
    rest = rest:sub(#word + 1)
  end
  return true
end
M.valid_component = valid_component

--[[
ref.docker_name(s, hub) -> { domain, path, tag, digest, name, canonical } |
nil, message
  hub: policy.images.hub ({ name, aliases }). Normalises a name as docker
  does: "busybox" is <hub.name>/library/busybox:latest, and an alias of the
  hub is the hub; the first component is a registry when it has a '.' or a
  ':' or is "localhost". canonical is name:tag, or
  name@digest when a digest is given (a tag beside a digest is kept in tag
  and ignored for lookups, as docker does).
]]
function M.docker_name(s, hub_policy)
  if type(hub_policy) ~= "table" or type(hub_policy.name) ~= "string" then
    error("ref.docker_name: the hub policy (policy.images.hub)", 2)
  end
  local hub = hub_policy.name
  if type(s) ~= "string" or s == "" then return nil, "an empty image name" end
  if s:find("[%s%c]") then return nil, string.format("%q is not an image name (spaces or control characters)", s) end
  local rest, digest = s:match("^(.-)@(.*)$")
  if not rest then rest = s end
  if digest and not digest:match("^sha256:%x+$") then
    return nil, string.format("%q: a digest is sha256:<64 hex digits>", s)
  end
  if digest and #digest ~= 71 then return nil, string.format("%q: a digest is sha256:<64 hex digits>", s) end
  if digest then digest = digest:lower() end
  local tag
  local last_slash = rest:match("^.*()/") or 0
  local colon = rest:find(":[^:/]*$")
  if colon and colon > last_slash then
    tag = rest:sub(colon + 1)
    rest = rest:sub(1, colon - 1)
    if not tag:match("^[%w_][%w_.%-]*$") or #tag > 128 then
      return nil, string.format("%q: invalid tag %q", s, tag)
    end
  end
  local domain, path = rest:match("^([^/]+)/(.+)$")
  if not domain or not (domain:find("[.:]") or domain == "localhost" or domain:find("%u")) then
    domain, path = hub, rest
  end
  for _, alias in ipairs(hub_policy.aliases or {}) do
    if domain == alias then domain = hub end
  end
  if domain == hub and not path:find("/", 1, true) then path = "library/" .. path end
  if path:find("%u") then return nil, string.format("%q: repository names must be lowercase", s) end
  for c in (path .. "/"):gmatch("([^/]*)/") do
    if not valid_component(c) then return nil, string.format("%q is not a valid repository name", s) end
  end
  if not domain:match("^[%w%.%-]+$") and not domain:match("^[%w%.%-]+:%d+$")
    and not domain:match("^%[[%x:]+%]:?%d*$") then
    return nil, string.format("%q: invalid registry %q", s, domain)
  end
  if not tag and not digest then tag = "latest" end
  local name = domain .. "/" .. path
  return {
    domain = domain, path = path, tag = tag, digest = digest, name = name,
    canonical = digest and (name .. "@" .. digest) or (name .. ":" .. tag),
  }
end

local function absolute(path)
  if path:sub(1, 1) == "/" then return path end
  local cwd = os.getenv("PWD")
  if not cwd or cwd == "" then
    local p = io.popen("pwd")
    cwd = p and p:read("l") or "."
    if p then p:close() end
  end
  return (cwd .. "/" .. path):gsub("/%./", "/"):gsub("/+", "/")
end
M.absolute = absolute

-- PATH[:SUFFIX] where PATH may itself hold ':' (the first ':' that leaves
-- an existing PATH wins, as skopeo reads it; else the whole string).
local function path_and_suffix(s, exists)
  if exists(s) then return s, nil end
  local i = s:find(":", 1, true)
  while i do
    local p = s:sub(1, i - 1)
    if p ~= "" and exists(p) then return p, s:sub(i + 1) end
    i = s:find(":", i + 1, true)
  end
  return s, nil
end

--[[
ref.parse(s, opts) -> ref | nil, message
  opts: hub (policy.images.hub), exists(path) -> bool (for PATH:SUFFIX).
  ref: { transport, input = s, key (the cache's name for it), ... }:
    docker, docker-daemon, name: docker = ref.docker_name(...)
    docker-archive: path, name (or nil); oci-archive, oci: path, tag
    rootfs: path; host: nothing else.
]]
function M.parse(s, opts)
  opts = opts or {}
  local hub = opts.hub
  local exists = opts.exists or function() return false end
  if type(s) ~= "string" then return nil, "an image reference must be a string" end
  if s == "" then return nil, "an empty image reference" end
  if s:find("%z") then return nil, "an image reference may not hold a NUL byte" end
  if s == "host" then return { transport = "host", input = s, key = "host" } end
  local transport, rest = s:match("^([%a][%w%-]*):(.*)$")
  if transport == "docker" and rest:sub(1, 2) == "//" then
    local d, err = M.docker_name(rest:sub(3), hub)
    if not d then return nil, err end
    return { transport = "docker", input = s, docker = d, key = d.canonical }
  end
  if transport and M.TRANSPORTS[transport] and transport ~= "docker" then
    if rest == "" then return nil, string.format("%q: %s: needs a %s", s, transport,
      transport == "docker-daemon" and "name" or "path") end
    if transport == "docker-daemon" then
      local d, err = M.docker_name(rest, hub)
      if not d then return nil, err end
      return { transport = transport, input = s, docker = d, key = "docker-daemon:" .. d.canonical }
    end
    if transport == "rootfs" then
      local p = absolute(rest)
      return { transport = transport, input = s, path = p, key = "rootfs:" .. p }
    end
    local p, suffix = path_and_suffix(rest, exists)
    p = absolute(p)
    local r = { transport = transport, input = s, path = p }
    if transport == "docker-archive" then
      if suffix then
        local d, err = M.docker_name(suffix, hub)
        if not d then return nil, err end
        r.name = d
      end
      r.key = "docker-archive:" .. p .. (r.name and (":" .. r.name.canonical) or "")
    else
      if suffix and suffix ~= "" and not suffix:match("^[%w_][%w_.%-/:@+]*$") then
        return nil, string.format("%q: invalid tag %q", s, suffix)
      end
      r.tag = suffix ~= "" and suffix or nil
      r.key = transport .. ":" .. p .. (r.tag and (":" .. r.tag) or "")
    end
    return r
  end
  if transport == "docker" then
    return nil, string.format("%q: a registry reference is docker://NAME", s)
  end
  -- A bare name ("busybox", "busybox:1.36", "127.0.0.1:5000/x").
  local d, err = M.docker_name(s, hub)
  if not d then
    return nil, err .. " (references: docker://NAME, docker-archive:PATH, oci-archive:PATH, oci:DIR[:TAG], docker-daemon:NAME, rootfs:DIR, host, or a bare NAME)"
  end
  return { transport = "name", input = s, docker = d, key = d.canonical }
end

-- Is host (a registry's host[:port]) on the loopback interface?
function M.is_loopback(host)
  local h = host:match("^%[(.-)%]") or host:match("^([^:]+)") or host
  h = h:lower()
  return h == "localhost" or h == "::1" or h:match("^127%.%d+%.%d+%.%d+$") ~= nil
end

return M

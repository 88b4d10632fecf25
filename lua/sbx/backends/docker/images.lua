-- The Docker backend's images: present on the daemon, or pulled with
-- progress; what sbx keeps of each (its architecture and default user).
local core = require "sbx.core"
local json, http = core.json, require "sbx.http"
local client = require "sbx.backends.docker.client"
local call, urlq, pol = client.call, client.urlq, client.pol

local M = {}

-- What sbx keeps of an image: its architecture (for the agent) and its
-- default user (the agent runs commands as that user).
local function image_facts(inspect)
  local cfg = type(inspect) == "table" and type(inspect.Config) == "table" and inspect.Config or {}
  return {
    arch = type(inspect) == "table" and inspect.Architecture or nil,
    user = type(cfg.User) == "string" and cfg.User ~= "" and cfg.User or nil,
  }
end

local function ensure_image(d, image, pull, deadline)
  if d.images[image] and pull ~= "always" then return true end
  if pull ~= "always" then
    local st, body, code = call(d, "GET", "/images/" .. urlq(image) .. "/json", nil, { deadline = deadline })
    if st then d.images[image] = image_facts(body) return true end
    local _ = body
    if code ~= "not_found" then return nil, body, code end
    if pull == "never" then
      return nil, string.format("image '%s' is not on the daemon and policy says pull = \"never\"", image), "image_unavailable"
    end
  end
  local name, tag = image:match("^(.-):([%w][%w_.%-]*)$")
  if not name then name, tag = image, "latest" end
  local timeout = client.seconds_left(deadline, pol().pull_timeout)
  local r, err = http.request {
    url = d.prefix .. "/images/create?fromImage=" .. urlq(name) .. "&tag=" .. urlq(tag),
    method = "POST", unix_socket = d.unix_socket, timeout = timeout, body = "", stream = true,
  }
  local failure
  if not r then failure = err
  else
    -- The daemon streams one JSON object a line: per layer, "Downloading"
    -- with progressDetail { current, total } (sbx.progress shows their
    -- sum); a started pull reports later failures as a line with "error".
    local body <close> = r.body_stream
    local meter = r.status < 300 and require("sbx.progress").start("pulling " .. image .. " (Docker daemon)")
    local got, sizes, buf, all = {}, {}, "", {}
    local function show()
      local sum, total = 0, 0
      for id, v in pairs(got) do sum, total = sum + v, total + (sizes[id] or v) end
      meter:set(sum, total)
    end
    local function line_of(l)
      local j = json.decode(l)
      if type(j) ~= "table" then return end
      if j.error then failure = j.error end
      local pd = type(j.progressDetail) == "table" and j.progressDetail or {}
      if j.status == "Downloading" and j.id and math.type(pd.current) then
        got[j.id], sizes[j.id] = pd.current, math.type(pd.total) and pd.total or sizes[j.id]
        show()
      elseif j.status == "Download complete" and j.id and sizes[j.id] then
        -- The last "Downloading" line may fall short of the layer's size.
        got[j.id] = sizes[j.id]
        show()
      end
    end
    while true do
      local chunk, rerr = body:read(timeout)
      if not chunk then
        if rerr ~= "eof" then failure = failure or rerr end
        break
      end
      if meter then
        buf = buf .. chunk
        for l in buf:gmatch("([^\r\n]*)\r?\n") do line_of(l) end
        buf = buf:match("[^\n]*$")
      else
        all[#all + 1] = chunk
      end
    end
    if meter then
      if buf ~= "" then line_of(buf) end
      if not failure then meter:finish() end
    else
      local text = table.concat(all)
      local j = json.decode(text)
      failure = type(j) == "table" and j.message or text
    end
  end
  if failure then
    return nil, string.format("image '%s' is not available locally and could not be pulled: %s", image, tostring(failure):gsub("%s+$", "")), "image_unavailable"
  end
  local st, body = call(d, "GET", "/images/" .. urlq(image) .. "/json", nil, { deadline = deadline })
  d.images[image] = image_facts(st and body)
  return true
end
M.ensure_image = ensure_image

return M

-- The local backend's images: the layers a box's overlay is made of.
local core = require "sbx.core"

local M = {}

-- Images -------------------------------------------------------------------------------

local function overlay_safe(dir)
  return dir:sub(1, 1) == "/" and not dir:find("[:,\\%s]")
end

-- The image's root: { host = true } or { lowers = { dir, ... } (top first),
-- config = { env, user, workdir } } | nil, message, code.
-- image = "rootfs:DIR" (a plain directory), "host", or the layers box option;
-- any other reference goes to sbx.images (OCI pulls, the cache shared with
-- other processes, unpacking: images.resolve(ref, { policy, hold }) ->
-- { layers = { dirs, lowest first }, rootfs = dir, host = bool, config =
-- { Env, User, WorkingDir }, lease }); the lease keeps the image from
-- `sbx images rm` and prune while the box lives (closed at destroy).
local function image_source(spec, pol)
  local image = spec.image
  local lowers, config, lease
  if spec.layers and #spec.layers > 0 then
    lowers, config = spec.layers, {}
  elseif image == "host" then
    return { host = true, config = {} }
  elseif type(image) == "string" and image:match("^rootfs:") then
    lowers, config = { image:sub(8) }, {}
  else
    -- The box's own pull (policy.box.pull merged with its options): with
    -- "never" no registry is asked, whatever the cache lacks.
    local img, err, code = require("sbx.images").resolve(image, { policy = pol, hold = true, pull = spec.pull })
    -- One code for every way an image can be missing (as the Docker
    -- backend does); the cause stays in the message.
    if not img then
      return nil, string.format("image '%s' is not available: %s (%s)", tostring(image),
        tostring(err), tostring(code or "error")), "image_unavailable"
    end
    local c = type(img.config) == "table" and img.config or {}
    -- Imports check these (sbx.images.validate); a record written before
    -- they did is refused here rather than at the box's first command.
    for _, k in ipairs { "User", "WorkingDir" } do
      if c[k] ~= nil and type(c[k]) ~= "string" then
        if img.lease then img.lease:close() end
        return nil, string.format("image '%s' is not usable: its config's %s is a %s, not a string (sbx images rm it and import it again)",
          tostring(image), k, type(c[k])), "image_unavailable"
      end
    end
    config = { env = c.Env, user = c.User, workdir = c.WorkingDir }
    if img.host then
      if img.lease then img.lease:close() end
      return { host = true, config = config }
    end
    if img.layers then
      -- overlayfs wants the top layer first.
      lowers = {}
      for i = #img.layers, 1, -1 do lowers[#lowers + 1] = img.layers[i] end
    else
      lowers = { img.rootfs }
    end
    lease = img.lease
  end
  for _, dir in ipairs(lowers) do
    if not overlay_safe(dir) then
      return nil, string.format("image directory %q must be an absolute path without ':', ',', '\\' or spaces " ..
        "(an overlay lowerdir)", dir), "image_unavailable"
    end
    if core.path_type(dir) ~= "dir" then
      return nil, string.format("image directory %s does not exist", dir), "image_unavailable"
    end
  end
  return { lowers = lowers, config = config, lease = lease }
end

M.image_source = image_source

return M

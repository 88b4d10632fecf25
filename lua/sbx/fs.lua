-- Small host-file helpers shared by the Lua layer.
local M = {}

-- The whole content of a host file, or nil when it cannot be read.
function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

return M

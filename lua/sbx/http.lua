-- core.http with the policy's limits filled in: C keeps only fallbacks, so
-- every Lua caller goes through here and policy.http decides how much of a
-- response body (or of a streamed one, ahead of its reader) is held.
local core = require "sbx.core"

local M = setmetatable({}, { __index = core.http })

function M.request(opts)
  local pol = require("sbx.config").policy.http
  local key = opts.stream and "max_buffer" or "max_body"
  if opts[key] == nil and pol and pol[key] then
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o[key] = pol[key]
    opts = o
  end
  return core.http.request(opts)
end

return M

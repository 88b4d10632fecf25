-- Base64, standard alphabet: what trace records, Docker's config.json
-- "auth" fields and kubeconfig *-data fields use.
--   encode(bytes) -> text (padded)
--   decode(text) -> bytes | nil (whitespace and padding ignored; nil on any
--   other character outside the alphabet)
local M = {}

local ALPHA = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local VALUE = {}
for i = 1, 64 do VALUE[ALPHA:byte(i)] = i - 1 end

function M.encode(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    local q = {}
    for k = 3, 0, -1 do
      local v = (n >> (6 * k)) & 63
      q[#q + 1] = ALPHA:sub(v + 1, v + 1)
    end
    if not b then q[3], q[4] = "=", "=" elseif not c then q[4] = "=" end
    out[#out + 1] = table.concat(q)
  end
  return table.concat(out)
end

function M.decode(s)
  s = s:gsub("[%s=]", "")
  local out, bits, n = {}, 0, 0
  for i = 1, #s do
    local v = VALUE[s:byte(i)]
    if not v then return nil end
    bits = ((bits << 6) | v) & 0xFFFFFF
    n = n + 6
    if n >= 8 then
      n = n - 8
      out[#out + 1] = string.char((bits >> n) & 0xFF)
    end
  end
  return table.concat(out)
end

return M

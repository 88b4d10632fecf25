-- needs: nothing
-- sbx.base64, the one codec behind traces, Docker's config.json "auth"
-- and kubeconfig *-data fields: RFC 4648 vectors, every byte value, every
-- padding length, and text that is not base64.
local tap = require "tap"
local b64 = require "sbx.base64"

for plain, coded in pairs { [""] = "", f = "Zg==", fo = "Zm8=", foo = "Zm9v", foob = "Zm9vYg==",
                            fooba = "Zm9vYmE=", foobar = "Zm9vYmFy" } do
  tap.is(b64.encode(plain), coded, "RFC 4648: encode " .. plain)
  tap.is(b64.decode(coded), plain, "RFC 4648: decode " .. coded)
end
local all = {}
for i = 0, 255 do all[#all + 1] = string.char(i) end
all = table.concat(all)
for cut = 0, 2 do
  local s = all:sub(1, #all - cut)
  tap.is(b64.decode(b64.encode(s)), s, "every byte value round-trips (" .. #s .. " bytes)")
end
tap.is(b64.decode("Zm9v\nYmFy \t"), "foobar", "whitespace is ignored")
tap.is(b64.decode("Zm9vYmE"), "fooba", "padding is optional")
tap.is(b64.decode("Zm9v*mFy"), nil, "a character outside the alphabet: nil")
tap.done()

-- needs: podman, root, docker
-- A Podman container record whose storage is gone (Podman 4.3 leaves one
-- when a create is cut off: "getting container from store ...: container
-- not known") fails Podman's whole compat container list. sbx lists through
-- Podman's own libpod API, which shows that record, so `sbx reap` still
-- works and removes it. The test makes such a record on a private Podman
-- service: a container created by podman, its entry taken out of the
-- storage's containers.json.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local json = sbx.json

local dir = H.sh("mktemp -d"):gsub("%s+$", "")
local sock = dir .. "/podman.sock"
local host = "unix://" .. sock
H.sh(string.format("cd %s && (podman system service --time=0 %s >%s/service.log 2>&1 & echo $! >%s/pid)", dir, host, dir, dir))
local up = false
for _ = 1, 100 do
  local r = sbx.http.request { url = "http://localhost/_ping", unix_socket = sock, timeout = 1 }
  if r and r.status == 200 then up = true break end
  sbx.sleep(0.1)
end
tap.ok(up, "a private Podman service answers")

local image = os.getenv("SBX_TEST_BUSYBOX") or "sbx-busybox:latest"
local _, has = H.sh("podman image exists " .. image)
if has ~= 0 then H.sh("docker save " .. image .. " | podman load") end

-- A box of an owner long gone (its deadline passed), then its storage entry
-- removed behind Podman's back.
local out, rc = H.sh("podman create --label sbx=1 --label sbx.owner.pid=1 --label sbx.owner.host=elsewhere " ..
  "--label sbx.owner.start=1 --label sbx.deadline=1 --label sbx.test=broken-record " .. image .. " true")
local id = out:match("(%x+)%s*$")
tap.is(rc, 0, "podman creates the container", out)
local graph = H.sh("podman info --format '{{.Store.GraphRoot}}'"):gsub("%s+$", "")
local store = graph .. "/overlay-containers/containers.json"
local f = io.open(store)
local entries = f and json.decode(f:read("a"))
if f then f:close() end
local kept = {}
for _, c in ipairs(entries or {}) do if c.id ~= id then kept[#kept + 1] = c end end
tap.is(#kept, #(entries or {}) - 1, "its entry is taken out of " .. store)
f = assert(io.open(store, "w"))
f:write(json.encode(json.array(kept)))
f:close()

local d = assert(require("sbx.backends.docker").connect(host))
tap.ok(d.podman, "sbx sees Podman")
local _, err, code = H.api("GET", "/containers/json?all=true", nil, host)
tap.like(tostring(err), "container not known", "Podman's compat list now fails whole (" .. tostring(code) .. ")")

local list = H.containers({ "sbx.test=broken-record" }, host)
tap.is(#list, 1, "sbx's list still shows the broken record")
tap.is(list[1] and list[1].Id, id, "by its id")

out, rc = H.sh(string.format("DOCKER_HOST=%s %s reap --backend docker", host, H.sbx_bin))
tap.is(rc, 0, "sbx reap works", out)
tap.like(out, "removed " .. (list[1] and list[1].Names[1] or "?"):gsub("%p", "%%%0") .. " %(past its deadline%)", "and names it, past its deadline", out)
tap.is(#H.containers({ "sbx.test=broken-record" }, host), 0, "it is gone")

-- Whatever failed above, nothing of the test stays.
if id then H.sh("podman rm -f " .. id) end
H.sh("kill $(cat " .. dir .. "/pid); rm -rf " .. dir)
tap.done()

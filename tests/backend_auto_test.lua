-- needs: docker, local, root
-- backend = "auto" (issue 16 item 6): the local backend where it isolates
-- fully here (user namespaces, a proc of the box's own, cgroups for memory,
-- pids and cpu) and has the image without a registry; else Docker when a
-- daemon answers. box.backend says which. The suite's policy turns
-- policy.local.auto off (tests/data/suite_policy.lua); this file turns it on.
local sbx = require "sbx"
local tap = require "tap"
local H = require "helper"

sbx.use_policy { ["local"] = { auto = true } }
local B = require "sbx.box"
local lb = require "sbx.backends.local"
local full, why = lb.full(sbx.policy)
local have = require("sbx.images").available(H.image)
local daemon = select(2, H.sh("timeout 20 docker version --format '{{.Server.Version}}'")) == 0

-- Is id a container of the daemon's?
local function container(id) return select(2, H.sh("docker inspect --format '{{.Id}}' " .. id)) == 0 end

-- DOCKER_HOST names a daemon (make test-podman sets it): asking for a
-- daemon is asking for Docker, and auto says so.
local env = os.getenv("DOCKER_HOST")
local named = env ~= nil and env ~= ""

if named then
  local box = assert(sbx.box { image = H.image })
  tap.is(box.backend, "docker", "DOCKER_HOST names a daemon (" .. env .. "): auto picks Docker")
  tap.ok(container(box.id), "and the box is a container of that daemon's")
  tap.is(box:exec("echo hi").stdout, "hi\n", "the box works")
  box:close()
elseif not full or not have then
  tap.skip("auto picks the local backend", not full and ("the local backend cannot isolate fully here: " ..
    tostring(why)) or (H.image .. " is not in sbx's image cache or archives"))
else
  local box = assert(sbx.box { image = H.image })
  tap.is(box.backend, "local", "auto picks the local backend here (it isolates fully and has " .. H.image .. ")")
  tap.is(box.backend_name, "local", "box.backend_name says the same")
  tap.like(tostring(box), "%(local%)", "and so does tostring(box)")
  tap.is(box:exec("echo hi").stdout, "hi\n", "the box works")
  tap.is(box.limits.memory.enforced, "cgroup", "its memory limit is a cgroup's")
  if daemon then tap.ok(not container(box.id), "no Docker container was made for it") end
  box:close()
end

-- Where the local backend would isolate only partly, Docker. policy.local.proc
-- = "copy" is the switch that gives boxes copies of /proc instead of a proc
-- of their own (as in a container with a masked /proc): full() says no.
do
  local partial = { ["local"] = { proc = "copy" } }
  local pfull, pwhy = lb.full(sbx.merge_policy(sbx.deep_copy(sbx.policy), partial))
  tap.ok(not pfull, "with policy.local.proc = \"copy\" the local backend reports partial isolation", pwhy)
  if daemon then
    local box, err = sbx.box { image = H.image, policy = partial }
    tap.ok(box, "a box is made", err)
    if box then
      tap.is(box.backend, "docker", "auto then picks Docker")
      tap.ok(container(box.id), "and the box is a container of the daemon's")
      tap.is(box:exec("echo hi").stdout, "hi\n", "that works")
      box:close()
    end
  else
    tap.skip("auto picks Docker where local isolates partly", "no Docker daemon answers")
  end
end

-- The rest of the rule, without making boxes.
do
  local absent = "sbx-test-absent-" .. sbx.core.pid() .. ":1"
  local want = (daemon or named) and "docker" or "local"
  tap.is(B.backend_name("auto", { image = absent }), want,
    "an image the local backend lacks (" .. absent .. "): " .. want)
  tap.is(B.backend_name("auto", { image = H.image, docker_host = "unix:///var/run/docker.sock" }), "docker",
    "a named daemon means Docker")
  tap.is(B.backend_name("auto", { image = "rootfs:/" }), "local", "a rootfs image means local")
  tap.is(B.backend_name("auto", { layers = { "/" } }), "local", "layers mean local")
  if full and have then
    tap.is(B.backend_name("auto", { image = H.image, network = "bridge" }), want,
      "network = \"bridge\", which the local backend cannot give: " .. want)
    tap.is(B.backend_name("auto", { image = H.image, host_config = { Privileged = false } }), want,
      "an option only Docker takes (host_config): " .. want)
  end
  local off = sbx.merge_policy(sbx.deep_copy(sbx.policy), { ["local"] = { auto = false } })
  tap.is(B.backend_name("auto", { image = H.image }, off), want,
    "policy.local.auto = false: " .. want .. " (Docker wherever a daemon answers)")
  tap.is(B.backend_name("docker", { image = H.image }), "docker", "a named backend is that backend")
end

if daemon then
  local box = assert(sbx.box { backend = "docker", image = H.image })
  tap.is(box.backend, "docker", "box.backend of a Docker box says docker")
  box:close()
end
tap.done()

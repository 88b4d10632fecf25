-- needs: docker, local, root
-- sbx without a Docker daemon: the README's first command (the hello
-- example) runs on the local backend when no daemon answers. The test hides
-- the daemon's socket in a mount namespace of its own (the daemon keeps
-- running for everything else), gives sbx a fresh image cache, and the
-- example's image comes from the archive scripts/setup.sh wrote
-- (policy.images.archives) with no daemon and no registry.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local archive = "/var/lib/sbx/images/sbx-debian:12.tar"
local st = sbx.core.path_type(archive)
tap.is(st, "file", "scripts/setup.sh wrote the example image's archive (" .. archive .. ")")

local cache = os.tmpname()
os.remove(cache)
local sbx_bin = H.sbx_bin
if sbx_bin:sub(1, 1) ~= "/" then sbx_bin = os.getenv("PWD") .. "/" .. sbx_bin end
-- The daemon's socket, as the probe of backend = "auto" finds it: /dev/null
-- bound over it (connect() is refused), only in this namespace.
local function without_daemon(cmd)
  return H.sh(string.format(
    "unshare -m sh -c 'mount --bind /dev/null /run/docker.sock && env -u DOCKER_HOST XDG_CACHE_HOME=%s %s'",
    cache, cmd))
end

local out, code = without_daemon(sbx_bin .. " run lua/examples/hello.lua")
tap.is(code, 0, "the hello example ran with no daemon (exit " .. tostring(code) .. ")")
tap.like(out, "box %x+ from sbx%-debian:12", "it made a box from the example image")
tap.like(out, "exit 0 in %d+ ms:\nLinux", "ran a command in it")
tap.like(out, "timed out:%s+true", "timed a command out")
tap.like(out, "tick 1\ntick 2\ntick 3", "ran a background process")
tap.like(out, "Exit code: 3", "and showed what a model reads")

local function script(text)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end
local probe = script([[local sbx = require "sbx"
local b = assert(sbx.box { image = "sbx-debian:12" })
print(b.backend_name, b:exec("cat /etc/debian_version").stdout)
b:close()]])
out = without_daemon(sbx_bin .. " run " .. probe)
tap.like(out, "^local\t12", "backend = \"auto\" chose local")
out = without_daemon(sbx_bin .. " images ls")
tap.like(out, "sbx%-debian:12", "the image is in sbx's own cache, by its name")

-- Naming a daemon is asking for docker: a dead one is an error, never a
-- silent switch to another backend.
local named = script([[local sbx = require "sbx"; local b, e, c = sbx.box { image = "sbx-debian:12" }; print(b, c)]])
out = H.sh("DOCKER_HOST=unix:///nonexistent/docker.sock " .. sbx_bin .. " run " .. named)
tap.like(out, "nil\tdaemon_unavailable", "DOCKER_HOST names a dead daemon: daemon_unavailable")

H.sh("rm -rf " .. cache)
os.remove(probe)
os.remove(named)
tap.done()

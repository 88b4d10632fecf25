-- Helpers for the local backend's tests: image root filesystems exported
-- from the local Docker images (cached by image id), the unprivileged test
-- users, and running a test file again as one of them with its TAP lines
-- relayed into this file's.
--
-- A test file runs as root and, at its end, runs itself again as each
-- unprivileged user (SBX_LOCAL_ROLE says which run this is):
--   "subid"   user sbxlocal, whose /etc/subuid grants a range (newuidmap)
--   "single"  user sbxlocal1, without a range: a box of one id
local sbx = require "sbx"
local L = {}

L.role = os.getenv("SBX_LOCAL_ROLE") or "root"
L.users = { subid = "sbxlocal", single = "sbxlocal1" }

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return out, ok and 0 or code
end
L.sh = sh

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
L.q = q

-- The root filesystem of a Docker image, exported once per image id and
-- owner: a directory root owns (for root) or the user owns (extracted as
-- that user, as an unprivileged user's own image store would be).
function L.rootfs(image, user)
  local id = sh("docker image inspect -f '{{.Id}}' " .. q(image)):match("sha256:(%x+)")
  assert(id, "no docker image " .. image)
  local base = user and ("/var/tmp/sbx-test-rootfs-" .. user) or "/var/tmp/sbx-test-rootfs"
  local dir = string.format("%s/%s-%s", base, image:gsub("[^%w]", "_"), id:sub(1, 12))
  if sbx.core.path_type(dir .. "/bin") or sbx.core.path_type(dir .. "/usr") then return dir end
  local as = user and ("runuser -u " .. user .. " -- ") or ""
  local tmp = dir .. ".tmp." .. sbx.core.pid()
  local script = "mkdir -p " .. q(base) .. (user and (" && chown " .. user .. " " .. q(base)) or "") ..
    " && " .. as .. "mkdir -p " .. q(tmp) ..
    " && c=$(docker create " .. q(image) .. " true) && { docker export \"$c\" | " .. as .. "tar -x -C " .. q(tmp) ..
    "; docker rm \"$c\" >/dev/null; } && " .. as .. "mv " .. q(tmp) .. " " .. q(dir)
  local out, rc = sh(script)
  assert(sbx.core.path_type(dir .. "/bin") or sbx.core.path_type(dir .. "/usr"),
    "cannot export " .. image .. " (" .. tostring(rc) .. "): " .. out)
  return dir
end

-- The rootfs this run uses (the root run hands the users theirs).
function L.my_rootfs(image)
  local env = os.getenv("SBX_LOCAL_ROOTFS")
  if env and env ~= "" then return env end
  return L.rootfs(image)
end

-- Makes the test users: sbxlocal with a subordinate id range, sbxlocal1
-- without one.
function L.ensure_users()
  if sh("id -u sbxlocal"):match("^%d+") == nil then
    sh("useradd -m -s /bin/sh sbxlocal")
  end
  if sh("id -u sbxlocal1"):match("^%d+") == nil then
    sh("useradd -m -s /bin/sh -K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0 sbxlocal1")
  end
  -- The range user needs one; the single-id user must have none.
  local sub = sh("cat /etc/subuid")
  assert(sub:find("\nsbxlocal:", 1, true) or sub:find("^sbxlocal:"), "sbxlocal has no /etc/subuid range")
  assert(not sub:find("sbxlocal1:", 1, true), "sbxlocal1 must have no /etc/subuid range")
end

-- Runs file as the user of role with this run's environment, relaying its
-- TAP lines into tap under a prefix. extra: more NAME=value.
function L.relay(tap, role, file, image, extra)
  local user = L.users[role]
  local rootfs = L.rootfs(image, user)
  local env = {
    "SBX_LOCAL_ROLE=" .. role, "SBX_LOCAL_ROOTFS=" .. rootfs,
    "LUA_PATH=" .. (os.getenv("LUA_PATH") or ""), "HOME=/home/" .. user,
    "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
  }
  -- The build under test (make check's is build-asan/, not build/) and how
  -- its sanitizers report.
  for _, name in ipairs { "SBX_BIN", "ASAN_OPTIONS", "UBSAN_OPTIONS", "SBX_SANITIZED" } do
    local v = os.getenv(name)
    if v then env[#env + 1] = name .. "=" .. v end
  end
  for _, e in ipairs(extra or {}) do env[#env + 1] = e end
  local cmd = string.format("cd %s && runuser -u %s -- env -i %s %s run %s 2>&1; echo \"__exit $?\"",
    q(os.getenv("PWD") or "."), user, table.concat((function()
      local t = {}
      for i, e in ipairs(env) do t[i] = q(e) end
      return t
    end)(), " "), q(os.getenv("SBX_BIN") or "build/sbx"), q(file))
  local p = io.popen(cmd)
  local planned, seen, status, pending = nil, 0, nil, nil
  local function flush()
    if pending then
      tap.ok(pending.pass, role .. ": " .. pending.name, pending.diag ~= "" and pending.diag or nil)
      pending = nil
    end
  end
  for line in p:lines() do
    local not_, name = line:match("^(n?o?t? ?)ok %d+ %- (.*)$")
    if name then
      flush()
      seen = seen + 1
      local skip = name:match("# SKIP (.*)$")
      if skip and not_ == "" then
        tap.skip(role .. ": " .. name:gsub("%s*# SKIP.*$", ""), skip)
      else
        pending = { pass = not_ == "", name = name, diag = "" }
      end
    elseif line:match("^1%.%.%d+$") then
      planned = tonumber(line:match("%d+$"))
    elseif line:match("^__exit ") then
      status = tonumber(line:match("%d+"))
    elseif pending and line:match("^#") then
      pending.diag = pending.diag .. line:gsub("^#%s*", "") .. "\n"
    else
      io.write("# [" .. role .. "] ", line, "\n")
    end
  end
  flush()
  p:close()
  tap.ok(planned ~= nil and planned == seen, role .. ": the run finished its plan (" .. tostring(seen) .. " of " ..
    tostring(planned) .. ")")
  tap.ok(status == 0, role .. ": the run exited 0 (" .. tostring(status) .. ")")
end

-- Relays this test file as both unprivileged users (from the root run).
function L.relay_users(tap, file, image, extra)
  if L.role ~= "root" then return end
  L.ensure_users()
  L.relay(tap, "subid", file, image, extra)
  L.relay(tap, "single", file, image, extra)
end

-- A local box on this run's rootfs.
function L.box(opts)
  opts = opts or {}
  opts.backend = "local"
  opts.image = opts.image or ("rootfs:" .. L.my_rootfs(opts.docker_image or os.getenv("SBX_TEST_IMAGE") or "sbx-debian:12"))
  opts.docker_image = nil
  return sbx.box(opts)
end

-- Processes on the host whose command line has pattern (for what must not
-- outlive a box).
function L.host_procs(pattern)
  local found = {}
  for _, pid in ipairs(sbx.core.sandbox.list("/proc") or {}) do
    if pid:match("^%d+$") then
      local f = io.open("/proc/" .. pid .. "/cmdline", "rb")
      local c = f and f:read("a") or ""
      if f then f:close() end
      c = c:gsub("%z", " ")
      if c:find(pattern) then found[#found + 1] = pid .. " " .. c end
    end
  end
  return found
end

return L

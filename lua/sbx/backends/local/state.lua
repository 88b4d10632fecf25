-- The local backend's state on the host: the state and disk directories,
-- the programs it installs there, and each box's owner record.
local core = require "sbx.core"
local owner = require "sbx.owner"
local read_file = require("sbx.fs").read
local S = core.sandbox
local sbx_config = require "sbx.config"
local function lpol(pol) return (pol or sbx_config.policy)["local"] end
local host = require "sbx.backends.local.host"
local disk_root_path = host.disk_root_path
local make_dirs = host.make_dirs

local M = {}

-- State on the host ----------------------------------------------------------------------

-- The state directory, made 0700 and checked to be this user's: it holds
-- programs sbx executes.
local roots = {}
local function state_root(pol)
  local lp = lpol(pol)
  local uid = S.ids()
  local dir = lp.state_dir
  if not dir then
    local xdg = os.getenv("XDG_RUNTIME_DIR")
    if uid == 0 then dir = "/run/sbx/local"
    elseif xdg and xdg ~= "" then dir = xdg .. "/sbx/local"
    else dir = "/tmp/sbx-" .. uid .. "/local" end
  end
  if roots[dir] then return dir end
  local ok, err = make_dirs(dir, tonumber("700", 8))
  if not ok then return nil, "cannot make the state directory: " .. tostring(err), "state_dir" end
  -- Every directory from the one sbx made down must be this user's.
  local cur = dir
  while cur ~= "" and cur ~= "/" do
    local st = S.stat(cur)
    if st and st.uid ~= uid and not (st.uid == 0 and cur ~= dir) then
      return nil, string.format("%s belongs to uid %d, not to this user (%d): sbx will not keep its programs there",
        cur, st.uid, uid), "state_dir"
    end
    if st and st.uid == 0 and uid ~= 0 then break end
    cur = cur:match("^(.*)/[^/]*$") or ""
  end
  for _, sub in ipairs { "bin", "boxes" } do
    local okd, errd, code = S.mkdir(dir .. "/" .. sub, tonumber("700", 8))
    if not okd and code ~= "EEXIST" then return nil, errd, "state_dir" end
  end
  roots[dir] = true
  return dir
end

-- The directory of disk layers (policy.local.disk_dir), made 0700 and
-- checked to be this user's: dir | nil, message, code.
local disk_roots = {}
local function disk_root(pol)
  local uid = S.ids()
  local dir = disk_root_path(pol)
  if disk_roots[dir] then return dir end
  local ok, err = make_dirs(dir, tonumber("700", 8))
  if not ok then return nil, "cannot make the directory of disk layers: " .. tostring(err), "state_dir" end
  local st = S.stat(dir)
  if not st or st.uid ~= uid then
    return nil, string.format("%s belongs to uid %s, not to this user (%d)", dir, tostring(st and st.uid), uid), "state_dir"
  end
  local okd, errd, code = S.mkdir(dir .. "/boxes", tonumber("700", 8))
  if not okd and code ~= "EEXIST" then return nil, errd, "state_dir" end
  disk_roots[dir] = true
  return dir
end

-- A program written once per content: <root>/bin/<name>-<sha256 prefix>.
local installed = {}
local function install(root, name, bytes)
  local path = string.format("%s/bin/%s-%s", root, name, core.sigv4.sha256(bytes):sub(1, 16))
  if installed[path] then return path end
  local cur = read_file(path)
  if cur ~= bytes then
    local ok, err, code = S.install(path, bytes, tonumber("555", 8))
    if not ok then return nil, err, code end
  end
  installed[path] = true
  return path
end

-- uname -m: the architecture of the agent the box needs.
local function host_arch()
  local m = read_file("/proc/sys/kernel/arch")
  if m then return (m:gsub("%s+$", "")) end
  local p = io.popen("uname -m")
  local out = p and p:read("l")
  if p then p:close() end
  return out or "x86_64"
end

local programs = {}
local function ensure_programs(root)
  if programs[root] then return programs[root] end
  local launcher = S.launcher()
  if not launcher then return nil, "this build of sbx carries no sbx-launch", "unsupported" end
  local arch = host_arch()
  local agent = core.agent.binary(arch)
  if not agent then return nil, "this build of sbx carries no agent for " .. arch, "unsupported" end
  local lp, err, code = install(root, "sbx-launch", launcher)
  if not lp then return nil, err, code end
  local ap, aerr, acode = install(root, "sbx-agent-" .. arch, agent)
  if not ap then return nil, aerr, acode end
  programs[root] = { launch = lp, agent = ap }
  return programs[root]
end

-- The owner record of a box: key value lines (sbx.owner's fields, the
-- launcher's pid and start time, the box's cgroup directories).
local function record_text(h, spec)
  local o = owner.identity()
  local now = os.time()
  local lines = {
    "owner.pid " .. o.pid, "owner.start " .. o.start, "owner.host " .. o.host,
    "created " .. now, "deadline " .. (now + math.floor(spec.lifetime)),
    "pid " .. tostring(h.pid or ""), "pid.start " .. tostring(h.pid and owner.proc_start(h.pid) or ""),
  }
  for _, dir in ipairs(h.cgroups or {}) do lines[#lines + 1] = "cgroup " .. dir end
  if h.disk then lines[#lines + 1] = "disk " .. h.disk end
  return table.concat(lines, "\n") .. "\n"
end

local function read_record(dir)
  local text = read_file(dir .. "/owner")
  if not text then return nil end
  local r = { cgroups = {} }
  for line in text:gmatch("[^\n]+") do
    local k, v = line:match("^(%S+) ?(.*)$")
    if k == "cgroup" then r.cgroups[#r.cgroups + 1] = v elseif k then r[k] = v end
  end
  return r
end

M.disk_root = disk_root
M.ensure_programs = ensure_programs
M.read_record = read_record
M.record_text = record_text
M.state_root = state_root

return M

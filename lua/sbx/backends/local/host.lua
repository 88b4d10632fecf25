-- The local backend's view of the host, found once per process: programs,
-- id mappings, cgroups, whether a fresh /proc can be mounted, where disk
-- layers go; full() says whether a box here is fully isolated.
local core = require "sbx.core"
local read_file = require("sbx.fs").read
local S = core.sandbox
local sbx_config = require "sbx.config"
local function lpol(pol) return (pol or sbx_config.policy)["local"] end

local M = {}

-- Helpers ---------------------------------------------------------------------------

local function exists(path) return core.path_type(path) ~= nil end

-- A program's path: as given when it has a slash, else found in PATH.
local function find_program(name)
  if name:find("/", 1, true) then return core.path_type(name) == "file" and name or nil end
  for dir in (os.getenv("PATH") or "/usr/local/bin:/usr/bin:/bin"):gmatch("[^:]+") do
    local p = dir .. "/" .. name
    if core.path_type(p) == "file" then return p end
  end
  for _, dir in ipairs { "/usr/sbin", "/usr/bin", "/sbin", "/bin" } do
    local p = dir .. "/" .. name
    if core.path_type(p) == "file" then return p end
  end
end

-- mkdir -p, each new directory with mode.
local function make_dirs(path, mode)
  local cur = ""
  for part in path:gmatch("[^/]+") do
    cur = cur .. "/" .. part
    if not exists(cur) then
      local ok, err, code = S.mkdir(cur, mode)
      if not ok and code ~= "EEXIST" then return nil, err, code end
    end
  end
  return true
end


-- Linux's RLIMIT_* numbers (the same on x86_64 and aarch64), by the names
-- Docker's ulimits use.
local RLIMITS = {
  cpu = 0, fsize = 1, data = 2, stack = 3, core = 4, rss = 5, nproc = 6, nofile = 7, memlock = 8,
  as = 9, locks = 10, sigpending = 11, msgqueue = 12, nice = 13, rtprio = 14, rttime = 15,
}
M.RLIMITS = RLIMITS

-- The host's facts, found once per process ---------------------------------------------

local facts

-- The subordinate id range /etc/subuid (or subgid) grants this user: start, count.
local function subids(file, name, id)
  local text = read_file(file) or ""
  for line in text:gmatch("[^\n]+") do
    local who, start, count = line:match("^([^:]+):(%d+):(%d+)")
    if who and (who == name or who == tostring(id)) then return tonumber(start), tonumber(count) end
  end
end

-- How this process maps ids into a box: "range" as root, "subid" (a
-- user with an /etc/subuid range and newuidmap), "single" otherwise.
local function id_mapping(pol)
  local uid, gid, name = S.ids()
  local lp = lpol(pol)
  if uid == 0 then return { kind = "range", uid = 0, gid = 0, count = lp.ids } end
  local us, uc = subids("/etc/subuid", name, uid)
  local gs, gc = subids("/etc/subgid", name, uid)
  local nu, ng = find_program(lp.newuidmap), find_program(lp.newgidmap)
  if us and gs and nu and ng and uc > 0 and gc > 0 then
    return { kind = "subid", uid = uid, gid = gid, sub_uid = us, sub_gid = gs,
      count = math.min(lp.ids, uc + 1, gc + 1), newuidmap = nu, newgidmap = ng }
  end
  local why = not us and "/etc/subuid grants " .. tostring(name or uid) .. " no range"
    or not gs and "/etc/subgid grants " .. tostring(name or uid) .. " no range"
    or "newuidmap/newgidmap (Debian's uidmap) are not installed"
  return { kind = "single", uid = uid, gid = gid, count = 1, why = why }
end

-- Mount points of cgroup hierarchies: { v1 = { controller = dir }, v2 = dir }.
local function cgroup_mounts()
  local out = { v1 = {} }
  for line in (read_file("/proc/self/mountinfo") or ""):gmatch("[^\n]+") do
    local mnt, fstype, opts = line:match("^%S+ %S+ %S+ %S+ (%S+) .- %- (%S+) %S+ (%S+)")
    if fstype == "cgroup2" and not out.v2 then
      out.v2 = mnt
    elseif fstype == "cgroup" then
      for o in opts:gmatch("[^,]+") do
        if o == "memory" or o == "pids" or o == "cpu" or o == "cpuacct" then out.v1[o] = out.v1[o] or mnt end
      end
    end
  end
  return out
end

-- This process's cgroup paths: { [controller] = path, [""] = v2 path }.
local function own_cgroups()
  local out = {}
  for line in (read_file("/proc/self/cgroup") or ""):gmatch("[^\n]+") do
    local ctrls, path = line:match("^%d+:([^:]*):(.*)$")
    if ctrls == "" then out[""] = path end
    for c in (ctrls or ""):gmatch("[^,]+") do out[c] = path end
  end
  return out
end

-- May sbx make groups in dir? (a probe group, made and removed)
local function writable(dir)
  local probe = dir .. "/sbx-probe-" .. core.pid()
  if not S.mkdir(probe, tonumber("755", 8)) then return false end
  S.rmdir(probe)
  return true
end

local function has_words(text, words)
  local set = {}
  for w in (text or ""):gmatch("%S+") do set[w] = true end
  for _, w in ipairs(words) do if not set[w] then return false end end
  return true
end

-- Where box cgroups go, per controller: { version, memory = dir, pids =
-- dir, cpu = dir (the parents of box groups), note }.
local function detect_cgroups(pol)
  local lp = lpol(pol)
  local none = { version = nil }
  if not lp.cgroups then none.why = "policy.local.cgroups is false" return none end
  local mounts, own = cgroup_mounts(), own_cgroups()
  -- v2: an explicit delegated root, or sbx's own group, with the
  -- controllers enabled for its children.
  local v2root = lp.cgroup_root or (mounts.v2 and own[""] and (mounts.v2 .. (own[""] == "/" and "" or own[""])))
  if v2root then
    local ctl = read_file(v2root .. "/cgroup.subtree_control")
    if has_words(ctl, { "memory", "pids" }) and writable(v2root) then
      local c = { version = 2, memory = v2root, pids = v2root }
      if has_words(ctl, { "cpu" }) then c.cpu = v2root end
      return c
    end
  end
  -- v1: each controller's hierarchy, under sbx's own group there.
  local c = { version = 1 }
  -- cpuacct: the box's CPU time, for the budgets (its own hierarchy, or
  -- the cpu one's where they share it).
  for _, ctrl in ipairs { "memory", "pids", "cpu", "cpuacct" } do
    local mnt, path = mounts.v1[ctrl], own[ctrl]
    if mnt and path then
      local dir = mnt .. (path == "/" and "" or path)
      if writable(dir) then c[ctrl] = dir end
    end
  end
  if c.memory or c.pids or c.cpu then return c end
  none.why = mounts.v2 and not next(mounts.v1) and
    "no delegated cgroup v2 directory with the memory and pids controllers (policy.local.cgroup_root)"
    or "sbx may not make cgroups here (no delegated cgroup v2 directory, and the v1 hierarchies are not writable)"
  return none
end

local q = require("sbx.util").shell_quote

-- What the kernel lets a box have here, asked once of bubblewrap itself
-- (as the box will ask): { userns = true | why, proc = true | why }.
-- Inside a container, Docker's default seccomp profile refuses user
-- namespaces, and a masked /proc (its default too) makes the kernel refuse
-- a new proc mount in one (fs/namespace.c, mount_too_revealing).
local function probe(bwrap)
  local function try(args)
    local p = io.popen(q(bwrap) .. " --unshare-user --ro-bind / / " .. args .. " true 2>&1")
    if not p then return "cannot run bubblewrap" end
    local out = p:read("a") or ""
    local ok = p:close()
    return ok and true or (out:gsub("%s+$", ""):gsub("^bwrap: ", ""))
  end
  local userns = try("")
  if userns ~= true then return { userns = userns, proc = userns } end
  return { userns = true, proc = try("--unshare-pid --proc /proc") }
end

local function get_facts(pol)
  if not facts then
    facts = { ids = id_mapping(pol), cgroups = detect_cgroups(pol), bwrap = find_program(lpol(pol).bwrap) }
    facts.probe = facts.bwrap and probe(facts.bwrap) or { userns = "bubblewrap is not installed", proc = "" }
  end
  return facts
end

-- The box's /proc: "mount" | "copy" | nil, message (refused).
local function proc_mode(pol)
  local f, lp = get_facts(pol), lpol(pol)
  if f.probe.userns ~= true then return nil, string.format(lp.messages.userns_blocked, f.probe.userns) end
  if lp.proc == "copy" then return "copy" end
  if f.probe.proc == true then return "mount" end
  if lp.proc == "auto" then return "copy" end
  return nil, lp.messages.proc_masked .. " (" .. f.probe.proc .. ")"
end

-- full(pol): may this backend isolate a box fully here (user namespaces,
-- a /proc of its own, cgroups for memory, pids and cpu)? true | false, why.
function M.full(pol)
  local f = get_facts(pol)
  local mode, why = proc_mode(pol)
  if mode ~= "mount" then return false, why or "the box's /proc would be copies (policy.local.proc)" end
  if not (f.cgroups.memory and f.cgroups.pids and f.cgroups.cpu) then
    return false, "no cgroups for the memory, pids and cpu limits (" .. tostring(f.cgroups.why) .. ")"
  end
  return true
end

-- Where disk layers go (policy.local.disk_dir or its default).
local function disk_root_path(pol)
  local dir = lpol(pol).disk_dir
  if dir then return dir end
  local uid = S.ids()
  if uid == 0 then return "/var/lib/sbx/local" end
  local base = os.getenv("XDG_CACHE_HOME")
  if not base or base:sub(1, 1) ~= "/" then
    local home = os.getenv("HOME")
    base = home and home:sub(1, 1) == "/" and (home .. "/.cache") or ("/var/tmp/sbx-" .. uid)
  end
  return base .. "/sbx/local"
end

-- The type of the file system that holds path: the longest mount point in
-- /proc/self/mountinfo that is path or above it.
local function fs_type(path)
  local best, fstype = -1, nil
  for line in (read_file("/proc/self/mountinfo") or ""):gmatch("[^\n]+") do
    local mnt, ft = line:match("^%S+ %S+ %S+ %S+ (%S+) .- %- (%S+) ")
    if mnt then
      mnt = mnt:gsub("\\(%d%d%d)", function(o) return string.char(tonumber(o, 8)) end)
      local under = mnt == "/" or path == mnt or path:sub(1, #mnt + 1) == mnt .. "/"
      if under and #mnt >= best then best, fstype = #mnt, ft end
    end
  end
  return fstype
end

-- Can the disk root hold an overlay's upper directory? (Not on overlayfs
-- itself, as a container's root is.) true | false, why; asked once per dir.
local disk_checked = {}
local function disk_usable(pol)
  local dir = disk_root_path(pol)
  if disk_checked[dir] == nil then
    local ft = fs_type(dir)
    disk_checked[dir] = ft ~= "overlay" or string.format("%s is on overlayfs (a container's root?), which cannot " ..
      "hold an overlay's upper directory; policy.local.disk_dir can name a directory on another file system", dir)
  end
  return disk_checked[dir] == true, disk_checked[dir]
end

-- Is the box's writable layer on disk (policy.local.layer)? src: { host }.
-- false, why: a tmpfs although no memory cgroup counts it.
local function disk_layer(pol, src)
  local lp = lpol(pol)
  if src.host or lp.layer == "tmpfs" then return false end
  if lp.layer == "disk" then return true end
  -- auto: on disk where no memory cgroup would count the tmpfs's pages
  if get_facts(pol).cgroups.memory then return false end
  return disk_usable(pol)
end

M.disk_layer = disk_layer
M.disk_root_path = disk_root_path
M.exists = exists
M.get_facts = get_facts
M.make_dirs = make_dirs
M.proc_mode = proc_mode

return M

-- The local backend: boxes without a daemon. A box is a set of Linux
-- namespaces (user, pid, mount, network, ipc, uts, cgroup) around a root
-- filesystem made from an image, with sbx-agent as its first process (PID
-- 1), whose stdin and stdout are the box's agent channel: pipes that only
-- the agent holds. Commands, files and sessions go through the agent
-- transport; there is no exec transport (transport = "exec" is
-- "unsupported").
--
-- The launch, one process chain started on sbx's loop (core.proc.spawn):
--   sbx-launch (src/sbx_launch.c, static, carried in libsbx; its protocol
--       is written there), started ahead as a spare (policy.local.spares):
--       it joins the box's cgroups while nobody waits and says "r". At
--       create sbx writes the cgroup limits and the owner record and sends
--       the box's options and seccomp program over the launcher's socket;
--       it dies with sbx from then on (PR_SET_PDEATHSIG), makes the box's
--       user and mount namespaces and says "u"; sbx writes the id map (as
--       root: 65536 ids, 0..65535 -> the same host ids; a user: newuidmap
--       with the /etc/subuid range, or the launcher's own single id) and
--       says "g". It binds the host's device nodes that bubblewrap's --dev
--       takes onto themselves read-only (box root may be host root), mounts
--       the box's writable layer (a tmpfs of policy.box.disk bytes on the
--       box's directory, or a directory on disk: policy.local.layer, "Disk
--       layers" below) and an overlay (userxattr) of the image's layers
--       under it, sets the rlimits, closes what it must not pass on, says
--       "x" and execs
--   bubblewrap (Debian's, not setuid)
--       as uid 0 of that user namespace: the other namespaces, the overlay
--       as /, /proc (its /sys read-only), /dev, the agent read-only at
--       /dev/sbx-agent, capabilities (policy.local.capabilities - cap_drop
--       + cap_add), no_new_privs, the seccomp filter (fd 4, built by
--       libseccomp from policy.local.seccomp), --die-with-parent, and
--       --as-pid-1, so it execs
--   sbx-agent, PID 1 of the box: it reaps every orphan, and when it goes
--       the kernel ends every process of the box's PID namespace.
-- bubblewrap 0.8 could not do the launcher's part: it maps one id unless
-- it is setuid, and it has no overlay and no size for a writable layer.
--
-- The box dies with its owner: sbx's death kills the launcher (now
-- bubblewrap), whose death kills the agent, whose death ends the box.
-- Nothing of a box is mounted in the host's namespace; what the host keeps
-- (the box's directory under the state directory with its owner record,
-- its cgroup directories) is removed by close() and, after a kill -9, by
-- `sbx reap --backend local`.
--
-- A lost agent is a lost box: the agent was the box's init, and its files
-- lived in its own mount namespace. The next command says "box_gone".
-- restart() starts the box afresh from its image (files written since are
-- gone); the agent kills a command's tree without forking, so a full pids
-- limit does not need it.
local core = require "sbx.core"
local owner = require "sbx.owner"
local read_file = require("sbx.fs").read
local S = core.sandbox

local M = {}
local disk_root_path   -- below

local sbx_config = require "sbx.config"
local function lpol(pol) return (pol or sbx_config.policy)["local"] end

-- Box options only this backend takes.
function M.options(check)
  -- The image as layer directories (top first) instead of image = ...:
  -- for sbx.images, which unpacks OCI layers (trusted code only).
  return { layers = check.maybe(check.list(check.str())) }
end

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
disk_root_path = function(pol)
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

-- Isolation ---------------------------------------------------------------------------

local function cap_name(c) return (tostring(c):upper():gsub("^CAP_", "")) end

-- The capabilities root in the box holds: the policy's set - cap_drop + cap_add.
local function capabilities(spec, pol)
  local set, order = {}, {}
  local function add(c) c = cap_name(c) if not set[c] then set[c] = true order[#order + 1] = c end end
  for _, c in ipairs(lpol(pol).capabilities) do add(c) end
  for _, c in ipairs(spec.cap_drop or {}) do
    c = cap_name(c)
    if c == "ALL" then set = {} else set[c] = nil end
  end
  for _, c in ipairs(spec.cap_add or {}) do add(c) end
  local out = {}
  for _, c in ipairs(order) do if set[c] then out[#out + 1] = c end end
  return out
end

-- A size with an optional k, m or g suffix (as Docker's tmpfs options), or nil.
local function parse_size(v)
  local n, unit = tostring(v):lower():match("^(%d+)([kmg]?)b?$")
  if not n then return nil end
  return math.tointeger(tonumber(n) * ({ [""] = 1, k = 1024, m = 1024 ^ 2, g = 1024 ^ 3 })[unit])
end

-- A tmpfs option string ("rw,size=64m,mode=1777") as { size, mode, ro } or nil, why.
local function parse_tmpfs(opts)
  local out = {}
  for o in tostring(opts):gmatch("[^,]+") do
    local k, v = o:match("^([%w_]+)=?(.*)$")
    if k == "size" then
      out.size = parse_size(v)
      if not out.size then return nil, "size " .. v .. " is not bytes (k, m, g suffixes)" end
    elseif k == "mode" then
      out.mode = v:match("^[0-7]+$") and v
      if not out.mode then return nil, "mode " .. v .. " is not octal" end
    elseif k == "ro" then out.ro = true
    elseif k ~= "rw" and k ~= "nosuid" and k ~= "nodev" then
      return nil, "bubblewrap's tmpfs takes size, mode, rw and ro (always nosuid, nodev), not " .. o
    end
  end
  return out
end

-- limits(spec, pol): what this backend enforces for spec, and how (sbx.limits).
function M.limits(spec, pol)
  local f = get_facts(pol)
  local cg = f.cgroups
  local out = {}
  local cgnote = cg.version and string.format("cgroup v%d", cg.version)
  if cg.memory then
    out.memory = { enforced = "cgroup", note = cgnote .. (cg.version == 2 and " memory.max, memory.swap.max = 0"
      or " memory.limit_in_bytes (and memsw where swap is counted); the OOM killer ends the box's largest process") }
  else
    out.memory = { enforced = "rlimit", note = "RLIMIT_DATA on every process of the box: each process's private " ..
      "writable memory, not the box's total (" .. tostring(cg.why) .. ")" }
  end
  if cg.pids then
    out.pids = { enforced = "cgroup", note = cgnote .. " pids.max" }
  else
    out.pids = { enforced = "rlimit", note = "RLIMIT_NPROC, counted per user in the box's own user namespace: the box's " ..
      "processes of one user at most (" .. tostring(cg.why) .. ")" }
  end
  if cg.cpu then
    out.cpus = { enforced = "cgroup", note = cgnote .. (cg.version == 2 and " cpu.max" or " cpu.cfs_quota_us") }
  else
    out.cpus = { enforced = false, note = "no cgroup with the cpu controller that sbx may write; no rlimit caps a rate " ..
      "(" .. tostring(cg.why or "cpu controller missing") .. ")" }
  end
  local on_disk, why_not = disk_layer(pol, { host = spec.image == "host" })
  if on_disk then
    out.disk = { enforced = "watched", note = string.format("the box's writable layer is a directory on the host's " ..
      "disk; sbx measures it every %g s (policy.local.disk_poll) and stops the box past the limit " ..
      "(disk_exceeded); a fast writer gets further before that", lpol(pol).disk_poll) }
  else
    out.disk = { enforced = "kernel", note = "the box's writable layer is a tmpfs of this size (its pages are host memory" ..
      (cg.memory and ", counted against the box's memory limit)" or "; no memory cgroup counts them" ..
      (why_not and (": not on disk because " .. why_not) or "") .. ")") }
  end
  -- disk = false asks nothing: the tmpfs then has the kernel's default
  -- size, half the host's memory.
  if spec.network == "none" then
    out.network = { enforced = "kernel", note = "a network namespace of its own, only loopback" }
  elseif spec.network == "host" then
    out.network = { enforced = "kernel", note = "the host's network namespace, shared" }
  else
    out.network = { enforced = false, note = string.format("the local backend offers network \"none\" and \"host\", not %q",
      tostring(spec.network)) }
  end
  out.read_only = { enforced = "kernel", note = "the root is remounted read-only (bubblewrap --remount-ro)" }
  out.cap_drop = { enforced = "kernel", note = "the capability sets of the box's processes; capabilities count in the " ..
    "box's user namespace only" }
  out.cap_add = { enforced = "kernel", note = "added to policy.local.capabilities, in the box's user namespace only" }
  out.no_new_privileges = { enforced = "kernel", note = "bubblewrap always sets no_new_privs" }
  out.init = { enforced = "kernel", note = "sbx-agent is PID 1 of the box's PID namespace and reaps every orphan" }
  out.ulimits = { enforced = "rlimit", note = "set by sbx-launch before bubblewrap" }
  -- A limit above sbx's own hard limit cannot be set without
  -- CAP_SYS_RESOURCE in the host's user namespace (even root may lack it).
  for name, v in pairs(spec.ulimits or {}) do
    local res, hard = RLIMITS[name], nil
    if res then hard = select(2, S.rlimit(res)) end
    if not res then
      out.ulimits = { enforced = false, note = "no rlimit is named " .. tostring(name) }
    elseif hard and v > hard then
      out.ulimits = { enforced = false, note = string.format("%s = %d is above sbx's own hard limit (%s)", name, v,
        tostring(hard)) }
    end
  end
  local bad
  for path, o in pairs(spec.tmpfs or {}) do
    local _, why = parse_tmpfs(o)
    if why then bad = path .. ": " .. why end
  end
  out.tmpfs = bad and { enforced = false, note = bad }
    or { enforced = "kernel", note = "bubblewrap's tmpfs mounts (their pages count against memory)" }
  return out
end

-- Images -------------------------------------------------------------------------------

local function overlay_safe(dir)
  return dir:sub(1, 1) == "/" and not dir:find("[:,\\%s]")
end

-- The image's root: { host = true } or { lowers = { dir, ... } (top first),
-- config = { env, user, workdir } } | nil, message, code.
-- image = "rootfs:DIR" (a plain directory), "host", or the layers box option;
-- any other reference goes to sbx.images (OCI pulls, the cache shared with
-- other processes, unpacking: images.resolve(ref, { policy, hold }) ->
-- { layers = { dirs, lowest first }, rootfs = dir, host = bool, config =
-- { Env, User, WorkingDir }, lease }); the lease keeps the image from
-- `sbx images rm` and prune while the box lives (closed at destroy).
local function image_source(spec, pol)
  local image = spec.image
  local lowers, config, lease
  if spec.layers and #spec.layers > 0 then
    lowers, config = spec.layers, {}
  elseif image == "host" then
    return { host = true, config = {} }
  elseif type(image) == "string" and image:match("^rootfs:") then
    lowers, config = { image:sub(8) }, {}
  else
    -- The box's own pull (policy.box.pull merged with its options): with
    -- "never" no registry is asked, whatever the cache lacks.
    local img, err, code = require("sbx.images").resolve(image, { policy = pol, hold = true, pull = spec.pull })
    -- One code for every way an image can be missing (as the Docker
    -- backend does); the cause stays in the message.
    if not img then
      return nil, string.format("image '%s' is not available: %s (%s)", tostring(image),
        tostring(err), tostring(code or "error")), "image_unavailable"
    end
    local c = type(img.config) == "table" and img.config or {}
    -- Imports check these (sbx.images.validate); a record written before
    -- they did is refused here rather than at the box's first command.
    for _, k in ipairs { "User", "WorkingDir" } do
      if c[k] ~= nil and type(c[k]) ~= "string" then
        if img.lease then img.lease:close() end
        return nil, string.format("image '%s' is not usable: its config's %s is a %s, not a string (sbx images rm it and import it again)",
          tostring(image), k, type(c[k])), "image_unavailable"
      end
    end
    config = { env = c.Env, user = c.User, workdir = c.WorkingDir }
    if img.host then
      if img.lease then img.lease:close() end
      return { host = true, config = config }
    end
    if img.layers then
      -- overlayfs wants the top layer first.
      lowers = {}
      for i = #img.layers, 1, -1 do lowers[#lowers + 1] = img.layers[i] end
    else
      lowers = { img.rootfs }
    end
    lease = img.lease
  end
  for _, dir in ipairs(lowers) do
    if not overlay_safe(dir) then
      return nil, string.format("image directory %q must be an absolute path without ':', ',', '\\' or spaces " ..
        "(an overlay lowerdir)", dir), "image_unavailable"
    end
    if core.path_type(dir) ~= "dir" then
      return nil, string.format("image directory %s does not exist", dir), "image_unavailable"
    end
  end
  return { lowers = lowers, config = config, lease = lease }
end

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

-- cgroups ------------------------------------------------------------------------------

-- Makes the box's groups (one per hierarchy that has a controller sbx
-- uses): the list of directories made, and parent -> directory | nil,
-- message, code (what was made is removed).
local function make_cgroups(cg, id)
  local made, dirs = {}, {}
  for _, ctrl in ipairs { "memory", "pids", "cpu", "cpuacct" } do
    local parent = cg[ctrl]
    if parent and not dirs[parent] then
      local dir = parent .. "/sbx-" .. id
      local ok, err, code = S.mkdir(dir, tonumber("755", 8))
      if not ok then
        for k = #made, 1, -1 do S.rmdir(made[k]) end
        return nil, "cannot make the box's cgroup: " .. tostring(err), code or "cgroup"
      end
      made[#made + 1] = dir
      dirs[parent] = dir
    end
  end
  return made, dirs
end

-- Writes spec's limits into the box's groups: true | nil, message, code.
local function write_limits(cg, dirs, spec)
  local function put(ctrl, file, value)
    local ok, err, code = S.write(dirs[cg[ctrl]] .. "/" .. file, value)
    if not ok then return nil, "cannot set the box's cgroup limit: " .. tostring(err), code or "cgroup" end
    return true
  end
  local ok, err, code = true, nil, nil
  local cpu = spec.cpus and string.format("%d", math.max(1000, math.floor(spec.cpus * 100000)))
  if cg.version == 2 then
    if spec.memory and cg.memory then
      ok, err, code = put("memory", "memory.max", string.format("%d", spec.memory))
      if ok then put("memory", "memory.swap.max", "0") end
    end
    if ok and spec.pids and cg.pids then ok, err, code = put("pids", "pids.max", tostring(spec.pids)) end
    if ok and cpu and cg.cpu then ok, err, code = put("cpu", "cpu.max", cpu .. " 100000") end
  else
    if spec.memory and cg.memory then
      ok, err, code = put("memory", "memory.limit_in_bytes", string.format("%d", spec.memory))
      -- No swap, where swap is counted.
      if ok and exists(dirs[cg.memory] .. "/memory.memsw.limit_in_bytes") then
        put("memory", "memory.memsw.limit_in_bytes", string.format("%d", spec.memory))
      end
    end
    if ok and spec.pids and cg.pids then ok, err, code = put("pids", "pids.max", tostring(spec.pids)) end
    if ok and cpu and cg.cpu then
      ok, err, code = put("cpu", "cpu.cfs_period_us", "100000")
      if ok then ok, err, code = put("cpu", "cpu.cfs_quota_us", cpu) end
    end
  end
  return ok, err, code
end

-- Removes the groups, retrying every millisecond while the kernel still
-- tears the box's processes down (the agent dies a moment after
-- bubblewrap); what is still in them after 20 ms (a reaped box's) is
-- killed. Until deadline: true | nil, message, code.
local function remove_cgroups(dirs, deadline)
  local left = {}
  for _, d in ipairs(dirs) do left[#left + 1] = d end
  local killed = false
  local kill_at = core.now() + 0.02
  while true do
    local still = {}
    for _, d in ipairs(left) do
      local ok, err, code = S.rmdir(d)
      if not ok and code ~= "ENOENT" then still[#still + 1] = d; left.err = err; left.code = code end
    end
    if #still == 0 then return true end
    left = still
    if (not killed and core.now() >= kill_at) or core.now() > (deadline - 0.5) then
      for _, d in ipairs(left) do
        for pid in (read_file(d .. "/cgroup.procs") or ""):gmatch("%d+") do
          pcall(core.proc.signal, math.tointeger(tonumber(pid)), "KILL")
        end
      end
      killed = true
    end
    if core.now() >= deadline then
      return nil, "the box's cgroups are still in use: " .. tostring(left.err), left.code or "EBUSY"
    end
    core.sleep(0.001)
  end
end

-- oom_killed(handle) -> killed, memory_limit: the box's OOM-kill count went
-- up since sbx last looked.
function M.oom_killed(h)
  local dir = h.memory_dir
  if not dir then return false end
  local text = read_file(dir .. (h.cgv == 2 and "/memory.events" or "/memory.oom_control")) or ""
  local n = tonumber(text:match("oom_kill (%d+)")) or 0
  local seen = h.oom_kills or 0
  h.oom_kills = n
  if n > seen then return true, h.memory_limit end
  return false
end

-- cpu_seconds(handle) -> seconds | nil: the CPU time of every process of
-- the box (its cpu cgroup: v2 cpu.stat usage_usec, v1 cpuacct.usage where
-- cpuacct shares the cpu hierarchy), for the budgets.
function M.cpu_seconds(h)
  local dir = h.cpu_dir
  if not dir then return nil end
  if h.cgv == 2 then
    local us = tonumber(((read_file(dir .. "/cpu.stat") or ""):match("usage_usec (%d+)")))
    return us and us / 1e6
  end
  local ns = tonumber(((read_file(dir .. "/cpuacct.usage") or ""):match("%d+")))
  return ns and ns / 1e9
end

-- oom_check(handle, job): the agent transport asks after a command ended
-- with SIGKILL's status.
function M.oom_check(h, job)
  job.oom_killed, job.memory_limit = M.oom_killed(h)
end

-- Lifetimes: one task for every box of the process, which destroys a box
-- past its lifetime (Docker's boxes stop their sleep; these have none).
local lifetimes = setmetatable({}, { __mode = "k" })   -- handle -> deadline
local lifetime_wake, lifetime_task

local function lifetime_watch()
  while next(lifetimes) do
    local now, nearest = core.now(), math.huge
    for h, t in pairs(lifetimes) do
      if h.destroyed then lifetimes[h] = nil
      elseif t <= now then
        lifetimes[h] = nil
        h.gone_reason = string.format("the box reached its lifetime (%g s) and was removed", h.spec.lifetime)
        M.destroy(h, true)
      else nearest = math.min(nearest, t - now) end
    end
    if next(lifetimes) then lifetime_wake:clear(); lifetime_wake:wait(math.min(nearest, 3600)) end
  end
  lifetime_task = nil
end

local function watch_lifetime(h, seconds)
  lifetimes[h] = core.now() + seconds
  lifetime_wake = lifetime_wake or core.event()
  if not lifetime_task then
    lifetime_task = core.spawn(lifetime_watch)
    lifetime_task:unref()
  else
    lifetime_wake:set()
  end
end

-- Launch --------------------------------------------------------------------------------

local seccomp_cache = {}
local function seccomp_program(pol)
  local sc = lpol(pol).seccomp
  if not sc then return nil end
  local key = table.concat(sc.deny or {}, ",") .. "|" .. table.concat(sc.enosys or {}, ",") .. "|" ..
    tostring(sc.deny_namespaces)
  if not seccomp_cache[key] then
    local bpf, err, code = S.seccomp { deny = sc.deny, enosys = sc.enosys, deny_namespaces = sc.deny_namespaces }
    if not bpf then return nil, err, code end
    seccomp_cache[key] = bpf
  end
  return seccomp_cache[key]
end

local AGENT_PATH = "/dev/sbx-agent"
-- The host's device nodes bubblewrap's --dev binds into every box
-- (bubblewrap.c, devnodes[]). As root, box root is host root to them: a
-- chmod, chown or touch in the box would change the host's own inode.
-- sbx-launch binds each onto itself read-only first (--ro-dev), so the box
-- gets them read-only (EROFS for any change of mode, owner or times) and
-- still reads and writes the devices.
local HOST_DEVICES = { "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty" }
-- Where policy.local.busybox appears in a box (grade.lua runs it).
M.BUSYBOX_PATH = "/dev/busybox-sbx"   -- busybox runs as busybox for argv[0] busybox*

-- The box's options for the launcher, and bubblewrap's command line after
-- "--" (sent over the launcher's socket).
local function launch_argv(h, spec, pol, src, bwrap, has_seccomp)
  local lp = lpol(pol)
  local rw = h.dir .. "/rw"
  local f = get_facts(pol)
  local a = {}
  local function add(...) for _, v in ipairs { ... } do a[#a + 1] = v end end
  if f.ids.kind == "single" then add("--map-self") end
  local copy = h.proc_mode == "copy"
  if copy then add("--keep-proc") end
  -- The writable layer: on disk (h.disk, bounded by the watcher), the
  -- tmpfs then only holds the root's mount point; or the tmpfs itself.
  add("--tmpfs", rw, h.disk and "1048576" or string.format("%d", spec.disk or 0))
  for _, d in ipairs(HOST_DEVICES) do add("--ro-dev", d) end
  local workdir = spec.workdir or src.config.workdir
  if src.host then
    add("--mkdir", rw .. "/root")
    if workdir then add("--mkdir", rw .. "/workdir") end
    for i, m in ipairs(lp.host_masks) do
      local st = S.stat(m)
      if st and st.type == "dir" then add("--mkdir", rw .. "/mask" .. i) end
    end
  else
    local top = h.disk or rw
    add("--overlay", table.concat(src.lowers, ":"), top .. "/upper", top .. "/work", rw .. "/root")
  end
  local cg = f.cgroups
  if spec.memory and not cg.memory then add("--rlimit", tostring(RLIMITS.data), string.format("%d", spec.memory), string.format("%d", spec.memory)) end
  if spec.pids and not cg.pids then add("--rlimit", tostring(RLIMITS.nproc), tostring(spec.pids), tostring(spec.pids)) end
  local names = {}
  for name in pairs(spec.ulimits or {}) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local v = string.format("%d", spec.ulimits[name])
    add("--rlimit", tostring(RLIMITS[name]), v, v)
  end
  add("--", bwrap)
  -- bubblewrap: namespaces (not --unshare-all, which would nest a user
  -- namespace of one id in the box's), the root, /proc, /dev, the agent.
  add("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup")
  if spec.network ~= "host" then add("--unshare-net") end
  add("--die-with-parent", "--as-pid-1", "--new-session", "--hostname", h.id:sub(1, 12))
  add("--bind", rw .. "/root", "/")
  if src.host then
    -- The host's top-level entries read-only over the box's own root.
    local masked = {}
    for _, m in ipairs(lp.host_masks) do masked[m] = true end
    local entries = S.list("/") or {}
    table.sort(entries)
    for _, e in ipairs(entries) do
      local p = "/" .. e
      local st = S.stat(p)
      if p == "/proc" or p == "/dev" or p == "/sys" or masked[p] or not st then
        -- left out: made below, or masked
      elseif st.type == "link" then
        add("--symlink", st.target, p)
      elseif st.type == "dir" or st.type == "file" then
        add("--ro-bind", p, p)
      end
    end
    for i, m in ipairs(lp.host_masks) do
      local st = S.stat(m)
      if st and st.type == "dir" then add("--bind", rw .. "/mask" .. i, m) end
    end
    -- The workdir is the box's own, whatever the host has there.
    if workdir then add("--bind", rw .. "/workdir", workdir) end
  end
  if copy then
    add("--ro-bind", h.dir .. "/proc", "/proc", "--dev", "/dev")
  else
    add("--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev")
  end
  add("--ro-bind", h.progs.agent, AGENT_PATH)
  -- sbx's own shell for checks in the run's box (policy.local.busybox).
  if lp.busybox and S.stat(lp.busybox) then add("--ro-bind", lp.busybox, M.BUSYBOX_PATH) end
  local paths = {}
  for p in pairs(spec.tmpfs or {}) do paths[#paths + 1] = p end
  table.sort(paths)
  local ro_tmpfs = {}
  for _, p in ipairs(paths) do
    local t = parse_tmpfs(spec.tmpfs[p])
    if t.size then add("--size", tostring(t.size)) end
    if t.mode then add("--perms", t.mode) end
    add("--tmpfs", p)
    if t.ro then ro_tmpfs[#ro_tmpfs + 1] = p end
  end
  if workdir and not src.host then add("--dir", workdir) end
  if spec.read_only then add("--remount-ro", "/") end
  for _, p in ipairs(ro_tmpfs) do add("--remount-ro", p) end
  add("--cap-drop", "ALL")
  for _, c in ipairs(capabilities(spec, pol)) do add("--cap-add", "CAP_" .. c) end
  if has_seccomp then add("--seccomp", "4") end   -- sbx-launch puts the program there
  add("--chdir", workdir or "/", "--clearenv", "--setenv", "PATH", lp.path)
  add("--", AGENT_PATH)
  if copy then add("--proc-fd", "5") end   -- sbx-launch's --keep-proc
  return a
end

-- The environment every command gets unless it sets the name: PATH, the
-- image's, the box's (later ones win).
local function box_env(spec, pol, src)
  local map, order = {}, {}
  local function put(k, v)
    if map[k] == nil then order[#order + 1] = k end
    map[k] = v
  end
  put("PATH", lpol(pol).path)
  for _, e in ipairs(src.config.env or {}) do
    local k, v = tostring(e):match("^([^=]+)=(.*)$")
    if k then put(k, v) end
  end
  for k, v in pairs(spec.env or {}) do put(k, tostring(v)) end
  local list = {}
  for _, k in ipairs(order) do list[#list + 1] = k .. "=" .. map[k] end
  return list
end

-- Writes the id maps of the launcher (pid) from outside: true | nil, message, code.
local function write_maps(ids, pid, deadline)
  if ids.kind == "range" then
    local map = string.format("0 0 %d\n", ids.count)
    local ok, err, code = S.write("/proc/" .. pid .. "/uid_map", map)
    if ok then ok, err, code = S.write("/proc/" .. pid .. "/gid_map", map) end
    return ok, err, code
  elseif ids.kind == "subid" then
    for _, which in ipairs { { ids.newuidmap, ids.uid, ids.sub_uid }, { ids.newgidmap, ids.gid, ids.sub_gid } } do
      local p, s = core.proc.spawn { argv = { which[1], tostring(pid), "0", tostring(which[2]), "1", "1",
        tostring(which[3]), tostring(ids.count - 1) }, env = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin" },
        capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 1024, tail = 0 }, output = { head = 0, tail = 0 } } }
      if not p then return nil, s, "idmap" end
      local info = p:wait(math.max(0.001, deadline - core.now()))
      if not info then p:close() return nil, which[1] .. " did not finish in time", "idmap" end
      s:wait(1)
      if info.status ~= 0 then
        return nil, string.format("%s failed (exit %s): %s", which[1], tostring(info.status),
          (s:captured("stderr") or ""):gsub("%s+$", "")), "idmap"
      end
    end
  end
  return true
end

local function remove_dir(dir)
  for _, name in ipairs(S.list(dir .. "/proc") or {}) do S.unlink(dir .. "/proc/" .. name) end
  S.rmdir(dir .. "/proc")
  S.rmdir(dir .. "/rw")
  S.unlink(dir .. "/owner")
  return S.rmdir(dir)
end

local function stderr_of(h)
  local said = h.chan and h.chan:captured("stderr") or ""
  said = said:gsub("%s+$", "")
  return said ~= "" and said or nil
end

-- The record, written again with what is known now.
local function write_record(h, spec)
  local rec, err = io.open(h.dir .. "/owner", "w")
  if not rec then return nil, "cannot write the box's record: " .. tostring(err), "state_dir" end
  rec:write(record_text(h, spec))
  rec:close()
  return true
end

-- Disk layers ---------------------------------------------------------------------------
-- policy.local.layer: a box's writable layer (the overlay's upper and work
-- directories) on the host's disk, under disk_root()/boxes/<id>, instead of
-- a tmpfs. Its files belong to the ids of the box (a user's subordinate
-- ids among them), so sbx measures and removes it from inside a user
-- namespace: sbx-launch --usage enters the box's own; sbx-launch --remove
-- makes one with the box's id map.

local LAUNCH_ENV = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin" }

-- Removes a disk layer (after its box's processes are gone): true | nil,
-- message, code.
local function remove_disk(dir, progs, pol, deadline)
  if not dir or not exists(dir) then return true end
  local f = get_facts(pol)
  local p, chan, sync = core.proc.spawn {
    argv = { progs.launch, tostring(core.pid()) }, env = LAUNCH_ENV,
    stdin = true, stdout = true, stderr = true, sync = true,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } },
  }
  if not p then return nil, "cannot remove the box's disk layer: " .. tostring(chan), sync or "launch_failed" end
  local function step(want)
    local ev = sync:wait(math.max(0.001, deadline - core.now()))
    return ev == "data" and sync:take(true) == want
  end
  local ok, err = step("r"), nil
  if ok then
    local args = { "--remove", dir, "--", "/" }
    if f.ids.kind == "single" then table.insert(args, 1, "--map-self") end
    sync:write(string.format("%d 0\n", #args) .. table.concat(args, "\0") .. "\0")
    ok = step("u")
  end
  if ok then
    ok, err = write_maps(f.ids, p:pid(), deadline)
    if ok then sync:write("g") ok = step("x") end
  end
  sync:close()
  local info = p:wait(math.max(0.001, deadline - core.now()))
  if not info then p:kill("KILL") p:wait(1) end
  chan:wait(0.2)
  local said = (chan:captured("stderr") or ""):gsub("%s+$", "")
  p:close()
  chan:close()
  if ok and info and info.status == 0 then return true end
  return nil, string.format("cannot remove the box's disk layer %s: %s", dir,
    err or (said ~= "" and said) or "sbx-launch did not finish"), "disk_layer"
end

-- The bytes a box's disk layer takes now, or nil.
local function disk_usage(h)
  if not (h.pid and h.disk) then return nil end
  local p, s = core.proc.spawn {
    argv = { h.progs.launch, "--usage", "/proc/" .. h.pid .. "/ns/user", h.disk .. "/upper" }, env = LAUNCH_ENV,
    capture = { stdout = { head = 64, tail = 0 }, stderr = { head = 1024, tail = 0 }, output = { head = 0, tail = 0 } },
  }
  if not p then return nil end
  local info = p:wait(30)
  if not info then p:kill("KILL") p:wait(1) end
  s:wait(1)
  local out = s:captured("stdout") or ""
  p:close()
  return info and info.status == 0 and tonumber(out:match("^(%d+)")) or nil
end

-- Past its limit a box stops: its processes are killed, its channel ends
-- with "disk_exceeded" (the running commands fail with it), and every later
-- command is refused with it (as a Docker box past its limit is frozen).
local function freeze(h, used)
  if h.frozen or h.destroyed then return end
  local live = h.policy and h.policy() or sbx_config.policy
  local msg = live.format_disk_exceeded(used, h.disk_limit, live)
  h.frozen = { message = msg, code = "disk_exceeded", used = used }
  if h.chan then h.chan:close("disk_exceeded", msg) end
  if h.proc then h.proc:kill("KILL") end
end

-- One watcher task for every disk-layer box with a limit in the process.
local disk_boxes = setmetatable({}, { __mode = "k" })   -- handle -> true
local disk_task

local function disk_watch()
  local last = 0
  while next(disk_boxes) do
    local lp = lpol(sbx_config.policy)
    core.sleep(math.max(lp.disk_poll, last / lp.disk_poll_load - last))
    local t0 = core.now()
    local list = {}
    for h in pairs(disk_boxes) do list[#list + 1] = h end
    for _, h in ipairs(list) do
      if h.destroyed or h.frozen then
        disk_boxes[h] = nil
      else
        local used = disk_usage(h)
        if used and used > h.disk_limit and not h.destroyed then freeze(h, used) disk_boxes[h] = nil end
      end
    end
    last = core.now() - t0
  end
  disk_task = nil
end

local function watch_disk(h, limit)
  h.disk_limit = limit
  disk_boxes[h] = true
  if not disk_task then
    disk_task = core.spawn(function() pcall(disk_watch) disk_task = nil end)
    disk_task:unref()
  end
end

-- Prepares a launcher for a box: its directory, its cgroups (without
-- limits yet), a record, and sbx-launch started, which joins the cgroups
-- and waits for the box's options. A spare until a box takes it.
local function new_launcher(root, progs, pol, id)
  local f = get_facts(pol)
  id = id or assert(core.random.hex(8))
  local h = { id = id, dir = root .. "/boxes/" .. id, root = root, progs = progs, pol = pol }
  local ok, err, code = S.mkdir(h.dir, tonumber("700", 8))
  if ok then ok, err, code = S.mkdir(h.dir .. "/rw", tonumber("755", 8)) end
  if not ok then return nil, "cannot make the box's directory: " .. tostring(err), code end
  local argv = { progs.launch, tostring(core.pid()), "--dir", h.dir }
  if f.cgroups.version then
    local made, dirs = make_cgroups(f.cgroups, id)
    if not made then
      S.rmdir(h.dir .. "/rw")
      S.rmdir(h.dir)
      return nil, dirs, "cgroup"
    end
    h.cgroups, h.cgroup_of = made, dirs
    for _, d in ipairs(made) do argv[#argv + 1] = "--cgroup" argv[#argv + 1] = d end
  end
  ok, err, code = write_record(h, { lifetime = pol.box.lifetime })
  local p, chan, sync
  if ok then
    p, chan, sync = core.proc.spawn {
      argv = argv, env = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin" },
      stdin = true, stdout = true, stderr = true, sync = true,
      -- A spare left when sbx ends removes what it made, itself.
      close_kills = false,
      chunks = true, chunk_limit = pol.agent.channel_buffer,
      capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } },
    }
    if not p then ok, err, code = nil, "cannot start the box: " .. tostring(chan), sync or "launch_failed" end
  end
  if not ok then
    if h.cgroups then remove_cgroups(h.cgroups, core.now() + 1) end
    remove_dir(h.dir)
    return nil, err, code
  end
  h.proc, h.chan, h.sync, h.pid = p, chan, sync, p:pid()
  return h
end

-- Spare launchers, per state directory: started ahead of the next box
-- (policy.local.spares), so that starting sbx-launch and joining cgroups
-- (slow under cgroup v1 after a quiet spell) happen while nobody waits.
-- sbx's end (or kill -9) ends them: each removes what it made.
local spares = {}            -- root -> list of handles
local refilling = {}

local function refill(root, progs, pol)
  local want = lpol(pol).spares
  if refilling[root] or want <= 0 then return end
  refilling[root] = true
  local t = core.spawn(function()
    local list = spares[root] or {}
    spares[root] = list
    while #list < want do
      local h = new_launcher(root, progs, pol)
      if not h then break end
      list[#list + 1] = h
    end
    refilling[root] = nil
  end)
  t:unref()
end

-- A launcher for a box: a spare whose program is still there, or a new one.
local function take_launcher(root, progs, pol)
  local list = spares[root] or {}
  while #list > 0 do
    local h = table.remove(list, 1)
    if h.progs == progs and h.proc:info().running then return h end
    h.proc:close()
    if h.cgroups then remove_cgroups(h.cgroups, core.now() + 1) end
    remove_dir(h.dir)
  end
  return new_launcher(root, progs, pol)
end

-- Starts the box in launcher h: the options go over its socket, then the
-- id maps, then go. true | nil, message, code.
local function start(h, spec, pol, deadline)
  local f = get_facts(pol)
  local sync, p, chan = h.sync, h.proc, h.chan
  local function fail(msg, code)
    sync:close()
    p:kill("KILL")
    local said
    -- What the launcher or bubblewrap said on its way out.
    if p:wait(1) then chan:wait(0.2) said = stderr_of(h) end
    return nil, msg .. (said and (": " .. said) or ""), code
  end
  -- "r": it is in its cgroups and waits for the box's options.
  if not h.ready then
    local ev = sync:wait(math.max(0.001, deadline - core.now()))
    if ev ~= "data" or sync:take(true) ~= "r" then
      return fail("the box's launcher did not start", ev == "timeout" and "timeout" or "launch_failed")
    end
    h.ready = true
  end
  local bpf, serr, scode = seccomp_program(pol)
  if lpol(pol).seccomp and not bpf then return fail(tostring(serr), scode) end
  if h.cgroups then
    local ok, err, code = write_limits(f.cgroups, h.cgroup_of, spec)
    if not ok then return fail(err, code) end
    local acct = f.cgroups.version == 2 and f.cgroups.cpu or f.cgroups.cpuacct
    if acct then h.cpu_dir, h.cgv = h.cgroup_of[acct], f.cgroups.version end
    if f.cgroups.memory then
      h.memory_dir, h.cgv = h.cgroup_of[f.cgroups.memory], f.cgroups.version
      h.memory_limit = spec.memory and math.floor(spec.memory)
      h.oom_kills = nil
    end
  end
  -- The disk layer's directory (kept across a restart, made afresh).
  if h.src and disk_layer(pol, h.src) then
    if not h.disk then
      local droot, derr, dcode = disk_root(pol)
      if not droot then return fail(derr, dcode) end
      h.disk = droot .. "/boxes/" .. h.id
    end
    local okm, merr, mcode = S.mkdir(h.disk, tonumber("700", 8))
    if not okm and mcode ~= "EEXIST" then return fail("cannot make the box's disk layer: " .. tostring(merr), mcode) end
  end
  -- The record before anything runs: a kill -9 from here on leaves
  -- something `sbx reap` can read.
  local ok, err, code = write_record(h, spec)
  if not ok then return fail(err, code) end
  h.proc_mode = proc_mode(pol)
  if h.proc_mode == "copy" then
    -- The box's /proc: copies taken now, bound read-only.
    local dir = h.dir .. "/proc"
    S.mkdir(dir, tonumber("755", 8))
    for _, name in ipairs(lpol(pol).proc_files) do
      local text = read_file("/proc/" .. name)
      if text then
        local okw, werr, wcode = S.install(dir .. "/" .. name, text, tonumber("444", 8))
        if not okw then return fail("cannot copy /proc/" .. name .. ": " .. tostring(werr), wcode) end
      end
    end
  end
  local argv = launch_argv(h, spec, pol, h.src, f.bwrap, bpf ~= nil)
  sync:write(string.format("%d %d\n", #argv, bpf and #bpf or 0) .. table.concat(argv, "\0") .. "\0" .. (bpf or ""))
  -- "u": the namespaces exist; the maps go in now.
  local ev = sync:wait(math.max(0.001, deadline - core.now()))
  if ev ~= "data" or sync:take(true) ~= "u" then
    return fail("the box's launcher did not start", ev == "timeout" and "timeout" or "launch_failed")
  end
  ok, err, code = write_maps(f.ids, h.pid, deadline)
  if not ok then return fail("cannot map the box's ids: " .. tostring(err), code) end
  sync:write("g")
  -- "x": the writable layer is mounted and the rlimits set, bubblewrap
  -- comes next. A mount or rlimit it could not set is said here instead.
  ev = sync:wait(math.max(0.001, deadline - core.now()))
  if ev ~= "data" or sync:take(true) ~= "x" then
    local where = h.disk and string.format(" (its writable layer is on disk under %s: an overlay needs a file " ..
      "system with user xattrs there; policy.local.disk_dir names another directory, layer = \"tmpfs\" keeps it " ..
      "in memory)", h.disk) or ""
    return fail("the box could not be set up" .. where, ev == "timeout" and "timeout" or "launch_failed")
  end
  sync:close()
  h.sync = nil
  h.fresh = true
  return true
end

-- Lifecycle ----------------------------------------------------------------------------

local reaped_once = false

-- create(spec, pol) -> handle | nil, message, code
function M.create(spec, pol)
  pol = pol or sbx_config.policy
  local f = get_facts(pol)
  if not f.bwrap then
    return nil, string.format("bubblewrap (%s) is not installed: apt-get install bubblewrap", lpol(pol).bwrap), "unsupported"
  end
  local mode, merr = proc_mode(pol)
  if not mode then return nil, merr, "unsupported" end
  local src, ierr, icode = image_source(spec, pol)
  if not src then return nil, ierr, icode end
  -- The start deadline begins once the image is ready: fetching and
  -- unpacking it (shared by every box that needs it, however long it
  -- takes) is not the box's start.
  local deadline = core.now() + math.min(spec.create_timeout, pol.agent.start_timeout)
  -- Every way out below without a box lets go of the image.
  local function unlease()
    if src.lease then src.lease:close() src.lease = nil end
  end
  local root, rerr, rcode = state_root(pol)
  if not root then unlease() return nil, rerr, rcode end
  if spec.reap_on_start and not reaped_once then
    reaped_once = true
    local t = core.spawn(function() pcall(M.reap, { quiet = true }, pol) end)
    t:unref()
  end
  local progs, perr, pcode = ensure_programs(root)
  if not progs then unlease() return nil, perr, pcode end
  local h, err, code = take_launcher(root, progs, pol)
  if not h then unlease() return nil, err, code end
  h.src, h.spec, h.pol = src, spec, pol
  local lok, launched, lmsg, lcode = pcall(start, h, spec, pol, deadline)
  if lok and not launched and lcode == "idmap" and f.ids.kind == "subid" then
    -- newuidmap is there but may not write the map (in a container without
    -- the capabilities it needs, or an /etc/subuid range outside the
    -- container's own): every box from now on has the single id instead,
    -- and box.limits.ids says why.
    f.ids = { kind = "single", uid = f.ids.uid, gid = f.ids.gid, count = 1,
      why = "newuidmap failed here (" .. tostring(lmsg):gsub("^cannot map the box's ids: ", "") .. ")" }
    h.src = nil   -- the image's lease stays with the box
    M.destroy(h, false, core.now() + lpol(pol).destroy_wait)
    h, err, code = take_launcher(root, progs, pol)
    if not h then unlease() return nil, err, code end
    h.src, h.spec, h.pol = src, spec, pol
    lok, launched, lmsg, lcode = pcall(start, h, spec, pol, deadline)
  end
  refill(root, progs, pol)
  if not lok or not launched then
    -- Cut short (an interrupt) or failed: nothing may stay.
    M.destroy(h, false, core.now() + lpol(pol).destroy_wait)
    if not lok then error(launched, 0) end
    return nil, lmsg, lcode or "launch_failed"
  end
  -- What this box got where the kernel decided (box.limits.proc, .ids).
  local ids = f.ids
  h.limits = {
    proc = h.proc_mode == "copy" and { enforced = "kernel", note = "copies: this container masks its /proc, " ..
      "so the box's /proc is read-only copies of policy.local.proc_files, without /proc/self or any " ..
      "process (docs/local-in-containers.md)" } or { enforced = "kernel", note = "a proc of the box's own PID namespace" },
    ids = { enforced = "kernel", note = ids.kind == "range" and string.format("%d ids, the same host ids", ids.count)
      or ids.kind == "subid" and string.format("%d ids: the user's own and its /etc/subuid range (newuidmap)", ids.count)
      or "a single id, the user's own: " .. tostring(ids.why) },
  }
  h.env = box_env(spec, pol, src)
  h.default_user = src.config.user ~= "" and src.config.user or nil
  watch_lifetime(h, spec.lifetime)
  if h.disk and spec.disk then watch_disk(h, spec.disk) end
  return h
end

-- destroy(handle, detached, deadline): the box's processes end at once
-- (bubblewrap's monitor is killed; the agent dies with it, and the box's
-- PID namespace with the agent); the host's leftovers (cgroups, the box's
-- directory) go as soon as the kernel lets go of them. detached: without
-- waiting (a collected box).
function M.destroy(h, detached, deadline)
  if h.destroyed then return true end
  h.destroyed = true
  lifetimes[h] = nil
  disk_boxes[h] = nil
  if h.src and h.src.lease then h.src.lease:close() h.src.lease = nil end
  if h.proc then h.proc:kill("KILL") end
  local pol = h.pol or sbx_config.policy
  local function cleanup(dl)
    local p = h.proc
    if p then
      h.proc = nil
      p:wait(math.max(0.001, dl - core.now()))
      p:close()
    end
    if h.chan then h.chan:close() end
    local ok, err, code = true, nil, nil
    if h.cgroups then ok, err, code = remove_cgroups(h.cgroups, dl) end
    if ok and h.disk then ok, err, code = remove_disk(h.disk, h.progs, pol, dl) end
    if ok then remove_dir(h.dir) end
    if not ok then return nil, err .. " (left to sbx reap --backend local)", code end
    return true
  end
  deadline = math.min(deadline or math.huge, core.now() + lpol(pol).destroy_wait)
  if detached then
    local t = core.spawn(cleanup, deadline)
    t:unref()
    return true
  end
  return cleanup(deadline)
end

-- restart(handle, deadline): the box again from its image (its processes
-- and the files written since are gone: the writable layer lived in the
-- box's mount namespace). The agent transport finds the new agent.
function M.restart(h, deadline)
  if h.destroyed then return nil, "the box is closed", "box_gone" end
  deadline = deadline or core.now() + 10
  local p = h.proc
  if p then
    h.proc = nil
    p:kill("KILL")
    p:wait(math.max(0.001, deadline - core.now()))
    p:close()
  end
  if h.chan then h.chan:close() end
  if h.cgroups then
    local ok, err, code = remove_cgroups(h.cgroups, deadline)
    if not ok then return nil, err, code end
  end
  if h.disk then
    local ok, err, code = remove_disk(h.disk, h.progs, h.pol, deadline)
    if not ok then return nil, err, code end
  end
  remove_dir(h.dir)
  -- A new launcher for the same box.
  local fresh, err, code = new_launcher(h.root, h.progs, h.pol, h.id)
  if not fresh then return nil, err, code end
  for _, k in ipairs { "cgroups", "cgroup_of", "proc", "chan", "sync", "pid" } do h[k] = fresh[k] end
  h.ready = nil
  local ok
  ok, err, code = start(h, h.spec, h.pol, deadline)
  if not ok then return nil, err, code end
  return true
end

-- agent_channel(handle, { key, deadline, pol }) -> channel, mac, extra |
-- nil, message, code. The channel is the agent's stdin and stdout, opened
-- when the box started: only the agent holds them (no authentication).
-- Asked again after the agent was lost, the box is gone with it.
function M.agent_channel(h, opts)
  if h.frozen then return nil, h.frozen.message, h.frozen.code end
  if h.destroyed then return nil, h.gone_reason or "the box is closed", "box_gone" end
  if not h.fresh then
    local said = stderr_of(h)
    return nil, "the box's agent (its first process) is gone, and the box with it" ..
      (said and (": " .. said) or ""), "box_gone"
  end
  h.fresh = false
  local _ = opts
  return h.chan, false, { default_user = h.default_user, env = h.env }
end

-- Reaper --------------------------------------------------------------------------------

-- reap(opts, pol) -> { removed = { { id, name, reason } }, kept = n }:
-- removes the boxes of this host's state directory whose owner process is
-- gone or whose deadline passed (opts.all: every box; opts.dry_run: only
-- say which): their processes, cgroups and directories.
function M.reap(opts, pol)
  opts = opts or {}
  pol = pol or sbx_config.policy
  local root, err, code = state_root(pol)
  if not root then return nil, err, code end
  local me = owner.identity()
  local now = os.time()
  local records = {}         -- id -> the box's record, read once
  local report = owner.reap_each(S.list(root .. "/boxes") or {}, opts, {
    reason = function(id)
      local dir = root .. "/boxes/" .. id
      local r = read_record(dir)
      records[id] = r
      if not r then
        local st = S.stat(dir)
        if st and now - st.mtime > lpol(pol).stale_after then return "no owner record" end
      elseif not (r["owner.pid"] == me.pid and r["owner.start"] == me.start) or opts.all then
        return owner.reap_reason({ ["sbx.owner.host"] = r["owner.host"], ["sbx.owner.pid"] = r["owner.pid"],
          ["sbx.owner.start"] = r["owner.start"], ["sbx.deadline"] = r.deadline }, opts, now) or nil
      end
    end,
    name = function(id) return id, id end,
    serial = true,           -- the state directory's programs are written once, by one remover
    remove = function(id)
      local r = records[id]
      local pid = r and math.tointeger(tonumber(r.pid or ""))
      if pid and pid > 1 and r["pid.start"] ~= "" and owner.proc_start(pid) == r["pid.start"] then
        pcall(core.proc.signal, pid, "KILL")
      end
      if r and #r.cgroups > 0 then remove_cgroups(r.cgroups, core.now() + lpol(pol).destroy_wait) end
      local progs = r and r.disk and ensure_programs(root)
      if progs then remove_disk(r.disk, progs, pol, core.now() + lpol(pol).destroy_wait) end
      remove_dir(root .. "/boxes/" .. id)
    end,
  })
  -- Disk layers whose box has no record any more (a reaper that knew no
  -- disk layers removed it), once stale.
  local droot = disk_root_path(pol)
  for _, id in ipairs(S.list(droot .. "/boxes") or {}) do
    local ddir = droot .. "/boxes/" .. id
    local st = S.stat(ddir)
    if not exists(root .. "/boxes/" .. id) and st and now - st.mtime > lpol(pol).stale_after then
      report.removed[#report.removed + 1] = { id = id, name = id, reason = "a disk layer without a box" }
      local progs = not opts.dry_run and ensure_programs(root)
      if progs then remove_disk(ddir, progs, pol, core.now() + lpol(pol).destroy_wait) end
    end
  end
  -- The image cache's half-done downloads and unpackings of processes
  -- that died (an sbx killed while it made a box from a new image).
  local ok, cache = pcall(require("sbx.images.cache").open, pol.images)
  if ok and cache then
    local _, left = cache:clean_tmp(opts.dry_run)
    for _, name in ipairs(left) do
      report.removed[#report.removed + 1] = { id = name, name = "image cache tmp/" .. name,
        reason = "an unpacking left by a process that is gone" }
    end
  end
  return report
end

return M

-- The local backend's launch: the sbx-launch and bubblewrap argv, the id
-- maps, spare launchers, and launch() that turns a spare into a box.
local core = require "sbx.core"
local read_file = require("sbx.fs").read
local S = core.sandbox
local sbx_config = require "sbx.config"
local function lpol(pol) return (pol or sbx_config.policy)["local"] end
local cgroups = require "sbx.backends.local.cgroups"
local host = require "sbx.backends.local.host"
local isolation = require "sbx.backends.local.isolation"
local state = require "sbx.backends.local.state"
local make_cgroups = cgroups.make_cgroups
local remove_cgroups = cgroups.remove_cgroups
local write_limits = cgroups.write_limits
local RLIMITS = host.RLIMITS
local disk_layer = host.disk_layer
local get_facts = host.get_facts
local proc_mode = host.proc_mode
local capabilities = isolation.capabilities
local parse_tmpfs = isolation.parse_tmpfs
local disk_root = state.disk_root
local record_text = state.record_text

local M = {}

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
local function launch(h, spec, pol, deadline)
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

M.box_env = box_env
M.new_launcher = new_launcher
M.refill = refill
M.remove_dir = remove_dir
M.launch = launch
M.stderr_of = stderr_of
M.take_launcher = take_launcher
M.write_maps = write_maps

return M

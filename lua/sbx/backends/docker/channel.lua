-- The Docker backend's agent channel: sbx-agent bound read-only from the
-- host or placed in the box, run on an attached exec whose pipes are the
-- channel (transports/agent.lua speaks over it).
local core = require "sbx.core"
local http = require "sbx.http"
local client = require "sbx.backends.docker.client"
local exec = require "sbx.backends.docker.exec"
local pol, home, exists = client.pol, client.home, client.exists
local exec_create = exec.exec_create

local M = {}

local ARCH = { amd64 = "x86_64", x86_64 = "x86_64", arm64 = "aarch64", aarch64 = "aarch64" }
local LOADER_GO = "__SBXAGENT_go__\n"

-- A one-file ustar archive (PUT /containers/{id}/archive takes a tar).
local function tar_one(name, data, mode)
  local function octal(n, width) return string.format("%0" .. (width - 1) .. "o", n) .. "\0" end
  local header = name .. string.rep("\0", 100 - #name) .. octal(mode, 8) .. octal(0, 8) .. octal(0, 8)
    .. octal(#data, 12) .. octal(os.time(), 12) .. "        " .. "0" .. string.rep("\0", 100)
    .. "ustar\0" .. "00" .. string.rep("\0", 32) .. string.rep("\0", 32) .. octal(0, 8) .. octal(0, 8)
    .. string.rep("\0", 155)
  header = header .. string.rep("\0", 512 - #header)
  local sum = 0
  for i = 1, 512 do sum = sum + header:byte(i) end
  header = header:sub(1, 148) .. string.format("%06o\0 ", sum) .. header:sub(157)
  local pad = (512 - #data % 512) % 512
  return header .. data .. string.rep("\0", pad) .. string.rep("\0", 1024)
end
M.tar_one = tar_one

-- The agent per architecture, copied out of the library once.
local agents = {}
local function agent_binary(arch)
  agents[arch] = agents[arch] or core.agent.binary(arch)
  return agents[arch]
end

-- The agent from the host: where the daemon runs on this host, each box
-- gets one host file, made once from the copy inside libsbx, as a
-- read-only bind (policy.docker.agent_bind): no upload per box, and a file
-- the box cannot replace, so a lost agent's successor is the host's copy
-- again. The file is sbx-agent-<arch>-<sha256 prefix> (mode 0555) in
-- policy.docker.agent_dir, a directory of this user's made 0700; its
-- content is checked against libsbx's once per process.
local function host_arch()
  local f = io.open("/proc/sys/kernel/arch", "r")
  local m = f and f:read("l")
  if f then f:close() end
  return m and ARCH[m]
end

local function agent_dir(dp)
  local dir = dp.agent_dir
  if dir then return dir end
  if core.sandbox.ids() == 0 then return "/var/cache/sbx/agent" end
  local xdg = os.getenv("XDG_CACHE_HOME")
  return ((xdg and xdg ~= "") and xdg or (home() .. "/.cache")) .. "/sbx/agent"
end

local host_files = {}       -- dir .. "\0" .. arch -> { path, hash }: written or checked by this process
-- agent_host_file(arch, docker policy) -> path, hash | nil, message
local function agent_host_file(arch, dp)
  local S = core.sandbox
  local dir = agent_dir(dp)
  local known = host_files[dir .. "\0" .. arch]
  if known then return known[1], known[2] end
  local bin = agent_binary(arch)
  if not bin then return nil, "this build of sbx carries no agent for " .. arch end
  local hash = core.sigv4.sha256(bin):sub(1, 16)
  local path = string.format("%s/sbx-agent-%s-%s", dir, arch, hash)
  local cur = ""
  for part in dir:gmatch("[^/]+") do
    cur = cur .. "/" .. part
    if not exists(cur) then
      local ok, err, code = S.mkdir(cur, tonumber("700", 8))
      if not ok and code ~= "EEXIST" then return nil, err end
    end
  end
  local uid, st = S.ids(), S.stat(dir)
  if not st or st.type ~= "dir" or st.uid ~= uid or st.mode & tonumber("022", 8) ~= 0 then
    return nil, dir .. " is not a directory of this user's that only it may write"
  end
  local f = io.open(path, "rb")
  local have = f and f:read("a")
  if f then f:close() end
  local fst = have == bin and S.stat(path)
  if not (fst and fst.type == "file" and fst.uid == uid and fst.mode == tonumber("555", 8)) then
    local ok, err = S.install(path, bin, tonumber("555", 8))
    if not ok then return nil, err end
  end
  host_files[dir .. "\0" .. arch] = { path, hash }
  return path, hash
end

-- agent_mount(d, spec) -> { source, target } | nil: the bind a new box gets,
-- or none (the upload then): a daemon not on this host (a tcp address; a
-- socket a user owns: a rootless daemon, a VM's), another architecture, a
-- box whose own capabilities or mounts could undo a read-only bind.
function M.agent_mount(d, spec, pol_)
  local dp = type(pol_) == "table" and pol_.docker or pol()
  if not dp.agent_bind or d.agent_bind == false or not d.unix_socket then return nil end
  if d.agent_bind == nil then
    local st = core.sandbox.stat(d.unix_socket)
    d.agent_bind = (st and st.type == "socket" and st.uid == 0) and true or false
    if not d.agent_bind then return nil end
  end
  local hc = spec.host_config or {}
  if hc.Privileged or hc.Mounts ~= nil or hc.Binds ~= nil then return nil end
  for _, list in ipairs { spec.cap_add or {}, type(hc.CapAdd) == "table" and hc.CapAdd or {} } do
    for _, c in ipairs(list) do
      local name = tostring(c):upper():gsub("^CAP_", "")
      if name == "SYS_ADMIN" or name == "ALL" then return nil end
    end
  end
  local facts = type(d.images[spec.image]) == "table" and d.images[spec.image] or {}
  local arch = ARCH[facts.arch or "amd64"]
  if not arch or arch ~= host_arch() then return nil end
  local path, hash = agent_host_file(arch, dp)
  if not path then return nil end
  return { source = path, target = "/.sbx-agent-" .. hash }
end

-- Places a fresh sbx-agent for the image's architecture and runs it with
-- args as root on an attached exec whose pipes are the channel: the
-- host's read-only copy where the box has one (agent_mount), else a copy
-- at a new random path each time (a copy left in the box is never
-- trusted) through the archive API where the root is writable, else
-- through a shell into a fresh temporary directory.
-- -> channel, facts | nil, reason, code
local function run_agent(h, opts, args)
  local d, deadline = h.daemon, opts.deadline
  if h.frozen then return nil, h.frozen.message, h.frozen.code end
  local facts = type(d.images[h.image]) == "table" and d.images[h.image] or {}
  local arch = ARCH[facts.arch or "amd64"]
  if not arch then
    return nil, string.format("the image is for %s, and sbx carries no agent for it", tostring(facts.arch)), "unsupported"
  end
  local bin = agent_binary(arch)
  if not bin then return nil, "this build of sbx carries no agent for " .. arch, "unsupported" end
  local argv, preface
  local path = "/.sbx-agent-" .. assert(core.random.hex(8))
  if h.agent_bound then
    argv = { h.agent_bound, table.unpack(args) }
  elseif not h.read_only then
    local r, err, ecode = http.request {
      url = d.prefix .. "/containers/" .. h.id .. "/archive?path=/", method = "PUT",
      unix_socket = d.unix_socket, headers = { ["Content-Type"] = "application/x-tar" },
      body = tar_one(path:sub(2), bin, tonumber("700", 8)),
      timeout = client.seconds_left(deadline, pol().api_timeout),
    }
    if r and r.status < 300 then argv = { path, table.unpack(args) } end
    if not r and err then
      return nil, string.format("cannot place the agent: the Docker daemon at %s: %s", d.endpoint, tostring(err)),
        ecode == "timeout" and "daemon_unresponsive" or "daemon_unavailable"
    end
  end
  if not argv then
    -- A read-only root: a fresh private directory where the box may write.
    local dirs = table.concat(h.agent_dirs or { "/tmp" }, " ")
    argv = { "sh", "-c", 'umask 077; d=; for p in ' .. dirs .. '; do d=$(mktemp -d -p "$p" 2>/dev/null) && break; done; ' ..
      '[ -n "$d" ] || { echo "no writable directory to place it in (tried ' .. dirs ..
      '; a read-only root needs a tmpfs with exec)" >&2; exit 125; }; head -c ' .. #bin ..
      ' > "$d/a" && chmod 700 "$d/a" && printf "' .. LOADER_GO .. '" && exec "$d/a"' ..
      (#args > 0 and (" " .. table.concat(args, " ")) or "") }
    preface = bin
  end
  local req = { argv = argv, env = { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" },
    user = "0", stdin = "" }
  local id, err, code = exec_create(h, req, deadline)
  if not id then return nil, err, code end
  local body = '{"Detach":false,"Tty":false}'
  local ch = core.stream.open {
    unix_socket = d.unix_socket, host = d.host, port = d.port, keep_open = true,
    request = table.concat {
      "POST /v", d.api, "/exec/", id, "/start HTTP/1.1\r\n", "Host: docker\r\n",
      "Content-Type: application/json\r\n", "Content-Length: ", #body, "\r\n",
      "Connection: close\r\n\r\n", body,
    },
    chunks = true, chunk_limit = opts.pol.agent.channel_buffer,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 4096, tail = 0 }, output = { head = 0, tail = 0 } },
  }
  -- A frozen box (disk past its limit) ends the channel with its code.
  if h.jobs and h.channel_job then h.jobs[h.channel_job] = nil end
  h.channel_job = { stream = ch }
  if h.jobs then h.jobs[h.channel_job] = true end
  h.channel = ch
  if preface then
    ch:write(preface)
    -- Nothing more goes in until the loader has read exactly the agent's
    -- bytes (busybox head reads ahead through stdio and would eat the key);
    -- what follows its line is the agent's.
    local said = ""
    while not said:find(LOADER_GO, 1, true) do
      local ev = ch:wait(math.max(0.001, deadline - core.now()))
      if ev == "timeout" then
        local why = (ch:captured("stderr") or ""):gsub("%s+$", "")
        ch:close()
        return nil, "the agent's loader did not finish" .. (why ~= "" and (": " .. why) or ""), "agent_unavailable"
      end
      said = said .. (ch:take(true) or "")
      if ev == "eof" and not said:find(LOADER_GO, 1, true) then
        local why = (ch:captured("stderr") or ""):gsub("%s+$", "")
        return nil, "the agent's loader failed" .. (why ~= "" and (": " .. why) or ""), "agent_unavailable"
      end
    end
    local rest = said:sub(said:find(LOADER_GO, 1, true) + #LOADER_GO)
    if rest ~= "" then
      local proxy = setmetatable({}, { __index = function(_, k)
        return function(_, ...) return ch[k](ch, ...) end
      end })
      function proxy.take(_, raw)
        local out, err = ch:take(raw)
        if rest then out, rest = rest .. (out or ""), nil end
        return out, err
      end
      return proxy, facts
    end
  end
  return ch, facts
end

-- agent_channel(handle, { key, deadline, pol }) -> channel, mac, extra |
-- nil, reason, code. The agent runs as root (so it can start commands as
-- any user) as the exec's process: a dropped connection to the daemon
-- closes its stdin and leaves it running. The channel's pipes belong to the
-- agent alone: no frame authentication.
function M.agent_channel(h, opts)
  local ch, facts, code = run_agent(h, opts, {})
  if not ch then return nil, facts, code end
  local extra = { default_user = facts.user }
  if h.agent_bound then
    -- The bound file would not run (a noexec mount, SELinux's labels): the
    -- upload, for this box and the daemon's later ones.
    extra.retry = function()
      if not h.agent_bound then return false end
      h.agent_bound, h.daemon.agent_bind = nil, false
      return true
    end
  end
  return ch, false, extra
end

-- agent_attach(handle, { name, deadline, pol }) -> channel | nil, reason,
-- code: the way back to a running agent after a dropped channel, through a
-- relay placed anew ("sbx-agent attach NAME"; the name is hex).
function M.agent_attach(h, opts)
  if not tostring(opts.name):match("^[%w%-]+$") then error("agent_attach: a bad socket name", 2) end
  local ch, err, code = run_agent(h, opts, { "attach", opts.name })
  if not ch then return nil, err, code end
  return ch
end

return M

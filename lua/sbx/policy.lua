-- The default policy. Every limit, message, name and description sbx uses
-- lives here; C only carries out what this table says. A policy file (sbx
-- --policy FILE, SBX_POLICY, or sbx.use_policy from a script) returns a table
-- that is merged over this one: tables merge key by key, anything else
-- (numbers, strings, lists, functions) replaces the default.
--
-- Hooks (the functions below) are plain functions in this table; a policy
-- replaces one by assigning another. Every hook is called with the live,
-- merged policy as its last argument (`pol`), and the defaults call each
-- other through it, never through this file's table: overriding
-- format_output or output.head_chars changes what format_result produces.
-- Types and ranges of every knob are checked when a policy is loaded
-- (sbx.policy_check; `sbx policy check FILE`).
local KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024

local policy = {}

local util = require "sbx.util"

-- The live policy when a caller passes none (a hook called by hand): the
-- one sbx.config holds once it is loaded. This file never loads it
-- (sbx.config requires this file); before it is loaded the live policy
-- would be a fresh copy of these defaults, so the defaults serve.
local function live(pol)
  local config = package.loaded["sbx.config"]
  return pol or (config and config.policy) or policy
end

-- Box defaults: what sbx.box{} uses for every option the caller leaves out.
-- The isolation options among them (memory, cpus, pids, disk, network,
-- read_only, cap_drop, cap_add, no_new_privileges, init, ulimits, tmpfs)
-- follow one rule on every backend (sbx.limits): set explicitly and not
-- enforceable there, the box is refused ("unsupported"); a default that
-- cannot be enforced is applied as closely as the backend allows; box.limits
-- reports what each box got.
policy.box = {
  -- "auto": local where it isolates fully and has the image
  -- (policy.local.auto), else docker when a daemon answers, else local (no
  -- daemon needed); or "docker", "local", "fargate", "kubernetes".
  backend = "auto",
  -- One of the two images scripts/setup.sh builds (no registry needed):
  -- Debian 12, as the former default debian:bookworm-slim was, with bash,
  -- coreutils and apt (sbx-busybox:latest has no bash nor glibc).
  -- Kubernetes and Fargate pull from a registry: name an image there.
  image = "sbx-debian:12",
  workdir = "/work",            -- created by the daemon if the image lacks it
  memory = 1024 * MiB,          -- bytes; swap is disabled (MemorySwap = Memory)
  cpus = 1.0,                   -- CPU quota in cores
  pids = 512,                   -- the fork-bomb ceiling
  -- Bytes the box may write to its own filesystem (its writable layer:
  -- files it creates or grows, image files it changes; tmpfs mounts count
  -- against memory instead), false for no limit. 10 GiB holds a toolchain,
  -- a repository and its build, and stops a runaway writer long before it
  -- fills a host disk that other boxes share. Docker enforces it with a
  -- storage quota where its storage driver has one, else sbx watches it
  -- (policy.docker.disk_poll) and freezes the box past it: commands fail
  -- with "disk_exceeded".
  disk = 10 * GiB,
  -- true: a default that the backend cannot enforce refuses the box too
  -- (nil, message, "unsupported"), as an explicitly set option always does.
  strict_limits = false,
  network = "none",             -- "none" isolates; "bridge" gives the box a network
  env = {},                     -- KEY = value set on the box itself
  labels = {},                  -- extra labels on the container
  init = true,                  -- an init as PID 1: reaps zombies, stops in ms
  read_only = false,            -- read-only root filesystem
  tmpfs = {},                   -- { ["/tmp"] = "rw,size=64m" }
  -- Capabilities a shell user in a box never needs; apt-get still works.
  cap_drop = { "NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SYS_CHROOT" },
  cap_add = {},
  ulimits = nil,                -- { nofile = 4096, nproc = 4096 }; nil: the daemon's defaults
  podman_ulimits = { nofile = 4096, nproc = 4096 },  -- used on Podman when ulimits is nil
  no_new_privileges = true,
  lifetime = 24 * 3600,         -- seconds; the box stops itself after this, even if sbx dies
  pull = "missing",             -- "missing" | "always" | "never"
  name_prefix = "sbx-",
  docker_host = nil,            -- overrides DOCKER_HOST and the socket search
  reap_on_start = true,         -- remove boxes of dead sbx processes at the first create
  -- Seconds sbx.box{} may take, the daemon's answers and an image pull
  -- included; past it creation fails with "daemon_unresponsive".
  -- How commands reach the box: "auto" (sbx-agent, one channel for every
  -- command, where it can be placed; else "exec"), "agent" (fail if it
  -- cannot be placed) or "exec" (one backend command per command).
  transport = "auto",
  create_timeout = 300,
  -- Seconds box:close() (and every box at exit) may take; past it the box
  -- is left to a background retry and to `sbx reap`. Exit never hangs on a
  -- frozen daemon.
  destroy_timeout = 10,
}

-- Commands.
policy.exec = {
  timeout = 120,                -- seconds, when the caller gives none
  max_timeout = 3600,           -- a larger request is lowered to this
  -- "auto": bash when the image has it, else sh. Or "bash", "sh", or an
  -- argv prefix such as { "/bin/zsh", "-c" }.
  shell = "auto",
  -- Non-interactive by default: stdin is closed and nothing waits for a user.
  env = {
    DEBIAN_FRONTEND = "noninteractive",
    GIT_TERMINAL_PROMPT = "0",
    GIT_EDITOR = "true",
    EDITOR = "true",
    PAGER = "cat",
    GIT_PAGER = "cat",
  },
  -- Host memory per running command, per stream: first `head` and last
  -- `tail` bytes are kept, the rest is only counted.
  capture = {
    stdout = { head = 64 * KiB, tail = 192 * KiB },
    stderr = { head = 64 * KiB, tail = 192 * KiB },
    output = { head = 64 * KiB, tail = 192 * KiB },  -- both streams interleaved
  },
  chunk_limit = 1 * MiB,        -- output queued for on_output before reading pauses
  kill_grace = 3,               -- seconds to wait for a killed command's stream to end
  -- The bash tool runs the commands of a box as one session (box:session():
  -- cd, variables, functions, aliases, options carry over); lm-deluge's word.
  stateful = false,
  -- How a session command starts: bash when the box has it, else sh. sbx
  -- appends two scripts (sbx.session_shell: bash's, then sh's) and the
  -- command; the launcher runs "$1" with bash or "$2" with sh, the command
  -- as the script's "$1".
  session_shell = { "sh", "-c", 'if command -v bash >/dev/null 2>&1; then exec bash --norc --noprofile -c "$1" sbx-session "$3"; fi; exec sh -c "$2" sbx-session "$3"', "sbx-session" },
  -- Where a session keeps its shell's state between commands, in the box
  -- (a file per session; %s: the session's id).
  session_state = "/tmp/.sbx-session-%s",
  -- The longest argument or NAME=value the box's kernel execs (Linux:
  -- MAX_ARG_STRLEN, 32 pages with the final NUL). A longer one is refused
  -- before it starts ("exec_failed"), as the kernel would refuse it.
  max_arg_bytes = 32 * 4 * KiB - 1,
  -- When neither the kill in the box nor the backend's targeted kill from
  -- the host (Docker: the daemon host's pids of that job) stops a command
  -- (a fork bomb fills the pids limit), the last resort: the box is
  -- restarted; every process in it dies (listed in the result's
  -- ended_processes), its files stay. "leave": report kill_failed instead.
  on_unkillable = "restart",    -- "restart" | "leave"
}

-- sbx-agent, the in-box program of the agent transport.
policy.agent = {
  start_timeout = 30,           -- seconds to place it and hear its hello
  window = 4 * MiB,             -- bytes in flight per stream (output, stdin) before the sender waits
  channel_buffer = 1 * MiB,     -- channel bytes read ahead of the frame reader; then the socket pauses
  stdin_chunk = 64 * KiB,       -- bytes of stdin per frame
  ping_interval = 30,           -- seconds of silence before a keep-alive ping
  ping_timeout = 15,            -- seconds a ping may go unanswered before the channel counts as dropped
  -- A dropped channel (the connection to the daemon, an ECS Exec session)
  -- is opened again and the box's commands go on. The agent keeps them for
  -- reattach_grace seconds without a channel (then ends them); sbx tries to
  -- reach it for reattach_timeout seconds; 0 turns re-attach off (a drop
  -- fails the pending commands with agent_lost at once).
  reattach_grace = 120,
  reattach_timeout = 60,
  attach_timeout = 10,          -- seconds for the agent to answer on its attach socket
  -- A command's stdout and stderr are sockets, not pipes: no other process
  -- of the box (an earlier command's leftover, a background process) can
  -- open them through /proc/PID/fd/1 and write into this command's output.
  -- The cost: opening /dev/stdout or /dev/stderr by name (`echo x >
  -- /dev/stderr`, `tee /dev/stdout`) fails with ENXIO ("No such device or
  -- address"); `>&2` and `2>&1` work. Off by default: `> /dev/stderr`,
  -- `tee /dev/stdout` and `tar -cf /dev/stdout` are common in the scripts
  -- boxes run; a harness that wants this turns it on.
  private_output = false,
  -- Seconds to end every process of a box whose agent was lost, before a
  -- fresh agent is placed (backend.clear: Docker, Kubernetes, Fargate).
  clear_timeout = 10,
  ack_bytes = 256 * KiB,        -- bytes between acknowledgements (what each side keeps to send again)
}

-- Background processes.
policy.background = {
  log = { head = 64 * KiB, tail = 1 * MiB },  -- bounded log per process
  name_pattern = "^[%w][%w_.%-]*$",
  max_name_length = 64,
  read_max = 64 * KiB,          -- default bytes per output read
  -- Host memory for the logs of finished processes, per box: past it the
  -- logs of the oldest finished ones are freed (their status, exit code
  -- and byte count stay; reading one gives "evicted"). Running processes
  -- keep their logs whatever this says. 0 frees each log when it ends.
  retain_bytes = 16 * MiB,
}

-- Files moved in and out of a box.
policy.files = {
  max_read = 16 * MiB,
  max_write = 256 * MiB,
  make_parents = true,
}

-- The MCP server (sbx mcp).
policy.mcp = {
  progress_interval = 5,        -- seconds between progress notifications of a quiet command
  max_line = 64 * MiB,          -- the longest JSON-RPC message read from stdin; a longer one is answered with an error and dropped
  -- What initialize tells the client about the server: a string, or a
  -- function of the policy and the backend the boxes will use ("auto"
  -- resolved by sbx mcp) returning one. A default does no I/O.
  instructions = function(p, backend)
    return "Tools run commands in an isolated sandbox (" .. tostring(backend or p.box.backend) .. ")."
  end,
  -- The message of a progress notification. info: elapsed (seconds), bytes
  -- (of output so far), last_line (the last output line), count (this
  -- notification's number).
  format_progress = function(info)
    return string.format("running for %.0fs; %d bytes of output; last line: %s",
      info.elapsed, info.bytes, info.last_line:sub(1, 200))
  end,
}

-- HTTP from Lua (sbx.http, sbx.httpc, the Docker and AWS clients).
policy.http = {
  max_body = 64 * MiB,          -- a response body beyond this is cut (truncated = true)
  max_buffer = 1 * MiB,         -- a streamed body read ahead of its reader; then the transfer pauses
  -- sbx.httpc retries (opts.retries = n): full jitter, delay =
  -- random(0, min(max, base * 2^n)); Retry-After is honoured up to
  -- max_retry_after seconds. A request's own opts.backoff wins.
  backoff = { base = 0.2, max = 5, max_retry_after = 60 },
  -- Transport failures worth another attempt (codes from core.http). A
  -- timeout is left out: the server may have acted on the request.
  retry_codes = { ECONNREFUSED = true, closed = true },
  retry_statuses = { [429] = true, [500] = true, [502] = true, [503] = true, [504] = true },
}

-- The Docker backend's calls to the daemon (seconds).
policy.docker = {
  api_timeout = 120,            -- one Engine API call, the whole transfer
  ping_timeout = 10,            -- /_ping while looking for a daemon
  ping_connect_timeout = 5,
  -- backend = "auto" asks once whether a daemon answers; a daemon that takes
  -- longer than this counts as none (the box is local).
  auto_timeout = 5,
  pull_timeout = 1800,          -- pulling an image
  kill_timeout = 10,            -- the in-box kill command
  -- An exec's exit code is read once its stream ended; the daemon may lag.
  exit_poll = { attempts = 50, fast = 10, fast_interval = 0.01, interval = 0.1 },
  -- An interrupt (SIGINT, SIGTERM) that comes while the daemon makes a
  -- container waits up to this many seconds for its answer, so the box is
  -- removed by the id it names rather than cut off half made (Podman then
  -- records the cut-off container seconds later, past any check for it).
  create_grace = 5,
  -- After a create cut off anyway (past that grace) the daemon may still be
  -- making the container: its removal is retried this often, this far apart.
  remove_retries = 20, remove_interval = 0.1,
  -- Removing what a frozen daemon may still make: tried every `interval`
  -- seconds until the daemon says 404 `confirmations` times in a row.
  orphan_sweep = { interval = 0.5, confirmations = 3, call_timeout = 5 },
  background_timeout = 10,      -- the reap at the first create, as a whole
  -- Where the storage driver has no size quota (overlay2 on ext4), sbx asks
  -- the daemon for the writable-layer size of every box with a disk limit,
  -- one call per daemon every disk_poll seconds, and freezes a box past its
  -- limit. A dd at full speed (0.5-1.5 GB/s into the page cache) got a
  -- median 40-80 MiB past the limit at 0.25 s, at most 190 MiB in 30 runs
  -- (at 1 s: 820 MiB, up to 1.9 GiB). The daemon walks each box's files to
  -- answer (0.2 ms per small box, about 4 us per file), so the next poll
  -- waits long enough that measuring takes at most disk_poll_load of the
  -- daemon's time: a box with many files is measured less often.
  disk_poll = 0.25,
  disk_poll_load = 0.1,
  -- Where the daemon runs on this host (a root-owned unix socket), sbx-agent
  -- goes into each box as a read-only bind of one host file made from the
  -- copy inside libsbx, instead of an archive upload per box: the box
  -- cannot replace it, and placing it costs no daemon call. A daemon that
  -- cannot bind it (in a VM: its socket is not root's here; rootless) or a
  -- bound file that does not run (SELinux's labels) falls back to the
  -- upload; so does a box that asks for CAP_SYS_ADMIN or mounts of its own.
  -- false: always upload.
  agent_bind = true,
  -- The host directory of that file (sbx-agent-<arch>-<sha256 prefix>,
  -- mode 0555, in a directory made 0700 and refused when another user owns
  -- it). nil: /var/cache/sbx/agent as root, else
  -- ${XDG_CACHE_HOME:-~/.cache}/sbx/agent.
  agent_dir = nil,
}

-- Images for the daemon-free backends (sbx.images): references as the
-- containers tools write them (docker://, docker-archive:, oci-archive:,
-- oci:, docker-daemon:, rootfs:, host), unpacked once into a cache shared
-- by boxes and by concurrent sbx processes. policy.box.pull says when a
-- registry is asked ("missing": only for what the cache lacks).
policy.images = {
  dir = nil,                    -- the cache; nil: ${XDG_CACHE_HOME:-~/.cache}/sbx/images
  -- Directories of `docker save` tarballs named NAME:TAG.tar ('/' as '_'):
  -- a bare name the cache and a daemon lack is its archive here, before
  -- its registry is asked. scripts/setup.sh writes sbx's example images
  -- to the first (the daemon's own image when one runs).
  archives = { "/var/lib/sbx/images" },
  -- Disk the cache may use, counted while an image unpacks: before an
  -- import the least recently used images no box holds make room for
  -- what it will likely take (4x its compressed layers), and an unpack
  -- that would take the cache past max_bytes stops there (once more
  -- after every image no box holds is gone), leaving nothing half made.
  max_bytes = 20 * GiB,
  -- Disk one image's layers may take together (each file its declared
  -- size, each directory 4 KiB), counted as they unpack: a gzip bomb
  -- stops here, not after.
  max_image_bytes = 16 * GiB,
  max_layer_bytes = 8 * GiB,    -- file bytes one layer may unpack to (its declared sizes, checked first)
  max_layer_entries = 1000000,  -- files, directories and links in one layer
  max_manifest_bytes = 4 * MiB, -- a manifest, index or config (the distribution server's own limit)
  -- A device node in a layer: "refuse" (the image is an error) or "skip".
  -- Unprivileged users cannot make them, and a box's /dev comes from the backend.
  device_nodes = "refuse",
  -- The platform taken from a multi-platform index: "os/arch[/variant]",
  -- nil for this machine's (linux and uname -m: amd64, arm64/v8, arm/v7, ...).
  platform = nil,
  -- Registries reached over plain HTTP (host or host:port), as Docker's
  -- insecure-registries; loopback registries always may be. Credentials
  -- are never sent over plain HTTP to any other host.
  insecure_registries = {},
  -- Where config.json is (auths, credHelpers, credsStore, as the docker
  -- CLI writes them); nil: $DOCKER_CONFIG, else ~/.docker.
  docker_config = nil,
  credential_helpers = true,    -- run docker-credential-<name> helpers that config.json names
  -- Docker Hub: the name images carry, other names for it that image names
  -- may use, where its registry answers, and the key the docker CLI files
  -- its credentials under.
  hub = {
    name = "docker.io",
    aliases = { "index.docker.io" },
    registry = "https://registry-1.docker.io",
    auth_key = "https://index.docker.io/v1/",
  },
  -- Registry calls: seconds per request (manifests, tokens: the whole
  -- transfer), to connect, and the silence a blob download may keep before
  -- it is abandoned and tried again; blob_timeout bounds one blob.
  timeout = 30,
  connect_timeout = 10,
  stall_timeout = 30,
  blob_timeout = 3600,
  -- Retries, as the AWS client's: 429, 5xx and transport failures (refused,
  -- cut, timed out), up to max_attempts attempts, full-jitter backoff
  -- random(0, min(backoff_cap, backoff_base * 2^(attempt-1))) seconds, or
  -- Retry-After up to max_retry_after. 401, 403 and 404 are answers, not
  -- retried.
  max_attempts = 5,
  backoff_base = 0.2,
  backoff_cap = 5,
  max_retry_after = 30,
  retry_statuses = { [429] = true, [500] = true, [502] = true, [503] = true, [504] = true },
  retry_transport = { ECONNREFUSED = true, closed = true, timeout = true },
  parallel = 3,                 -- layers fetched and unpacked at once
  -- Seconds to wait for another process that is unpacking the same layer,
  -- or removing images, before giving up ("busy").
  lock_timeout = 600,
  -- A bare name (no transport) is looked up in the cache, then exported
  -- from a local Docker daemon when one answers (daemon = true), then read
  -- from its archive in `archives`, then pulled from its registry as
  -- policy.box.pull allows.
  daemon = true,
}

-- sbx eval and sbx.harness.run.
policy.harness = {
  concurrency = 4,              -- tasks at once when the caller gives none
  value_max = 4096,             -- bytes of a Lua check's return value kept in a result
  slowest = 5,                  -- tasks listed as the slowest in the summary
  -- Tasks that ended in "error" (no box, a daemon failure, ...) are shown
  -- with their reason: on their progress line (stderr) and in the
  -- summary, at most error_lines of them there; each reason its first
  -- line, cut at error_chars characters (--out keeps the whole text).
  error_lines = 10,
  error_chars = 300,
  -- Box options a task file may set. Task files are data, often a
  -- stranger's: numbers from a task may only lower the policy's values and
  -- its network may only be "none"; anything outside this list makes the
  -- task an error naming the option. policy, labels, backend and
  -- transport are never taken from a task file; what reaches the host
  -- only as task_host_access allows.
  task_box_options = { "image", "workdir", "env", "memory", "cpus", "pids", "disk", "read_only", "lifetime" },
  -- What a task file may reach of the host, by name; nothing by default.
  -- A task whose box reaches the host otherwise is an error naming the
  -- option and this knob. The names:
  --   "image:host"    image = "host" (the host's root, local backend)
  --   "image:rootfs"  image = "rootfs:DIR" (a host directory as the root)
  --   "image:path"    image = "oci:DIR", "docker-archive:PATH" or
  --                   "oci-archive:PATH" (a host file or directory read)
  --   "network:host"  network = "host" (the host's network namespace)
  --   "docker_host"   another daemon; "host_config" Docker's raw HostConfig
  --                   (binds, host namespaces, devices); "layers" host
  --                   directories as the image's layers (local backend)
  -- A name listed here lets the task set that value whatever
  -- task_box_options says.
  task_host_access = {},
  -- Seconds a Lua task file's chunk may run while it loads (its functions
  -- run under their task's timeout: the task's, else exec.timeout).
  load_timeout = 10,
}

-- The scheduler: Lua code on one loop. After SIGINT or SIGTERM, Lua code
-- of the main thread (a script's chunk) that runs this many seconds without reaching a wait (where the signal is
-- delivered) gets "interrupted (signal N)" where it is, so a loop that
-- never waits does not keep sbx from closing its boxes; false: only at the
-- next wait. Code under a deadline (sbx.deadline: task functions, hooks)
-- stops at the signal at once.
policy.scheduler = {
  slice = 1,
}

-- Progress of long steps (sbx.progress): an image's export from a daemon,
-- its download from a registry, its unpacking into the cache. Lines with
-- bytes and rate go to stderr (never stdout), so scripts and pipes that
-- read stdout are unaffected.
policy.progress = {
  -- "auto": on a terminal from the start of a step; elsewhere only once a
  -- step has run `after` seconds (a quick one says nothing). "always" (as
  -- on a terminal) or "never".
  mode = "auto",
  after = 10,                   -- seconds a step runs before it speaks (not on a terminal)
  interval = 1,                 -- seconds between a step's lines on a terminal
  plain_interval = 10,          -- and elsewhere (logs)
  -- The line for a step: p = { what, bytes, total (or nil), count, of (or
  -- nil), seconds, rate (bytes/s or nil), done }.
  format = function(p)
    local size = util.size
    local parts = { size(p.bytes) }
    if p.total and p.total > 0 then
      parts[1] = string.format("%s of %s (%d%%)", size(p.bytes), size(p.total), math.floor(100 * math.min(1, p.bytes / p.total)))
    end
    if p.of then parts[#parts + 1] = string.format("%d/%d layers", p.count, p.of) end
    local rate = p.rate and (size(p.rate) .. "/s") or "-"
    if p.done then
      return string.format("sbx: %s: done, %s in %.1f s (%s)", p.what, table.concat(parts, ", "), p.seconds, rate)
    end
    return string.format("sbx: %s: %s at %s, %.0f s", p.what, table.concat(parts, ", "), rate, p.seconds)
  end,
}

-- Grading (sbx.harness, lua/sbx/grade.lua; docs/grading.md): where a
-- task's check runs, and what it may carry over from its run.
policy.grade = {
  -- Where a check runs when the task says nothing (task check_box, or
  -- `sbx eval --check-box`): "fresh", a new box from the task's image
  -- with only the task's outputs unpacked into it; "same", the run's box
  -- once every process in it is killed, under sbx's own busybox (local
  -- backend only).
  check_box = "fresh",
  -- Bytes of the outputs' tar archive read from the run box (its declared
  -- sizes count too); more makes the task fail.
  max_output_bytes = 64 * 1024 * 1024,
  -- Entries (files, directories, links) in a task's outputs.
  max_output_entries = 100000,
  -- Bytes of one path or link target in a task's outputs.
  max_output_path = 4096,
  -- Seconds for packing the outputs in the run box and unpacking them in
  -- the check box, each (the task's timeout when it is shorter).
  transfer_timeout = 120,
}

-- Warm pools (sbx.pool): boxes of one spec made ahead, so a taker gets one
-- at once. sbx.pool{} may override every knob here but size for its pool.
policy.pool = {
  -- Boxes `sbx eval` (also --pool N) and `sbx mcp` keep ready for boxes of
  -- their default spec; 0: no pool, every task or session makes its own.
  -- A task whose box options differ from the pool's gets a fresh box.
  size = 0,
  -- Creations in flight per pool (more only while more takers wait with
  -- nothing ready: one each); one at a time while creations fail.
  create_concurrency = 4,
  -- After the k-th failed creation in a row the next one waits
  -- min(max, base * 2^(k-1)) seconds: a failing image never loops hot.
  backoff = { base = 0.5, max = 30 },
  -- Seconds a ready box may wait before it is replaced (nil: no limit but
  -- the lifetime rule below).
  max_age = nil,
  -- A ready box is replaced once less than this part of its lifetime
  -- (policy.box.lifetime, counted from its creation) is left, so a taker
  -- always gets at least that much of it: 0.25 of 24 h is 6 h.
  lifetime_margin = 0.25,
}

-- Free for a policy's own data (a log path, a deny list): sbx never reads it.
policy.user = {}

-- Call traces (sbx.trace): every box call as one JSON line.
policy.trace = {
  path = nil,                   -- a file: record from the first sbx.box{} on (also SBX_TRACE=path)
  -- Env names matching any of these Lua patterns have their values recorded
  -- as "[redacted]". Names are upper-cased first, and so are the patterns'
  -- letters (not their %-classes: %w stays %w). %f[%w]X%f[%W] matches X as
  -- a word part between underscores: GITHUB_PAT, not PATH.
  redact = {
    "KEY", "TOKEN", "SECRET", "PASS", "CRED", "COOKIE", "SESSION", "PRIVATE", "DSN", "CONN%a*_STR",
    "AUTH%f[%W]", "AUTHORI[SZ]",  -- OAUTH, BASIC_AUTH, AUTHORIZATION; not GIT_AUTHOR_NAME
    "%f[%w]PAT%f[%W]",            -- GITHUB_PAT, PAT_X; not PATH
    "_PWD%f[%W]", "^PWD_",        -- DB_PWD, PWD_X; not the shell's PWD and OLDPWD
  },
  -- A value redacted by its name is also replaced wherever it appears in
  -- any record (output, commands, file data, messages) when it has at
  -- least this many bytes; a shorter one would blank out ordinary text.
  min_value_bytes = 8,
  url_credentials = true,       -- scheme://user:password@host anywhere: the userinfo is "[redacted]", the password replaced everywhere
  secrets = {},                 -- literal strings replaced by "[redacted]" anywhere in a record (any length)
  record_stdin = false,         -- record exec stdin and write_file data (else only their size)
}

-- Hooks and budgets: what a policy decides, not only what it says ---------------

-- policy.hooks.before_exec(box, req, pol) runs before every user command
-- (box:exec, box:spawn, tool calls, harness phases, session commands; never
-- sbx's own helpers such as file transfer or kill). req is
--   { command, argv, env, cwd, user, timeout, stdin_bytes, background, source }
-- with command as the caller gave it (a string or an argv table), env a
-- table NAME = value and source one of "exec", "spawn", "tool", "harness",
-- "session". Return nothing to run req as is, a (changed) req table to run
-- that instead (a new command is turned into argv again), or false and a
-- message to refuse: the caller gets nil, message, "denied".
-- policy.hooks.after_exec(box, req, result, pol) sees every result (for a
-- background process: its process view when it ends) and returns nothing to
-- keep it or a table to replace it (ignored for background processes).
-- Each hook runs under a deadline (sbx.deadline) of timeout seconds, and
-- before_exec also within the command's own timeout, which its time is
-- taken from: a hook that never returns (a loop, a wait) ends there and
-- the command returns nil, message, "hook_timeout" without running.
policy.hooks = {
  before_exec = nil,
  after_exec = nil,
  timeout = 10,
}

-- The message of a command whose hook did not return in time.
function policy.format_hook_timeout(which, seconds)
  return string.format("hooks.%s did not return within %g s (policy hooks.timeout, and the command's timeout)", which, seconds)
end

-- Per-box budgets (nil: unlimited). A refused command counts against none.
--   commands: user commands started; seconds: their wall time summed,
--   background processes' as they run, and never less than the CPU time of
--   every process in the box where the backend measures it (Docker, local
--   with a cpu cgroup); the rest caps the next command's timeout;
--   output_bytes: bytes produced (stdout + stderr, counted even when not
--   kept), background processes' as they arrive. box.usage shows the
--   settled counters (and cpu_seconds). Past a budget a command returns nil,
--   message, "budget_exceeded"; a box past its seconds or output_bytes
--   budget while commands run has them all stopped (see budget_poll).
policy.budget = {
  commands = nil,
  seconds = nil,
  output_bytes = nil,
}
-- Seconds between a budget watcher's looks at a box with a seconds or
-- output_bytes budget (one stats call per look on Docker).
policy.budget_poll = 1

local BUDGET_UNITS = { commands = "commands", seconds = "s", output_bytes = "bytes of output" }

-- The message of a command refused by a budget.
function policy.format_budget_exceeded(which, used, limit)
  local unit = BUDGET_UNITS[which] or which
  return string.format("the box's %s budget is used up: %s of %s %s used",
    which:gsub("_", " "), (math.type(used) == "float" and string.format("%.1f", used) or tostring(used)),
    tostring(limit), unit)
end

-- The message of a command on a box that wrote past policy.box.disk: the
-- box is frozen (paused), its running commands fail and so does every later
-- one. used and limit are bytes.
function policy.format_disk_exceeded(used, limit)
  return string.format("the box wrote %.0f MB, past its disk limit of %.0f MB: it is frozen and runs no more commands; close it",
    used / 1e6, limit / 1e6)
end

-- The message of a command with an argument (which: "command" for a
-- command string, "argument N", "env NAME") longer than exec.max_arg_bytes.
function policy.format_arg_too_long(which, bytes, pol)
  pol = live(pol)
  return string.format("%s is %d bytes; the box runs no command with an argument longer than %d bytes (policy exec.max_arg_bytes). Put long text in a file first (write_file, or a heredoc in several commands) or pass it on stdin.",
    which == "command" and "the command" or which, bytes, pol.exec.max_arg_bytes)
end

-- The message of a command refused by before_exec without one of its own.
policy.denied_message = "the policy does not allow this command"

-- Process names: p1, p2, ...
function policy.process_name(box, n, pol)
  return "p" .. n
end

-- The shell argv for a command string.
function policy.shell_argv(shell, command, pol)
  if type(shell) == "table" then
    local argv = { table.unpack(shell) }
    argv[#argv + 1] = command
    return argv
  elseif shell == "bash" then
    return { "bash", "-c", command }
  elseif shell == "sh" then
    return { "sh", "-c", command }
  end
  -- auto: one sh that execs bash when it exists; costs one execve.
  return { "sh", "-c", 'if command -v bash >/dev/null 2>&1; then exec bash -c "$1"; fi; exec sh -c "$1"', "sh", command }
end

-- What the model reads ------------------------------------------------------

policy.output = {
  head_chars = 2000,            -- shown from the start of the output
  tail_chars = 6000,            -- shown from the end
}

local function char_len(s) return utf8.len(s) or #s end

local function first_chars(s, n)
  if char_len(s) <= n then return s end
  return s:sub(1, utf8.offset(s, n + 1) - 1)
end

local function last_chars(s, n)
  local len = char_len(s)
  if len <= n then return s end
  if n == 0 then return "" end
  return s:sub(utf8.offset(s, len - n + 1))
end
policy.first_chars, policy.last_chars = first_chars, last_chars

-- What stands in for the bytes a capture left out, inside result.stdout,
-- result.stderr and result.output (the program's view, not the model's).
function policy.omitted_marker(part, pol)
  return string.format("\n...[%d bytes omitted]...\n", part.omitted)
end

-- The line that says how many bytes of a command's output were not UTF-8
-- text and were replaced (by U+FFFD) in what the model reads; the result
-- itself keeps them.
function policy.format_replaced(n, pol)
  return string.format("[%d %s of this output %s not UTF-8 text; each run of them is shown as \u{FFFD}]",
    n, n == 1 and "byte" or "bytes", n == 1 and "is" or "are")
end

-- Head and tail with a line that says how much is missing, in bytes, so the
-- model knows the size of what it did not see (and can read it from a file).
-- part: { head, tail, omitted, bytes } as in result.parts (the command's
-- bytes); invalid UTF-8 is replaced here, and a last line says how much.
function policy.format_output(part, pol)
  pol = live(pol)
  local limits = pol.output
  local model_text = util.model_text
  local head, rh = model_text(part.head)
  local tail, rt = model_text(part.tail)
  local omitted = part.omitted
  local text
  if omitted == 0 then
    -- Everything was captured; cut only for the model's view.
    local all = head .. tail
    if char_len(all) <= limits.head_chars + limits.tail_chars then
      text = all
    else
      head = first_chars(all, limits.head_chars)
      tail = last_chars(all, limits.tail_chars)
      omitted = #all - #head - #tail
    end
  else
    local h = first_chars(head, limits.head_chars)
    local cut_head = #head - #h
    local t = last_chars(tail, limits.tail_chars)
    omitted = omitted + cut_head + (#tail - #t)
    head, tail = h, t
  end
  text = text or string.format("%s\n...[%d bytes omitted; %d bytes in all]...\n%s", head, omitted, part.bytes, tail)
  if rh + rt > 0 then
    text = text .. (text:sub(-1) == "\n" and "" or "\n") .. pol.format_replaced(rh + rt, pol)
  end
  return text
end

-- The line for a command that ran past its timeout. "killed" only when the
-- kill was confirmed (r.kill_confirmed: its processes are gone); otherwise
-- the command may still run, and the line says so.
function policy.format_timed_out(r, pol)
  if r.kill_confirmed ~= false then
    return string.format("[Timed out after %gs; the command and its child processes were killed]", r.timeout)
  end
  return string.format("[Timed out after %gs; the kill could not be confirmed: the command may still be running%s]",
    r.timeout, r.kill_error and (" (" .. tostring(r.kill_error) .. ")") or "")
end

-- The text for one command result.
function policy.format_result(r, pol)
  pol = live(pol)
  local out = pol.format_output(r.parts.output, pol)
  local lines = {}
  if r.timed_out then
    lines[#lines + 1] = pol.format_timed_out(r, pol)
  elseif r.error then
    lines[#lines + 1] = "[Error: " .. r.error .. "]"
  elseif r.exit_code ~= 0 then
    lines[#lines + 1] = string.format("[Exit code: %s]", tostring(r.exit_code))
  end
  if r.oom_killed then lines[#lines + 1] = pol.format_oom(r, pol) end
  if r.session_reset then
    lines[#lines + 1] = "[The session's state (directory, variables, functions) is as it was before this command]"
  end
  if r.box_restarted then
    lines[#lines + 1] = "[The box was restarted to stop runaway processes; files are kept, processes are gone]"
  end
  if out == "" then
    if #lines == 0 then return "(no output)" end
    lines[#lines + 1] = "(no output)"
  else
    lines[#lines + 1] = out
  end
  return table.concat(lines, "\n")
end

-- The message of a command that could not start ("exec_failed"), where the
-- transport reports the failed step itself (sbx-agent, the exec start
-- check): info = { stage = "cwd" | "user" | "exec" | "stdio", reason,
-- program, cwd, user }.
function policy.format_exec_failed(info, pol)
  if info.stage == "cwd" then
    return string.format("the command could not start: cannot change to the directory %s: %s", tostring(info.cwd), info.reason)
  elseif info.stage == "user" then
    return string.format("the command could not start: cannot run as user %s: %s", tostring(info.user), info.reason)
  elseif info.stage == "stdio" then
    return "the command could not start: cannot set up its input and output: " .. tostring(info.reason)
  end
  return string.format("the command could not start: cannot run %s: %s", tostring(info.program), info.reason)
end

-- The line for a command the OOM killer ended (r.oom_killed; r.memory_limit
-- in bytes when the box could tell).
function policy.format_oom(r, pol)
  local limit = r.memory_limit and string.format(" (%s)", r.memory_limit % MiB == 0
    and string.format("%d MiB", r.memory_limit // MiB) or string.format("%d bytes", r.memory_limit)) or ""
  return "[Out of memory: the command was killed for using more than the box's memory limit" .. limit ..
    "; use less memory, for example smaller inputs or fewer processes at once]"
end

function policy.format_started(p, pol)
  return string.format("Started background process '%s'.\nCommand: %s\nUse list_processes to check its status, process_output to read its output, kill_process to stop it.",
    p.name, p.command)
end

function policy.status_text(p, pol)
  if p.status == "running" then return "running" end
  if p.status == "killed" then return "killed" end
  if p.status == "failed" then return "failed: " .. tostring(p.error) end
  return "exited " .. tostring(p.exit_code) .. (p.oom_killed and " (out of memory)" or "")
end

function policy.format_processes(list, name, pol)
  pol = live(pol)
  if #list == 0 then return "No background processes have been started." end
  if name then
    for _, p in ipairs(list) do
      if p.name == name then
        return string.format("Process: %s\nCommand: %s\nStatus: %s\nRunning for: %.1fs\nOutput: %d bytes",
          p.name, p.command, pol.status_text(p, pol), p.elapsed, p.output_bytes)
      end
    end
    local names = {}
    for _, p in ipairs(list) do names[#names + 1] = p.name end
    return string.format("Process '%s' not found. Available: %s", name, table.concat(names, ", "))
  end
  local rows = { string.format("%-8s %-12s %-9s %-10s %s", "NAME", "STATUS", "ELAPSED", "OUTPUT", "COMMAND") }
  for _, p in ipairs(list) do
    local cmd = p.command
    if char_len(cmd) > 60 then cmd = first_chars(cmd, 60) .. "..." end
    rows[#rows + 1] = string.format("%-8s %-12s %-9s %-10s %s", p.name, pol.status_text(p, pol),
      string.format("%.1fs", p.elapsed), p.output_bytes .. "B", cmd)
  end
  return table.concat(rows, "\n")
end

function policy.format_process_output(o, pol)
  pol = live(pol)
  local lines = {}
  if o.skipped > 0 then
    lines[#lines + 1] = string.format("[%d bytes before offset %d are no longer kept]", o.skipped, o.offset + o.skipped)
  end
  lines[#lines + 1] = o.text ~= "" and o.text or "(no new output)"
  if (o.replaced or 0) > 0 then lines[#lines + 1] = pol.format_replaced(o.replaced, pol) end
  lines[#lines + 1] = string.format("[%s; next offset %d of %d bytes]", pol.status_text(o.process, pol), o.next_offset, o.total)
  return table.concat(lines, "\n")
end

-- Reading the log of a finished process that retain_bytes freed.
function policy.format_evicted(p, pol)
  pol = live(pol)
  return string.format("the output of process '%s' (%s, %d bytes) is no longer kept: a box keeps at most %d bytes of logs of finished processes (policy.background.retain_bytes) and frees the oldest first. To keep a command's output, redirect it to a file in the box (for example: command > /tmp/%s.log 2>&1) and read that file.",
    p.name, pol.status_text(p, pol), p.output_bytes, pol.background.retain_bytes, p.name)
end

function policy.format_killed(p, pol)
  pol = live(pol)
  return string.format("Process '%s' stopped (%s).", p.name, pol.status_text(p, pol))
end

-- How a failed tool call reads to the model: it says what to change.
function policy.format_tool_error(msg, pol)
  return "Error: " .. msg
end

-- The tools handed to a model --------------------------------------------------
-- A tool: { description, parameters = { { name, json schema, required = },
-- ... }, run = function(box, args, ctx, pol) (optional; the built-in
-- handler of that name otherwise), name = (optional; the key) }. A
-- description (the tool's or a parameter's) may be a function of the live
-- policy, so the numbers a model reads are the policy's own. false removes
-- a tool.

policy.tools = {
  bash = {
    description = "Run a shell command in the sandbox (bash when the image has it, else sh) and return its output. stdin is closed; nothing interactive works. Long output keeps its beginning and end. A command that runs past its timeout is killed with all its child processes. Set run_in_background=true for servers and other long-running processes, then use process_output and kill_process.",
    parameters = {
      { "command", { type = "string", description = "The shell command to run." }, required = true },
      { "timeout", { type = "integer", minimum = 1, description = function(pol)
        return string.format("Seconds before the command is killed (default %s, at most %s). Ignored with run_in_background.",
          tostring(pol.exec.timeout), tostring(pol.exec.max_timeout))
      end } },
      { "run_in_background", { type = "boolean", description = "Start the command and return at once with a process name instead of waiting for it." } },
      { "name", { type = "string", description = "Name for a background process (letters, digits, '_', '.', '-'); default p1, p2, ..." } },
    },
  },
  list_processes = {
    description = "List background processes with their status, elapsed time and output size, or show one process by name.",
    parameters = {
      { "name", { type = "string", description = "A process name; omit to list all." } },
    },
  },
  process_output = {
    description = "Read the output (stdout and stderr interleaved) of a background process. Pass the returned next offset to read only what is new.",
    parameters = {
      { "name", { type = "string", description = "The process name." }, required = true },
      { "offset", { type = "integer", minimum = 0, description = "Byte offset to read from (default 0)." } },
      { "max_bytes", { type = "integer", minimum = 1, description = function(pol)
        return string.format("Most bytes to return (default %d).", pol.background.read_max)
      end } },
    },
  },
  kill_process = {
    description = "Stop a background process and all its child processes.",
    parameters = {
      { "name", { type = "string", description = "The process name." }, required = true },
      { "signal", { type = "string", enum = { "TERM", "KILL", "INT", "HUP" }, description = "Signal to send (default KILL)." } },
    },
  },
}
policy.tool_order = { "bash", "list_processes", "process_output", "kill_process" }


-- The Fargate backend (sbx.box{ backend = "fargate", subnets = {...} }).
-- Box options of the same names override these per box.
policy.fargate = {
  cluster = "sbx",                      -- created when missing
  region = nil,                         -- nil: the AWS region chain (AWS_REGION, AWS_DEFAULT_REGION, profile)
  profile = nil,                        -- nil: AWS_PROFILE / default
  credentials = nil,                    -- { access_key=, secret_key=, session_token= }; nil: the chain
  endpoint_url = nil,                   -- one URL for ECS and IAM (a stand-in); nil: AWS_ENDPOINT_URL_* or AWS
  -- Task size in ECS's units (a valid Fargate pair). The box options
  -- memory (bytes) and cpus become a container limit within it where ECS
  -- can set one (box.limits says what was enforced).
  task_cpu = "1024",                    -- CPU units
  task_memory = "2048",                 -- MiB
  container = "sbx",                    -- the container name in the task definition
  family_prefix = "sbx-",               -- task definitions are shared by content: <prefix><hash>
  deregister_task_definitions = true,   -- when this process closes the last box of one
  assign_public_ip = "ENABLED",         -- the exec agent must reach the SSM endpoints
  subnets = nil, security_groups = nil, -- required per box or here
  -- IAM: give ARNs to skip role management, or names to have them ensured.
  task_role_arn = nil, execution_role_arn = nil,
  task_role = "sbx-task-role", execution_role = "sbx-execution-role",
  trust_policy = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ecs-tasks.amazonaws.com"},"Action":"sts:AssumeRole"}]}',
  exec_policy_name = "sbx-ecs-exec",
  exec_policy = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["ssmmessages:CreateControlChannel","ssmmessages:CreateDataChannel","ssmmessages:OpenControlChannel","ssmmessages:OpenDataChannel"],"Resource":"*"}]}',
  execution_policy_arn = "arn:aws:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy",
  iam_propagation = 30,                 -- seconds RunTask is retried while a new role propagates
  iam_retry_interval = 1,               -- seconds between those retries
  start_timeout = 600,                  -- seconds from RunTask to a running exec agent
  poll_interval = 0.5,                  -- seconds between DescribeTasks polls (one call for all waiting boxes)
  exec_connect_timeout = 30,            -- seconds ExecuteCommand is retried on TargetNotConnectedException
  exec_connect_backoff = { base = 0.2, max = 2 },  -- seconds between those tries, doubling
  -- Exec transport: a command's timeout counts from its ready marker (the
  -- SSM agent reads a new session's PTY only after 1 s: amazon-ssm-agent,
  -- agent/session/shell/shell.go); until the marker comes, this many
  -- seconds from ExecuteCommand, then the command is timed out.
  command_start_timeout = 30,
  ready_poll = 0.05,                    -- seconds between looks for the marker while waiting for it
  stop_reason = "sbx: box closed",
  -- A command whose data channel drops is killed in the task, by a new
  -- session; tried this many times, this many seconds apart.
  drop_kill_attempts = 3, drop_kill_delay = 1,
  -- Command-line prefixes of ECS Exec's own processes in the container:
  -- ECS bind-mounts the SSM agent at /ecs-execute-command-<uuid>/ (older
  -- platforms: /managed-agents/execute-command/) and runs it beside the
  -- task's processes. Ending a box's processes (a lost agent, a spent
  -- budget) spares these: without them no command reaches the box again.
  exec_agent_paths = { "/ecs-execute-command-", "/managed-agents/" },
  started_by = "sbx",                   -- RunTask startedBy; the reaper lists tasks by it
  -- The SSM data channel.
  ssm = {
    connect_timeout = 30,
    client_version = "1.2.0.0",
    terminal = { cols = 300, rows = 100 },  -- what the reference plugin sends without a TTY
    input_chunk = 1024,                 -- stdin bytes per message, as the plugin reads them
    window = 512,                       -- unacked input messages before send waits
    reorder_capacity = 10000,           -- early agent messages kept for in-order delivery
    initial_rtt = 0.1, initial_rto = 0.2, max_rto = 1.0, min_rto_var = 0.01,
    rtt_alpha = 0.125, rtt_beta = 0.25,
    resend_interval = 0.1,              -- how often the oldest unacked message is looked at
    max_resends = 3000,                 -- of one message, then the session fails (about 5 min)
    ping_interval = 300,
    ping_payload = "keepalive",
    -- ECS Exec ends a session without client input for 20 minutes (a
    -- websocket ping is not input); a session that sent nothing for this
    -- many seconds sends the terminal size again. nil: never.
    keepalive_interval = 300,
    max_message = 1024 * KiB,
    max_queue = 4 * MiB,
    kms_message = "sbx does not support KMS-encrypted ECS Exec sessions: remove kmsKeyId from the cluster's executeCommandConfiguration",
  },
}

-- The local backend (sbx.box{ backend = "local", image = "rootfs:DIR" |
-- "host" }): a box is Linux namespaces (user, pid, mount, network, ipc,
-- uts, cgroup) around an image's root filesystem, started by bubblewrap
-- with sbx-agent as its first process; no daemon. "local" is a Lua keyword:
-- a policy writes this block as ["local"] = { ... }.
policy["local"] = {
  bwrap = "bwrap",              -- bubblewrap (Debian's package); a name is looked up in PATH
  -- box.backend = "auto" picks this backend, even where a Docker daemon
  -- answers, when it isolates fully here (user namespaces, a /proc of the
  -- box's own, cgroups for memory, pids and cpu) and has the box's image
  -- without a registry or daemon (in sbx's image cache, an archive in
  -- images.archives, a rootfs); false: auto picks Docker whenever a daemon
  -- answers.
  auto = true,
  -- Debian's uidmap, for a user whose /etc/subuid grants a range of ids.
  newuidmap = "newuidmap", newgidmap = "newgidmap",
  -- Where boxes keep what the host must see (owner records, the
  -- mountpoints of their writable layers, sbx-agent and sbx-launch).
  -- nil: /run/sbx/local as root, else $XDG_RUNTIME_DIR/sbx/local or
  -- /tmp/sbx-<uid>/local (made 0700, refused when another user owns it).
  state_dir = nil,
  -- Where a box's writable layer lives: "tmpfs" (host memory: a tmpfs of
  -- policy.box.disk bytes in the box's own mount namespace, counted against
  -- the box's memory cgroup where it has one), "disk" (a directory under
  -- disk_dir on the host's disk, measured every disk_poll seconds; past
  -- policy.box.disk the box is stopped and its commands end with
  -- "disk_exceeded"), or "auto": the tmpfs where the box has a memory
  -- cgroup (it counts the tmpfs's pages: as root), else disk (a user
  -- without a delegated cgroup: nothing would count the tmpfs, and a box
  -- could pin host memory up to its disk limit).
  layer = "auto",
  -- The directory of "disk" layers; nil: /var/lib/sbx/local as root, else
  -- $XDG_CACHE_HOME/sbx/local or ~/.cache/sbx/local (made 0700).
  disk_dir = nil,
  -- Seconds between measurements of the disk layers (one walk of each
  -- box's layer by sbx-launch --usage inside the box's user namespace);
  -- a walk that took t waits at least t / disk_poll_load - t, so measuring
  -- takes at most that share of the time.
  disk_poll = 0.25,
  disk_poll_load = 0.1,
  -- Ids mapped into a box. As root, box ids 0..ids-1 are the same host ids
  -- (image files keep their owners, apt's _apt works); a user's own id is
  -- the box's root and, where /etc/subuid grants a range, ids 1..ids-1 come
  -- from it (newuidmap); without one the box has that single id.
  ids = 65536,
  -- Memory, pids and CPU limits through cgroups where sbx may write them
  -- (v2: a delegated directory with the controllers enabled; v1: the
  -- memory, pids and cpu hierarchies under sbx's own groups); rlimits
  -- where it may not. false: rlimits only.
  cgroups = true,
  -- A delegated cgroup v2 directory to make box groups in (its
  -- cgroup.subtree_control lists memory, pids and cpu); nil: sbx's own.
  cgroup_root = nil,
  -- What root in a box holds (Docker's default set), before the box's
  -- cap_drop and cap_add; capabilities count in the box's user namespace.
  capabilities = { "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
    "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE" },
  -- The seccomp filter (libseccomp, loaded by bubblewrap before the agent
  -- runs), in the spirit of Docker's default profile: these fail with
  -- EPERM, enosys with ENOSYS (clone3: libc falls back to clone, whose
  -- flags the filter reads), and deny_namespaces fails clone() with a
  -- CLONE_NEW* flag. ptrace stays allowed, as on Docker with a kernel >=
  -- 4.8: the box's own processes only. false: no filter.
  seccomp = {
    deny = {
      "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsconfig", "fsmount",
      "fspick", "move_mount", "open_tree", "mount_setattr", "kexec_load", "kexec_file_load",
      "init_module", "finit_module", "delete_module", "bpf", "perf_event_open", "keyctl", "add_key",
      "request_key", "swapon", "swapoff", "reboot", "acct", "quotactl", "settimeofday",
      "clock_settime", "clock_adjtime", "adjtimex", "syslog", "iopl", "ioperm", "uselib",
      "userfaultfd", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "kcmp",
      "io_uring_setup", "io_uring_enter", "io_uring_register", "mbind", "set_mempolicy",
      "migrate_pages", "move_pages", "vhangup", "nfsservctl", "sysfs", "ustat", "_sysctl",
    },
    enosys = { "clone3" },
    deny_namespaces = true,
  },
  -- image = "host": the host's files read-only, with an empty directory of
  -- the box's own writable layer over each of these (a daemon's socket
  -- under /run stays out of reach).
  host_masks = { "/run", "/tmp", "/var/tmp", "/var/run" },
  -- A static busybox on the host, bound read-only into every box at
  -- /dev/busybox-sbx: the shell and tools of a check that runs in the
  -- run's own box (policy.grade.check_box = "same"), which the task can
  -- neither replace (no mount in a box) nor preload into (static).
  -- nil, or a path that is not there: no such checks on this host.
  busybox = "/bin/busybox",
  -- PATH for commands that set none (Docker's default).
  path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  -- Seconds close() waits for a box's processes to be gone and its cgroups
  -- removed; what is left then goes to `sbx reap --backend local`.
  destroy_wait = 2,
  -- Record-less box directories (a create cut short) older than this many
  -- seconds are leftovers for the reaper.
  stale_after = 60,
  -- The box's /proc. "mount": a proc of its own (the box's PID namespace),
  -- else the box is refused. Inside a container whose /proc is masked
  -- (Docker's default: /proc/kcore, /proc/sys and others are covered),
  -- the kernel refuses a new proc mount to a user namespace. "auto": a
  -- proc of its own where the kernel allows one, else "copy". "copy": a
  -- read-only /proc of copies of proc_files, taken at the box's start; the
  -- box keeps its PID namespace and the agent sees the container's /proc
  -- (docs/local-in-containers.md says what a box gives up).
  proc = "auto",
  proc_files = { "cpuinfo", "meminfo", "stat", "uptime", "loadavg", "version", "filesystems",
    "cmdline", "devices", "diskstats", "partitions", "swaps", "zoneinfo", "vmstat" },
  -- One line each where the local backend cannot isolate at all.
  messages = {
    proc_masked = "the local backend cannot mount a /proc for its box here (a container whose /proc is " ..
      "masked): start the container with --security-opt systempaths=unconfined, or set " ..
      "policy[\"local\"].proc = \"copy\" (a /proc of copies; docs/local-in-containers.md)",
    userns_blocked = "the local backend needs user namespaces, which this system refuses (%s): in a " ..
      "container, start it with --security-opt seccomp=unconfined --security-opt apparmor=unconfined " ..
      "(Docker's default seccomp profile blocks them); on a host, allow unprivileged user namespaces " ..
      "(sysctl kernel.unprivileged_userns_clone=1, or kernel.apparmor_restrict_unprivileged_userns=0); " ..
      "or use backend = \"docker\"",
  },
  -- sbx-launch processes started ahead of the next box (each in the
  -- cgroups of its future box, waiting): under cgroup v1 joining a cgroup
  -- after a quiet spell waits for an RCU grace period (milliseconds), which
  -- a spare pays while nobody waits. 0: every box starts its own.
  spares = 1,
}

-- The Kubernetes backend (sbx.box{ backend = "kubernetes" }): a box is a
-- pod. Box options of the same names override these per box.
policy.kubernetes = {
  -- Where the configuration comes from, as kubectl finds it: nil reads
  -- KUBECONFIG (files merged in order), else ~/.kube/config; a path ("a:b"
  -- or a list) here is read instead (a missing file is then an error).
  kubeconfig = nil,
  context = nil,                        -- nil: the kubeconfig's current-context
  namespace = nil,                      -- nil: the context's, else "default"
  -- In a pod: true uses its service account (KUBERNETES_SERVICE_HOST and
  -- the token, re-read as it rotates); "auto" does when no kubeconfig file
  -- exists; false never does.
  in_cluster = "auto",
  service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount",
  container = "box",                    -- the pod's container name
  name_prefix = "sbx-",                 -- pod (and NetworkPolicy) names: <prefix><12 hex digits>
  start_timeout = 300,                  -- seconds from create to a running container (image pull included)
  -- An Unschedulable pod fails the box at once with the scheduler's
  -- message (a node selector, taint or affinity no node meets); false
  -- waits (a cluster autoscaler may add a node) until start_timeout.
  fail_unschedulable = true,
  -- Scheduler messages that mean "full for now", not "never": a pod whose
  -- message holds one of these waits until start_timeout (the box says
  -- what it waits for) and then fails with the scheduler's message. Plain
  -- substrings of the message ("0/3 nodes are available: 1 Insufficient
  -- cpu, 2 node(s) didn't match Pod's node affinity/selector.").
  wait_unschedulable = { "Insufficient cpu", "Insufficient memory", "Insufficient ephemeral-storage",
    "Too many pods" },
  -- on_wait(box_name, message): called when a pod starts waiting for a
  -- reason (and when the reason changes); nil: nothing is said until the
  -- box runs or start_timeout passes.
  on_wait = nil,
  watch_timeout = 300,                  -- seconds a readiness watch asks the server to keep open (then it is renewed)
  request_timeout = 30,                 -- seconds per API call
  connect_timeout = 10,
  retries = 5,                          -- 429, 5xx and refused connections, with backoff
  backoff = { base = 0.2, max = 5, max_retry_after = 30 },  -- seconds; Retry-After honoured up to the last
  token_reread = 60,                    -- seconds a token file (service account) is trusted before it is read again
  credential_slack = 10,                -- an exec plugin's credential is fetched again this long before it expires
  exec_plugin_timeout = 60,             -- seconds an exec credential plugin may run
  -- The exec channel protocols offered, in order (the server picks the
  -- first it speaks): v5 can end stdin, v4 cannot (see the backend).
  exec_protocols = { "v5.channel.k8s.io", "v4.channel.k8s.io" },
  exec_connect_timeout = 30,            -- seconds to open one exec stream
  exec_max_message = 16 * MiB,          -- the largest websocket message taken from the server
  -- The largest websocket message sbx sends on an exec stream, as one frame
  -- (core.ws never fragments): the exec server reads each frame as a
  -- message and its first byte as the channel (docs/kubernetes.md). Stdin,
  -- the agent's loader and agent frames are split to fit.
  exec_max_send = 64 * KiB,
  -- The longest exec URL sbx sends (libwebsockets cuts a request line near
  -- 2 kB); commands travel on stdin, so the URL is a short boot line.
  exec_max_url = 2000,
  stdin_chunk = 64 * KiB - 1,           -- stdin bytes per websocket message (exec_max_send less the channel byte)
  kill_timeout = 10,                    -- seconds the in-box kill may take
  -- The pod: resources are the box's memory, cpus and disk as limits;
  -- requests = nil asks for request_fraction of each limit (Burstable QoS:
  -- a node holds 1/fraction times as many boxes as its allocatable
  -- says); request_fraction = 1 makes requests equal the limits
  -- (Guaranteed QoS); or give them, e.g. { cpu = "250m", memory = "256Mi" }.
  requests = nil,
  request_fraction = 0.25,
  -- network = "none": after the pod runs, sbx tries from inside the box to
  -- connect to the API server's address (and the node's kubelet port);
  -- box.limits.network says "verified" or "not enforced by this cluster".
  -- "refuse" fails (and deletes) a box whose check connects; "note" keeps
  -- it and says so; false does not check.
  network_check = "note",
  network_check_timeout = 3,            -- seconds each connection attempt may take
  -- Whether a box's pod is gone (deleted, evicted, past its lifetime) is
  -- looked at (a GET of the pod) when an exec stream ends without an exit
  -- status, with a SIGKILL nobody sent, or an exec is refused.
  gone_check_timeout = 10,              -- seconds for that look
  -- While the pod still looks alive then: seconds to keep looking, every
  -- gone_poll, before the end counts as the command's own (the kubelet
  -- kills the containers and posts the status about together).
  gone_grace = 2,
  gone_poll = 0.25,
  runtime_class = nil,                  -- runtimeClassName (e.g. "gvisor", "kata")
  node_selector = nil,                  -- { ["kubernetes.io/arch"] = "amd64" }
  tolerations = nil,                    -- a list of toleration objects
  image_pull_secrets = nil,             -- a list of Secret names
  service_account = nil,                -- serviceAccountName; its token is never mounted
  run_as_user = nil,                    -- securityContext.runAsUser; nil: the image's user
  image_pull_policy = nil,              -- nil: from box.pull (missing: IfNotPresent, always, never)
  annotations = {},                     -- extra pod annotations
}

-- AWS service calls (sbx.aws.client), retried as botocore's "standard" mode.
-- A client's own options (retry = {...}, timeout =) win over these.
policy.aws = {
  max_attempts = 5,             -- attempts per call, the first one included
  backoff_base = 0.1,           -- seconds; delay = random(0, min(cap, base * 2^(attempt-1)))
  backoff_cap = 5,              -- seconds
  timeout = 30,                 -- seconds per attempt, the whole transfer
  connect_timeout = 10,         -- seconds per attempt to connect
  -- Temporary credentials are fetched again when this many seconds or fewer
  -- remain; if that fails they are still used until `refresh_mandatory`.
  -- The credential endpoints, as the SDKs default them: ECS container
  -- credentials (timeout per try, tries) and IMDSv2 (timeout, unless
  -- AWS_METADATA_SERVICE_TIMEOUT says; the session token's lifetime).
  container_timeout = 2, container_attempts = 3,
  imds_timeout = 1, imds_token_ttl = 21600,
  refresh_advisory = 15 * 60,
  refresh_mandatory = 10 * 60,
  -- Error codes worth another attempt (sets: a policy may add or drop one).
  throttling_codes = {
    Throttling = true, ThrottlingException = true, ThrottledException = true,
    RequestThrottledException = true, TooManyRequestsException = true,
    ProvisionedThroughputExceededException = true, TransactionInProgressException = true,
    RequestLimitExceeded = true, BandwidthLimitExceeded = true, LimitExceededException = true,
    RequestThrottled = true, SlowDown = true, PriorRequestNotComplete = true,
    EC2ThrottledException = true,
  },
  transient_codes = { RequestTimeout = true, RequestTimeoutException = true },
  retry_statuses = { [500] = true, [502] = true, [503] = true, [504] = true },
  -- Transport failures (core.http codes): refused, reset or cut, timed out.
  -- A timed-out request may have been carried out; botocore retries it too.
  retry_transport = { ECONNREFUSED = true, closed = true, timeout = true },
}

return policy

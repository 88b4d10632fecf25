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
--
-- One concern per file: host (the host's facts, full()), isolation
-- (sbx.limits), images (a box's layers), state (directories and owner
-- records on the host), cgroups, launch (the argv, id maps, spare
-- launchers), disk (disk layers and their watcher), lifecycle (create,
-- destroy, restart, the lifetime watcher, the agent's channel) and reap.
-- This module is the backend contract's face (sbx.backend): it only
-- gathers them.
local host = require "sbx.backends.local.host"
local isolation = require "sbx.backends.local.isolation"
local cgroups = require "sbx.backends.local.cgroups"
local launch = require "sbx.backends.local.launch"
local lifecycle = require "sbx.backends.local.lifecycle"
local reap = require "sbx.backends.local.reap"

local M = {}

-- Box options only this backend takes.
function M.options(check)
  -- The image as layer directories (top first) instead of image = ...:
  -- for sbx.images, which unpacks OCI layers (trusted code only).
  return { layers = check.maybe(check.list(check.str())) }
end

M.RLIMITS, M.full = host.RLIMITS, host.full
M.limits = isolation.limits
M.BUSYBOX_PATH = launch.BUSYBOX_PATH
M.oom_check, M.cpu_seconds = cgroups.oom_check, cgroups.cpu_seconds
M.create, M.destroy, M.restart = lifecycle.create, lifecycle.destroy, lifecycle.restart
M.agent_channel = lifecycle.agent_channel
M.reap = reap.reap

return M

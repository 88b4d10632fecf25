-- The Fargate backend: a box is an ECS task on Fargate whose container
-- sleeps for the box's lifetime; commands run through ECS Exec, one SSM data
-- channel each (sbx.aws.ssm_session). The box contract is box.lua's.
--
-- Protocol facts (docs/aws-protocol.md 1.8): the agent execs the command
-- on a PTY without a shell and reports no exit status for ECS Exec, so
-- every command runs inside a small sh wrapper that
--   1. puts the PTY in raw mode (no CR-LF translation, no echo, no signals
--      from input bytes) and prints a ready marker with stty's status and a
--      public per-command id,
--   2. reads one line from the PTY: a secret of 128 random bits that sbx
--      sends only after the ready marker, so echo is already off,
--   3. runs the command in a subshell without the secret, after the start
--      check (transports/start_check.lua: a missing cwd or program is
--      exec_failed, its marker cut from the output), with stdin from
--      /dev/null, or from exactly N bytes of the PTY when the caller gives
--      stdin (sent after a stdin marker that says the secret line is read),
--   4. prints an exit marker with the secret and $? through the shell's
--      builtin printf.
-- The markers are cut out of the output, and so is the PTY's echo of the
-- secret line where there is one (no stty); CR-LF is normalised only when
-- stty was missing.
--
-- Why a secret read from the PTY: the exit marker is the only exit status
-- there is, so whoever can print it can report any status (in an eval
-- harness, a reward hack). Anything in an argv or an environment is
-- readable by every process in the box (/proc/*/cmdline, /proc/*/environ),
-- so the secret is in neither: not in the sh -c string, never exported,
-- never an external command's argument. It exists only in the wrapper's
-- shell variable and, on the way in, in the PTY's input queue, which the
-- wrapper drains before the command starts. Only a marker with the secret
-- counts, and only the first: markers printed later, by the command or by
-- background processes, are ignored, and those printed earlier cannot know
-- the secret.
--
-- What remains on this transport, because the command runs as the same user
-- on the same PTY as the wrapper (the in-box agent planned in the transport
-- issue, which reports exit statuses itself, closes these by construction):
--   - a process of that user can read the wrapper's memory while the command
--     runs (/proc/<pid>/mem, ptrace; a grep of the wrapper's heap finds the
--     secret where Yama's ptrace_scope is 0 or absent), and so forge a marker;
--   - a process left running by an earlier command can open the next
--     command's PTY (/proc/<wrapper>/fd/0) and race the wrapper's read for
--     the secret line (or stop the wrapper first), then print a marker
--     with it;
--   - any process can write to another command's PTY: a command's output is
--     only as trustworthy as the box (the secret protects its exit status).
-- And on any transport, root in the box (most images) can replace /bin/sh
-- or put a stty or head early in PATH, and so own the later wrappers; on
-- AWS the SSM agent itself runs in the task, where root can ptrace it.
--
-- One concern per file: clients (ECS, IAM, one-time work, fspec), cluster
-- (cluster and roles), isolation (task sizes, sbx.limits), taskdefs (task
-- definitions shared by content), waiting (DescribeTasks for every waiting
-- box), lifecycle (create, destroy, restart), exec (per-command functions:
-- the exec transport; clear), channel (the agent's channel) and reap. This
-- module is the backend contract's face (sbx.backend): it only gathers
-- them.
local isolation = require "sbx.backends.fargate.isolation"
local lifecycle = require "sbx.backends.fargate.lifecycle"
local exec = require "sbx.backends.fargate.exec"
local channel = require "sbx.backends.fargate.channel"
local reap = require "sbx.backends.fargate.reap"

local M = {}
-- ExecuteCommand takes the command line in JSON: UTF-8 text only.
M.text_argv = "ECS ExecuteCommand takes the command as JSON text"

-- Box options only this backend takes: every policy.fargate knob.
function M.options(check) return check.section_rules("fargate") end

M.limits = isolation.limits
M.create, M.destroy, M.restart = lifecycle.create, lifecycle.destroy, lifecycle.restart
M.start, M.finish, M.clear = exec.start, exec.finish, exec.clear
M.wrapper, M.marker_filter = exec.wrapper, exec.marker_filter
M.agent_channel, M.agent_attach = channel.agent_channel, channel.agent_attach
M.reap = reap.reap

return M

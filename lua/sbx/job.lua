--[[
sbx.job: what every backend needs about one job, without sbx.box: its
random marker, the request that kills its processes in the box, the one
that clears a box of every process, and the result table of a finished
job. A leaf (it requires sbx.core and sbx.config only), so backends
require it and sbx.box re-exports it (box.random_id, box.kill_request,
box.clear_request, box.build_result: the same functions).
]]
local core = require "sbx.core"
local config = require "sbx.config"
local util = require "sbx.util"

local M = {}

-- random_id() -> 16 hex digits from the CSPRNG: a job's marker, a box's
-- or a session's name (sbx.util.random_id).
M.random_id = util.random_id

-- Turns one captured stream into { head, tail, omitted, bytes }: the bytes
-- the command wrote, as they came (text for a model is made from them by
-- sbx.model_text, in the policy's formatters).
local function capture_part(stream, name)
  local head, tail, total, omitted = stream:captured(name)
  return { head = head, tail = tail, omitted = omitted, bytes = total }
end

local function part_text(part, marker, pol)
  if part.omitted == 0 then return part.head .. part.tail end
  return part.head .. marker(part, pol) .. part.tail
end

-- build_result(job, fields [, pol]) -> the result table of a finished job.
function M.build_result(job, fields, pol)
  pol = pol or config.policy
  local s = job.stream
  local r = fields or {}
  r.parts = {
    stdout = capture_part(s, "stdout"),
    stderr = capture_part(s, "stderr"),
    output = capture_part(s, "output"),
  }
  local marker = pol.omitted_marker
  r.stdout = part_text(r.parts.stdout, marker, pol)
  r.stderr = part_text(r.parts.stderr, marker, pol)
  r.output = part_text(r.parts.output, marker, pol)
  r.stdout_bytes = r.parts.stdout.bytes
  r.stderr_bytes = r.parts.stderr.bytes
  r.truncated = r.parts.stdout.omitted > 0 or r.parts.stderr.omitted > 0 or r.parts.output.omitted > 0
  -- Set by a backend's finish when the OOM killer ended the command.
  if job.oom_killed then r.oom_killed, r.memory_limit = true, job.memory_limit end
  return r
end

-- What both in-box scripts below start with (POSIX sh, builtins only):
-- stat_of PID sets ppid and start (in clock ticks since boot) from
-- /proc/PID/stat (the command name, which may hold blanks and ")", cut
-- off first); life is the box's own lifetime process, which no script
-- ever signals: PID 1, or where PID 1 is an init (not the "sleep" that
-- keeps a box alive), its oldest child.
local BOX_PROCESSES = [[
stat_of() {
  read -r line < "/proc/$1/stat" 2>/dev/null || return 1
  line=${line##*) }
  set -- $line
  ppid=$2; start=${20}
}
life=1
read -r line < /proc/1/stat
case "$line" in
  *"(sleep)"*) ;;
  *) best=""
     for p in /proc/[0-9]*; do
       stat_of "${p#/proc/}" || continue
       [ "$ppid" = 1 ] || continue
       if [ -z "$best" ] || [ "$start" -lt "$best" ]; then best=$start; life=${p#/proc/}; fi
     done ;;
esac
]]

-- The in-box kill (POSIX sh: dash, bash and busybox ash; grep), for
-- transports that run each command as its own exec. A job's processes are:
--   * those whose environment carries the job's marker (SBX_JOB=<16 hex
--     digits>, so no marker is a prefix of another), setsid or not;
--   * the children of job processes (PPid), which catches `env -i`;
--   * processes whose stdout or stderr is the job's own pipe;
--   * orphans (PPid 1) with no SBX_JOB marker at all that started after the
--     job did (`env -i` plus a double fork): sbx passes how long ago the
--     job started (in 1/100 s: /proc/uptime's unit and USER_HZ), so this
--     holds even when the job's first process is gone. The box's own
--     lifetime process (PID 1, or the first child of an init) is never one.
-- A KILL first stops every job process (a stopped process cannot fork or
-- run the next step of a script), looks again until no new one appears,
-- then kills them all: no later step of a timed-out script ever runs.
-- What remains on this transport: a process that escapes before its job is
-- killed AND carries another job's marker, or a marker-less orphan that
-- started before the job (an earlier daemon) and joined it by no pipe. The
-- in-box agent's per-job subreaper closes that (see the transport issue).
-- It prints how many processes it signalled.
local KILL_SCRIPT = [[
sig=$1; m="SBX_JOB=$2"; age=${3:-0}; me=$$
job=" "; refs=""; n=0
in_job() { case "$job" in *" $1 "*) return 0;; esac; return 1; }
]] .. BOX_PROCESSES .. [[
read up _ < /proc/uptime; up=${up%.*}${up#*.}
since=$(( up - age - 50 ))
member() {
  [ "$ppid" = "$me" ] && return 1
  in_job "$ppid" && return 0
  for r in $refs; do
    [ -p "$1/fd/1" ] && [ "$1/fd/1" -ef "$r" ] && return 0
    [ -p "$1/fd/2" ] && [ "$1/fd/2" -ef "$r" ] && return 0
  done
  grep -qs "$m" "$1/environ" && return 0
  [ "$ppid" = 1 ] && [ "$start" -ge "$since" ] && ! grep -qs "SBX_JOB=" "$1/environ" && return 0
  return 1
}
scan() {
  new=""
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$me" ] || [ "$pid" = 1 ] || [ "$pid" = "$life" ] && continue
    in_job "$pid" && continue
    stat_of "$pid" || continue
    if member "$p"; then
      job="$job$pid "; new="$new $pid"
      if [ -z "$refs" ] && grep -qs "$m" "$p/environ"; then
        for fd in 1 2; do [ -p "$p/fd/$fd" ] && refs="$refs $p/fd/$fd"; done
      fi
    fi
  done
  [ -n "$new" ]
}
while scan; do :; done
if [ "$sig" = KILL ]; then
  for round in 1 2 3 4 5 6 7 8; do
    for pid in $job; do kill -s STOP "$pid" 2>/dev/null; done
    scan || break
  done
  for pid in $job; do kill -s KILL "$pid" 2>/dev/null && n=$((n+1)); done
  for pid in $job; do kill -s CONT "$pid" 2>/dev/null; done
else
  for pid in $job; do kill -s "$sig" "$pid" 2>/dev/null && n=$((n+1)); done
fi
echo "$n"
]]

-- The request a backend starts to signal a job's tree: signal with or
-- without "SIG"; the job's marker and start (core.now() of its start).
-- Small captures: it prints a count.
function M.kill_request(signal, job)
  signal = tostring(signal or "KILL"):gsub("^SIG", "")
  local age = job.started and math.ceil((core.now() - job.started) * 100) or 0
  return {
    argv = { "sh", "-c", KILL_SCRIPT, "sh", signal, job.marker, tostring(age) }, env = {},
    capture = { stdout = { head = 256, tail = 0 }, stderr = { head = 1024, tail = 0 }, output = { head = 1024, tail = 0 } },
  }
end

-- run_helper(impl, handle, req, deadline, what) -> exit_code, job | nil,
-- message, code: one of sbx's own requests (a kill, a clear) run to its end
-- through a backend's per-command functions (start and finish of the
-- backend contract, sbx.backend) by deadline. A backend whose commands
-- start late (job.start_timeout and job.ready_at: an ECS Exec session
-- waits before its first read) gets the same time counted from the start,
-- as box.lua counts a command's timeout. Past it the request is abandoned
-- (job.abandon() where the backend gives one, else its stream closed):
-- "daemon_unresponsive", for nothing answered in time (what names the
-- request in that message). The helper's output
-- is in job.stream:captured(...).
function M.run_helper(impl, handle, req, deadline, what)
  if type(deadline) ~= "number" then error("run_helper needs a deadline", 2) end
  req.is_kill = true        -- a helper's own dropped channel must not start another kill
  local t0 = core.now()
  local budget = math.max(0.1, deadline - t0)
  req.deadline = req.deadline or t0 + budget
  local job, err, code = impl.start(handle, req)
  if not job then return nil, err, code end
  while true do
    local limit, poll = t0 + budget, nil
    if job.start_timeout then
      if job.ready_at then
        limit = math.max(limit, job.ready_at + budget)
      else
        limit, poll = math.max(limit, t0 + job.start_timeout), job.ready_poll or 0.05
      end
    end
    local left = limit - core.now()
    local ev = left > 0 and job.stream:wait(poll and math.min(poll, left) or left) or "timeout"
    if ev == "eof" then break end
    if ev == "data" then job.stream:take() end
    if ev == "timeout" and core.now() >= limit then
      if job.abandon then job.abandon() else job.stream:close() end
      return nil, string.format("%s did not finish in time", what or "sbx's own command in the box"),
        "daemon_unresponsive"
    end
  end
  local info = job.stream:info()
  if info.error_code then
    if impl.stream_error then return nil, impl.stream_error(handle, info) end
    return nil, info.error, info.error_code
  end
  local exit_code, ferr, fcode = impl.finish(handle, job, deadline)
  if exit_code == nil then return nil, ferr, fcode end
  return exit_code, job
end

-- kill_by_exec(impl, handle, job, signal, deadline) -> true | nil, message,
-- code: the kill of the exec transport, for every backend with
-- per-command functions (a backend's own kill replaces it): kill_request
-- run as another command, which must exit 0.
function M.kill_by_exec(impl, handle, job, signal, deadline)
  job.killed = true
  local exit_code, kjob, code = M.run_helper(impl, handle, M.kill_request(signal, job), deadline,
    "the kill command")
  if exit_code == nil then return nil, kjob, code end
  if exit_code ~= 0 then
    return nil, string.format("the kill command failed (exit %s): %s", tostring(exit_code),
      (kjob.stream:captured("output"))), "kill_failed"
  end
  return true
end

-- The in-box end of every process of a box but its own lifetime process
-- (PID 1, or the first child of an init), for a box whose agent was lost
-- (POSIX sh, builtins only: no fork of its own joins the list). It stops
-- every other process, looks again until no new one appears (a stopped
-- process cannot fork), kills them all, and prints how many are left
-- (processes that did not go: 0 when the box is clear). Spared besides:
-- the script's own ancestors (where the exec runs under an in-box agent
-- of the platform, such as ECS Exec's SSM agent and its session worker)
-- and every process whose command line starts with one of the script's
-- arguments (that agent's install directory; no blanks in a prefix).
local CLEAR_SCRIPT = [[
me=$$
keep="$*"
]] .. BOX_PROCESSES .. [[
ancestors=" "
p=$me
while stat_of "$p" && [ "$ppid" -gt 1 ]; do ancestors="$ancestors$ppid "; p=$ppid; done
spared() {
  case "$ancestors" in *" $1 "*) return 0;; esac
  [ -n "$keep" ] || return 1
  cmd=; { read -r cmd < "/proc/$1/cmdline"; } 2>/dev/null
  for k in $keep; do
    case "$cmd" in "$k"*) return 0;; esac
  done
  return 1
}
others() {
  list=""
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$me" ] || [ "$pid" = 1 ] || [ "$pid" = "$life" ] && continue
    spared "$pid" && continue
    stat_of "$pid" || continue
    # A process of this very exec (the daemon's exec has PPid 0 in the box)
    # is only the script itself; zombies wait for their parent.
    case "$line" in Z*) continue;; esac
    list="$list $pid"
  done
}
for round in 1 2 3 4 5 6 7 8; do
  others
  [ -z "$list" ] && break
  for pid in $list; do kill -s STOP "$pid" 2>/dev/null; done
  seen=$list
  others
  [ "$list" = "$seen" ] || continue
  for pid in $list; do kill -s KILL "$pid" 2>/dev/null; done
  for pid in $list; do kill -s CONT "$pid" 2>/dev/null; done
done
# Killed processes take a moment to become zombies: look again a while.
n=0
try=0
while [ "$try" -lt 200 ]; do
  others
  n=0; for pid in $list; do n=$((n+1)); done
  [ "$n" = 0 ] && break
  for pid in $list; do kill -s KILL "$pid" 2>/dev/null; done
  try=$((try+1))
done
echo "$n"
]]

-- The request a backend starts to end every process of a box but its
-- lifetime process (see CLEAR_SCRIPT); keep: command-line prefixes of
-- processes to spare (a platform's in-box agent). Small captures: it
-- prints a count.
function M.clear_request(keep)
  local argv = { "sh", "-c", CLEAR_SCRIPT, "sh" }
  for _, k in ipairs(keep or {}) do argv[#argv + 1] = k end
  return {
    argv = argv, env = {}, user = "0",
    capture = { stdout = { head = 256, tail = 0 }, stderr = { head = 1024, tail = 0 }, output = { head = 1024, tail = 0 } },
  }
end

return M

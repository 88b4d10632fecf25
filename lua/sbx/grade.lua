-- sbx.grade: where a harness task's check runs, so the graded code cannot
-- touch its own grade (docs/grading.md says what a task can and cannot
-- influence). The harness (harness.lua) calls it for every task with a
-- check; the knobs are policy.grade.
--
-- check_box = "fresh" (the default): the run's box is closed (every
-- process the task started is gone with it) once its declared outputs are
-- packed there as a tar archive; core.tar checks that archive on the host
-- (paths under the outputs only, no .., links that stay inside, no devices,
-- bounded by policy.grade.max_output_*) and writes it again clean; a fresh
-- box from the task's image gets check_files, the outputs and check_setup,
-- then runs the check. Nothing else of the run reaches the check: not its
-- /bin/sh, not /etc/ld.so.preload, not a test file it changed.
--
-- check_box = "same": the check runs in the run's box after every process
-- in it is killed, with sbx's own static busybox (policy.local.busybox,
-- bound read-only at /dev/busybox-sbx) as its shell and tools. Only the
-- local backend has both (an agent that is PID 1 and cannot be traced, no
-- mount in a box); elsewhere the task is an error that says so.
local core = require "sbx.core"

local M = {}


local FIELDS = { "outputs", "check_files", "check_setup", "check_box" }
M.FIELDS = FIELDS

-- Packs the outputs at / in the run box: the paths that exist, as one tar
-- on stdout (nothing when none does). The run box's own tar: whatever it
-- writes is checked on the host.
local PACK = 'cd / || exit 1; n=$#; for p; do if [ -e "$p" ] || [ -h "$p" ]; then set -- "$@" "$p"; fi; done; ' ..
  'shift $n; [ $# -eq 0 ] && exit 0; exec tar -cf - -- "$@"'

-- "/work/out/" -> "work/out"; nil for a relative path or one with "..".
local function clean_root(p)
  if type(p) ~= "string" or p:sub(1, 1) ~= "/" then return nil end
  local parts = {}
  for c in p:gmatch("[^/]+") do
    if c == ".." then return nil end
    if c ~= "." then parts[#parts + 1] = c end
  end
  if #parts == 0 then return nil end
  return table.concat(parts, "/")
end

-- grade.validate(task, id, json): checks the grading fields of a task
-- (raises a usage error naming the task). Called by harness validate.
function M.validate(t, id, json)
  for _, k in ipairs(FIELDS) do
    if t[k] == json.null then t[k] = nil end
  end
  if t.check_box ~= nil and t.check_box ~= "fresh" and t.check_box ~= "same" then
    error(string.format("task '%s': check_box must be \"fresh\" or \"same\"", id), 0)
  end
  if t.outputs ~= nil then
    if type(t.outputs) ~= "table" then
      error(string.format("task '%s': outputs must be a list of absolute paths", id), 0)
    end
    for _, p in ipairs(t.outputs) do
      if not clean_root(p) then
        error(string.format("task '%s': output '%s' must be an absolute path without '..' (and not /)", id, tostring(p)), 0)
      end
    end
  end
  if t.check_files ~= nil and type(t.check_files) ~= "table" then
    error(string.format("task '%s': check_files must map path to content", id), 0)
  end
  if t.check_setup ~= nil and type(t.check_setup) ~= "table" and type(t.check_setup) ~= "string"
    and type(t.check_setup) ~= "function" then
    error(string.format("task '%s': check_setup must be a list of commands", id), 0)
  end
end

-- grade.mode(task, opts, pol) -> "fresh" | "same": the task's, else the
-- run's (opts.check_box, sbx eval --check-box), else the policy's.
function M.mode(task, opts, pol)
  return task.check_box or opts.check_box or pol.grade.check_box
end

-- grade.require_outputs(task, opts, pol): a task with run and check that
-- grades in a fresh box must say what of its run the check sees.
function M.require_outputs(task, opts, pol)
  if task.run ~= nil and task.check ~= nil and task.outputs == nil and M.mode(task, opts, pol) == "fresh" then
    error(string.format("task '%s' has run and check but no outputs: its check runs in a fresh box, " ..
      "so add outputs = [\"/path/the/check/reads\", ...] (the paths the run writes), " ..
      "or check_box = \"same\" on the local backend", tostring(task.id)), 0)
  end
end

-- grade.same_problem(box) -> nil | message: why a check cannot run in
-- this box itself.
function M.same_problem(box)
  if box.backend_name ~= "local" then
    return string.format("check_box = \"same\" runs only on the local backend (an agent that is the box's " ..
      "PID 1 and sbx's own busybox); this box is on %s: declare outputs and use check_box = \"fresh\"",
      tostring(box.backend_name))
  end
  local lp = box:policy()["local"]
  if not lp.busybox or not core.path_type(lp.busybox) then
    return "check_box = \"same\" needs a static busybox on the host (policy.local.busybox: " ..
      tostring(lp.busybox) .. "; Debian's busybox-static)"
  end
end

local function busybox_path() return require("sbx.backends.local").BUSYBOX_PATH end

-- Reads the outputs from the run box and checks them: clean archive |
-- nil, reason (the task's doing: failed) | raises infra.
local function take_outputs(ctx, box, task)
  local pol = box:policy().grade
  local roots = {}
  for i, p in ipairs(task.outputs) do roots[i] = clean_root(p) end
  local timeout = math.min(pol.transfer_timeout, task.timeout or math.huge)
  local argv = { "sh", "-c", PACK, "sh" }
  for _, r in ipairs(roots) do argv[#argv + 1] = r end
  local data, err, code = require("sbx.box").capture_stdout(box, argv, "the outputs", pol.max_output_bytes, timeout)
  if not data then
    if code == "too_large" then
      return nil, string.format("outputs: more than policy.grade.max_output_bytes (%d bytes)", pol.max_output_bytes)
    elseif code == "not_found" or code == "timeout" or code == "exec_failed" then
      -- The packer runs in the run's box with its shell: a shell the task
      -- removed or replaced is the task's doing, not sbx's.
      return nil, "outputs: " .. tostring(err)
    end
    ctx.infra("outputs: " .. tostring(err), code)
  end
  local clean, terr = core.tar.filter(data, roots, {
    max_bytes = pol.max_output_bytes, max_entries = pol.max_output_entries, max_path = pol.max_output_path })
  if not clean then return nil, "outputs refused: " .. tostring(terr) end
  return clean
end

-- Runs a list of commands (check_setup) in box; a failure is sbx's or the
-- grader's (an error), never the task's.
local function run_list(ctx, box, task, list, name)
  if list == nil then return end
  if type(list) ~= "table" or (getmetatable(list) and getmetatable(list).__call) then list = { list } end
  ctx.res.phases[name] = core.json.array {}
  for i, cmd in ipairs(list) do
    local p, ok = ctx.run_command(box, cmd, "check")
    ctx.res.phases[name][i] = p
    if not ok then
      ctx.infra(string.format("%s command %d %s", name, i, p.timed_out and "timed out" or ("exited " .. tostring(p.exit_code))), "check_setup")
    end
  end
end

local function write_files(ctx, box, task, files)
  local keys = {}
  for k in pairs(files or {}) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, path in ipairs(keys) do
    local data = files[path]
    if type(data) ~= "string" then ctx.infra(string.format("check_files['%s'] must be a string", tostring(path)), "bad_task") end
    local ok, err, code = box:write_file(path, data, { timeout = task.timeout })
    if not ok then ctx.infra("check_files: " .. tostring(err), code) end
  end
end

local function verdict(ctx, p, ok)
  ctx.res.phases.check = p
  if not ok then
    ctx.res.reason = p.timed_out and "check timed out"
      or p.exit_code ~= nil and ("check exited " .. tostring(p.exit_code)) or "check returned false"
  end
  return ok
end

-- The fresh-box check. ctx: res, infra, run_command(box, cmd, phase),
-- close_run_box(), new_box() -> box (closed by the harness's ctx.track).
local function check_fresh(ctx, box, task)
  local clean
  if task.outputs and #task.outputs > 0 then
    local reason
    clean, reason = take_outputs(ctx, box, task)
    if not clean then ctx.close_run_box(); ctx.res.reason = reason; return false end
  end
  -- Every process of the run goes with its box before the check starts.
  ctx.close_run_box()
  local cbox = ctx.new_box()
  write_files(ctx, cbox, task, task.check_files)
  if clean and #clean > 0 then
    local pol = cbox:policy().grade
    local r, err, code = require("sbx.box").helper_exec(cbox, { "tar", "-xf", "-", "-C", "/" },
      { stdin = clean, timeout = math.min(pol.transfer_timeout, task.timeout or math.huge) })
    if not r then ctx.infra("unpacking the outputs: " .. tostring(err), code) end
    if r.exit_code ~= 0 then
      ctx.infra("unpacking the outputs in the check box: " .. tostring((r.stderr or ""):gsub("%s+$", "")), "unpack_failed")
    end
  end
  run_list(ctx, cbox, task, task.check_setup, "check_setup")
  return verdict(ctx, ctx.run_command(cbox, task.check, "check"))
end

-- The same-box check: kill everything, then sbx's busybox.
local function check_same(ctx, box, task)
  local problem = M.same_problem(box)
  if problem then ctx.infra(problem, "unsupported") end
  local bb = busybox_path()
  -- kill -9 -1 from inside: every process but the agent (PID 1) and the
  -- killer itself; twice, for a child forked while the first ran.
  -- The killer's own supervisor goes too, so its result says nothing
  -- (the process "vanished"): the count that follows is what tells. A
  -- killed process stays in /proc until the agent reaps it, so a few
  -- rounds, a tenth of a second apart.
  local BOX = require "sbx.box"
  local count = 'n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; ' ..
    '[ "$p" = 1 ] || [ "$p" = $$ ] || [ "$p" = "$PPID" ] || n=$((n+1)); done; echo $n'
  local left
  for _ = 1, 50 do
    BOX.helper_exec(box, { bb, "kill", "-9", "-1" }, { timeout = 30 })
    left = BOX.helper_exec(box, { bb, "sh", "-c", count }, { timeout = 30 })
    if left and left.exit_code == 0 and tonumber(left.stdout) == 0 then break end
    core.sleep(0.1)
  end
  if not left or left.exit_code ~= 0 or tonumber(left.stdout) ~= 0 then
    ctx.infra("the run's processes did not all go before the check: " ..
      tostring(left and left.stdout or "no count"), "kill_failed")
  end
  write_files(ctx, box, task, task.check_files)
  local function wrap(cmd)
    if type(cmd) == "string" then return { bb, "sh", "-c", cmd } end
    if type(cmd) == "table" and not (getmetatable(cmd) and getmetatable(cmd).__call) then
      local a = { bb, "sh", "-c", '"$@"', "sh" }
      for _, v in ipairs(cmd) do a[#a + 1] = v end
      return a
    end
    return cmd
  end
  local setup = task.check_setup
  if setup ~= nil then
    if type(setup) ~= "table" or (getmetatable(setup) and getmetatable(setup).__call) then setup = { setup } end
    local w = {}
    for i, c in ipairs(setup) do w[i] = wrap(c) end
    run_list(ctx, box, task, w, "check_setup")
  end
  return verdict(ctx, ctx.run_command(box, wrap(task.check), "check"))
end

-- grade.check(ctx, box, task) -> verdict. Fills ctx.res; raises infra.
function M.check(ctx, box, task)
  if task.run == nil then
    -- Nothing graded ran in this box: the check runs where setup did.
    write_files(ctx, box, task, task.check_files)
    run_list(ctx, box, task, task.check_setup, "check_setup")
    return verdict(ctx, ctx.run_command(box, task.check, "check"))
  end
  if M.mode(task, ctx.opts, box:policy()) == "same" then return check_same(ctx, box, task) end
  return check_fresh(ctx, box, task)
end

return M

-- The sbx command line. main(argv) returns the exit status.
local sbx = require "sbx"

local M = {}

local USAGE = [[
usage: sbx [--policy FILE|NAME] COMMAND [ARGS...]

commands:
  run SCRIPT [ARGS...]   run a Lua script with the sbx module (the global sbx,
                         and require "sbx"; arg holds ARGS)
  reap [--all] [--dry-run] [--backend B] [--cluster C] [--context X] [--namespace N]
                         remove boxes whose owner process is gone or whose
                         lifetime has passed (--all: every sbx box;
                         --dry-run: only list them; B: docker, fargate or
                         kubernetes, default the policy's; C: the ECS
                         cluster; X, N: the kubeconfig context and namespace)
  tools [--format F] [--strict|--no-strict]
                         print the tools the policy defines, as the value of
                         a request's tools field; F: openai, openai-responses,
                         anthropic, gemini, mcp (default)

  policy check FILE|NAME  validate a policy file: every field's type and range,
                         unknown names (with the nearest known one)
  policy show [FILE|NAME]
                         print the merged policy (defaults, SBX_POLICY or
                         --policy, then FILE) as Lua

  images [ls | pull REF | rm REF... | prune]
                         the image cache of the daemon-free backends
                         (${XDG_CACHE_HOME:-~/.cache}/sbx/images): list it,
                         pull REF (docker://NAME, docker-archive:PATH,
                         oci-archive:PATH, oci:DIR[:TAG], docker-daemon:NAME,
                         or a bare NAME), remove images by reference or id,
                         remove what no name needs and fit policy.images.max_bytes

  mcp [--backend B] [--image I]
                         serve the tools over MCP (stdio, JSON-RPC 2.0); one
                         box per session, created at the first tool call, or
                         taken from a pool made at start when policy.pool.size
                         is above 0
  eval TASKS [--concurrency N] [--backend B] [--image I] [--out FILE]
       [--report FILE] [--pool N] [--check-box fresh|same]
                         run evaluation tasks (TASKS: a .jsonl file, one JSON
                         task per line, or a .lua file returning a list), each
                         in its own box; results as JSON Lines in --out (tasks
                         already passed/failed there are skipped), an HTML
                         report with --report; --pool N keeps N boxes made
                         ahead for tasks that set no box options of their own
                         (default policy.pool.size; 0: none); --check-box:
                         where checks of tasks that say nothing run
                         (default policy.grade.check_box). Exit 0 when
                         every task ran, 1 on errors, 2 on usage errors,
                         128 + N after signal N (130 SIGINT, 143 SIGTERM)

options:
  --policy FILE|NAME     a policy overlay: a Lua file returning a table, or a
                         bundled policy ("lm-deluge"); also SBX_POLICY
  --help, -h             this text
  --version              the version and the git commit it was built from
]]

local function err(...)
  io.stderr:write("sbx: ", table.concat({ ... }), "\n")
end

-- The value after option args[i], or nil after saying which option lacks one.
local function value_of(cmd, args, i)
  local v = args[i + 1]
  if v == nil then err(cmd, ": ", args[i], " needs a value") end
  return v
end

local commands = {}

--[[
A script's stdout that fails (the reader of `sbx run x.lua | head -1` went
away) interrupts the script as SIGINT would: print, io.write and
io.stdout's write and flush raise "interrupted (signal 13)" where the write
failed, every pending wait of every task gets the same error, and the boxes
are removed. Without this, print to a closed pipe fails silently (SIGPIPE
no longer kills sbx, see main.c) and a printing loop runs on, making boxes.
Returns a function -> nil | { message, errno } of the first failure.
]]
local function guard_stdout()
  local core = sbx.core
  local stdout = io.stdout
  local failure
  local function check(f, ok, msg, errno)
    if ok then return ok end
    if f ~= stdout then return ok, msg, errno end
    if not failure then
      failure = { message = msg, errno = errno }
      core.interrupt(core.SIGPIPE)
    end
    error(string.format("interrupted (signal %d)", core.SIGPIPE), 0)
  end
  local methods = getmetatable(stdout).__index
  local write, flush, io_write = methods.write, methods.flush, io.write
  methods.write = function(f, ...) return check(f, write(f, ...)) end
  methods.flush = function(f, ...) return check(f, flush(f, ...)) end
  io.write = function(...) return check(io.output(), io_write(...)) end
  _G.print = function(...)
    local n = select("#", ...)
    local parts = table.pack(...)
    for i = 1, n do parts[i] = tostring(parts[i]) end
    check(stdout, write(stdout, table.concat(parts, "\t", 1, n), "\n"))
  end
  return function() return failure end
end

function commands.run(args)
  local script = table.remove(args, 1)
  if not script then err("run needs a script (sbx run SCRIPT.lua)") return 2 end
  local chunk, lerr = loadfile(script, "t")
  if not chunk then err(lerr) return 1 end
  _G.arg = { [0] = script, table.unpack(args) }
  -- A script run by sbx has the module as the global sbx (require "sbx"
  -- gives the same table): the README's snippets run as written.
  _G.sbx = sbx
  -- os.exit skips every cleanup: boxes are removed before it leaves.
  local exit = os.exit
  os.exit = function(...)
    pcall(sbx.shutdown)
    return exit(...)
  end
  local stdout_failure = guard_stdout()
  -- A closed stdout ends sbx with 141 (128 + SIGPIPE) and no message, as
  -- a shell reports a pipeline member that SIGPIPE ended: `set -o pipefail`
  -- sees it as it sees `yes | head -1`, and the boxes are gone all the
  -- same. Any other stdout failure is reported and ends with 1.
  local function stdout_closed()
    local f = stdout_failure()
    if not f then return nil end
    -- The failed write raised where it was, so the interruption may still
    -- be pending: one drain delivers it to the other tasks (and returns),
    -- the next lets them clean up, detached removals of dropped boxes too.
    pcall(sbx.drain)
    pcall(sbx.drain)
    if f.errno == sbx.core.EPIPE then return 128 + sbx.core.SIGPIPE end
    pcall(sbx.shutdown)   -- before saying so
    err("cannot write to stdout: ", tostring(f.message), "; boxes removed")
    return 1
  end
  local ok, e = xpcall(chunk, debug.traceback, table.unpack(args))
  if ok then
    ok = sbx.drain()
    local code = stdout_closed()
    if code then return code end
    if not ok then return 1 end
    return 0
  end
  local signals, last = sbx.core.signals()
  if signals > 0 and tostring(e):find("interrupted") then
    if stdout_failure() then return stdout_closed() end
    err("interrupted; removing boxes")
    -- Tasks woke with the same error and are cleaning up after themselves
    -- (a box half created, a command to kill): let them finish.
    pcall(sbx.drain)
    return 128 + last
  end
  -- A refusal of the environment (the local backend without user
  -- namespaces, say) raised by the script's assert: the line, not a trace.
  local refusal = require("sbx.box").last_refusal
  if refusal and tostring(e):find(refusal, 1, true) then err(refusal) return 1 end
  err(tostring(e))
  return 1
end

function commands.reap(args)
  local opts = {}
  local i = 1
  while args[i] do
    local a = args[i]
    if a == "--all" then opts.all = true
    elseif a == "--dry-run" then opts.dry_run = true
    elseif (a == "--backend" or a == "--cluster" or a == "--context" or a == "--namespace") and args[i + 1] then
      opts[a:sub(3)] = args[i + 1]
      i = i + 1
    else err("reap: unknown option or missing value: ", a) return 2 end
    i = i + 1
  end
  local report, rerr = sbx.reap(opts)
  if not report then err(rerr) return 1 end
  for _, r in ipairs(report.removed) do
    print(string.format("%s %s (%s)", opts.dry_run and "would remove" or "removed", r.name, r.reason))
  end
  print(string.format("%s %d box(es); %d kept (owner alive)", opts.dry_run and "would reap" or "reaped",
    #report.removed, report.kept))
  return 0
end

function commands.tools(args)
  local format, strict = "mcp", nil
  local i = 1
  while args[i] do
    if args[i] == "--format" then
      format = value_of("tools", args, i)
      if not format then return 2 end
      i = i + 2
    elseif args[i] == "--strict" then strict = true; i = i + 1
    elseif args[i] == "--no-strict" then strict = false; i = i + 1
    else err("tools: unknown option ", args[i]) return 2 end
  end
  local out, ferr = sbx.tools.export(format, { strict = strict })
  if not out then err("tools: ", ferr) return 2 end
  print(sbx.json.encode(out))
  return 0
end

function commands.policy(args)
  local sub, file = args[1], args[2]
  if sub == "check" then
    if not file or args[3] then err("policy check needs one file or bundled name (sbx policy check FILE)") return 2 end
    local ok, e = pcall(sbx.use_policy, file)
    if not ok then err(tostring(e)) return 1 end
    print(string.format("%s: ok", file))
    return 0
  elseif sub == "show" then
    if args[3] then err("policy show takes at most one file") return 2 end
    if file then
      local ok, e = pcall(sbx.use_policy, file)
      if not ok then err(tostring(e)) return 1 end
    end
    io.write(sbx.policy_check.show(sbx.policy))
    return 0
  end
  err("policy needs check FILE or show [FILE] (see sbx --help)")
  return 2
end

-- sbx images [ls | pull REF | rm REF... | prune]: the image cache.
function commands.images(args)
  local images = require "sbx.images"
  local function human(n)
    n = tonumber(n) or 0
    local units = { "B", "kB", "MB", "GB", "TB" }
    local i = 1
    while n >= 1000 and i < #units do n = n / 1000; i = i + 1 end
    return i == 1 and string.format("%d%s", n, units[i]) or string.format("%.1f%s", n, units[i])
  end
  local function ago(t)
    if not t then return "-" end
    local s = os.time() - t
    if s < 60 then return "just now" end
    if s < 3600 then return string.format("%d minutes ago", s // 60) end
    if s < 86400 then return string.format("%d hours ago", s // 3600) end
    return string.format("%d days ago", s // 86400)
  end
  local sub = args[1] or "ls"
  if sub == "ls" or sub == "list" then
    if args[2] then err("images ls takes no arguments") return 2 end
    local list, lerr = images.list()
    if not list then err("images: ", lerr) return 1 end
    print(string.format("%-60s %-12s %-14s %-9s %s", "NAME", "IMAGE ID", "SOURCE", "SIZE", "LAST USED"))
    for _, e in ipairs(list) do
      print(string.format("%-60s %-12s %-14s %-9s %s", e.name or "<none>", e.digest:sub(8, 19), e.source or "-",
        human(e.size), ago(e.used)))
    end
    return 0
  elseif sub == "pull" then
    local ref = args[2]
    if not ref or args[3] then err("images pull needs one reference (sbx images pull REF)") return 2 end
    local t0 = sbx.now()
    local img, perr, code = images.pull(ref)
    if not img then
      err("images pull: ", perr)
      return code == "bad_reference" and 2 or 1
    end
    print(string.format("%s %s (%s, %d layers, %s) in %.2f s", img.name, img.digest or "", img.source,
      img.layers and #img.layers or 0, human(img.size), sbx.now() - t0))
    return 0
  elseif sub == "rm" or sub == "remove" then
    if not args[2] then err("images rm needs a reference or an image id") return 2 end
    local status = 0
    for i = 2, #args do
      local report, rerr, code = images.remove(args[i])
      if report then
        for _, n in ipairs(report.names) do print("untagged " .. n) end
        for _, id in ipairs(report.images) do print("deleted " .. id) end
        if report.freed > 0 then print("freed " .. human(report.freed)) end
      else
        err("images rm: ", rerr)
        status = (code == "bad_reference" and status == 0) and 2 or 1
      end
    end
    return status
  elseif sub == "prune" then
    if args[2] then err("images prune takes no arguments") return 2 end
    local report, perr = images.prune()
    if not report then err("images prune: ", perr) return 1 end
    for _, id in ipairs(report.images) do print("deleted " .. id) end
    print(string.format("removed %d image(s), %d layer(s), freed %s; the cache uses %s%s", #report.images,
      report.layers, human(report.freed), human(report.size),
      #report.held > 0 and string.format(" (%d image(s) in use kept)", #report.held) or ""))
    return 0
  end
  err("images: unknown subcommand '", sub, "' (ls, pull REF, rm REF, prune)")
  return 2
end

function commands.mcp(args)
  local box = {}
  local i = 1
  while args[i] do
    local a = args[i]
    if a == "--backend" or a == "--image" then
      local v = value_of("mcp", args, i)
      if not v then return 2 end
      box[a:sub(3)] = v
      i = i + 2
    else err("mcp: unknown option ", a) return 2 end
  end
  local ok, e = pcall(require("sbx.mcp").serve, { box = box })
  if not ok then
    if tostring(e):find("interrupted") then return 0 end
    err(tostring(e))
    return 1
  end
  return 0
end

function commands.eval(args)
  local harness = require "sbx.harness"
  local opts = { box = {}, progress = "auto", summary_stream = io.stdout }
  local file, report
  local i = 1
  while args[i] do
    local a, v = args[i], args[i + 1]
    local function need()
      if v == nil then err("eval: ", a, " needs a value") return false end
      i = i + 2
      return true
    end
    if a == "--concurrency" then
      if not need() then return 2 end
      opts.concurrency = math.tointeger(tonumber(v))
      if not opts.concurrency or opts.concurrency < 1 then err("eval: --concurrency must be a positive integer") return 2 end
    elseif a == "--backend" then if not need() then return 2 end opts.backend = v
    elseif a == "--image" then if not need() then return 2 end opts.box.image = v
    elseif a == "--out" then if not need() then return 2 end opts.out = v
    elseif a == "--report" then if not need() then return 2 end report = v
    elseif a == "--pool" then
      if not need() then return 2 end
      opts.pool = math.tointeger(tonumber(v))
      if not opts.pool or opts.pool < 0 then err("eval: --pool must be an integer >= 0") return 2 end
    elseif a == "--check-box" then
      if not need() then return 2 end
      if v ~= "fresh" and v ~= "same" then err("eval: --check-box must be fresh or same") return 2 end
      opts.check_box = v
    elseif a:sub(1, 2) == "--" then err("eval: unknown option ", a) return 2
    elseif file then err("eval: one task file only (got ", file, " and ", a, ")") return 2
    else file = a; i = i + 1 end
  end
  if not file then err("eval needs a task file (sbx eval TASKS.jsonl|TASKS.lua)") return 2 end
  if sbx.core.path_type(file) == "dir" then
    err("eval: ", file, " is a directory; give a task file (TASKS.jsonl or TASKS.lua)")
    return 2
  end
  local lok, tasks, terr = pcall(harness.load_tasks, file)
  if not lok then
    -- Only an interrupt while the task file loads raises here.
    local _, last = sbx.core.signals()
    err("eval: ", tostring(tasks))
    return last > 0 and 128 + last or 1
  end
  if not tasks then err("eval: ", terr) return 2 end
  opts.tasks = tasks
  local ok, summary = pcall(harness.run, opts)
  if not ok then
    local e = tostring(summary)
    -- Bad task definitions are usage errors; anything else is a failure.
    if e:find("^task ") or e:find("concurrency") then err("eval: ", e) return 2 end
    err("eval: ", e)
    return 1
  end
  if report then
    local rok, rerr = require("sbx.report").write(report, summary.all, { title = "sbx eval: " .. file })
    if not rok then err("eval: cannot write the report: ", rerr) return 1 end
  end
  if summary.interrupted then
    err("interrupted; boxes removed, finished results kept")
    local _, last = sbx.core.signals()
    return last > 0 and 128 + last or 1
  end
  if summary.errors > 0 then return 1 end
  return 0
end

function M.main(argv)
  -- The sbx command takes SIGINT and SIGTERM (an embedding program that
  -- only loads the module keeps its own): they stop Lua code where it
  -- runs and close the boxes (core.handle_signals).
  sbx.core.handle_signals()
  local args = { table.unpack(argv) }
  local policy = os.getenv("SBX_POLICY")
  while args[1] and args[1]:sub(1, 1) == "-" do
    local a = table.remove(args, 1)
    if a == "--help" or a == "-h" then io.write(USAGE) return 0
    elseif a == "--version" then print(string.format("sbx %s (commit %s)", sbx.version, sbx.core.commit)) return 0
    elseif a == "--policy" then
      policy = table.remove(args, 1)
      if not policy then err("--policy needs a file or a name") return 2 end
    elseif a:match("^%-%-policy=") then policy = a:sub(10)
    else err("unknown option ", a, " (see sbx --help)") return 2 end
  end
  if policy and policy ~= "" then
    local ok, perr = pcall(sbx.use_policy, policy)
    if not ok then err(tostring(perr)) return 2 end
  end
  local name = table.remove(args, 1)
  if not name then io.stderr:write(USAGE) return 2 end
  local cmd = commands[name]
  if not cmd then err("unknown command '", name, "' (see sbx --help)") return 2 end
  local ok, code = pcall(cmd, args)
  if not ok then err(tostring(code)) return 1 end
  return code
end

return M

-- needs: nothing
-- Policy is Lua, all the way down, with no daemon: every data knob and every
-- hook changes what the model reads; overrides reach hooks through the live
-- policy; per-box overlays; validation at load; before_exec/after_exec and
-- budgets. Boxes come from tests/lib/fake_backend.lua (the backend contract
-- over core.stream.sink), so results go through the real capture code.
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"
local fake = require "fake_backend"
package.loaded["sbx.backends.fake"] = fake

local json = sbx.json
local defaults = sbx.deep_copy(sbx.policy)

-- Resets the live policy to the defaults between cases.
local function reset()
  for k in pairs(sbx.policy) do sbx.policy[k] = nil end
  for k, v in pairs(sbx.deep_copy(defaults)) do sbx.policy[k] = v end
  sbx.policy_generation = sbx.policy_generation + 1
end

-- A fake box whose commands print what `outputs` says: command -> result.
local function fake_box(outputs, opts)
  local o = { backend = "fake", respond = function(_, cmd)
    local r = outputs[cmd]
    if type(r) == "function" then r = r() end
    return r or { stdout = "" }
  end }
  for k, v in pairs(opts or {}) do o[k] = v end
  return assert(sbx.box(o))
end

local function call(box, name, args) return (sbx.tools.call(box:tools(), name, args)) end

-- 1. The scenario of the issue, run as written: sbx --policy F run ---------------
do
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local f = assert(io.open(dir .. "/F.lua", "w"))
  f:write("return { output = { head_chars = 7, tail_chars = 7 }, exec = { max_timeout = 77 } }\n")
  f:close()
  local s = assert(io.open(dir .. "/script.lua", "w"))
  s:write([[
package.loaded["sbx.backends.fake"] = require "fake_backend"
local sbx = require "sbx"
local box = assert(sbx.box { backend = "fake", respond = function() return { stdout = ("0123456789"):rep(300) } end })
io.write((sbx.tools.call(box:tools(), "bash", { command = "print 3000" })))
]])
  s:close()
  local out, code = H.sh(string.format("cd %s && LUA_PATH='%s/tests/lib/?.lua;;' %s --policy %s/F.lua run %s/script.lua",
    os.getenv("PWD"), os.getenv("PWD"), H.sbx_bin, dir, dir))
  tap.is(code, 0, "sbx --policy F run: the script runs")
  tap.is(out, "0123456\n...[2986 bytes omitted; 3000 bytes in all]...\n3456789",
    "a bash tool call printing 3000 characters shows the model 7 + 7 characters and a marker")
  local exported = H.sh(string.format("%s --policy %s/F.lua tools --format openai", H.sbx_bin, dir))
  tap.like(exported, "at most 77%)", "the exported bash description states max_timeout from the policy file")
  f = assert(io.open(dir .. "/bad.lua", "w"))
  f:write("return { exec = { timeout = 'ten' } }\n")
  f:close()
  out, code = H.sh(string.format("%s --policy %s/bad.lua tools", H.sbx_bin, dir))
  tap.is(code, 2, "a mistyped policy field is refused at load")
  tap.like(out, "exec%.timeout must be a number > 0, not the string \"ten\"", "naming the field and what it needs")
  out, code = H.sh(string.format("%s policy check %s/bad.lua", H.sbx_bin, dir))
  tap.is(code, 1, "sbx policy check fails a bad file")
  tap.like(out, "exec%.timeout", "and names the field")
  out, code = H.sh(string.format("%s policy check %s/F.lua", H.sbx_bin, dir))
  tap.is(code, 0, "sbx policy check passes a good one")
  out = H.sh(string.format("%s policy show %s/F.lua", H.sbx_bin, dir))
  tap.like(out, "head_chars = 7,", "sbx policy show prints the merged policy")
  tap.like(out, "max_timeout = 77,", "with the file's values")
  tap.like(out, "tail_chars = 7,", "and its other values")
  tap.ok(load(out) ~= nil, "as Lua that loads")
  os.execute("rm -rf " .. dir)
end

-- 2. Data knobs change what the model reads ---------------------------------------
local long = ("a"):rep(100) .. ("b"):rep(100)
local outputs = {
  long = { stdout = long },
  fail = { stdout = "oops\n", exit_code = 3 },
  quiet = { stdout = "" },
  hang = { hang = true, stdout = "started\n" },
}

do
  reset()
  local box = fake_box(outputs)
  tap.is(call(box, "bash", { command = "long" }), long, "defaults: 200 characters shown whole")
  sbx.use_policy { output = { head_chars = 3, tail_chars = 4 } }
  tap.is(call(box, "bash", { command = "long" }), "aaa\n...[193 bytes omitted; 200 bytes in all]...\nbbbb",
    "use_policy reaches the next call of an existing box (output.head_chars/tail_chars)")
  sbx.use_policy { format_output = function(part) return "<" .. part.bytes .. " bytes>" end }
  tap.is(call(box, "bash", { command = "long" }), "<200 bytes>", "a format_output override reaches the tool text")
  tap.is(call(box, "bash", { command = "fail" }), "[Exit code: 3]\n<5 bytes>", "through the default format_result")
  sbx.use_policy { format_result = function(r, pol) return "exit=" .. tostring(r.exit_code) .. " " .. pol.format_output(r.parts.output, pol) end }
  tap.is(call(box, "bash", { command = "fail" }), "exit=3 <5 bytes>", "a format_result override calls the live format_output")
  sbx.use_policy { format_tool_error = function(msg) return "E! " .. msg end }
  tap.like(call(box, "bash", { command = 5 }), "^E! invalid arguments for bash", "format_tool_error override")
  box:close()
end

do
  reset()
  local box = fake_box(outputs)
  sbx.use_policy { exec = { timeout = 9, max_timeout = 20 } }
  call(box, "bash", { command = "quiet" })
  local t = box:tools()[1]
  tap.like(t.schema.properties.timeout.description, "default 9, at most 20", "the timeout description states exec.timeout and max_timeout")
  local r = box:exec("hang", { timeout = 500 })
  tap.is(r.timeout, 20, "a timeout above exec.max_timeout is lowered to it")
  tap.ok(r.timed_out, "and the command runs until then")
  sbx.use_policy { background = { read_max = 3 } }
  local pd = box:tools()[3]
  tap.like(pd.schema.properties.max_bytes.description, "default 3%)", "process_output's description states background.read_max")
  sbx.use_policy { tools = { bash = { description = "Shell, please." } }, tool_order = { "bash", "list_processes" } }
  local tools = box:tools()
  tap.is(#tools, 2, "tool_order chooses the tools")
  tap.is(tools[1].description, "Shell, please.", "a tool description from the policy")
  tap.is(#sbx.tools.export("mcp"), 2, "sbx.tools.export uses the global policy")
  box:close()
end

do
  reset()
  sbx.use_policy {
    process_name = function(_, n) return "job" .. n end,
    format_started = function(p) return "bg " .. p.name end,
    status_text = function(p) return "STATE:" .. p.status end,
    omitted_marker = function(part) return "<cut " .. part.omitted .. ">" end,
  }
  local box = fake_box(outputs)
  tap.is(call(box, "bash", { command = "quiet", run_in_background = true }), "bg job1", "process_name and format_started")
  box:wait("job1", 5)
  tap.like(call(box, "list_processes", {}), "job1%s+STATE:exited", "a status_text override reaches the process table")
  tap.like(call(box, "list_processes", { name = "job1" }), "Status: STATE:exited", "and the single-process view")
  tap.like(call(box, "process_output", { name = "job1" }), "%[STATE:exited; next offset", "and process_output")
  call(box, "bash", { command = "hang", run_in_background = true, name = "srv" })
  tap.like(call(box, "kill_process", { name = "srv" }), "stopped %(STATE:killed%)", "and kill_process")
  sbx.use_policy { exec = { capture = { stdout = { head = 2, tail = 2 }, output = { head = 2, tail = 2 } } } }
  local r = box:exec("long")
  tap.is(r.stdout, "aa<cut 196>bb", "omitted_marker shapes result.stdout")
  sbx.use_policy { shell_argv = function(_, command) return { "bash", "-c", "wrapped: " .. command } end }
  box:exec("x")
  tap.is(fake.started[#fake.started].command, "wrapped: x", "shell_argv builds the argv")
  box:close()
end

-- 3. Per-box overlays, side by side ---------------------------------------------------
do
  reset()
  local plain = fake_box(outputs)
  local short = fake_box(outputs, { policy = { output = { head_chars = 1, tail_chars = 1 } } })
  local delu = fake_box(outputs, { policy = "lm-deluge" })
  tap.is(call(plain, "bash", { command = "long" }), long, "a box without an overlay uses the global policy")
  tap.is(call(short, "bash", { command = "long" }), "a\n...[198 bytes omitted; 200 bytes in all]...\nb", "a box overlay applies to that box")
  tap.is(#delu:tools(), 2, "a bundled policy by name as a box overlay")
  tap.is(call(delu, "bash", { command = "fail" }), "[Exit code: 3]\noops\n", "lm-deluge strings on its box only")
  tap.is(delu.spec.workdir, "/workspace", "the overlay's box defaults apply to that box")
  tap.is(plain.spec.workdir, defaults.box.workdir, "and not to the others")
  sbx.use_policy { output = { head_chars = 2, tail_chars = 2 } }
  tap.is(call(plain, "bash", { command = "long" }), "aa\n...[196 bytes omitted; 200 bytes in all]...\nbb", "use_policy reaches the plain box")
  tap.is(call(short, "bash", { command = "long" }), "a\n...[198 bytes omitted; 200 bytes in all]...\nb", "while the overlay still wins on its box")
  sbx.use_policy { exec = { max_timeout = 4 } }
  tap.is(short:exec("hang", { timeout = 100 }).timeout, 4, "a live change the overlay does not set reaches the overlay box")
  tap.checkerr("box%.memory must be", sbx.box, { backend = "fake", policy = { box = { memory = "lots" } } })
  plain:close(); short:close(); delu:close()
end

-- 4. Validation --------------------------------------------------------------------
do
  reset()
  tap.checkerr("policy field exec%.timeout must be a number > 0, not the string \"ten\"", sbx.use_policy, { exec = { timeout = "ten" } })
  tap.checkerr("exec%.max_timeout must be > 0, not %-1", sbx.use_policy, { exec = { max_timeout = -1 } })
  tap.checkerr("unknown policy field exec%.timout %(did you mean exec%.timeout%?%)", sbx.use_policy, { exec = { timout = 5 } })
  tap.checkerr("unknown policy field outptu %(did you mean output%?%)", sbx.use_policy, { outptu = {} })
  tap.checkerr("box%.pull must be one of \"missing\", \"always\", \"never\"", sbx.use_policy, { box = { pull = "sometimes" } })
  tap.checkerr("tools%.bash%.description must be", sbx.use_policy, { tools = { bash = { description = 5 } } })
  tap.checkerr("hooks%.before_exec must be a function or nil", sbx.use_policy, { hooks = { before_exec = "deny" } })
  tap.checkerr("budget%.commands must be an integer", sbx.use_policy, { budget = { commands = 1.5 } })
  tap.checkerr("trace%.redact must be a list", sbx.use_policy, { trace = { redact = "KEY" } })
  tap.checkerr("box%.cap_drop%[2%] must be a string", sbx.use_policy, { box = { cap_drop = { "ALL", 3 } } })
  tap.checkerr("unknown box option 'memroy' %(did you mean 'memory'%?%)", sbx.box, { backend = "fake", memroy = 1 })
  tap.checkerr("unknown box option 'binds'", sbx.box, { backend = "fake", binds = { "/:/host" } })
  tap.checkerr("box option memory must be a number > 0 or false, not the string \"lots\"", sbx.box, { backend = "fake", memory = "lots" })
  tap.is(sbx.policy.exec.timeout, defaults.exec.timeout, "a refused policy changes nothing")
  local ok = pcall(sbx.use_policy, { exec = { shell = { "/bin/zsh", "-c" } }, user = { anything = { 1, 2 } },
    tools = { mine = { description = function() return "x" end, parameters = { { "a", { type = "string" }, required = true } },
      run = function() return "ran" end } }, tool_order = { "mine" } })
  tap.ok(ok, "valid values of every shape load (argv shell, user data, a new tool)")
  local box = fake_box(outputs)
  tap.is(call(box, "mine", { a = "z" }), "ran", "and a policy's own tool runs")
  box:close()
end

-- 5. Hooks: before_exec and after_exec -------------------------------------------------
do
  reset()
  local seen = {}
  sbx.use_policy { hooks = {
    before_exec = function(box, req, pol)
      seen[#seen + 1] = req
      if type(req.command) == "string" and req.command:find("rm %-rf") then return false, "no deleting, please" end
      if req.command == "quiet" and req.source == "exec" then
        local r = {}
        for k, v in pairs(req) do r[k] = v end
        r.command, r.env = "long", { CHANGED = "1" }
        return r
      end
    end,
    after_exec = function(box, req, result)
      if req.command == "fail" then result.exit_code = 99 return result end
    end,
  } }
  local box = fake_box(outputs)
  local r, err, code = box:exec("rm -rf /")
  tap.ok(r == nil and code == "denied", "a before_exec refusal: nil, message, \"denied\"")
  tap.is(err, "no deleting, please", "with the hook's message")
  local before = #fake.started
  box:exec("rm -rf /tmp")
  tap.is(#fake.started, before, "the refused command never reaches the backend")
  tap.is(box.usage.commands, 0, "and counts against no budget")
  tap.like(call(box, "bash", { command = "rm -rf /" }), "^Error: no deleting, please$", "a tool call reads the refusal")
  local req = seen[#seen]
  tap.is(req.source, "tool", "tool calls say source = tool")
  tap.is(req.timeout, defaults.exec.timeout, "req.timeout is the effective timeout")
  tap.is(req.background, false, "req.background")
  tap.ok(type(req.argv) == "table" and req.argv[#req.argv] == "rm -rf /", "req.argv is the shell argv")
  tap.is(req.env.PAGER, "cat", "req.env holds the policy's env")
  r = box:exec("quiet")
  tap.is(r.stdout, long, "a changed req runs instead (a new command is turned into argv)")
  tap.is(fake.started[#fake.started].command, "long", "the backend got the new command")
  local env = table.concat(fake.started[#fake.started].env, " ")
  tap.like(env, "CHANGED=1", "with the hook's env")
  tap.ok(not env:find("PAGER"), "and only that env (plus sbx's job marker)")
  tap.is(box:exec("fail").exit_code, 99, "after_exec replaces a result")
  box:spawn({ "sleep", "1" }, { stdin = "abc" })
  tap.is(seen[#seen].source, "spawn", "spawn says source = spawn")
  tap.is(seen[#seen].background, true, "with background = true")
  tap.is(seen[#seen].stdin_bytes, 3, "and stdin_bytes")
  tap.is(seen[#seen].command[1], "sleep", "an argv command is handed over as given")
  box:write_file("/x", "data")
  tap.is(seen[#seen].command[1], "sleep", "sbx's own helpers (write_file) never reach the hook")
  box:close()
  tap.checkerr("hooks%.before_exec must return", function()
    reset()
    sbx.use_policy { hooks = { before_exec = function() return 42 end } }
    local b = fake_box(outputs)
    b:exec("quiet")
  end)
end

-- 5b. Hooks that never return end at their deadline (policy.hooks.timeout,
-- and the command's own timeout for before_exec); the command never runs.
do
  reset()
  sbx.use_policy { hooks = { timeout = 0.3, before_exec = function(_, req)
    if req.command == "spin" then while true do pcall(function() while true do end end) end end
    if req.command == "wait" then sbx.sleep(3600) end
  end } }
  local box = fake_box(outputs)
  local before = #fake.started
  for _, c in ipairs { "spin", "wait" } do
    local r, err, code = box:exec(c)
    tap.ok(r == nil and code == "hook_timeout", "a before_exec that never returns (" .. c .. "): hook_timeout", err)
    tap.like(err or "", "hooks.before_exec did not return", "the message names the hook")
  end
  tap.is(#fake.started, before, "and neither command reached the backend")
  sbx.use_policy { hooks = { timeout = 3600 } }
  local r, err, code = box:exec("spin", { timeout = 0.3 })
  tap.ok(r == nil and code == "hook_timeout", "before_exec runs within the command's own timeout", err)
  tap.ok(box:exec("quiet"), "the box goes on running commands")
  box:close()
  reset()
  sbx.use_policy { hooks = { timeout = 0.3, after_exec = function() while true do end end } }
  box = fake_box(outputs)
  r, err, code = box:exec("quiet")
  tap.ok(r == nil and code == "hook_timeout", "an after_exec that never returns: hook_timeout", err)
  box:close()
end

-- 6. Budgets ---------------------------------------------------------------------------------
do
  reset()
  sbx.use_policy { budget = { commands = 2 } }
  local box = fake_box(outputs)
  tap.ok(box:exec("quiet"), "budget: first command")
  tap.ok(box:exec("quiet"), "budget: second command")
  local r, err, code = box:exec("quiet")
  tap.ok(r == nil and code == "budget_exceeded", "the third is refused with budget_exceeded")
  tap.like(err, "commands budget is used up: 2 of 2 commands used", "the message says which budget and how much")
  tap.is(box.usage.commands, 2, "box.usage counts the commands")
  tap.like(call(box, "bash", { command = "quiet" }), "^Error: the box's commands budget is used up", "a model reads it")
  box:close()

  reset()
  sbx.use_policy { budget = { output_bytes = 300 } }
  box = fake_box(outputs)
  box:exec("long")
  tap.is(box.usage.output_bytes, 200, "output bytes are counted")
  box:exec("long")
  r, err, code = box:exec("long")
  tap.is(code, "budget_exceeded", "past output_bytes the next command is refused")
  tap.like(err, "output bytes budget is used up: 400 of 300", "naming the output budget")
  box:close()

  reset()
  sbx.use_policy { budget = { seconds = 0.6 } }
  box = fake_box(outputs)
  r = box:exec("hang", { timeout = 100 })
  tap.ok(r.timed_out and r.timeout <= 0.6, "the seconds budget caps the next command's timeout")
  tap.ok(box.usage.seconds >= 0.55, "and the wall time is counted")
  r, err, code = box:exec("quiet")
  tap.is(code, "budget_exceeded", "once spent, commands are refused")
  tap.like(err, "seconds budget", "naming the seconds budget")
  box:close()

  reset()
  sbx.use_policy { budget = { commands = 1 }, hooks = { before_exec = function(_, req)
    if req.command == "fail" then return false end end } }
  box = fake_box(outputs)
  r, err, code = box:exec("fail")
  tap.is(code, "denied", "a refusal without a message")
  tap.is(err, sbx.policy.denied_message, "uses policy.denied_message")
  tap.ok(box:exec("quiet"), "a refused command did not use the budget")
  box:close()
end

-- 7. The harness under hooks and budgets ------------------------------------------------------
do
  reset()
  sbx.use_policy { hooks = { before_exec = function(_, req)
    if req.source == "harness" and type(req.command) == "string" and req.command:find("forbidden") then
      return false, "forbidden by policy"
    end
  end } }
  local s = sbx.harness.run { progress = "none", box = { backend = "fake", respond = function() return { stdout = "" } end },
    tasks = {
      { id = "run-refused", run = "forbidden run" },
      { id = "setup-refused", setup = { "forbidden setup" }, run = "true" },
      { id = "check-refused", run = "true", check = "forbidden check", outputs = { "/tmp/none" } },
      { id = "fine", run = "true" },
      { id = "bad-option", box = { host_config = { Privileged = true } }, run = "true" },
    } }
  local by = {}
  for _, r in ipairs(s.results) do by[r.id] = r end
  tap.is(by["run-refused"].status, "failed", "a refused run is a failed task")
  tap.like(by["run-refused"].reason, "forbidden by policy", "with the refusal as its reason")
  tap.is(by["setup-refused"].status, "error", "a refused setup is an error")
  tap.is(by["check-refused"].status, "error", "a refused check is an error")
  tap.is(by.fine.status, "passed", "an allowed task passes")
  tap.is(by["bad-option"].status, "error", "a task may not set host_config")
  tap.like(by["bad-option"].error, "host_config", "and the error names the option")
end

-- 8. lm-deluge strings without a daemon ----------------------------------------------------------
do
  reset()
  sbx.use_policy "lm-deluge"
  local box = fake_box {
    ["true"] = { stdout = "" },
    ["exit 1"] = { exit_code = 1 },
    mixed = { stdout = "out\n", stderr = "err\n", exit_code = 3 },
    big = { stdout = ("x"):rep(6000), exit_code = 2 },
    uni = { stdout = ("é"):rep(5001) },
    slow = { hang = true },
  }
  tap.is(call(box, "bash", { command = "true" }), "(no output)", "lm-deluge: (no output)")
  tap.is(call(box, "bash", { command = "exit 1" }), "[Exit code: 1]\n", "lm-deluge: exit code with empty output")
  tap.is(call(box, "bash", { command = "mixed" }), "[Exit code: 3]\nout\nerr\n", "lm-deluge: combined output after the exit code")
  tap.is(call(box, "bash", { command = "big" }), "[Exit code: 2]\n...[truncated]...\n" .. ("x"):rep(5000), "lm-deluge: last 5000 characters")
  tap.is(call(box, "bash", { command = "uni" }), "...[truncated]...\n" .. ("é"):rep(5000), "lm-deluge: counted in characters")
  tap.is(call(box, "bash", { command = "slow", timeout = 1 }), "[Timeout after 1s]", "lm-deluge: timeout string")
  tap.is(call(box, "bash", { command = "true", wait = false }),
    "Started background process 'p1'.\nCommand: true\nUse list_processes() to check status.", "lm-deluge: wait=false runs in the background")
  box:wait("p1", 5)
  tap.like(call(box, "list_processes", {}), "p1       exit 0              true", "lm-deluge: process table")
  sbx.use_policy { output = { tail_chars = 10 } }
  tap.is(call(box, "bash", { command = "big" }), "[Exit code: 2]\n...[truncated]...\n" .. ("x"):rep(10), "lm-deluge reads output.tail_chars from the live policy")
  sbx.use_policy { exec = { timeout = 33 } }
  tap.like(box:tools()[1].schema.properties.timeout.description, "default: 33,", "lm-deluge's timeout description follows exec.timeout")
  box:close()
end

-- 9. Every other text hook and background knob reaches the model ------------------------------
do
  reset()
  local box = fake_box {
    quiet = { stdout = "" },
    hog = { oom = 64 * 1024 * 1024 },
    hang = { hang = true },
    forty = { stdout = ("z"):rep(40) },
  }
  sbx.use_policy {
    format_processes = function(list, name) return "PROCS " .. #list .. " " .. tostring(name) end,
    format_process_output = function(o) return "OUT " .. o.process.name .. " " .. o.total end,
    format_killed = function(p) return "KILLED " .. p.name end,
    format_oom = function(r) return "OOM " .. r.memory_limit end,
    format_arg_too_long = function(which, bytes) return "LONG " .. which .. " " .. bytes end,
    format_budget_exceeded = function(which, used, limit) return "BUDGET " .. which .. " " .. used .. "/" .. limit end,
    format_evicted = function(p) return "EVICTED " .. p.name end,
  }
  call(box, "bash", { command = "forty", run_in_background = true, name = "a" })
  box:wait("a", 5)
  tap.is(call(box, "list_processes", {}), "PROCS 1 nil", "a format_processes override is the process table")
  tap.is(call(box, "list_processes", { name = "a" }), "PROCS 1 a", "and the single-process view")
  tap.is(call(box, "process_output", { name = "a" }), "OUT a 40", "a format_process_output override")
  call(box, "bash", { command = "hang", run_in_background = true, name = "srv" })
  tap.is(call(box, "kill_process", { name = "srv" }), "KILLED srv", "a format_killed override")
  tap.like(call(box, "bash", { command = "hog" }), "OOM 67108864", "a format_oom override reaches the bash text")
  sbx.use_policy { exec = { max_arg_bytes = 10 } }
  tap.like(call(box, "bash", { command = "echo " .. ("x"):rep(20) }), "^Error: LONG argument %d+ %d+$",
    "a format_arg_too_long override (exec.max_arg_bytes from the live policy)")
  reset()
  sbx.use_policy {
    format_budget_exceeded = function(which, used, limit) return "BUDGET " .. which .. " " .. used .. "/" .. limit end,
    format_evicted = function(p) return "EVICTED " .. p.name end,
    background = { retain_bytes = 50 },
    budget = { commands = 3 },
  }
  local b2 = fake_box { forty = { stdout = ("z"):rep(40) }, quiet = { stdout = "" } }
  call(b2, "bash", { command = "forty", run_in_background = true, name = "first" })
  b2:wait("first", 5)
  call(b2, "bash", { command = "forty", run_in_background = true, name = "second" })
  b2:wait("second", 5)
  tap.is(call(b2, "process_output", { name = "first" }), "Error: EVICTED first",
    "background.retain_bytes evicts the oldest log, and format_evicted says so")
  call(b2, "bash", { command = "quiet" })
  tap.is(call(b2, "bash", { command = "quiet" }), "Error: BUDGET commands 3/3", "a format_budget_exceeded override")
  b2:close()
  reset()
  sbx.use_policy { background = { name_pattern = "^srv%-%d+$", max_name_length = 6 } }
  local b3 = fake_box { quiet = { stdout = "" } }
  tap.like(call(b3, "bash", { command = "quiet", run_in_background = true, name = "web" }), "^Error: .*web",
    "background.name_pattern refuses a name outside it")
  tap.like(call(b3, "bash", { command = "quiet", run_in_background = true, name = "srv-1" }), "srv%-1",
    "and takes one inside it")
  tap.like(call(b3, "bash", { command = "quiet", run_in_background = true, name = "srv-123" }), "^Error: .*6",
    "background.max_name_length refuses a longer name, saying the limit")
  b3:close()
  box:close()
end

-- 10. A box overlay from a policy file ------------------------------------------------------------
do
  reset()
  local file = os.tmpname()
  local f = assert(io.open(file, "w"))
  f:write("return { output = { head_chars = 2, tail_chars = 2 }, format_tool_error = function(m) return 'FILE: ' .. m end }\n")
  f:close()
  local fbox = fake_box(outputs, { policy = file })
  local plain = fake_box(outputs)
  tap.is(call(fbox, "bash", { command = "long" }), "aa\n...[196 bytes omitted; 200 bytes in all]...\nbb",
    "sbx.box{ policy = FILE }: the file's overlay on that box")
  tap.like(call(fbox, "bash", { command = 5 }), "^FILE: ", "its hooks too")
  tap.is(call(plain, "bash", { command = "long" }), long, "and not on another box")
  os.remove(file)
  f = assert(io.open(file, "w"))
  f:write("return { output = { head_chras = 2 } }\n")
  f:close()
  tap.checkerr("head_chras.*did you mean output%.head_chars", sbx.box, { backend = "fake", policy = file })
  os.remove(file)
  fbox:close(); plain:close()
end

reset()
tap.done()

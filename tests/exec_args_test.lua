-- needs: nothing
-- What a command is made of reaches the box as C strings: a NUL byte would
-- cut an argument short, so it is refused before anything runs, never
-- changed. Env names are names. A model's arguments (NUL, huge or odd
-- numbers) get a tool error or a clamped answer, never an internal error.
local tap = require "tap"
local sbx = require "sbx"
local fake = require "fake_backend"
package.loaded["sbx.backends.fake"] = fake

local function respond(_, cmd)
  if cmd and cmd:match("^print ") then return { stdout = string.rep("x", tonumber(cmd:match("%d+"))) } end
  return { stdout = "ran\n" }
end
local box = assert(sbx.box { backend = "fake", respond = respond })
local started = #fake.started

local function refused(pattern, name, f, ...)
  tap.checkerr(pattern, f, ...)
  tap.is(#fake.started, started, name .. ": nothing started")
end

-- NUL bytes: argv, command strings, env, cwd, user; exec and spawn alike.
refused("argument 3 of the command contains a NUL byte", "argv", box.exec, box, { "printf", "%s", "a\0b" })
refused("the command contains a NUL byte", "command string", box.exec, box, "echo a\0b")
refused("the command contains a NUL byte", "spawn", box.spawn, box, "sleep 1\0")
refused("env FOO contains a NUL byte", "env value", box.exec, box, "true", { env = { FOO = "a\0b" } })
refused("cwd contains a NUL byte", "cwd", box.exec, box, "true", { cwd = "/tmp\0/x" })
refused("user contains a NUL byte", "user", box.exec, box, "true", { user = "root\0" })
refused("path must not contain a NUL byte", "read_file", box.read_file, box, "/etc/passwd\0.txt")
refused("path must not contain a NUL byte", "write_file", box.write_file, box, "/tmp/a\0b", "x")
tap.checkerr("cwd must be a string", box.exec, box, "true", { cwd = 42 })

-- Env names: NAME, not NAME=value, not empty, not starting with a digit.
refused("env name \"A=B\" is not a valid name", "A=B", box.exec, box, "true", { env = { ["A=B"] = "x" } })
refused("env name \"\" is not a valid name", "empty name", box.exec, box, "true", { env = { [""] = "x" } })
refused("env name \"1X\" is not a valid name", "leading digit", box.exec, box, "true", { env = { ["1X"] = "x" } })
refused("env name \"A\\0\" is not a valid name", "NUL in a name", box.exec, box, "true", { env = { ["A\0"] = "x" } })
refused("env name 5 is not a valid name", "a number as a name", box.spawn, box, "true", { env = { [5] = "x" } })
local r = assert(box:exec("true", { env = { _OK_1 = "x", lower = 1, FLAG = false } }))
tap.is(#fake.started, started + 1, "valid names run")
started = #fake.started
local env = table.concat(fake.started[#fake.started].env, " ")
tap.ok(env:find("_OK_1=x", 1, true) and env:find("lower=1", 1, true) and not env:find("FLAG"), "with their values (false removes)")

-- The same rules for policies and box options, checked when loaded.
tap.checkerr("exec%.env: \"A=B\" is not a valid environment variable name", sbx.use_policy, { exec = { env = { ["A=B"] = "1" } } })
tap.checkerr("exec%.env%.X: must not contain a NUL byte", sbx.use_policy, { exec = { env = { X = "a\0" } } })
tap.checkerr("box option env: \"\" is not a valid environment variable name", sbx.box, { backend = "fake", env = { [""] = "x" } })

-- A hook's changed request is held to the same rules.
local hbox = assert(sbx.box { backend = "fake", respond = respond, policy = { hooks = { before_exec = function(_, req)
  if req.command == "hook-nul" then return { argv = { "echo", "a\0" } } end
  if req.command == "hook-env" then return { env = { ["X Y"] = "1" } } end
end } } })
refused("hooks%.before_exec: argument 2 of the command contains a NUL byte", "hook argv", hbox.exec, hbox, "hook-nul")
refused("hooks%.before_exec: env name \"X Y\" is not a valid name", "hook env", hbox.exec, hbox, "hook-env")
hbox:close()

-- A model's arguments through the tools: a text it can act on.
local tools = box:tools()
local function call(name, args)
  local text, is_error = sbx.tools.call(tools, name, args)
  return text, is_error
end
local function no_internals(text, name)
  tap.ok(not tostring(text):find("%.lua:%d+:"), name .. ": no Lua file path in " .. string.format("%q", tostring(text)))
end
local t, e = call("bash", '{"command": "echo a\\u0000b"}')
tap.like(t, "^Error: invalid arguments for bash: arguments%.command must not contain NUL bytes", "a NUL in a model's command is a tool error")
tap.is(e, true, "flagged as an error")
tap.is(#fake.started, started, "and nothing ran")
t = call("bash", { command = "true", run_in_background = true, name = "a\0" })
tap.like(t, "must not contain NUL bytes", "a NUL in a process name")

-- Numbers: every numeric parameter of the default tools.
assert(box:spawn("print 1000", { name = "log" }))
assert(box:wait("log", 5))
t = call("process_output", '{"name": "log", "offset": 1e308}')
tap.like(t, "^%(no new output%)\n%[exited 0; next offset 1000 of 1000 bytes%]$", "offset 1e308 reads nothing, next offset at the end")
no_internals(t, "offset 1e308")
t = call("process_output", '{"name": "log", "offset": 1e400}')
tap.like(t, "next offset 1000 of 1000 bytes", "offset 1e400 (inf) too")
t = call("process_output", { name = "log", max_bytes = 2 ^ 62 })
tap.like(t, "^" .. string.rep("x", 1000) .. "\n%[exited 0; next offset 1000 of 1000 bytes%]$", "max_bytes 2^62 reads what there is")
no_internals(t, "max_bytes 2^62")
t = call("process_output", '{"name": "log", "max_bytes": 1e400}')
tap.like(t, "next offset 1000 of 1000", "max_bytes 1e400 too")
t = call("process_output", { name = "log", offset = 999, max_bytes = 2 ^ 53 })
tap.like(t, "^x\n", "a big max_bytes from an offset")
t = call("process_output", { name = "log", offset = -1 })
tap.like(t, "^Error: invalid arguments for process_output: arguments%.offset must be at least 0", "a negative offset")
t = call("process_output", { name = "log", max_bytes = 0 })
tap.like(t, "must be at least 1", "max_bytes 0")
t = call("process_output", { name = "log", offset = 0 / 0 })
tap.like(t, "must be integer", "offset NaN")
t = call("bash", '{"command": "echo hi", "timeout": 1e308}')
tap.is(t, "ran\n", "timeout 1e308 is lowered to max_timeout and runs")
t = call("bash", '{"command": "echo hi", "timeout": 9223372036854775807}')
tap.is(t, "ran\n", "timeout 2^63-1 too")
t = call("bash", { command = "echo hi", timeout = -5 })
tap.like(t, "must be at least 1", "a negative timeout")
t = call("bash", { command = "echo hi", timeout = 2.5 })
tap.like(t, "must be integer", "a fractional timeout")

-- From Lua, the same numbers are contract errors or clamped.
tap.is(box:output("log", { offset = 1e308 }).next_offset, 1000, "box:output clamps a huge offset")
tap.is(#box:output("log", { max_bytes = math.huge }).text, 1000, "and a huge max_bytes")
tap.checkerr("offset must be a number >= 0", box.output, box, "log", { offset = -1 })
tap.checkerr("max_bytes must be a number >= 1", box.output, box, "log", { max_bytes = 0 / 0 })

-- The lm-deluge policy's timeout has no minimum: still a text, no internals.
local lm = assert(sbx.box { backend = "fake", respond = respond, policy = "lm-deluge" })
local lt = lm:tools()
t = sbx.tools.call(lt, "bash", { command = "echo hi", timeout = -5 })
tap.like(t, "timeout must be positive", "lm-deluge: a negative timeout says what is wrong")
no_internals(t, "lm-deluge negative timeout")
t = sbx.tools.call(lt, "bash", { command = "echo hi", timeout = 0 })
no_internals(t, "lm-deluge timeout 0")
lm:close()
box:close()
tap.done()

-- needs: docker
-- The LLM tools of the default policy: schemas, validation of a model's
-- arguments, and the texts it reads back.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local box = H.box()
local tools = box:tools()
local names = {}
for _, t in ipairs(tools) do names[#names + 1] = t.name end
tap.is(table.concat(names, ","), "bash,list_processes,process_output,kill_process", "default tool set")

local bash = tools[1]
tap.is(table.concat(bash.schema.required, ","), "command", "only command is required")
tap.is(bash.schema.additionalProperties, false, "schemas are closed")
local enc = sbx.json.encode(bash.schema)
tap.like(enc, '^{"type":"object","properties":{"command":{"type":"string"', "schema encodes in a stable order")

local call = function(name, args) return sbx.tools.call(tools, name, args) end

tap.is(call("bash", '{"command": "echo hi"}'), "hi\n", "a JSON string call runs the command")
tap.is(call("bash", { command = "true" }), "(no output)", "empty output says so")
tap.is(call("bash", { command = "echo oops >&2; exit 4" }), "[Exit code: 4]\noops\n", "non-zero exit code first")
tap.is(call("bash", { command = "echo a", timeout = sbx.json.null, name = sbx.json.null, run_in_background = sbx.json.null }),
  "a\n", "nulls for optional parameters (strict mode) are accepted")
tap.is(call("bash", { command = "echo b", name = "" }), "b\n", "an empty string name counts as absent")

-- A model's mistakes: clear messages, no exception.
tap.like(call("bash", '{"command": "echo hi"'), "^Error: the arguments for bash are not valid JSON", "malformed JSON")
tap.like(call("bash", "{}"), "missing the required field 'command'", "missing required field")
tap.like(call("bash", { command = "x", timeout = "ten" }), "arguments.timeout must be integer, not the string \"ten\"", "wrong type named with its value")
tap.like(call("bash", { command = "x", timout = 5 }), "unknown field 'timout' %(allowed: command, name, run_in_background, timeout%)", "misspelt field lists the allowed ones")
tap.like(call("bash", '[1,2]'), "must be a JSON object", "an array instead of an object")
tap.like(call("bash", '"ls"'), "must be a JSON object", "a bare string instead of an object")
tap.like(call("python", { code = "1" }), "no tool named 'python'; available tools: bash, list_processes", "unknown tool")
tap.like(call("bash", { command = "x", timeout = 0 }), "at least 1", "timeout below the minimum")
tap.like(call("kill_process", { name = "p1", signal = "NOPE" }), 'must be one of "TERM", "KILL"', "enum values are listed")
tap.like(call("bash", { command = 42 }), "arguments.command must be string, not integer 42", "a number for the command")

-- Timeout from the model: killed, and it is told so.
local t = call("bash", { command = "echo started; sleep 60", timeout = 1 })
tap.like(t, "^%[Timed out after 1s; the command and its child processes were killed%]\nstarted", "timeout text with the partial output")

-- Long output: head and tail with the size of what is missing.
local long = call("bash", { command = "seq 1 100000" })
tap.like(long, "^1\n2\n3\n", "long output keeps its head")
tap.like(long, "100000\n$", "and its tail")
tap.like(long, "bytes omitted; 588895 bytes in all", "and says how much was left out")

-- Background processes through the tools.
tap.is(call("list_processes", {}), "No background processes have been started.", "no processes yet")
local started = call("bash", { command = "for i in 1 2 3; do echo tick$i; sleep 0.2; done", run_in_background = true })
tap.like(started, "^Started background process 'p1'%.", "background start names the process")
local started2 = call("bash", { command = "sleep 300", run_in_background = true, name = "server" })
tap.like(started2, "'server'", "a chosen name")
tap.like(call("bash", { command = "sleep 1", run_in_background = true, name = "server" }), "still running", "a running name cannot be reused")
tap.like(call("bash", { command = "sleep 1", run_in_background = true, name = "bad name!" }), "invalid process name", "names are validated")
box:wait("p1", 10)
local listing = call("list_processes", {})
tap.like(listing, "p1%s+exited 0", "list shows an exited process with its code")
tap.like(listing, "server%s+running", "and a running one")
tap.like(call("list_processes", { name = "p1" }), "Status: exited 0", "one process by name")
tap.like(call("list_processes", { name = "zz" }), "Process 'zz' not found. Available: p1, server", "unknown name lists the known ones")
local out = call("process_output", { name = "p1" })
tap.like(out, "^tick1\ntick2\ntick3\n", "process_output returns the log")
tap.like(out, "next offset 18 of 18 bytes", "with the next offset")
tap.like(call("process_output", { name = "p1", offset = 12 }), "^tick3\n", "reading from an offset")
tap.like(call("kill_process", { name = "server" }), "Process 'server' stopped %(killed%)", "kill_process stops it")
tap.like(call("list_processes", {}), "server%s+killed", "and the list says killed")

box:close()
tap.done()

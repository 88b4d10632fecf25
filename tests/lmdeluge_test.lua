-- needs: docker
-- The bundled lm-deluge policy reproduces lm-deluge 0.0.89's DockerSandbox
-- strings exactly (tool texts, output rules, process listing).
local tap = require "tap"
local sbx = require "sbx"
sbx.use_policy("lm-deluge")
local H = require "helper"

local box = H.box()
local tools = box:tools()
tap.is(#tools, 2, "two tools, as the original")
tap.is(tools[1].description, "Execute a bash command in the Docker sandbox environment. The sandbox has Python 3.12 and uv pre-installed. Use 'apt-get update && apt-get install -y <package>' for system packages. Set wait=false to run servers or long-running processes in background.", "bash description verbatim")
tap.is(sbx.json.encode(tools[1].schema.properties),
  '{"command":{"type":"string","description":"The shell command to execute"},"timeout":{"type":"integer","description":"Timeout in seconds (default: 60, only for wait=true)"},"wait":{"type":"boolean","description":"If true (default), wait for completion. If false, run in background."},"name":{"type":"string","description":"Name for background process (e.g., \'server\'). Only used with wait=false."}}',
  "bash parameters verbatim, in the original order")
tap.is(tools[2].description, "Check status of background processes started with wait=false.", "list_processes description verbatim")
tap.is(sbx.policy.box.workdir, "/workspace", "workdir /workspace")
tap.is(sbx.policy.exec.timeout, 60, "timeout 60 s")

local call = function(name, args) return sbx.tools.call(tools, name, args) end
tap.is(call("bash", { command = "true" }), "(no output)", "(no output)")
tap.is(call("bash", { command = "exit 1" }), "[Exit code: 1]\n", "exit code with empty output ends in a newline")
tap.is(call("bash", { command = "echo out; sleep 0.2; echo err >&2; exit 3" }), "[Exit code: 3]\nout\nerr\n", "combined output after the exit code")
local long = call("bash", { command = "head -c 6000 /dev/zero | tr '\\0' x; exit 2" })
tap.is(long, "[Exit code: 2]\n...[truncated]...\n" .. string.rep("x", 5000), "last 5000 characters after the marker")
local uni = call("bash", { command = "for i in $(seq 1 5001); do printf 'é'; done" })
tap.is(uni, "...[truncated]...\n" .. string.rep("é", 5000), "counted in characters, not bytes")
local big = call("bash", { command = "seq 1 200000" })
tap.like(big, "^%.%.%.%[truncated%]%.%.%.\n", "a capture-truncated output still gets the marker")
tap.like(big, "\n200000\n$", "and the true tail")
tap.is(call("bash", { command = "sleep 30", timeout = 1 }), "[Timeout after 1s]", "timeout string")
local left = box:exec("ps -eo args | grep -c '^sleep 30' || true")
tap.is(left.stdout, "0\n", "and unlike the original, the command is gone")

tap.is(call("list_processes", {}), "No background processes have been started.", "empty registry sentence")
tap.is(call("bash", { command = "sleep 0.2; exit 2", wait = false }),
  "Started background process 'p1'.\nCommand: sleep 0.2; exit 2\nUse list_processes() to check status.", "background start message")
tap.is(call("bash", { command = "sleep 300", wait = false, name = "server" }),
  "Started background process 'server'.\nCommand: sleep 300\nUse list_processes() to check status.", "named background process")
box:wait("p1", 10)
tap.is(call("list_processes", { name = "" }),
  "NAME     STATUS              COMMAND\np1       exit 2              sleep 0.2; exit 2\nserver   running             sleep 300", "process table")
tap.like(call("list_processes", { name = "p1" }), "^Process: p1\nCommand: sleep 0%.2; exit 2\nStatus: completed %(exit code: 2%)\nRunning for: 0%.%ds$", "single process detail")
tap.is(call("list_processes", { name = "zz" }), "Process 'zz' not found. Available: p1, server", "unknown name")
call("bash", { command = "echo " .. string.rep("a", 50), wait = false })
tap.like(call("list_processes", {}), "p2       running             echo a+%.%.%.", "commands cut at 40 characters plus ...")
box:close()
tap.done()

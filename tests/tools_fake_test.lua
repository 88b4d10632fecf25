-- needs: nothing
-- The texts a model reads, without a daemon: the default policy's tools
-- and the bundled lm-deluge policy on the fake backend (tests/lib/
-- fake_backend.lua), whose commands answer with chosen output, so what is
-- checked is the policy's formatting and the tools' validation, through
-- the real capture and result code. tools_test.lua and lmdeluge_test.lua
-- check the same texts against real boxes.
local tap = require "tap"
local sbx = require "sbx"

package.loaded["sbx.backends.fake"] = require "fake_backend"

-- What each command prints: a small table of the commands used below.
local function respond(_, cmd)
  if cmd == nil then return {} end
  local word = cmd:match("^echo (%S+)$")
  if word then return { stdout = word .. "\n" } end
  if cmd == "true" then return {} end
  if cmd == "exit 1" then return { exit_code = 1 } end
  if cmd == "echo oops >&2; exit 4" then return { stderr = "oops\n", exit_code = 4 } end
  if cmd == "echo out; sleep 0.2; echo err >&2; exit 3" then
    return { stdout = "out\n", stderr = "err\n", exit_code = 3 }
  end
  if cmd == "seq 1 100000" or cmd == "seq 1 200000" then
    local n, t = tonumber(cmd:match("(%d+)$")), {}
    for i = 1, n do t[i] = i end
    return { stdout = table.concat(t, "\n") .. "\n" }
  end
  if cmd == "x6000" then return { stdout = string.rep("x", 6000), exit_code = 2 } end
  if cmd == "e5001" then return { stdout = string.rep("é", 5001) } end
  if cmd:find("^sleep") or cmd:find("sleep 60$") then return { stdout = cmd:find("^echo started") and "started\n" or nil, hang = true } end
  return { stdout = "?\n" }
end

-- The default policy ---------------------------------------------------------------------
do
  local box <close> = assert(sbx.box { backend = "fake", respond = respond })
  local tools = box:tools()
  local names = {}
  for _, t in ipairs(tools) do names[#names + 1] = t.name end
  tap.is(table.concat(names, ","), "bash,list_processes,process_output,kill_process", "default tool set")
  local call = function(name, args) return sbx.tools.call(tools, name, args) end
  tap.is(call("bash", '{"command": "echo hi"}'), "hi\n", "a JSON string call runs the command")
  tap.is(call("bash", { command = "true" }), "(no output)", "empty output says so")
  tap.is(call("bash", { command = "echo oops >&2; exit 4" }), "[Exit code: 4]\noops\n", "non-zero exit code first")
  tap.is(call("bash", { command = "echo a", timeout = sbx.json.null, name = sbx.json.null,
    run_in_background = sbx.json.null }), "a\n", "nulls for optional parameters (strict mode) are accepted")
  tap.like(call("bash", '{"command": "echo hi"'), "^Error: the arguments for bash are not valid JSON", "malformed JSON")
  tap.like(call("bash", "{}"), "missing the required field 'command'", "missing required field")
  tap.like(call("bash", { command = "x", timeout = "ten" }), "arguments.timeout must be integer, not the string \"ten\"",
    "wrong type named with its value")
  tap.like(call("bash", { command = "x", timout = 5 }),
    "unknown field 'timout' %(allowed: command, name, run_in_background, timeout%)", "misspelt field lists the allowed ones")
  tap.like(call("python", { code = "1" }), "no tool named 'python'; available tools: bash, list_processes", "unknown tool")
  tap.like(call("kill_process", { name = "p1", signal = "NOPE" }), 'must be one of "TERM", "KILL"', "enum values are listed")
  local t = call("bash", { command = "echo started; sleep 60", timeout = 1 })
  tap.like(t, "^%[Timed out after 1s; the command and its child processes were killed%]\nstarted",
    "timeout text with the partial output")
  local long = call("bash", { command = "seq 1 100000" })
  tap.like(long, "^1\n2\n3\n", "long output keeps its head")
  tap.like(long, "100000\n$", "and its tail")
  tap.like(long, "bytes omitted; 588895 bytes in all", "and says how much was left out")
  tap.is(call("list_processes", {}), "No background processes have been started.", "no processes yet")
end

-- The lm-deluge policy, string for string -------------------------------------------------
do
  local box <close> = assert(sbx.box { backend = "fake", respond = respond, policy = "lm-deluge" })
  local tools = box:tools()
  tap.is(#tools, 2, "lm-deluge: two tools, as the original")
  tap.is(tools[2].description, "Check status of background processes started with wait=false.",
    "lm-deluge: list_processes description verbatim")
  local call = function(name, args) return sbx.tools.call(tools, name, args) end
  tap.is(call("bash", { command = "true" }), "(no output)", "lm-deluge: (no output)")
  tap.is(call("bash", { command = "exit 1" }), "[Exit code: 1]\n", "lm-deluge: exit code with empty output ends in a newline")
  tap.is(call("bash", { command = "echo out; sleep 0.2; echo err >&2; exit 3" }), "[Exit code: 3]\nout\nerr\n",
    "lm-deluge: combined output after the exit code")
  tap.is(call("bash", { command = "x6000" }), "[Exit code: 2]\n...[truncated]...\n" .. string.rep("x", 5000),
    "lm-deluge: last 5000 characters after the marker")
  tap.is(call("bash", { command = "e5001" }), "...[truncated]...\n" .. string.rep("é", 5000),
    "lm-deluge: counted in characters, not bytes")
  local big = call("bash", { command = "seq 1 200000" })
  tap.like(big, "^%.%.%.%[truncated%]%.%.%.\n", "lm-deluge: a capture-truncated output still gets the marker")
  tap.like(big, "\n200000\n$", "lm-deluge: and the true tail")
  tap.is(call("bash", { command = "sleep 30", timeout = 1 }), "[Timeout after 1s]", "lm-deluge: timeout string")
  tap.is(call("list_processes", {}), "No background processes have been started.", "lm-deluge: empty registry sentence")
end

tap.done()

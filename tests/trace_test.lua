-- Call traces (sbx.trace) and the replay backend: a session recorded against
-- the real daemon, checked line by line, then replayed in a child sbx that
-- cannot reach Docker, with every result and tool text compared.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir))
local trace_path = dir .. "/trace.jsonl"

-- The session, as source: run here on a real box and in the child on a
-- replay box. It returns what a caller saw, in order.
local SESSION = [==[
local sbx, box = ...
local seen = {}
local function see(label, ...) seen[#seen + 1] = { label, table.pack(...) } end
see("secret", box:exec('test "$API_KEY" = supersecret && echo key-ok', { env = { API_KEY = "supersecret", PLAIN = "visible" } }))
see("failing", box:exec("echo out; echo err >&2; exit 3"))
see("timeout", box:exec("echo before; sleep 5", { timeout = 1 }))
see("stdin", box:exec({ "wc", "-c" }, { stdin = "hello stdin" }))
see("long", box:exec("seq 1 100000"))
see("spawn", box:spawn("for i in 1 2 3; do echo tick $i; done; sleep 30", { name = "ticker" }))
sbx.sleep(0.5)
see("output", box:output("ticker"))
see("processes", box:processes())
see("kill", box:kill("ticker"))
see("wait", box:wait("ticker", 5))
see("missing", box:output("nope"))
see("write", box:write_file("/tmp/t/a.txt", "data\n"))
see("read", box:read_file("/tmp/t/a.txt"))
see("read_missing", box:read_file("/tmp/none.txt"))
local tools = box:tools()
local call = function(name, args) return sbx.tools.call(tools, name, args) end
see("tool_fail", call("bash", { command = "echo tool; exit 2" }))
see("tool_timeout", call("bash", '{"command": "sleep 5", "timeout": 1}'))
see("tool_bg", call("bash", { command = "echo bg; sleep 30", run_in_background = true }))
sbx.sleep(0.5)
see("tool_output", call("process_output", { name = "p1" }))
see("tool_list", call("list_processes", {}))
see("tool_kill", call("kill_process", { name = "p1" }))
see("tool_bad", call("process_output", { name = "p9" }))
return seen
]==]

-- A stable text for any value: sorted keys, floats at 15 digits (sbx.json
-- keeps 15 significant digits, see the report).
local CANON = [==[
local function canon(v)
  local t = type(v)
  if t == "table" then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    local out = {}
    for _, k in ipairs(keys) do out[#out + 1] = tostring(k) .. "=" .. canon(v[k]) end
    return "{" .. table.concat(out, ",") .. "}"
  elseif t == "number" then
    return math.type(v) == "float" and string.format("%.15g", v) or tostring(v)
  elseif t == "string" then
    return (string.format("%q", v):gsub("\n", "n"))
  end
  return tostring(v)
end
return canon
]==]
local canon = assert(load(CANON, "=canon"))()

-- Recording ------------------------------------------------------------------------

tap.ok(sbx.trace.start(trace_path, { secrets = { "supersecret" } }), "trace started")
local box = H.box { image = H.busybox }
local seen = assert(load(SESSION, "=session"))(sbx, box)
box:close()
tap.ok(sbx.trace.stop(), "trace stopped")
tap.is(sbx.trace.active(), nil, "no trace after stop")

local byl = {}
for _, s in ipairs(seen) do byl[s[1]] = s[2] end
tap.is(byl.secret[1].stdout, "key-ok\n", "the secret env reached the command")
tap.is(byl.failing[1].exit_code, 3, "failing command")
tap.is(byl.timeout[1].timed_out, true, "timed out")
tap.like(byl.stdin[1].stdout, "^%s*11\n$", "stdin")
tap.is(byl.output[1].text, "tick 1\ntick 2\ntick 3\n", "background output")
tap.is(byl.kill[1].status, "killed", "killed")
tap.is(byl.read[1], "data\n", "file round trip")
tap.is(byl.tool_fail[1], "[Exit code: 2]\ntool\n", "tool text")
tap.like(byl.tool_timeout[1], "^%[Timed out after 1s", "tool timeout text")

local f = assert(io.open(trace_path))
local text = f:read("a")
f:close()
tap.ok(not text:find("supersecret", 1, true), "the secret appears nowhere in the trace")
tap.ok(not text:find("hello stdin", 1, true), "stdin is not recorded by default")

local recs, ops, last_seq, in_order = {}, {}, 0, true
for line in text:gmatch("[^\n]+") do
  local r = assert(sbx.json.decode(line))
  recs[#recs + 1] = r
  ops[#ops + 1] = r.op
  if r.seq ~= last_seq + 1 then in_order = false end
  last_seq = r.seq
end
tap.ok(in_order, "seq counts up line by line")
tap.is(table.concat(ops, ","),
  "create,exec,exec,exec,exec,exec,spawn,output,processes,kill,wait,output,write_file,read_file,read_file," ..
  "exec,exec,spawn,output,processes,kill,output,close", "one line per outermost call, in order")
local r1 = recs[2]
tap.is(r1.box, box.id, "records name the box")
tap.is(r1.args.env.API_KEY, "[redacted]", "a secret env name is redacted")
tap.is(r1.args.env.PLAIN, "visible", "other env values are kept")
tap.is(r1.args.command, 'test "$API_KEY" = [redacted] && echo key-ok', "a listed secret is redacted in the command")
tap.is(r1.result.exit_code, 0, "exit code recorded")
tap.is(r1.result.parts.stdout.head, "key-ok\n", "parts recorded")
tap.ok(type(r1.t) == "number" and type(r1.duration) == "number", "t and duration")
tap.is(recs[5].args.stdin_bytes, 11, "stdin size recorded")
tap.is(recs[3].result.exit_code, 3, "failing exit code recorded")
tap.is(recs[4].result.timed_out, true, "timeout recorded")
tap.is(recs[12].error.code, "not_found", "an error is recorded as {message, code}")
tap.is(recs[1].result.id, box.id, "create records the id")

-- Tracing is off again: the methods are the plain ones.
local plain = H.box { image = H.busybox }
tap.is(plain:exec("echo x").stdout, "x\n", "works after stop")
plain:close()
local f2 = io.open(trace_path); local after = f2:read("a"); f2:close()
tap.is(#after, #text, "nothing recorded after stop")

-- Replay in-process: a different command is a mismatch.
local rb = assert(sbx.box { backend = "replay", trace = trace_path, trace_box = 1 })
local r, err, code = rb:exec("echo different")
tap.is(r, nil, "mismatch returns nil")
tap.like(err, "^replay mismatch: expected exec .* got exec \"echo different\"", "mismatch message")
tap.is(code, "replay_mismatch", "mismatch code")
local r2 = rb:exec("echo out; echo err >&2; exit 3")
tap.is(r2 and r2.exit_code, 3, "the next exec is the second recorded one")
rb:close()

-- Replay in a child that cannot reach Docker ------------------------------------------

local session_file = dir .. "/session.lua"
local sf = assert(io.open(session_file, "w")); sf:write(SESSION); sf:close()
local out_file = dir .. "/replayed.txt"
local script = dir .. "/replay.lua"
local cf = assert(io.open(dir .. "/canon.lua", "w")); cf:write(CANON); cf:close()
local sc = assert(io.open(script, "w"))
sc:write(string.format([[
-- Any use of the Docker backend is a failure.
package.loaded["sbx.backends.docker"] = setmetatable({}, { __index = function(_, k) error("docker backend used: " .. tostring(k)) end })
local sbx = require "sbx"
local canon = assert(loadfile(%q))()
local box = assert(sbx.box { backend = "replay", trace = %q })
local seen = assert(loadfile(%q))(sbx, box)
box:close()
local lines = {}
for _, s in ipairs(seen) do lines[#lines + 1] = s[1] .. " " .. canon(s[2]) end
local other, err, code = sbx.box { backend = "replay", trace = %q }
lines[#lines + 1] = "extra_box " .. canon({ other == nil, err, code })
local o = assert(io.open(%q, "w")); o:write(table.concat(lines, "\n")); o:close()
print("replayed")
]], dir .. "/canon.lua", trace_path, session_file, trace_path, out_file))
sc:close()
local t0 = sbx.now()
local out, rc = H.sh("DOCKER_HOST=unix:///nonexistent " .. H.sbx_bin .. " run " .. script)
tap.is(rc, 0, "the replay child succeeds")
tap.like(out, "^replayed\n$", "the child says nothing else", out)
tap.ok(sbx.now() - t0 < 5, "replay does not wait for timeouts (the sleeps are 1s in all)")

local rf = io.open(out_file)
local replayed = {}
if rf then
  for line in rf:lines() do
    local label, rest = line:match("^(%S+) (.*)$")
    replayed[label] = rest
  end
  rf:close()
end
for _, s in ipairs(seen) do
  local want = canon(s[2])
  tap.is(replayed[s[1]], want, "replayed " .. s[1] .. " is identical")
end
tap.like(replayed.extra_box or "", 'replay mismatch: expected no more boxes', "a second box has no recorded box left")

os.execute("rm -rf " .. dir)
tap.done()

-- needs: docker
-- Call traces (sbx.trace) and the replay backend: a session recorded against
-- the real daemon, checked line by line, then replayed in a child sbx that
-- cannot reach Docker, with every result and tool text compared.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local dir = H.tmpdir()
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
see("binary", box:exec("printf 'a\\377\\376b\\000c\\n'"))
see("tool_binary", call("bash", { command = "printf 'x\\377y'" }))
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
for _, e in ipairs(seen) do
  if e[1] == "binary" then tap.is(e[2][1].stdout, "a\255\254b\0c\n", "live: the result holds the command's exact bytes") end
  if e[1] == "tool_binary" then
    tap.like(e[2][1], "^x\u{FFFD}y\n%[1 byte of this output is not UTF%-8", "live: the tool text repairs them and says how many")
  end
end
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
  "exec,exec,spawn,output,processes,kill,output,exec,exec,close", "one line per outermost call, in order")
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

-- Redaction everywhere in a record ------------------------------------------------
-- Values redacted by env name are replaced wherever they appear (output,
-- commands, file data before it is base64-encoded); URL credentials are
-- replaced anywhere; the default name patterns cover DB_PASS, GITHUB_PAT,
-- lower-case names, but not PATH.
do
  local path = dir .. "/redact.jsonl"
  local SECRETS = {
    "dbpassword-1", "hunter2hunter2", "ghp_patvalue_0123456789", "lowercasesecret", "boxtokenvalue123",
    "s3cr3tpw", "cookievalue42", "sessionvalue42",
  }
  tap.ok(sbx.trace.start(path, { record_stdin = true }), "redaction: trace started")
  local b = H.box { image = H.busybox, env = { BOX_TOKEN = "boxtokenvalue123" } }
  local env = {
    DB_PASS = "dbpassword-1",
    DATABASE_URL = "postgres://u:hunter2hunter2@db/x",
    GITHUB_PAT = "ghp_patvalue_0123456789",
    db_password = "lowercasesecret",
    SHORT_TOKEN = "abc12",
    HTTP_COOKIE = "cookievalue42",
    SESSION_ID = "sessionvalue42",
    PATH = "/usr/local/bin:/usr/bin:/bin",
    PATHOLOGY = "not-a-secret-at-all",
    OLDPWD = "/work/previous",
  }
  local r = b:exec('echo "$DB_PASS $GITHUB_PAT $db_password $HTTP_COOKIE $SESSION_ID"; echo "$DATABASE_URL" >&2;'
    .. ' echo pw=hunter2hunter2; echo abc12345; echo "$PATH $PATHOLOGY $OLDPWD"', { env = env })
  tap.like(r.stdout, "dbpassword%-1 ghp_", "redaction: the command saw the real values")
  b:exec("echo dbpassword-1 in the command; echo box=$BOX_TOKEN")
  b:exec("echo https://alice:s3cr3tpw@example.com/x ssh://git@example.com/repo")
  b:write_file("/tmp/s.bin", "\255\254 dbpassword-1 \255")
  local data = b:read_file("/tmp/s.bin")
  tap.is(data, "\255\254 dbpassword-1 \255", "redaction: the file round trip is untouched")
  b:close()
  sbx.trace.stop()

  local f = assert(io.open(path))
  local text = f:read("a")
  f:close()
  local recs = assert(sbx.trace.load(path))
  -- Every string of every record, base64 fields decoded.
  local strings = {}
  local function collect(v)
    if type(v) == "string" then strings[#strings + 1] = v
    elseif type(v) == "table" then
      if v.base64 then strings[#strings + 1] = sbx.trace.bytes_in(v) end
      for _, x in pairs(v) do collect(x) end
    end
  end
  collect(recs)
  local all = table.concat(strings, "\n")
  for _, secret in ipairs(SECRETS) do
    tap.ok(not text:find(secret, 1, true) and not all:find(secret, 1, true),
      "redaction: " .. secret .. " appears nowhere, base64 data included")
  end
  local by_op = {}
  for _, rec in ipairs(recs) do
    by_op[rec.op] = by_op[rec.op] or {}
    table.insert(by_op[rec.op], rec)
  end
  local e1 = by_op.exec[1]
  local renv = e1.args.env
  tap.is(renv.DB_PASS, "[redacted]", "redaction: DB_PASS")
  tap.is(renv.GITHUB_PAT, "[redacted]", "redaction: GITHUB_PAT")
  tap.is(renv.db_password, "[redacted]", "redaction: names compare case-insensitively")
  tap.is(renv.HTTP_COOKIE, "[redacted]", "redaction: COOKIE")
  tap.is(renv.SESSION_ID, "[redacted]", "redaction: SESSION")
  tap.is(renv.DATABASE_URL, "postgres://[redacted]@db/x", "redaction: DATABASE_URL keeps scheme and host")
  tap.is(renv.SHORT_TOKEN, "[redacted]", "redaction: a short value is redacted by its name")
  tap.is(renv.PATH, "/usr/local/bin:/usr/bin:/bin", "redaction: PATH is kept")
  tap.is(renv.PATHOLOGY, "not-a-secret-at-all", "redaction: PAT only as a word part")
  tap.is(renv.OLDPWD, "/work/previous", "redaction: the shell's OLDPWD is kept")
  local out = e1.result.parts.stdout.head
  tap.like(out, "^%[redacted%] %[redacted%] %[redacted%] %[redacted%] %[redacted%]\n", "redaction: echoed values in stdout", out)
  tap.like(out, "\npw=%[redacted%]\n", "redaction: a URL's password is replaced alone too", out)
  tap.like(out, "\nabc12345\n", "redaction: a short (< 8 bytes) value is not replaced elsewhere", out)
  tap.like(out, "/usr/local/bin:/usr/bin:/bin not%-a%-secret%-at%-all /work/previous\n$", "redaction: PATH's value is kept", out)
  tap.is(e1.result.parts.stderr.head, "postgres://[redacted]@db/x\n", "redaction: URL credentials in stderr")
  local e2 = by_op.exec[2]
  tap.is(e2.args.command, "echo [redacted] in the command; echo box=$BOX_TOKEN", "redaction: a secret inside a command string")
  tap.is(e2.result.parts.stdout.head, "[redacted] in the command\nbox=[redacted]\n",
    "redaction: a value of the box's env, in a later record")
  local e3 = by_op.exec[3]
  tap.is(e3.args.command, "echo https://[redacted]@example.com/x ssh://git@example.com/repo",
    "redaction: URL credentials in a command; a user alone is kept")
  tap.is(by_op.create[1].args.env.BOX_TOKEN, "[redacted]", "redaction: the box's env in the create record")
  tap.is(sbx.trace.bytes_in(by_op.write_file[1].args.data), "\255\254 [redacted] \255",
    "redaction: binary file data is redacted before base64")
  tap.is(sbx.trace.bytes_in(by_op.read_file[1].result.data), "\255\254 [redacted] \255",
    "redaction: read data too")

  -- The redacted trace still replays.
  local rb = assert(sbx.box { backend = "replay", trace = path })
  local rr, rerr = rb:exec('echo "$DB_PASS $GITHUB_PAT $db_password $HTTP_COOKIE $SESSION_ID"; echo "$DATABASE_URL" >&2;'
    .. ' echo pw=hunter2hunter2; echo abc12345; echo "$PATH $PATHOLOGY $OLDPWD"', { env = env })
  tap.is(rr and rr.stdout, out, "replay: the redacted exec answers with the recorded output", rerr)
  rr, rerr = rb:exec("echo dbpassword-1 in the command; echo box=$BOX_TOKEN")
  tap.ok(rr and rr.exit_code == 0, "replay: a command with a redacted part matches", rerr)
  rr, rerr = rb:exec("echo https://alice:s3cr3tpw@example.com/x ssh://git@example.com/repo")
  tap.ok(rr and rr.exit_code == 0, "replay: a command with redacted URL credentials matches", rerr)
  rb:close()
end

os.execute("rm -rf " .. dir)
tap.done()

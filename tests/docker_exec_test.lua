-- needs: docker
-- Commands in a real Docker box: streams, exit codes, env/cwd/user, stdin,
-- shells, streaming callbacks, text hygiene.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local box = H.box()

local r = assert(box:exec("echo out; echo err >&2; exit 3"))
tap.is(r.exit_code, 3, "exit code comes back")
tap.is(r.stdout, "out\n", "stdout kept apart")
tap.is(r.stderr, "err\n", "stderr kept apart")
tap.like(r.output, "out\n", "output interleaves both streams")
tap.like(r.output, "err\n", "output has stderr too")
tap.is(r.timed_out, false, "not timed out")
tap.is(r.truncated, false, "not truncated")
tap.ok(r.duration > 0 and r.duration < 30, "duration in seconds")
tap.is(r.stdout_bytes, 4, "stdout byte count")

r = assert(box:exec("echo $0; echo ${BASH_VERSION:+bash}"))
tap.like(r.stdout, "bash\n$", "bash runs commands when the image has it")
r = assert(box:exec("[[ 1 == 1 ]] && echo bashism-ok"))
tap.is(r.stdout, "bashism-ok\n", "bashisms work under the bash tool")

r = assert(box:exec("echo $FOO-$DEBIAN_FRONTEND-$PAGER; pwd", { env = { FOO = "bar" }, cwd = "/tmp" }))
tap.is(r.stdout, "bar-noninteractive-cat\n/tmp\n", "per-call env, policy env and cwd")
r = assert(box:exec("id -u", { user = "65534" }))
tap.is(r.stdout, "65534\n", "per-call user")
r = assert(box:exec("pwd"))
tap.is(r.stdout, "/work\n", "box workdir is the default cwd")

r = assert(box:exec("cat | tr a-z A-Z", { stdin = "hello stdin" }))
tap.is(r.stdout, "HELLO STDIN", "stdin bytes reach the command")
r = assert(box:exec("cat; echo rc=$?", { timeout = 10 }))
tap.is(r.stdout, "rc=0\n", "without stdin the command reads EOF at once (no hang)")
tap.is(r.timed_out, false, "and does not wait for input")

r = assert(box:exec({ "printf", "%s|", "a b", "$HOME", ";" }))
tap.is(r.stdout, "a b|$HOME|;|", "argv form passes arguments untouched")

local seen = {}
r = assert(box:exec("for i in 1 2 3; do echo line$i; echo e$i >&2; sleep 0.05; done", {
  on_output = function(stream, text) seen[#seen + 1] = stream .. ":" .. text end,
}))
local joined = table.concat(seen, ",")
tap.ok(#seen >= 2, "on_output called for chunks as they arrive (" .. #seen .. " calls)")
tap.like(joined, "stdout:line1", "callback sees stdout")
tap.like(joined, "stderr:e3", "callback sees stderr")

r = assert(box:exec([[printf 'ok \377\376 bad \xc3\xa9 good\n'; head -c 3000 /dev/urandom]]))
tap.is(r.stdout:sub(1, 18), "ok \255\254 bad \xc3\xa9 good\n", "r.stdout keeps the bytes the command wrote")
tap.is(#r.stdout, 18 + 3000, "all of them")
tap.ok(sbx.json.decode(sbx.json.encode({ out = r.stdout })) ~= nil, "binary output encodes to valid JSON")
tap.is(r.stdout_bytes, 18 + 3000, "byte counts are of the raw bytes")
local mt, replaced = sbx.model_text("ok \255\254 bad \xc3\xa9 good\n")
tap.is(mt, "ok \u{FFFD}\u{FFFD} bad é good\n", "sbx.model_text: a U+FFFD for each invalid byte (maximal subpart), valid text stays")
tap.is(replaced, 2, "and says how many bytes it replaced")
local tool_text = sbx.policy.format_result(r)
tap.ok(sbx.text.valid(tool_text), "the tool text for it is valid UTF-8")
tap.like(tool_text, "%[%d+ bytes of this output are not UTF%-8 text", "and says that bytes were replaced")
local bg = assert(box:spawn("printf 'a\\377b'"))
box:wait(bg, 10)
local o = assert(box:output(bg))
tap.ok(o.text == "a\u{FFFD}b" and o.replaced == 1, "box:output gives text, and how many bytes it replaced")
tap.like(sbx.policy.format_process_output(o), "%[1 byte of this output is not UTF%-8 text", "and process_output's text says so")

-- A multibyte character split across chunk boundaries survives streaming.
local chunks = {}
r = assert(box:exec([[for i in $(seq 1 200); do printf 'é'; done; printf '\xe2\x82'; sleep 0.1; printf '\xac\n']], {
  on_output = function(_, text) chunks[#chunks + 1] = text end,
}))
local streamed = table.concat(chunks)
tap.is(streamed, string.rep("é", 200) .. "€\n", "streamed text never splits a character")

-- Many tasks sharing one box.
local tasks = {}
for i = 1, 12 do
  tasks[i] = sbx.spawn(function() return assert(box:exec("echo task" .. i)).stdout end)
end
local outs = sbx.gather(tasks)
local all = true
for i = 1, 12 do all = all and outs[i] == "task" .. i .. "\n" end
tap.ok(all, "12 concurrent execs on one box each get their own output")

r = assert(box:exec("exit 0"))
tap.is(r.stdout, "", "empty output is an empty string")
r = assert(box:exec("no-such-command-xyz"))
tap.is(r.exit_code, 127, "a missing command is exit 127, not an error")
local res, err, code = box:exec("pwd", { cwd = "/does/not/exist" })
tap.ok(res == nil or res.exit_code ~= 0, "a bad cwd fails the call (" .. tostring(err or (res and res.output)) .. ")")

box:close()
tap.checkerr("closed box", function() box:exec("true") end)

-- busybox: no bash, so sh runs the command.
local bb = H.box { image = H.busybox }
r = assert(bb:exec("echo ${BASH_VERSION:-nobash}"))
tap.is(r.stdout, "nobash\n", "busybox image falls back to sh")
bb:close()

tap.done()

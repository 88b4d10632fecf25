-- needs: docker, local
-- A task cannot change its own grade (issue 17, docs/grading.md). Every
-- task below has a check that fails on an honest reading (the run wrote
-- "wrong"); each run attacks the check another way, and the verdict must
-- stay "failed". On Docker and on the local backend, in a fresh check box
-- (the default) and, on the local backend, in the same box.
local tap = require "tap"
local H = require "helper"
local L = require "local_helper"
local sbx = require "sbx"
local harness = sbx.harness

local function by_id(results)
  local t = {}
  for _, r in ipairs(results) do t[r.id] = r end
  return t
end

local scratch = os.tmpname()
os.remove(scratch)
assert(os.execute("mkdir -p " .. scratch))

-- A shared object that ends every process it is loaded into with status 0
-- (for /etc/ld.so.preload), built here with the system compiler.
local function build_preload()
  local src = scratch .. "/p.c"
  local f = assert(io.open(src, "wb"))
  f:write("#include <unistd.h>\n__attribute__((constructor)) static void p(void) { _exit(0); }\n")
  f:close()
  local _, code = H.sh(string.format("cc -shared -fPIC -o %s/p.so %s", scratch, src))
  if code ~= 0 then return nil end
  local g = assert(io.open(scratch .. "/p.so", "rb"))
  local so = g:read("a")
  g:close()
  return so
end

-- A static program left behind by a run: it attaches (ptrace) to every
-- new sh and grep and rewrites their exit status to 0
-- (tests/data/ptrace_forger.c; x86_64 only).
local function build_tracer()
  local _, code = H.sh(string.format("uname -m | grep -qx x86_64 && { musl-gcc -static -O2 -o %s/tr tests/data/ptrace_forger.c" ..
    " || cc -static -O2 -o %s/tr tests/data/ptrace_forger.c; }", scratch, scratch))
  if code ~= 0 then return nil end
  local f = assert(io.open(scratch .. "/tr", "rb"))
  local d = f:read("a")
  f:close()
  return d
end

-- A tar archive with an entry that climbs out with "..", made by Python's
-- tarfile (tar itself refuses to write one).
local function dotdot_tar()
  local out = H.sh(string.format([[python3 -c 'import tarfile,io
b=io.BytesIO(); t=tarfile.open(fileobj=b,mode="w",format=tarfile.GNU_FORMAT)
i=tarfile.TarInfo("work/out/../../etc/evil"); d=b"x"; i.size=1; t.addfile(i,io.BytesIO(d)); t.close()
open("%s/dd.tar","wb").write(b.getvalue())' && echo made]], scratch))
  if not out:find("made") then return nil end
  local f = assert(io.open(scratch .. "/dd.tar", "rb"))
  local d = f:read("a")
  f:close()
  return d
end

local CHECK = "grep -q correct /work/answer"
local WRONG = "mkdir -p /work && echo wrong > /work/answer"
local OUT = { "/work/answer" }

-- The attacks: each a task whose honest verdict is "failed".
local function attacks(preload, evil_tar, tracer)
  local t = {
    { id = "honest-pass", run = "mkdir -p /work && echo correct > /work/answer", check = CHECK, outputs = OUT },
    { id = "honest-fail", run = WRONG, check = CHECK, outputs = OUT },
    -- /bin/sh and grep replaced by scripts that exit 0.
    { id = "replace-sh", outputs = OUT, check = CHECK, run = WRONG ..
      " && printf '#!/bin/busybox sh\\nexit 0\\n' > /tmp/x && chmod +x /tmp/x" ..
      " && for p in /bin/grep /usr/bin/grep /bin/sh; do if [ -e $p ]; then rm -f $p; cp /tmp/x $p; fi; done; true" },
    -- A process left behind that rewrites the answer once the check starts
    -- (the check's file marker appears).
    { id = "left-writer", outputs = OUT, check_files = { ["/work/marker"] = "x" },
      check = "sleep 1; " .. CHECK, run = WRONG ..
      " && (setsid sh -c 'while [ ! -e /work/marker ]; do sleep 0.05; done; echo correct > /work/answer' " ..
      "</dev/null >/dev/null 2>&1 &) ; true" },
    -- A left process that writes "correct" into the check's output.
    { id = "left-output", outputs = OUT, check_files = { ["/work/marker"] = "x" },
      check = "sleep 1; cat /work/answer; " .. CHECK, run = WRONG ..
      " && (setsid sh -c 'while [ ! -e /work/marker ]; do sleep 0.05; done; " ..
      "for f in /proc/[0-9]*/fd/1; do echo correct > $f; done' </dev/null >/dev/null 2>&1 &) ; true" },
    -- The test file changed outside the declared outputs.
    { id = "test-file", outputs = OUT, files = { ["/work/test.sh"] = CHECK .. "\n" },
      check_files = { ["/work/test.sh"] = CHECK .. "\n" },
      check = "sh /work/test.sh", run = WRONG .. " && echo 'exit 0' > /work/test.sh" },
    -- Outputs that leave their directory.
    { id = "tar-symlink", outputs = { "/work/out" }, check = "test ! -e /work/out/e/hostname-was-read",
      run = "mkdir -p /work/out && ln -s /etc /work/out/e" },
    { id = "tar-huge", outputs = { "/work/out" }, check = "true",
      run = "mkdir -p /work/out && dd if=/dev/zero of=/work/out/big bs=1024 count=2048 2>/dev/null" },
  }
  if preload then
    t[#t + 1] = { id = "ld-preload", outputs = OUT, files = { ["/tmp/p.so"] = preload }, check = CHECK,
      run = WRONG .. " && cp /tmp/p.so /lib/p.so && echo /lib/p.so > /etc/ld.so.preload" }
  end
  if tracer then
    local start = " && chmod +x /tmp/tr && (setsid /tmp/tr </dev/null >/dev/null 2>&1 &) ; sleep 0.3"
    -- The control: with no protection (the run's own grep), the forger
    -- turns a failing grep into status 0. It gets three tries: about one
    -- run in ten, on Docker and local alike, its scan of /proc misses the
    -- first sh (not understood; not reproducible with the forger logging).
    t[#t + 1] = { id = "ptrace-control", files = { ["/tmp/tr"] = tracer },
      run = WRONG .. start .. "; for i in 1 2 3; do sh -c 'sleep 1; " .. CHECK .. "' && exit 0; done; exit 1" }
    t[#t + 1] = { id = "ptrace", outputs = OUT, files = { ["/tmp/tr"] = tracer },
      check = "sleep 1; " .. CHECK, run = WRONG .. start .. "; true" }
  end
  if evil_tar then
    -- tar itself replaced: the run box's tar prints an archive with "..".
    t[#t + 1] = { id = "tar-dotdot", outputs = { "/work/out" }, files = { ["/tmp/e.tar"] = evil_tar },
      check = "test ! -e /etc/evil",
      run = "mkdir -p /work/out && printf '#!/bin/sh\\ncat /tmp/e.tar\\n' > /tmp/t && chmod +x /tmp/t" ..
        " && for p in /bin/tar /usr/bin/tar; do if [ -e $p ]; then rm -f $p; cp /tmp/t $p; fi; done; true" }
  end
  return t
end

local function expect(name, r, preload, evil_tar, tracer)
  if tracer then
    tap.is((r["ptrace-control"] or {}).status, "passed", name .. ": the ptrace forger works on an unprotected grep")
    local x = r.ptrace or {}
    tap.is(x.status, "failed", name .. ": a process left to ptrace the check cannot forge its status (" .. tostring(x.reason or x.error) .. ")")
  else
    tap.skip(name .. ": no static x86_64 compiler for the ptrace forger")
    tap.skip(name .. ": no static x86_64 compiler for the ptrace forger")
  end
  tap.is(r["honest-pass"] and r["honest-pass"].status, "passed", name .. ": an honest answer passes")
  tap.is(r["honest-fail"] and r["honest-fail"].status, "failed", name .. ": a wrong answer fails")
  for _, id in ipairs { "replace-sh", "left-writer", "left-output", "test-file" } do
    local x = r[id] or {}
    tap.is(x.status, "failed", string.format("%s: %s cannot pass its check (%s)", name, id, tostring(x.reason or x.error)))
  end
  local sym = r["tar-symlink"] or {}
  tap.ok(sym.status == "failed" and tostring(sym.reason):find("leaves the declared outputs", 1, true),
    name .. ": a symlink out of the outputs is refused: " .. tostring(sym.reason or sym.error))
  local huge = r["tar-huge"] or {}
  tap.ok(huge.status == "failed" and tostring(huge.reason):find("max_output_bytes", 1, true),
    name .. ": outputs over the limit fail the task: " .. tostring(huge.reason or huge.error))
  if preload then
    local x = r["ld-preload"] or {}
    tap.is(x.status, "failed", name .. ": /etc/ld.so.preload does not reach the check (" .. tostring(x.reason or x.error) .. ")")
  else
    tap.skip(name .. ": no compiler for the preload library")
  end
  if evil_tar then
    local x = r["tar-dotdot"] or {}
    tap.ok(x.status == "failed" and tostring(x.reason):find("outside the declared outputs", 1, true),
      name .. ": an archive entry with .. is refused: " .. tostring(x.reason or x.error))
  else
    tap.skip(name .. ": no python3 for the .. archive")
  end
end

local preload, evil_tar, tracer = build_preload(), dotdot_tar(), build_tracer()
local saved = sbx.policy.grade.max_output_bytes
sbx.policy.grade.max_output_bytes = 1024 * 1024

-- Docker, fresh check boxes. Named, not left to "auto": the suite's policy
-- pins auto to Docker, but without it auto picks the local backend here.
local s = harness.run { concurrency = 4, backend = "docker", box = { image = H.image }, progress = "none",
  tasks = attacks(preload, evil_tar, tracer) }
expect("docker", by_id(s.results), preload, evil_tar, tracer)

-- Docker refuses a same-box check, and says why.
s = harness.run { concurrency = 1, backend = "docker", box = { image = H.image }, progress = "none",
  tasks = { { id = "same", run = WRONG, check = CHECK, check_box = "same" } } }
local x = by_id(s.results).same or {}
tap.ok(x.status == "error" and x.code == "unsupported" and tostring(x.error):find("local backend", 1, true),
  "docker: check_box = \"same\" is refused: " .. tostring(x.error))

-- A task with run and check but no outputs is a usage error that says what to add.
local ok, e = pcall(harness.run, { progress = "none", tasks = { { id = "no-out", run = "true", check = "true" } } })
tap.ok(not ok and tostring(e):find("add outputs", 1, true), "no outputs: " .. tostring(e))

-- The same from the command line: a usage error (exit 2) that says what to
-- add; --check-box takes fresh or same only.
local tf = scratch .. "/t.jsonl"
local fh = assert(io.open(tf, "wb"))
fh:write(sbx.json.encode { id = "cli", run = "true", check = "true" }, "\n")
fh:close()
local text, code = H.sh(string.format("%s eval %s --image %s", H.sbx_bin, tf, H.busybox))
tap.ok(code == 2 and text:find("add outputs", 1, true), "sbx eval: no outputs is a usage error: " .. text)
text, code = H.sh(string.format("%s eval %s --check-box maybe", H.sbx_bin, tf))
tap.ok(code == 2 and text:find("--check-box must be fresh or same", 1, true), "sbx eval: a bad --check-box: " .. text)

-- The local backend (as root): fresh boxes, then the same box.
local root = L.rootfs(H.image)
s = harness.run { concurrency = 4, backend = "local", box = { image = "rootfs:" .. root }, progress = "none",
  tasks = attacks(preload, evil_tar, tracer) }
expect("local", by_id(s.results), preload, evil_tar, tracer)

local same = {}
for _, t in ipairs(attacks(preload, nil, tracer)) do
  if t.id ~= "tar-symlink" and t.id ~= "tar-huge" and t.id ~= "test-file" and t.id ~= "ptrace-control" then
    t.check_box = "same"
    t.outputs = nil
    same[#same + 1] = t
  end
end
s = harness.run { concurrency = 4, backend = "local", box = { image = "rootfs:" .. root }, progress = "none",
  tasks = same }
local r = by_id(s.results)
tap.is(r["honest-pass"] and r["honest-pass"].status, "passed", "local same box: an honest answer passes")
for _, id in ipairs { "honest-fail", "replace-sh", "left-writer", "left-output", "ld-preload", "ptrace" } do
  if r[id] then
    tap.is(r[id].status, "failed", string.format("local same box: %s fails (%s)", id, tostring(r[id].reason or r[id].error)))
  else
    tap.skip("local same box: " .. id .. " not run")
  end
end

sbx.policy.grade.max_output_bytes = saved
os.execute("rm -rf " .. scratch)
tap.done()

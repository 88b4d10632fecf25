-- needs: docker
-- The evaluation harness (sbx.harness and `sbx eval`) against the real daemon.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local harness = sbx.harness
local json = sbx.json

local function by_id(results)
  local t = {}
  for _, r in ipairs(results) do t[r.id] = r end
  return t
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local read = H.slurp

local function lines_of(path)
  local out = {}
  for line in (read(path) or ""):gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

local function tmp(suffix)
  local p = os.tmpname()
  os.remove(p)
  return p .. suffix
end

local function owned_containers(pid)
  return H.containers { "sbx.owner.pid=" .. pid }
end

tap.ok(type(harness) == "table" and type(harness.run) == "function", "sbx.harness is exposed")
tap.checkerr("has no id", harness.run, { tasks = { { run = "true" } }, progress = "none" })
tap.checkerr("duplicate id", harness.run, { tasks = { { id = "a", run = "true" }, { id = "a", run = "true" } }, progress = "none" })

-- Verdicts -------------------------------------------------------------------

do
  local seen = {}
  local s = harness.run {
    concurrency = 8, box = { image = H.busybox }, progress = "none",
    on_result = function(r) seen[#seen + 1] = r.id end,
    tasks = {
      { id = "pass", run = "echo hello" },
      { id = "fail", run = "echo oops; exit 3" },
      { id = "check-pass", run = "echo x > /tmp/o", check = "grep -q x /tmp/o", outputs = { "/tmp/o" } },
      { id = "check-fail", run = "true", check = "grep -q nothing /etc/hostname", outputs = { "/tmp/none" } },
      { id = "files", files = { ["/work/sub/t.sh"] = "echo from-file" },
        setup = { "chmod +x /work/sub/t.sh", "echo prepared > /work/p" },
        run = "/work/sub/t.sh && cat /work/p", check = "test -f /work/p", outputs = { "/work/p" } },
      { id = "setup-fail", setup = { "exit 7" }, run = "true" },
      { id = "timeout", run = "echo started; sleep 30", timeout = 1 },
      { id = "no-image", box = { image = "sbx-no-such-image:never" }, run = "true" },
      { id = "lua", run = function(box) return box:exec("echo lua") end,
        check = function(box) return box:read_file("/etc/hostname") ~= nil end, outputs = { "/tmp/none" } },
      { id = "lua-false", run = "true", check = function() return false end, outputs = { "/tmp/none" } },
      { id = "lua-error", run = function() error("boom in task") end },
    },
  }
  local r = by_id(s.results)
  tap.is(#s.results, 11, "every task has a result")
  tap.is(#seen, 11, "on_result is called for each")
  tap.is(r.pass.status, "passed", "exit 0 without a check passes")
  tap.is(r.pass.passed, true, "passed = true")
  tap.is(r.pass.phases.run.exit_code, 0, "run exit code recorded")
  tap.is(r.pass.phases.run.output, "hello\n", "run output recorded")
  tap.is(r.pass.phases.run.stdout_bytes, 6, "stdout bytes recorded")
  tap.is(r.fail.status, "failed", "non-zero exit without a check fails")
  tap.is(r.fail.phases.run.exit_code, 3, "its exit code")
  tap.is(r.fail.error, nil, "a failing task is no error")
  tap.is(r["check-pass"].status, "passed", "a passing check passes")
  tap.is(r["check-pass"].phases.check.exit_code, 0, "check phase recorded")
  tap.is(r["check-fail"].status, "failed", "a failing check fails")
  tap.is(r["check-fail"].phases.check.exit_code, 1, "check exit code")
  tap.is(r.files.status, "passed", "files and setup are in place for run")
  tap.is(r.files.phases.run.output, "from-file\nprepared\n", "run sees files and setup")
  tap.is(#r.files.phases.setup, 2, "each setup command recorded")
  tap.is(r["setup-fail"].status, "failed", "a failing setup command fails the task")
  tap.is(r["setup-fail"].phases.run, nil, "and run does not happen")
  tap.is(r.timeout.status, "failed", "a run that times out fails")
  tap.is(r.timeout.phases.run.timed_out, true, "timed_out recorded")
  tap.is(r.timeout.phases.run.exit_code, nil, "no exit code for a killed command")
  tap.ok(r.timeout.phases.run.duration < 10, "the timeout killed it", r.timeout.phases.run.duration)
  tap.is(r["no-image"].status, "error", "a box that cannot be created is an error")
  tap.like(r["no-image"].error, "sbx%-no%-such%-image", "with the daemon's reason")
  tap.is(r["no-image"].passed, false, "and not passed")
  tap.is(r.lua.status, "passed", "Lua function run and check")
  tap.is(r.lua.phases.run.output, "lua\n", "a function returning an exec result is recorded")
  tap.is(r["lua-false"].status, "failed", "a check function returning false fails")
  tap.is(r["lua-error"].status, "error", "a Lua error is an error")
  tap.like(r["lua-error"].error, "boom in task", "with its message")
  tap.is(s.passed, 4, "summary: passed")
  tap.is(s.failed, 5, "summary: failed")
  tap.is(s.errors, 2, "summary: errors")
  tap.is(s.interrupted, false, "not interrupted")
  local left = 0
  for _ in pairs(sbx.boxes) do left = left + 1 end
  tap.is(left, 0, "every box was closed")
  tap.is(#owned_containers(sbx.core.pid()), 0, "and is gone from the daemon")
end

-- Concurrency -------------------------------------------------------------------

do
  -- Overlap is counted, not timed: each task holds its slot until all six
  -- are inside their command at once (a loaded machine only makes it slower).
  local inside, most_inside = 0, 0
  local tasks = {}
  for i = 1, 6 do tasks[i] = { id = "sleep" .. i, run = function(box)
    inside = inside + 1
    most_inside = math.max(most_inside, inside)
    local deadline = sbx.now() + 60
    while most_inside < 6 and sbx.now() < deadline do sbx.sleep(0.05) end
    local r = box:exec("true")
    inside = inside - 1
    return r
  end } end
  local s = harness.run { tasks = tasks, concurrency = 6, box = { image = H.busybox }, progress = "none" }
  tap.is(s.passed, 6, "six tasks pass")
  tap.is(most_inside, 6, "all six run at once at concurrency 6")

  local running, max_running = 0, 0
  local bounded = {}
  for i = 1, 5 do
    bounded[i] = { id = "b" .. i, run = function(box)
      running = running + 1
      max_running = math.max(max_running, running)
      local r = box:exec("sleep 2")
      running = running - 1
      return r
    end }
  end
  s = harness.run { tasks = bounded, concurrency = 2, box = { image = H.busybox }, progress = "none" }
  tap.is(s.passed, 5, "bounded tasks pass")
  tap.ok(max_running <= 2, "never more than 2 at once", max_running)
  tap.is(max_running, 2, "and 2 did run together")
end

-- Resume --------------------------------------------------------------------------

do
  local out = tmp(".jsonl")
  local tasks = {
    { id = "ok", run = "true" },
    { id = "bad", run = "false" },
    { id = "err", box = { image = "sbx-no-such-image:never" }, run = "true" },
  }
  local s1 = harness.run { tasks = tasks, out = out, box = { image = H.busybox }, progress = "none" }
  tap.is(s1.ran, 3, "first run runs everything")
  local l1 = lines_of(out)
  tap.is(#l1, 3, "one line per task")
  local ok_all = true
  for _, line in ipairs(l1) do
    local r = json.decode(line)
    if type(r) ~= "table" or not r.id or not r.status then ok_all = false end
  end
  tap.ok(ok_all, "each line is a JSON result")
  -- A torn last line (a crash mid-write) must not break the next run.
  local f = assert(io.open(out, "ab"))
  f:write('{"id":"torn","sta')
  f:close()
  local ran = {}
  local s2 = harness.run { tasks = tasks, out = out, box = { image = H.busybox }, progress = "none",
    on_result = function(r) ran[#ran + 1] = r.id end }
  tap.is(table.concat(ran, ","), "err", "second run executes only the error task")
  tap.is(s2.skipped, 2, "passed and failed ones are skipped")
  tap.is(s2.overall.passed, 1, "overall counts include earlier results")
  local l2 = lines_of(out)
  local last = json.decode(l2[#l2])
  tap.is(type(last) == "table" and last.id, "err", "the retried result is appended on its own line")
  local s3 = harness.run { tasks = { { id = "ok", run = "false" } }, out = out, progress = "none" }
  tap.is(s3.ran, 0, "a passed id is not run again")
  os.remove(out)
end

-- Command line --------------------------------------------------------------------

do
  local dir = tmp("-eval")
  assert(os.execute("mkdir -p " .. dir))
  local tasks = dir .. "/tasks.jsonl"
  write(tasks, table.concat({
    json.encode { id = "cli-pass", run = "echo '<b>bold</b> & more'" },
    json.encode { id = "<script>alert(1)</script>", run = "exit 4" },
    "",
    json.encode { id = "cli-check", run = "echo 1 > /work/x", check = "test -s /work/x", outputs = json.array { "/work/x" },
      setup = json.array { "mkdir -p /work" } },
  }, "\n") .. "\n")
  local out, report = dir .. "/results.jsonl", dir .. "/report.html"
  local text, code = H.sh(string.format("%s eval %s --image %s --concurrency 3 --out %s --report %s",
    H.sbx_bin, tasks, H.busybox, out, report))
  tap.is(code, 0, "eval exits 0 when every task ran (one failed)")
  tap.like(text, "passed%s+2", "the summary counts the passes")
  tap.like(text, "%[3/3%]", "plain progress lines when stderr is no terminal")
  local lines = lines_of(out)
  tap.is(#lines, 3, "three JSON lines")
  local got = {}
  for _, l in ipairs(lines) do
    local r = json.decode(l)
    if type(r) == "table" then got[r.id] = r.status end
  end
  tap.is(got["cli-pass"], "passed", "cli-pass passed")
  tap.is(got["<script>alert(1)</script>"], "failed", "the failing one failed")
  tap.is(got["cli-check"], "passed", "cli-check passed")
  local html = read(report) or ""
  tap.like(html, "<svg", "the report has an inline SVG")
  tap.like(html, "&lt;script&gt;alert%(1%)&lt;/script&gt;", "task ids are escaped")
  tap.ok(not html:find("<script>", 1, true), "no raw <script> in the report")
  tap.like(html, "&lt;b&gt;bold&lt;/b&gt; &amp; more", "output is escaped")
  tap.ok(not html:find("https?://[%w.]+/[%w/]+%.js") and not html:find("<link"), "no external assets")

  -- Again: everything is already done; a malformed line is only a warning.
  local f = assert(io.open(out, "ab")); f:write("not json at all\n"); f:close()
  text, code = H.sh(string.format("%s eval %s --image %s --out %s", H.sbx_bin, tasks, H.busybox, out))
  tap.is(code, 0, "a resumed run with nothing left exits 0")
  tap.like(text, "malformed", "the malformed line is reported")
  tap.like(text, "skipped%s+3", "and every task is skipped")

  -- A Lua task file; an error exits 1.
  local luatasks = dir .. "/tasks.lua"
  write(luatasks, string.format([[
return {
  { id = "lua-file", box = { image = %q }, run = function(box, task) return box:exec("echo " .. task.id) end,
    check = function(box) return true end, outputs = { "/tmp/none" } },
  { id = "broken", box = { image = "sbx-no-such-image:never" }, run = "true" },
}]], H.busybox))
  text, code = H.sh(string.format("%s eval %s --out %s", H.sbx_bin, luatasks, dir .. "/lua.jsonl"))
  tap.is(code, 1, "an infrastructure error exits 1")
  local lr = {}
  for _, l in ipairs(lines_of(dir .. "/lua.jsonl")) do local r = json.decode(l); lr[r.id] = r.status end
  tap.is(lr["lua-file"], "passed", "a .lua task file with function phases")
  tap.is(lr.broken, "error", "the broken one is an error")

  text, code = H.sh(H.sbx_bin .. " eval")
  tap.is(code, 2, "no task file: usage error")
  text, code = H.sh(H.sbx_bin .. " eval " .. tasks .. " --concurrency zero")
  tap.is(code, 2, "a bad --concurrency: usage error")
  write(dir .. "/bad.jsonl", '{"run":"true"}\n')
  text, code = H.sh(H.sbx_bin .. " eval " .. dir .. "/bad.jsonl")
  tap.is(code, 2, "a task without an id: usage error")
  tap.like(text, "no id", "and says so")
  text = H.sh(H.sbx_bin .. " --help")
  tap.like(text, "eval TASKS", "eval is in the usage text")
  os.execute("rm -rf " .. dir)
end

-- SIGINT ------------------------------------------------------------------------------

do
  local dir = tmp("-int")
  assert(os.execute("mkdir -p " .. dir))
  local tasks, out = dir .. "/tasks.jsonl", dir .. "/results.jsonl"
  local list = { json.encode { id = "quick", run = "true" } }
  for i = 1, 4 do list[#list + 1] = json.encode { id = "long" .. i, run = "sleep 120" } end
  write(tasks, table.concat(list, "\n") .. "\n")
  local pidfile, rcfile, log = dir .. "/pid", dir .. "/rc", dir .. "/log"
  os.execute(string.format("( sh -c 'echo $$ > %s; exec %s eval %s --image %s --concurrency 3 --out %s' > %s 2>&1; echo $? > %s ) &",
    pidfile, H.sbx_bin, tasks, H.busybox, out, log, rcfile))
  local pid
  local deadline = sbx.now() + 30
  -- Wait until quick finished and three long tasks run (long4 waits for a slot).
  local ready = false
  while sbx.now() < deadline do
    pid = pid or (read(pidfile) or ""):match("%d+")
    if pid and #lines_of(out) >= 1 then
      local running = 0
      for _, c in ipairs(owned_containers(pid)) do
        if c.State == "running" and (c.Labels["sbx.task"] or ""):match("^long") then running = running + 1 end
      end
      if running == 3 then ready = true break end
    end
    sbx.sleep(0.2)
  end
  tap.ok(ready, "three long tasks are running", read(log))
  sbx.sleep(1)   -- their commands start
  os.execute("kill -INT " .. tostring(pid))
  deadline = sbx.now() + 30
  while not read(rcfile) and sbx.now() < deadline do sbx.sleep(0.1) end
  local rc = tonumber((read(rcfile) or ""):match("%d+"))
  tap.ok(rc and rc ~= 0, "interrupted eval exits non-zero", rc)
  tap.is(rc, 130, "with status 130 (128 + SIGINT)")
  local l = lines_of(out)
  tap.is(#l, 1, "the finished result is kept, nothing else written")
  tap.like(l[1] or "", '"id":"quick"', "it is quick's")
  local text = read(log) or ""
  tap.like(text, "interrupted", "the run says it was interrupted")
  tap.like(text, "not run%s+4", "the summary is printed with what did not run")
  tap.is(#owned_containers(pid), 0, "no box of the interrupted process remains")
  os.execute("rm -rf " .. dir)
end

tap.done()

-- needs: docker
-- A task file is data from a stranger: it may not widen a box's isolation or
-- reach the host. Hostile JSONL tasks (binds, host pid/network namespaces,
-- capabilities, another daemon, spoofed labels, a policy, a backend, bigger
-- limits) become errors naming the option; a hostile Lua task file has no
-- io/os/require and its phase functions never see the daemon handle.
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"
local json = sbx.json

local dir = H.tmpdir()
local write = H.write

local hostile = {
  { id = "binds", box = { host_config = { Binds = { "/:/host" } } }, run = "cat /host/etc/hostname", want = "host_config" },
  { id = "pid-host", box = { host_config = { PidMode = "host" } }, run = "ls /proc", want = "host_config" },
  { id = "net-host", box = { network = "host" }, run = "true", want = "network" },
  { id = "cap-add", box = { cap_add = { "SYS_ADMIN" } }, run = "true", want = "cap_add" },
  { id = "privileged-caps", box = { cap_drop = json.array {} }, run = "true", want = "cap_drop" },
  { id = "big-memory", box = { memory = 1e12 }, run = "true", want = "memory" },
  { id = "more-pids", box = { pids = 100000 }, run = "true", want = "pids" },
  { id = "other-daemon", box = { docker_host = "tcp://203.0.113.1:2375" }, run = "true", want = "docker_host" },
  { id = "spoof-labels", box = { labels = { ["sbx.owner.pid"] = "1" } }, run = "true", want = "labels" },
  { id = "policy", box = { policy = "/tmp/evil.lua" }, run = "true", want = "policy" },
  { id = "backend", box = { backend = "fargate" }, run = "true", want = "backend" },
  { id = "transport", box = { transport = "exec" }, run = "true", want = "transport" },
  { id = "writable", box = { read_only = false }, run = "true", want = "read_only" },
}
local lines = {}
for _, t in ipairs(hostile) do
  lines[#lines + 1] = json.encode { id = t.id, box = t.box, run = t.run }
end
lines[#lines + 1] = json.encode { id = "fine", box = { memory = 256 * 1024 * 1024, network = "none", pids = 64 }, run = "true" }
write(dir .. "/tasks.jsonl", table.concat(lines, "\n") .. "\n")
write(dir .. "/ro.lua", "return { box = { read_only = true } }\n")

-- The refused tasks' own boxes (by their task labels: other sbx processes
-- on this daemon may make boxes meanwhile).
local function refused_boxes()
  local n = 0
  for _, t in ipairs(hostile) do
    for _ in H.sh("docker ps -aq --filter label=sbx.task=" .. t.id):gmatch("%x+") do n = n + 1 end
  end
  return n
end
local out, code = H.sh(string.format("%s --policy %s/ro.lua eval %s/tasks.jsonl --image %s --out %s/out.jsonl --concurrency 4",
  H.sbx_bin, dir, dir, H.busybox, dir))
tap.is(code, 1, "errors in the task file make sbx eval exit 1", out)
local by = {}
for line in io.lines(dir .. "/out.jsonl") do
  local r = json.decode(line)
  by[r.id] = r
end
for _, t in ipairs(hostile) do
  local r = by[t.id]
  tap.ok(r and r.status == "error" and tostring(r.error):find(t.want, 1, true),
    string.format("task '%s' is an error naming %s", t.id, t.want), r and r.error)
end
tap.is(by.fine and by.fine.status, "passed", "a task that only lowers limits runs")
tap.is(refused_boxes(), 0, "no box of a refused task exists")

-- A policy can widen the list for tasks it trusts.
write(dir .. "/wide.lua", 'return { harness = { task_box_options = { "image", "cap_add" } } }\n')
write(dir .. "/wide.jsonl", json.encode { id = "caps", box = { cap_add = { "SYS_PTRACE" } },
  run = "grep -q CapEff /proc/self/status" } .. "\n")
out, code = H.sh(string.format("%s --policy %s/wide.lua eval %s/wide.jsonl --image %s --out %s/wide.out",
  H.sbx_bin, dir, dir, H.busybox, dir))
tap.is(code, 0, "a policy that widens task_box_options lets the task set it", out)

-- A hostile Lua task file.
write(dir .. "/io.lua", 'local f = io.open("/etc/shadow") return { { id = "x", run = "true" } }\n')
out, code = H.sh(string.format("%s eval %s/io.lua", H.sbx_bin, dir))
tap.is(code, 2, "a Lua task file that touches io does not load")
tap.like(out, "io", "and the error says why")
write(dir .. "/os.lua", 'os.execute("touch ' .. dir .. '/pwned") return {}\n')
H.sh(string.format("%s eval %s/os.lua", H.sbx_bin, dir))
tap.ok(not io.open(dir .. "/pwned"), "a Lua task file cannot run host commands")
write(dir .. "/req.lua", 'local x = require("sbx") return {}\n')
out, code = H.sh(string.format("%s eval %s/req.lua", H.sbx_bin, dir))
tap.is(code, 2, "nor require modules")
write(dir .. "/view.lua", string.format([[
return {
  { id = "reach", box = { image = %q }, run = function(box)
      if box.backend ~= nil or box.impl ~= nil or box.handle ~= nil or box.spec ~= nil then return "reached" end
      if pcall(function() box.handle = 1 end) then return "wrote" end
      if getmetatable(box) then return "metatable" end
      local tl = box:tools()
      if tl.box ~= nil then return "the tools list reached the box" end
      box.usage.commands = -1000
      if box.usage.commands == -1000 then return "reset its usage" end
      if not tl[1].run({ command = "true" }) then return "a tool does not run" end
      return box:exec("echo inside").stdout
    end,
    check = function(box) return box:exec("true").exit_code == 0 end, outputs = { "/tmp/none" } },
}]], H.busybox))
out, code = H.sh(string.format("%s eval %s/view.lua --out %s/view.out", H.sbx_bin, dir, dir))
tap.is(code, 0, "a Lua task's functions still drive their box", out)
local r = json.decode(io.lines(dir .. "/view.out")())
tap.is(r.phases.run.value, "inside\n", "through a view without the backend, handle or spec")
os.execute("rm -rf " .. dir)
tap.done()

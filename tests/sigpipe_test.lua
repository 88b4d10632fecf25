-- needs: docker
-- A reader that goes away: `sbx run script.lua | head -1` and an MCP client
-- that stops reading. sbx must not be killed by SIGPIPE: it removes every
-- box it made and exits with its documented status (141 for run, as a
-- pipeline member that SIGPIPE ended; 0 for mcp, a session that ended).
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local json = sbx.json

local dir = H.tmpdir()

local slurp = H.slurp

local write = H.write

local function boxes_of(pid)
  return #H.containers { "sbx.owner.pid=" .. tostring(pid) }
end

-- Waits until path holds a number (a pid, an exit status); nil after limit seconds.
local function wait_number(path, limit)
  local deadline = sbx.now() + (limit or 60)
  while sbx.now() < deadline do
    local n = tonumber((slurp(path) or ""):match("%d+"))
    if n then return n end
    sbx.sleep(0.1)
  end
end

-- Every script writes its pid first, so its boxes can be found by label.
local PROLOGUE = [[
local sbx = require "sbx"
local pf = io.open(os.getenv("SBX_PIDFILE"), "w"); pf:write(sbx.core.pid(), "\n"); pf:close()
]]

-- Runs `sbx run script | head -1` and returns status, stderr, pid, the line head got.
local function pipeline(name, body)
  local base = dir .. "/" .. name
  write(base .. ".lua", PROLOGUE .. body)
  local cmd = string.format(
    "(SBX_PIDFILE=%s.pid timeout -k 5 90 %s run %s.lua 2>%s.err; echo $? >%s.rc) | head -1 >%s.out",
    base, H.sbx_bin, base, base, base, base)
  os.execute(cmd)
  return wait_number(base .. ".rc", 5), slurp(base .. ".err") or "", wait_number(base .. ".pid", 1),
    slurp(base .. ".out") or ""
end

local function check(name, body, what)
  local rc, err, pid, line = pipeline(name, body)
  tap.ok(line:find("^box ") ~= nil, what .. ": head got the first line", line)
  tap.is(rc, 141, what .. ": exit status 141, like a pipeline member ended by SIGPIPE")
  tap.is(err, "", what .. ": nothing on stderr")
  tap.is(pid and boxes_of(pid), 0, what .. ": every box of the process is removed")
end

local BOX = string.format("sbx.box { image = %q }", H.busybox)

-- A tight loop: print never fails loudly, so only sbx can stop it.
check("print_loop", "local b = assert(" .. BOX .. [[)
while true do print("box " .. b.id, ("x"):rep(200)) end
]], "print in a tight loop")

-- A script that keeps making boxes must not go on once nobody reads. Each
-- box is dropped and collected just before the write: its removal
-- (detached, nobody waits for it) is under way when the write fails, and
-- must still finish. The first line comes early, so head is gone by then.
check("box_loop", [[
io.write("box loop\n")
io.stdout:flush()
sbx.sleep(0.5)
while true do
  local b = assert(]] .. BOX .. [[)
  local id = b.id
  b = nil
  collectgarbage()
  io.write("box ", id, "\n")
  io.stdout:flush()
  sbx.sleep(0.05)
end
]], "io.write in a loop that creates and drops boxes")

-- The printing task fails; the main chunk, waiting, is interrupted too.
check("task_print", "local b = assert(" .. BOX .. [[)
sbx.spawn(function()
  while true do io.stdout:write("box ", b.id, "\n"); io.stdout:flush(); sbx.sleep(0.01) end
end)
sbx.sleep(300)
]], "a task writes while the main chunk waits")

-- MCP: the client reads the initialize answer, then stops reading --------------

do
  local base = dir .. "/mcp"
  local fifo = base .. ".in"
  assert(os.execute("mkfifo " .. fifo))
  -- head -1 reads the initialize answer and leaves: the server's stdout is closed.
  os.execute(string.format(
    "(sh -c 'echo $$ >%s.pid; exec %s mcp --image %s' <%s 2>%s.err; echo $? >%s.rc) | head -1 >%s.out &",
    base, H.sbx_bin, H.busybox, fifo, base, base, base))
  local input = assert(io.open(fifo, "w"))
  local function send(t)
    t.jsonrpc = "2.0"
    input:write(json.encode(t), "\n")
    input:flush()
  end
  local pid = wait_number(base .. ".pid", 10)
  send { id = 1, method = "initialize", params = { protocolVersion = "2025-06-18", capabilities = json.object(),
    clientInfo = { name = "t", version = "1" } } }
  send { method = "notifications/initialized" }
  send { id = 2, method = "tools/call", params = { name = "bash", arguments = { command = "sleep 300" } } }
  local up = false
  for _ = 1, 300 do
    if pid and boxes_of(pid) > 0 then up = true break end
    sbx.sleep(0.1)
  end
  tap.ok(up, "mcp: the tool call made a box")
  sbx.sleep(1)     -- the sleep 300 runs in it
  tap.like(slurp(base .. ".out") or "", '"id":1', "mcp: the client read the initialize answer")
  -- The answer to this ping is written to a closed pipe.
  send { id = 3, method = "ping" }
  local rc = wait_number(base .. ".rc", 30)
  input:close()
  if not rc and pid then
    -- Still serving: end it, so the checks below see the outcome, not a race.
    os.execute("kill -TERM " .. pid .. " 2>/dev/null")
    wait_number(base .. ".rc", 30)
  end
  tap.is(rc, 0, "mcp: the session ends, exit 0, while its input is still open")
  tap.is(pid and boxes_of(pid), 0, "mcp: the box (and the call in flight) is gone")
  tap.is(slurp(base .. ".err") or "", "", "mcp: nothing on stderr")
end

-- Commands sbx starts keep the default SIGPIPE (a command in a pipeline
-- must still die of it), also after libwebsockets, which sets SIG_IGN, ran.
do
  local path = dir .. "/sigign.lua"
  write(path, [[
local sbx = require "sbx"
local function ignored()
  local p = io.popen("grep SigIgn /proc/self/status")
  local mask = tonumber(p:read("a"):match("(%x+)%s*$"), 16)
  p:close()
  return (mask >> (sbx.core.SIGPIPE - 1)) & 1
end
local before = ignored()
sbx.core.ws.connect { url = "ws://127.0.0.1:1/", timeout = 5 }   -- refused; the lws context is made
print(before, ignored())
]])
  local out = H.sh(H.sbx_bin .. " run " .. path)
  tap.is(out, "0\t0\n", "children get the default SIGPIPE, before and after lws")
end

os.execute("rm -rf " .. dir)
tap.done()

-- needs: nothing
-- core.proc.spawn: a host process on the loop whose pipes are an
-- sbx.stream (the local backend's agent channel is one). Output, stdin,
-- back-pressure, exit statuses, signals, the sync socket, memfd files,
-- close and the collector, misuse.
local sbx = require "sbx"
local tap = require "tap"
local P = sbx.core.proc

local SMALL = { stdout = { head = 65536, tail = 0 }, stderr = { head = 65536, tail = 0 }, output = { head = 65536, tail = 0 } }

local function alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return false end
  local st = f:read("a")
  f:close()
  return not st:match("^%d+ %b() Z")
end

-- Output, stdin, exit status.
do
  local p, s = assert(P.spawn { argv = { "/bin/sh", "-c", "echo out; echo err >&2; cat; exit 3" }, stdin = true, capture = SMALL })
  tap.ok(math.type(p:pid()) == "integer" and p:pid() > 1, "a pid")
  tap.ok(s:write("from stdin\n"), "stdin takes bytes")
  s:close_stdin()
  tap.is(s:wait(10), "eof", "the stream ends when the process closes its output")
  tap.is((s:captured("stdout")), "out\nfrom stdin\n", "stdout, and stdin echoed exactly")
  tap.is((s:captured("stderr")), "err\n", "stderr apart")
  local info = assert(p:wait(10))
  tap.is(info.status, 3, "the exit status")
  tap.is(info.running, false, "and it is no longer running")
  local _, err, code = p:kill()
  tap.is(code, "ESRCH", "kill after exit: ESRCH (" .. tostring(err) .. ")")
end

-- env and cwd are exactly what was given.
do
  local p, s = assert(P.spawn { argv = { "/bin/sh", "-c", "pwd; env | sort" }, env = { "A=1", "B=two words" }, cwd = "/tmp", capture = SMALL })
  s:wait(10)
  p:wait(10)
  local out = s:captured("stdout")
  tap.like(out, "^/tmp\n", "cwd")
  tap.ok(out:find("A=1\n", 1, true) and out:find("B=two words\n", 1, true) and not out:find("HOME=", 1, true),
    "env is the list given, nothing else")
end

-- Back-pressure: a fast writer nobody reads stops at the chunk limit.
do
  local p, s = assert(P.spawn { argv = { "/bin/sh", "-c", "head -c 20000000 /dev/zero" }, chunks = true, chunk_limit = 1 << 20,
    capture = { stdout = { head = 0, tail = 0 }, stderr = { head = 0, tail = 0 }, output = { head = 0, tail = 0 } } })
  sbx.sleep(0.5)
  local held = s:info().held_bytes
  tap.ok(held <= 4 * 1024 * 1024, "unread output holds at most a few MiB of host memory (" .. held .. " bytes)")
  tap.ok(p:info().running, "and the writer waits")
  local total = 0
  while true do
    local ev = s:wait(10)
    if ev == "data" then total = total + #(s:take(true)) end
    if ev ~= "data" then break end
  end
  tap.is(total, 20000000, "every byte arrives once read")
  tap.is(s:info().stdout_bytes, 20000000, "and is counted")
  p:wait(10)
end

-- Signals, waiting, a program that is not there.
do
  local p = assert(P.spawn { argv = { "sleep", "30" } })
  local _, err, code = p:wait(0.1)
  tap.is(code, "timeout", "wait with a timeout: timeout (" .. tostring(err) .. ")")
  tap.ok(p:kill("TERM"), "kill TERM")
  local info = assert(p:wait(10))
  tap.is(info.signal, 15, "the process ended by SIGTERM")
  local q, qerr, qcode = P.spawn { argv = { "/nonexistent/program" } }
  tap.ok(q == nil and qcode == "ENOENT", "a missing program: ENOENT (" .. tostring(qerr) .. ")")
end

-- The sync socket (fd 3) and memfd files.
do
  local p, s, sync = assert(P.spawn { argv = { "/bin/sh", "-c", "printf ready >&3; read x <&3; echo \"got $x\"; cat <&4" },
    sync = true, files = { [4] = "file bytes\0with a NUL" }, capture = SMALL })
  tap.is(sync:wait(10), "data", "the program speaks on fd 3")
  tap.is(sync:take(true), "ready", "what it said")
  sync:write("go\n")
  s:wait(10)
  p:wait(10)
  tap.is((s:captured("stdout")), "got go\nfile bytes\0with a NUL", "it read fd 3, and fd 4 holds the file's bytes")
end

-- close() and the collector end a running process; close_kills = false does not.
do
  local p = assert(P.spawn { argv = { "sleep", "30" } })
  local pid = p:pid()
  p:close()
  sbx.sleep(0.2)
  tap.ok(not alive(pid), "close() kills a running process")
  tap.ok(not pcall(p.pid, p), "a closed process raises")
  local q = assert(P.spawn { argv = { "sleep", "30" }, close_kills = false })
  local qpid = q:pid()
  q:close()
  sbx.sleep(0.2)
  tap.ok(alive(qpid), "close_kills = false: close() lets it run")
  P.signal(qpid, "KILL")
  local gpid
  do gpid = assert(P.spawn { argv = { "sleep", "30" } }):pid() end
  collectgarbage()
  collectgarbage()
  sbx.sleep(0.2)
  tap.ok(not alive(gpid), "a dropped process is killed by the collector")
end

-- Many at once.
do
  local tasks = {}
  for i = 1, 40 do
    tasks[i] = sbx.spawn(function()
      local p, s = assert(P.spawn { argv = { "/bin/sh", "-c", "echo " .. i }, capture = SMALL })
      s:wait(10)
      p:wait(10)
      return (s:captured("stdout"))
    end)
  end
  local outs = sbx.gather(tasks)
  local ok = true
  for i = 1, 40 do if outs[i] ~= i .. "\n" then ok = false end end
  tap.ok(ok, "40 processes at once, each with its own output")
end

-- Misuse raises.
tap.checkerr("argv", P.spawn, { argv = {} })
tap.checkerr("fds 4%-63", P.spawn, { argv = { "true" }, files = { [3] = "x" } })
tap.checkerr("string", P.spawn, { argv = { "true", 42 } })
tap.done()

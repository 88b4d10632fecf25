-- needs: docker
-- The scheduler keeps running tasks while the main chunk blocks on input:
-- a wake that comes from a timer must not be followed by a poll that
-- sleeps until the next input line (regression: the MCP server hung).
local tap = require "tap"
local H = require "helper"

local script = os.tmpname() .. ".lua"
local f = assert(io.open(script, "w"))
f:write([[
local sbx = require "sbx"
local reader = sbx.core.lines.open(0)
local t0 = sbx.now()
local finished_at
local t = sbx.spawn(function()
  for _ = 1, 10 do sbx.sleep(0.05) end
  -- HTTP completions arrive in curl's socket and timer callbacks.
  for _ = 1, 20 do assert(sbx.http.request { url = "http://localhost/_ping", unix_socket = "/var/run/docker.sock" }) end
  local b = assert(sbx.box { image = "]] .. H.busybox .. [[" })
  assert(b:exec("echo hi").stdout == "hi\n")
  b:close()
  finished_at = sbx.now() - t0
end)
local line = reader:read()
print(string.format("%s %s %.2f %.2f", line, t:status(), finished_at or -1, sbx.now() - t0))
local second, _, code = reader:read()
print(tostring(second), code)
]])
f:close()
local out = H.sh("(sleep 4; echo first) | " .. H.sbx_bin .. " run " .. script)
local line, status, fin, read_at = out:match("^(%S+) (%S+) (%S+) (%S+)")
tap.is(line, "first", "the main chunk reads a line from stdin")
tap.is(status, "done", "a task finished while the main chunk waited for input")
tap.ok(tonumber(fin) and tonumber(fin) > 0 and tonumber(fin) < tonumber(read_at),
  "and it finished before the input arrived (" .. tostring(fin) .. " s < " .. tostring(read_at) .. " s)")
tap.like(out, "\nnil\teof\n", "end of input reads as nil, 'eof'")
tap.done()

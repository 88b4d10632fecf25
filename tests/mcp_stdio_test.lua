-- needs: docker
-- `sbx mcp` over pipes, line by line: what the server answers to messages
-- an SDK client never sends (over-long lines, notifications before and
-- after initialize, ids it must not answer), and the texts it takes from
-- policy.mcp. The SDK-driven test is tests/sdk/mcp_test.mjs.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local json = sbx.json

local dir = H.tmpdir()

local write = H.write

local function slurp(path)
  local f = io.open(path)
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

local MAX = 1000
local policy_file = dir .. "/policy.lua"
write(policy_file, string.format([[
return { mcp = {
  max_line = %d,
  instructions = function(p) return "custom instructions for " .. p.mcp.progress_interval end,
  format_progress = function(info) return string.format("tick %%d: %%d bytes", info.count, info.bytes) end,
  progress_interval = 0.2,
} }
]], MAX))

local INIT = { id = "init", method = "initialize", params = { protocolVersion = "2025-06-18",
  capabilities = json.object(), clientInfo = { name = "t", version = "1" } } }

local function line(t)
  if type(t) == "string" then return t end
  t.jsonrpc = "2.0"
  return json.encode(t)
end

-- Feeds the lines to `sbx mcp` (through a pipe when via_pipe, else from a
-- file), input ending after the last one; returns the decoded output
-- messages, the exit status and stderr.
local function session(name, lines, via_pipe)
  local input, out, err = dir .. "/" .. name .. ".in", dir .. "/" .. name .. ".out", dir .. "/" .. name .. ".err"
  local text = {}
  for i, l in ipairs(lines) do text[i] = line(l) end
  write(input, table.concat(text, "\n") .. "\n")
  local cmd = string.format("%s --policy %s mcp --image %s", H.sbx_bin, policy_file, H.busybox)
  if via_pipe then
    cmd = string.format("cat %s | timeout -k 5 120 %s >%s 2>%s", input, cmd, out, err)
  else
    cmd = string.format("timeout -k 5 120 %s <%s >%s 2>%s", cmd, input, out, err)
  end
  local ok, _, code = os.execute(cmd)
  local msgs = {}
  for l in slurp(out):gmatch("[^\n]+") do
    msgs[#msgs + 1] = json.decode(l) or { undecodable = l }
  end
  return msgs, ok and 0 or code, slurp(err)
end

local function by_id(msgs, id)
  for _, m in ipairs(msgs) do if m.id == id then return m end end
end

local function text_of(m)
  return m and m.result and m.result.content and m.result.content[1].text
end

-- Over-long lines --------------------------------------------------------------

for _, via_pipe in ipairs { false, true } do
  local how = via_pipe and "pipe" or "file"
  local long = line { id = "long", method = "ping", params = { pad = ("x"):rep(MAX) } }
  -- Far beyond the limit and beyond the reader's 64 KiB chunks.
  local huge = line { id = "huge", method = "ping", params = { pad = ("y"):rep(300000) } }
  local msgs, code, err = session("long_" .. how, {
    INIT, { method = "notifications/initialized" },
    long, { id = 1, method = "ping" },
    huge, { id = 2, method = "tools/list" },
    long:sub(1, MAX), { id = 3, method = "ping" },
  }, via_pipe)
  tap.is(code, 0, how .. ": the session ends at the end of input, exit 0")
  tap.is(err, "", how .. ": nothing on stderr")
  local errors = {}
  for _, m in ipairs(msgs) do
    if m.error and m.id == json.null then errors[#errors + 1] = m.error end
  end
  tap.is(#errors, 3, how .. ": one error (id null) per over-long line, one for the cut one", json.encode(msgs))
  tap.is(errors[1] and errors[1].code, -32600, how .. ": an over-long line is an invalid request")
  tap.like(errors[1] and errors[1].message, tostring(MAX) .. " bytes", how .. ": the error names the limit")
  tap.is(by_id(msgs, "long"), nil, how .. ": the over-long request itself is dropped")
  tap.is(by_id(msgs, "huge"), nil, how .. ": so is the huge one")
  tap.ok(by_id(msgs, 1) and by_id(msgs, 1).result, how .. ": the line after an over-long one is answered")
  local tl = by_id(msgs, 2)
  tap.ok(tl and tl.result and #tl.result.tools == 4, how .. ": and the session goes on (tools/list after the huge line)")
  tap.is(errors[3] and errors[3].code, -32700, how .. ": a line of exactly the limit is read (cut JSON: a parse error)")
  tap.ok(by_id(msgs, 3) and by_id(msgs, 3).result, how .. ": and the next line is answered")
end

-- Notifications and initialize ---------------------------------------------------

do
  local msgs, code, err = session("notify", {
    -- Before initialize: a notification runs nothing, a request is refused.
    { method = "tools/call", params = { name = "bash", arguments = { command = "touch /tmp/ran-before-init" } } },
    { id = 1, method = "tools/call", params = { name = "bash", arguments = { command = "touch /tmp/ran-before-init" } } },
    { id = 2, method = "ping" },
    -- An initialize without id is a notification: not answered, initializes nothing.
    { method = "initialize", params = INIT.params },
    { id = 3, method = "tools/list" },
    INIT, { method = "notifications/initialized" },
    -- After initialize: notifications of any method are not answered.
    { method = "ping" },
    { method = "tools/list" },
    { method = "no/such/method" },
    { method = "tools/call", params = { name = "bash", arguments = { command = "touch /tmp/ran-as-notification" } } },
    { id = 4, method = "tools/call", params = { name = "bash",
      arguments = { command = "sleep 1; ls /tmp/ran-* 2>/dev/null | wc -l" } } },
    { id = 5, method = "no/such/method" },
    { id = { 1 }, method = "ping" },
  })
  tap.is(code, 0, "notify: exit 0")
  tap.is(err, "", "notify: nothing on stderr")
  for _, m in ipairs(msgs) do
    if m.id == nil then
      tap.ok(false, "notify: every message out has an id", json.encode(m))
    end
  end
  local r1 = by_id(msgs, 1)
  tap.is(r1 and r1.error and r1.error.code, -32002, "a tools/call request before initialize is refused")
  tap.ok(by_id(msgs, 2) and by_id(msgs, 2).result, "ping before initialize is answered")
  local r3 = by_id(msgs, 3)
  tap.is(r3 and r3.error and r3.error.code, -32002, "an initialize notification initializes nothing")
  tap.ok(by_id(msgs, "init") and by_id(msgs, "init").result, "initialize is answered")
  local r4 = by_id(msgs, 4)
  tap.like(text_of(r4), "^%s*0\n$", "no tools/call notification ran, before or after initialize", text_of(r4))
  local r5 = by_id(msgs, 5)
  tap.is(r5 and r5.error and r5.error.code, -32601, "an unknown method request is answered")
  local bad
  for _, m in ipairs(msgs) do if m.id == json.null then bad = m end end
  tap.is(bad and bad.error and bad.error.code, -32600, "an id that is neither string nor number is an invalid request")
  tap.is(#msgs, 7, "seven answers: requests only", json.encode(msgs))
end

-- Texts from policy.mcp ----------------------------------------------------------

do
  local msgs = session("texts", {
    INIT, { method = "notifications/initialized" },
    { id = 1, method = "tools/call", params = { name = "bash", arguments = { command = "sleep 1; echo done" },
      _meta = { progressToken = "p" } } },
  })
  local init = by_id(msgs, "init")
  tap.is(init and init.result.instructions, "custom instructions for 0.2", "policy.mcp.instructions (given the merged policy)")
  local progress
  for _, m in ipairs(msgs) do
    if m.method == "notifications/progress" then progress = m.params end
  end
  tap.like(progress and progress.message, "^tick %d+: %d+ bytes$", "policy.mcp.format_progress",
    json.encode(msgs))
  tap.is(text_of(by_id(msgs, 1)), "done\n", "the call is answered")
end

-- The default texts stay what they were.
do
  local pol = require("sbx.policy")
  local picked = require("sbx.box").backend_name(pol.box.backend, nil, pol)
  tap.is(type(pol.mcp.instructions) == "function" and pol.mcp.instructions(pol, picked) or pol.mcp.instructions,
    "Tools run commands in an isolated sandbox (" .. tostring(picked) .. ").",
    "default instructions (the backend auto picks with the default policy)")
  tap.ok(picked == "docker" or picked == "local", "auto names docker or local (" .. tostring(picked) .. ")")
  tap.is(pol.mcp.format_progress { elapsed = 3.2, bytes = 10, last_line = "x", count = 1 },
    "running for 3s; 10 bytes of output; last line: x", "default progress text")
end

os.execute("rm -rf " .. dir)
tap.done()

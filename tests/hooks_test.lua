-- needs: docker
-- Policies that act, against the real daemon: a policy file's before_exec
-- refusal never runs (checked in the box), a commands budget refuses the
-- next command with its code, box.usage counts; the example guard policy
-- logs every command.
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"
local json = sbx.json

local dir = H.tmpdir()
local pf = dir .. "/policy.lua"
local f = assert(io.open(pf, "w"))
f:write([[
return {
  budget = { commands = 3 },
  hooks = {
    before_exec = function(box, req)
      if type(req.command) == "string" and req.command:find("forbidden") then
        return false, "this policy forbids it"
      end
    end,
  },
}
]])
f:close()

sbx.use_policy(pf)
local box = H.box { image = H.busybox }
local r, err, code = box:exec("touch /tmp/forbidden; echo ran")
tap.ok(r == nil, "the refused command returns no result")
tap.is(code, "denied", "with code denied")
tap.is(err, "this policy forbids it", "and the policy's message")
local data, rerr, rcode = box:read_file("/tmp/forbidden")
tap.ok(data == nil and rcode == "not_found", "the refused command never ran: the file does not exist in the box", rerr)
tap.is(box.usage.commands, 0, "neither the refusal nor sbx's own read counted")
tap.is(box:exec("echo one").stdout, "one\n", "budget: command 1")
tap.is(box:exec({ "echo", "two" }).stdout, "two\n", "budget: command 2")
local name = box:spawn("echo three")
tap.ok(name ~= nil, "budget: command 3 (a background one)")
box:wait(name, 10)
r, err, code = box:exec("echo four")
tap.is(code, "budget_exceeded", "the budget's next command is refused with its code")
tap.like(err, "commands budget is used up: 3 of 3", "saying which budget and how much was used")
tap.is(box.usage.commands, 3, "box.usage.commands counts")
tap.ok(box.usage.output_bytes >= #"one\ntwo\nthree\n", "box.usage.output_bytes counts", box.usage.output_bytes)
tap.ok(box.usage.seconds > 0, "box.usage.seconds counts")
local tools = box:tools()
tap.like(sbx.tools.call(tools, "bash", { command = "echo five" }), "^Error: the box's commands budget is used up",
  "the model reads the budget refusal")
box:close()

-- The example guard policy: deny list, budget, a JSON Lines log.
local log = dir .. "/commands.jsonl"
local script = dir .. "/script.lua"
f = assert(io.open(script, "w"))
f:write(string.format([[
local sbx = require "sbx"
local box = assert(sbx.box { image = %q })
local r, err, code = box:exec("curl http://example.com")
print("curl", code)
print("echo", box:exec("echo hi").stdout)
print("fail", box:exec("exit 3").exit_code)
box:close()
]], H.busybox))
f:close()
local out, status = H.sh(string.format("SBX_GUARD_LOG=%s %s --policy lua/examples/guard_policy.lua run %s", log, H.sbx_bin, script))
tap.is(status, 0, "the example policy runs a script", out)
tap.like(out, "curl%s+denied", "it refuses curl")
tap.like(out, "echo%s+hi", "and runs the rest")
local lines = {}
for line in io.lines(log) do lines[#lines + 1] = json.decode(line) end
tap.is(#lines, 3, "it logged every command, the refused one too")
tap.ok(lines[1].refused ~= nil and lines[1].command == "curl http://example.com", "the refusal is logged with its pattern")
tap.ok(lines[2].command == "echo hi" and lines[2].exit_code == 0, "a result is logged with its exit code")
tap.is(lines[3].exit_code, 3, "and a failing one")
tap.is(lines[3].usage.commands, 2, "with the box's usage")
os.execute("rm -rf " .. dir)
tap.done()

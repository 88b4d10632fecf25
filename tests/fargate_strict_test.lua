-- needs: docker, python3
-- Fargate against a stand-in as strict as the SSM agent (docs/aws-protocol.md
-- 1.9): the agent's output reader turns every valid EF BF BD (U+FFFD) into
-- a lone EF (amazon-ssm-agent, agent/session/shell/shell.go,
-- processStdoutData). sbx's agent channel escapes what it sends
-- (src/pty_escape.c), so U+FFFD text and binary dense in EF BF BD arrive
-- exactly; the stand-in is shown to rewrite (the escaping is needed).
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local standin = assert(H.standin())
sbx.use_policy {
  fargate = {
    endpoint_url = standin.url, region = "us-east-1", credentials = standin.credentials,
    subnets = { "subnet-standin" }, security_groups = { "sg-standin" },
  },
}

-- The codec as Lua sees it.
local d = sbx.core.agent.pty_decoder()
tap.is(d:decode("a\xEF"), "a", "pty_decoder: an EF at a chunk's end waits")
tap.ok(not d:done(), "and is pending")
tap.is(d:decode("0b"), "\xEFb", "its 30 completes it")
local d2 = sbx.core.agent.pty_decoder()
local v, why = d2:decode("x\xEF\xBF")
tap.ok(v == nil and tostring(why):find("escaping is broken", 1, true), "a rewritten escape is refused: " .. tostring(why))

local FFFD = "\xEF\xBF\xBD"
local blob = {}
for i = 0, 4095 do
  local k = i % 5
  blob[#blob + 1] = k == 0 and FFFD or k == 1 and "\xEF" or k == 2 and string.char(i % 256) or k == 3 and "\xEF0" or "\xBF\xBD"
end
blob = table.concat(blob)

-- The exec transport carries the SSM agent's rewrite as it is: proof that
-- the stand-in is strict.
do
  local box <close> = assert(sbx.box { backend = "fargate", image = H.image, transport = "exec" })
  local r = assert(box:exec({ "printf", "a\\357\\277\\275b" }))
  -- "a", EF, "b": three bytes where the command wrote five.
  tap.is(r.stdout_bytes, 3, "exec transport: the stand-in rewrites U+FFFD to a lone EF as the SSM agent does ("
    .. string.format("%q", r.stdout) .. ")")
end

do
  local box <close> = assert(sbx.box { backend = "fargate", image = H.image, transport = "agent" })
  tap.is(box.transport, "agent", "a task on the agent")
  local r = assert(box:exec({ "printf", "a\\357\\277\\275b" }))
  tap.is(r.stdout, "a" .. FFFD .. "b", "agent transport: U+FFFD in a command's output arrives whole")
  tap.is(r.exit_code, 0, "with its exit status")
  assert(box:write_file("/tmp/blob", blob))
  local back = box:read_file("/tmp/blob")
  tap.ok(back == blob, string.format("a %d-byte file dense in EF BF BD goes in and comes back exactly (%s bytes)",
    #blob, back and #back))
  r = assert(box:exec("cat /tmp/blob | wc -c"))
  tap.is(tonumber(r.stdout), #blob, "and is whole in the box")
  r = assert(box:exec("i=0; while [ $i -lt 200 ]; do printf '\\357\\277\\275'; i=$((i+1)); done"))
  tap.is(r.stdout, FFFD:rep(200), "200 U+FFFD written by a command come back as written")
  r = assert(box:exec("echo still"))
  tap.is(r.stdout, "still\n", "the channel is still good afterwards")
end

tap.done()

-- The same box on Fargate. Against AWS, set the usual AWS_* variables (or a
-- profile) and give real subnets; to try it here, against the stand-in:
--   scripts/aws-standin --port 4566 &
--   AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=AKIDSTANDIN \
--   AWS_SECRET_ACCESS_KEY=standin-secret AWS_REGION=us-east-1 \
--     build/sbx run lua/examples/fargate.lua sbx-busybox:latest subnet-local
-- usage: build/sbx run lua/examples/fargate.lua IMAGE SUBNET [SECURITY_GROUP]
local sbx = require "sbx"

local image, subnet, sg = arg[1], arg[2], arg[3]
if not image or not subnet then
  io.stderr:write("usage: sbx run lua/examples/fargate.lua IMAGE SUBNET [SECURITY_GROUP]\n")
  os.exit(2)
end
sbx.use_policy { fargate = { subnets = { subnet }, security_groups = sg and { sg } or nil } }

local t0 = sbx.now()
local box <close>, err, code = sbx.box { backend = "fargate", image = image }
if not box then
  io.stderr:write(string.format("cannot create the box: %s (%s)\n", err, code))
  os.exit(1)
end
print(string.format("task %s running after %.2f s", box.id, sbx.now() - t0))

local r = assert(box:exec("uname -sr; echo out; echo err >&2; exit 3"))
print(string.format("exit %d in %.0f ms:\n%s", r.exit_code, r.duration * 1000, r.output))

r = assert(box:exec("sleep 30", { timeout = 1 }))
print("timed out:", r.timed_out, "(the command was killed in the task)")

local name = assert(box:spawn("for i in 1 2 3; do echo tick $i; sleep 0.1; done"))
box:wait(name, 10)
print("background " .. name .. ":\n" .. box:output(name).text)

local tools = box:tools()
print("the model sees:\n" .. sbx.tools.call(tools, "bash", '{"command": "echo hello; exit 3"}'))

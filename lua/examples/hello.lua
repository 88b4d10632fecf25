-- A first sbx script: a box, a few commands, a background process, the
-- text a model would see, and the box removed at the end.
--   build/sbx run lua/examples/hello.lua [IMAGE]
local sbx = require "sbx"

local image = arg[1] or os.getenv("SBX_IMAGE") or "sbx-debian:12"
local box <close> = assert(sbx.box { image = image })
print("box " .. box.id:sub(1, 12) .. " from " .. image)

local r = assert(box:exec("uname -sr; echo \"shell: $0\"; id -u; ls / | head -3"))
print(string.format("exit %d in %.0f ms:\n%s", r.exit_code, r.duration * 1000, r.stdout))

r = assert(box:exec("sleep 30", { timeout = 1 }))
print("timed out:", r.timed_out, "exit code:", r.exit_code)

local name = assert(box:spawn("for i in 1 2 3; do echo tick $i; sleep 0.1; done"))
box:wait(name, 5)
print("background " .. name .. ":\n" .. box:output(name).text)

local tools = box:tools()
print("the model sees:\n" .. sbx.tools.call(tools, "bash", '{"command": "echo hello; exit 3"}'))

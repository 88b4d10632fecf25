-- needs: docker, local
-- The README's Lua snippets run as written: each ```lua block is taken from
-- README.md and run by `sbx run` (a policy file by `sbx policy check` and
-- as --policy), in a fresh directory, against the real daemon. Every block
-- is accounted for: run here, run by readme_exit_test.lua (Kubernetes and
-- Fargate, against the stand-ins), or named below with why it cannot run
-- here. A fragment that uses a name it does not define gets that name from
-- a one-line prelude, shown in the test's output.
local tap = require "tap"
local H = require "helper"

local sbx_bin = H.sbx_bin
if sbx_bin:sub(1, 1) ~= "/" then sbx_bin = os.getenv("PWD") .. "/" .. sbx_bin end
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local f = assert(io.open("README.md", "rb"))
local readme = f:read("a")
f:close()

-- Every ```lua block with the heading it is under.
local blocks = {}
local heading
for line, nl in readme:gmatch("([^\n]*)()\n?") do
  local h = line:match("^##+ (.+)$")
  if h then heading = h end
  if line == "```lua" then
    blocks[#blocks + 1] = { heading = heading, code = readme:match("^(.-)```", nl + 1) }
  end
end

-- heading -> how: "run" (with an optional prelude), "policy", "elsewhere" (why)
local HOW = {
  ["Using it from Lua"] = { "run" },
  ["Policy"] = { "policy" },
  ["Traces and replay"] = { "run", prelude = 'local api_key = "k-readme-secret"' },
  ["Warm pools"] = { "run" },
  ["The local backend"] = { "run" },
  ["Images"] = { "elsewhere", "it pulls from a registry at 127.0.0.1:5000, which this test does not start; images_registry_test.lua makes the same calls" },
  ["Fargate"] = { "elsewhere", "readme_exit_test.lua runs it against the AWS stand-in" },
  ["Kubernetes"] = { "elsewhere", "readme_exit_test.lua runs it against the Kubernetes stand-in" },
}

tap.ok(#blocks >= 8, "README has its Lua snippets (" .. #blocks .. ")")
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. q(dir)))

for i, b in ipairs(blocks) do
  local how = HOW[b.heading]
  local label = string.format("snippet %d (%s)", i, tostring(b.heading))
  if not how then
    tap.ok(false, label .. ": every snippet is run here or named in HOW")
  elseif how[1] == "elsewhere" then
    tap.skip(label, how[2])
  elseif how[1] == "policy" then
    local path = dir .. "/mypolicy.lua"
    local pf = assert(io.open(path, "w"))
    pf:write(b.code)
    pf:close()
    local out, code = H.sh(string.format("cd %s && %s policy check mypolicy.lua", q(dir), q(sbx_bin)))
    tap.is(code, 0, label .. ": sbx policy check accepts it", out)
    local sf = assert(io.open(dir .. "/under_policy.lua", "w"))
    sf:write('local b <close> = assert(sbx.box {})\nprint(b:exec("echo policy-ok").stdout)\n')
    sf:close()
    out, code = H.sh(string.format("cd %s && %s --policy mypolicy.lua run under_policy.lua", q(dir), q(sbx_bin)))
    tap.is(code, 0, label .. ": a box runs under it", out)
    tap.like(out, "policy%-ok", label .. ": and its command ran", out)
  else
    local path = string.format("%s/snippet%d.lua", dir, i)
    local sf = assert(io.open(path, "w"))
    sf:write((how.prelude and (how.prelude .. "\n") or "") .. b.code)
    sf:close()
    local out, code = H.sh(string.format("cd %s && timeout 300 %s run %s", q(dir), q(sbx_bin), q(path)))
    tap.is(code, 0, label .. ": runs as written" .. (how.prelude and (" after `" .. how.prelude .. "`") or ""), out)
  end
end

os.execute("rm -rf " .. q(dir))
tap.done()

-- needs: nothing
-- The command line.
local tap = require "tap"
local H = require "helper"
local bin = H.sbx_bin

local out, code = H.sh(bin .. " --version")
tap.like(out, "^sbx %d+%.%d+%.%d+", "--version")
out, code = H.sh(bin .. " --help")
tap.like(out, "usage: sbx", "--help")
tap.is(code, 0, "--help exits 0")
out, code = H.sh(bin .. " frobnicate")
tap.like(out, "unknown command 'frobnicate'", "unknown command")
tap.is(code, 2, "exits 2")
out, code = H.sh(bin .. " run /nonexistent.lua")
tap.like(out, "nonexistent", "a missing script is named")
tap.is(code, 1, "exits 1")
out, code = H.sh(bin .. " --policy /nonexistent-policy.lua run /dev/null")
tap.like(out, "neither a bundled policy nor a readable file", "a bad policy is explained")

local script = os.tmpname() .. ".lua"
local f = io.open(script, "w")
f:write([[
local sbx = require "sbx"
print(sbx.policy.exec.timeout, sbx.policy.box.workdir, ...)
]])
f:close()
out = H.sh(bin .. " run " .. script .. " a b")
tap.is(out, "120\t/work\ta\tb\n", "run passes arguments")
out = H.sh(bin .. " --policy lm-deluge run " .. script)
tap.is(out, "60\t/workspace\n", "--policy by bundled name")
out = H.sh("SBX_POLICY=lm-deluge " .. bin .. " run " .. script)
tap.is(out, "60\t/workspace\n", "SBX_POLICY")
local pol = os.tmpname() .. ".lua"
f = io.open(pol, "w")
f:write("return { exec = { timeout = 7 }, box = { workdir = '/srv' } }")
f:close()
out = H.sh(bin .. " --policy " .. pol .. " run " .. script)
tap.is(out, "7\t/srv\n", "--policy FILE merges over the defaults")
out = H.sh(bin .. " tools")
tap.like(out, '^%[{"name":"bash","description":', "sbx tools prints the definitions")
out = H.sh(bin .. " --policy lm-deluge tools")
tap.like(out, '"wait"', "and follows the policy")

-- A missing option value or a directory for a file: one line, exit 2.
local function one_line_usage(cmd, pattern, name)
  local o, c = H.sh(bin .. " " .. cmd .. " </dev/null")
  tap.is(c, 2, name .. ": exits 2")
  tap.like(o, "^sbx: " .. pattern .. "[^\n]*\n$", name .. ": one clear line")
end
one_line_usage("tools --format", "tools: %-%-format needs a value", "tools --format without a value")
one_line_usage("mcp --image", "mcp: %-%-image needs a value", "mcp --image without a value")
one_line_usage("mcp --backend", "mcp: %-%-backend needs a value", "mcp --backend without a value")
local tdir = os.tmpname()
os.remove(tdir)
os.execute("mkdir -p " .. tdir)
one_line_usage("eval " .. tdir, "eval: " .. tdir:gsub("%p", "%%%0") .. " is a directory", "eval DIR")
os.execute("rm -rf " .. tdir)
tap.done()

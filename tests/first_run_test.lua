-- needs: docker, local, root
-- A first run that works offline: the policy's default image is one that
-- scripts/setup.sh builds (no registry is reachable here), so sbx.box{}
-- without an image, `sbx eval` and `sbx mcp` without --image work with the
-- Docker daemon and without one (the local backend, from setup's archive);
-- and a task or session whose box cannot be made says why on stderr and in
-- eval's summary, not only in --out.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local json = sbx.json

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local sbx_bin = H.sbx_bin
if sbx_bin:sub(1, 1) ~= "/" then sbx_bin = os.getenv("PWD") .. "/" .. sbx_bin end
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -m 700 -p " .. q(dir)))
local function write(name, text)
  local path = dir .. "/" .. name
  H.write(path, text)
  return path
end
local function slurp(path)
  local f = io.open(path)
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

-- The default ---------------------------------------------------------------------------

local built = {}
for ref in slurp("scripts/build-images.sh"):gmatch("local ref=([%w%.:/_-]+)") do built[ref] = true end
tap.ok(built["sbx-debian:12"] and built["sbx-busybox:latest"], "scripts/build-images.sh builds sbx-debian:12 and sbx-busybox:latest")
local default = require("sbx.policy").box.image
tap.ok(built[default], "policy.box.image (" .. tostring(default) .. ") is an image scripts/setup.sh builds")
tap.is(sbx.policy.box.image, default, "and the live policy has it")

-- sbx.box{} with no image, with the daemon and without one.
local probe = write("probe.lua", [[local sbx = require "sbx"
local b = assert(sbx.box {})
print(b.backend_name, b.spec.image, (b:exec("cat /etc/debian_version").stdout:gsub("%s+$", "")))
]])
local cache = dir .. "/cache"
local out, code = H.sh(string.format("timeout -k 5 300 %s run %s", q(sbx_bin), q(probe)))
tap.is(code, 0, "sbx.box{} with no image works on the daemon\n" .. out)
tap.like(out, "^docker\tsbx%-debian:12\t12", "a Docker box from sbx-debian:12")
-- The daemon's socket hidden in a mount namespace of this command's own, a
-- fresh image cache: the image comes from setup's archive, no registry.
out, code = H.sh(string.format(
  "unshare -m sh -c 'mount --bind /dev/null /run/docker.sock && env -u DOCKER_HOST XDG_CACHE_HOME=%s timeout -k 5 300 %s run %s'",
  cache, sbx_bin, probe))
tap.is(code, 0, "and with no daemon\n" .. out)
tap.like(out, "^local\tsbx%-debian:12\t12", "a local box from setup's sbx-debian:12 archive")

-- sbx eval --------------------------------------------------------------------------------

local tasks = write("tasks.jsonl", table.concat({
  json.encode { id = "ok", run = "grep -q '^12' /etc/debian_version" },
  json.encode { id = "nobox", box = { image = "sbx-no-such-image:first-run" }, run = "true" },
}, "\n") .. "\n")
local function eval(args)
  local o, e = dir .. "/eval.out", dir .. "/eval.err"
  local _, _, c = os.execute(string.format("timeout -k 5 300 %s eval %s %s >%s 2>%s </dev/null",
    q(sbx_bin), q(tasks), args, q(o), q(e)))
  return slurp(o), slurp(e), c
end
local so, se, ec = eval("")
tap.is(ec, 1, "eval with a task in error exits 1\n" .. se)
tap.like(se, "%[%d/2%] ok passed", "the task with no image ran in the default image and passed")
tap.like(se, "%[%d/2%] nobox error [%d.]+s: image_unavailable: [^\n]*sbx%-no%-such%-image:first%-run",
  "the error's progress line on stderr says why: its code and message, naming the image")
tap.like(so, "\nerrors:\n  nobox%s+image_unavailable: [^\n]*sbx%-no%-such%-image", "the summary lists the error with its reason")
-- More errors than the summary lists: it says how many it left out.
do
  local lines = {}
  for i = 1, 4 do lines[i] = json.encode { id = "e" .. i, box = { image = "sbx-no-such-image:first-run" }, run = "true" } end
  tasks = write("tasks4.jsonl", table.concat(lines, "\n") .. "\n")
  local pol = write("pol.lua", "return { harness = { error_lines = 2, error_chars = 40 } }\n")
  local o2, e2 = dir .. "/eval2.out", dir .. "/eval2.err"
  os.execute(string.format("timeout -k 5 300 %s --policy %s eval %s --out %s >%s 2>%s </dev/null",
    q(sbx_bin), q(pol), q(tasks), q(dir .. "/r.jsonl"), q(o2), q(e2)))
  local s2 = slurp(o2)
  local listed = select(2, s2:gsub("\n  e%d%s+image_unavailable", ""))
  tap.is(listed, 2, "policy.harness.error_lines: the summary lists that many errors\n" .. s2)
  tap.like(s2, "%.%.%. and 2 more %(every reason is in [^\n]*r%.jsonl%)", "and says where the others are")
  local reason = slurp(e2):match("e%d error [%d.]+s: ([^\n]*)") or ""
  tap.ok(#reason <= #"image_unavailable: " + 40 + 3 and reason:sub(-3) == "...",
    "policy.harness.error_chars cuts a long reason: " .. reason)
end

-- sbx mcp ---------------------------------------------------------------------------------

local INIT = json.encode { jsonrpc = "2.0", id = "init", method = "initialize", params = { protocolVersion = "2025-06-18",
  capabilities = json.object(), clientInfo = { name = "t", version = "1" } } }
local CALL = json.encode { jsonrpc = "2.0", id = 1, method = "tools/call",
  params = { name = "bash", arguments = { command = "cat /etc/debian_version" } } }
local input = write("mcp.in", INIT .. "\n" .. json.encode { jsonrpc = "2.0", method = "notifications/initialized" } .. "\n" .. CALL .. "\n")
local function mcp(args)
  local o, e = dir .. "/mcp.out", dir .. "/mcp.err"
  local _, _, c = os.execute(string.format("timeout -k 5 300 %s mcp %s <%s >%s 2>%s", q(sbx_bin), args, q(input), q(o), q(e)))
  local answer
  for l in slurp(o):gmatch("[^\n]+") do
    local m = json.decode(l)
    if m and m.id == 1 then answer = m end
  end
  return answer, slurp(e), c
end
local answer, merr, mcode = mcp("")
tap.is(mcode, 0, "sbx mcp with no --image ends at the end of input, exit 0\n" .. merr)
local text = answer and answer.result and answer.result.content[1].text or ""
tap.like(text, "12%.%d+", "its box is from the default image (Debian 12)")
answer, merr = mcp("--image sbx-no-such-image:first-run")
text = answer and answer.result and answer.result.content[1].text or ""
tap.ok(answer and answer.result and answer.result.isError, "a session whose box cannot be made: the call is an error")
tap.like(text, "image_unavailable", "whose text names the code")
tap.like(merr, "sbx mcp: the sandbox could not be created: image_unavailable: [^\n]*sbx%-no%-such%-image",
  "and stderr says why")

H.sh("rm -rf " .. q(dir))
tap.done()

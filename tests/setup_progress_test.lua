-- needs: nothing
-- scripts/setup.sh and scripts/build-images.sh never go silent for minutes:
-- each step says what it does, and a long command (apt-get, debootstrap,
-- npm, an export) runs under `busy`, which says every
-- $SBX_SETUP_HEARTBEAT seconds that it is still at it, for how long, and
-- the command's own last line. The function is taken from each script and
-- run on its own (setup itself needs root and minutes). Both scripts take
-- log and busy from scripts/lib/steps.sh, their one home.
local tap = require "tap"
local H = require "helper"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local out_file = os.tmpname()

for _, script in ipairs { "scripts/setup.sh", "scripts/build-images.sh" } do
  local f = assert(io.open(script))
  local text = f:read("a")
  f:close()
  tap.ok(text:find('/lib/steps.sh" || exit 1\n', 1, true) and not text:find("\nbusy%(%) {"),
    script .. ": sources scripts/lib/steps.sh and defines no busy of its own")
end

for _, script in ipairs { "scripts/lib/steps.sh" } do
  -- log and busy exactly as the file defines them.
  local defs = string.format([[eval "$(sed -n '/^log() /p; /^busy() {/,/^}/p' %s)"]], script)
  local function run(body, every)
    return H.sh(string.format("SBX_SETUP_HEARTBEAT=%d bash -c %s", every or 1, q("set -euo pipefail; " .. defs .. "; " .. body)))
  end
  local out, rc = run(string.format("busy 'sleeping' %s -- sh -c 'echo first; echo working on it; sleep 6'; echo rc=$?", q(out_file)))
  tap.is(rc, 0, script .. ": busy runs the command\n" .. out)
  tap.like(out, "setup: still sleeping %(%d+s%): working on it\n", script .. ": and says it is still at it, with the command's last line")
  tap.like(out, "rc=0\n$", script .. ": its status is the command's (0)")
  tap.ok(not out:find("first", 1, true), script .. ": the command's output went to the file, not the terminal")
  out = run("busy 'failing' -- sh -c 'exit 3' || echo rc=$?")
  tap.like(out, "rc=3\n$", script .. ": a failing command's status comes through (3)")
  out = run("busy 'quick' -- true; echo done", 30)
  tap.is(out, "done\n", script .. ": a quick command says nothing")
end

-- Every apt-get, debootstrap and npm in the scripts runs under busy.
for _, script in ipairs { "scripts/setup.sh", "scripts/build-images.sh" } do
  local f = assert(io.open(script))
  local text = f:read("a")
  f:close()
  local bare = {}
  for line in text:gmatch("[^\n]+") do
    local code = line:gsub("#.*", ""):gsub("log \"[^\"]*\"", "")
    if (code:match("^%s*apt%-get ") or code:match("^%s*debootstrap ") or code:match("npm ci")) and not code:match("busy ")
      and not text:find("busy [^\n]*%-%- \\\n" .. line:gsub("%p", "%%%0"), 1) then
      bare[#bare + 1] = line
    end
  end
  tap.is(#bare, 0, script .. ": no long command runs without saying it is busy: " .. table.concat(bare, " | "))
end
os.remove(out_file)
tap.done()

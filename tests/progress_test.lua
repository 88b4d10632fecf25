-- needs: docker, python3
-- Progress of long steps (sbx.progress, policy.progress): an image's export
-- from the daemon, its download from a registry and its unpacking say how
-- many bytes at what rate, on stderr only; on a terminal from the start,
-- elsewhere only past policy.progress.after; throttled to one line per
-- interval; "never" silences them. Each case runs `sbx run` with a fresh
-- image cache, so the step really happens.
local tap = require "tap"
local H = require "helper"
local IH = require "images_helper"
local sbx = require "sbx"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local sbx_bin = H.sbx_bin
if sbx_bin:sub(1, 1) ~= "/" then sbx_bin = os.getenv("PWD") .. "/" .. sbx_bin end
local dir = IH.tmpdir("progress")
local n = 0
local function write(name, text)
  local path = dir .. "/" .. name
  H.write(path, text)
  return path
end
local script = write("resolve.lua", [[local sbx = require "sbx"
local img, err, code = require("sbx.images").resolve(arg[1], { pull = "always" })
print(img and "resolved" or ("failed: " .. tostring(err) .. " " .. tostring(code)))
]])

-- run(progress policy, ref [, tty]) -> stdout, stderr (merged on a terminal)
local function run(progress, ref, tty)
  n = n + 1
  local parts = {}
  for k, v in pairs(progress) do parts[#parts + 1] = string.format("%s = %q", k, v) end
  local pol = write("pol" .. n .. ".lua", "return { progress = { " .. table.concat(parts, ", ") .. " } }\n")
  local env = "env XDG_CACHE_HOME=" .. q(dir .. "/cache" .. n)
  local cmd = string.format("%s %s --policy %s run %s %s", env, sbx_bin, q(pol), q(script), q(ref))
  if tty then
    local out = H.sh(string.format("timeout -k 5 300 /usr/bin/python3 tests/pty_run.py %s", q(cmd)))
    return out:gsub("\r\n", "\n"), nil
  end
  local o, e = dir .. "/out" .. n, dir .. "/err" .. n
  os.execute(string.format("timeout -k 5 300 %s >%s 2>%s </dev/null", cmd, q(o), q(e)))
  return IH.read(o) or "", IH.read(e) or ""
end
local function count(text, pattern) return select(2, text:gsub(pattern, "")) end

local ref = H.busybox
local name = ref:gsub("[%-%.]", "%%%0")

-- Not a terminal, "always": the export and the unpacking each end with a
-- line saying bytes, time and rate; at most one line before that (the
-- interval is an hour); stdout has only the script's output.
do
  local out, err = run({ mode = "always", plain_interval = 3600, interval = 3600 }, ref)
  tap.is(out, "resolved\n", "stdout has only what the script printed")
  tap.like(err, "sbx: exporting [^\n]*" .. name .. " from the Docker daemon: done, [%d.]+ [KM]iB in [%d.]+ s %([%d.]+ [KMG]?i?B/s%)\n",
    "the export's last line: bytes, seconds and rate\n" .. err)
  tap.like(err, "sbx: unpacking [^\n]*" .. name .. ": done, [%d.]+ [KM]iB, 1/1 layers in [%d.]+ s", "the unpacking's: bytes and layers")
  tap.ok(count(err, "sbx: exporting ") <= 2, "throttled: at most one line before the last (the interval is an hour)")
end

-- Not a terminal, "auto": a step shorter than `after` says nothing.
do
  local out, err = run({ mode = "auto", after = 3600 }, ref)
  tap.is(out, "resolved\n", "auto, not a terminal: resolved")
  tap.is(count(err, "sbx: "), 0, "and a quick step says nothing on stderr: " .. err)
end

-- On a terminal, "auto" speaks from the start; "never" does not.
do
  local out = run({ mode = "auto", after = 3600 }, ref, true)
  tap.like(out, "sbx: exporting [^\n]*done", "auto, on a terminal: the export says its progress at once\n" .. out)
  tap.like(out, "resolved", "and the script ran")
  out = run({ mode = "never" }, ref, true)
  tap.like(out, "resolved", "never, on a terminal: the script ran")
  tap.is(count(out, "sbx: "), 0, "and no progress line: " .. out)
end

-- A download from a registry: bytes of the total the manifest gives.
do
  local reg = IH.registry()
  local r = "docker://" .. reg.registry .. "/library/busybox:latest"
  local out, err = run({ mode = "always", plain_interval = 3600 }, r)
  tap.is(out, "resolved\n", "the registry image resolved\n" .. err)
  tap.like(err, "sbx: downloading [^\n]*library/busybox:latest: done, [%d.]+ [KM]iB of [%d.]+ [KM]iB %(100%%%) in [%d.]+ s",
    "the download's last line: bytes of the manifest's total\n" .. err)
  -- The Docker daemon's own pull (a box from an image it lacks): the sum
  -- of its layers' "Downloading" progress. library/big is 30 MB of layer
  -- no other image here has; the daemon forgets it afterwards. (Podman
  -- pulls from a plain-HTTP registry only where registries.conf calls it
  -- insecure; Docker takes 127.0.0.0/8 as such by default.)
  local big = reg.registry .. "/library/big:latest"
  if H.daemon().podman then
    tap.skip("the daemon's pull says its bytes of the layers' total",
      "Podman does not pull from a plain-HTTP loopback registry unless registries.conf says so")
    tap.skip("throttled to one line an hour before the last", "the same")
    reg:stop()
  else
    local box_script = write("box.lua", string.format([[local sbx = require "sbx"
local b, err, code = sbx.box { backend = "docker", image = %q, transport = "exec" }
print(b and "made" or ("not made: " .. tostring(code)))
]], big))
    local pol = write("pull.lua", 'return { progress = { mode = "always", plain_interval = 3600 } }\n')
    local o, e = dir .. "/pull.out", dir .. "/pull.err"
    os.execute(string.format("timeout -k 5 300 %s --policy %s run %s >%s 2>%s </dev/null", sbx_bin, q(pol), q(box_script), q(o), q(e)))
    H.sh("docker rmi " .. q(big))
    err = IH.read(e) or ""
    local got, total = err:match("sbx: pulling [^\n]*library/big:latest %(Docker daemon%): done, ([%d.]+ [KM]iB) of ([%d.]+ [KM]iB)")
    tap.ok(got and got == total, "the daemon's pull says its bytes of the layers' total: " .. tostring(got) .. " of " .. tostring(total) .. "\n" .. err)
    tap.ok(count(err, "sbx: pulling ") <= 2, "throttled to one line an hour before the last")
    reg:stop()
  end
end

-- Bad knobs are refused when the policy is loaded.
for _, case in ipairs {
  { 'progress = { mode = "loud" }', "progress.mode must be one of" },
  { "progress = { after = -1 }", "progress.after must be >= 0" },
  { 'progress = { format = "text" }', "progress.format" },
} do
  local bad = write("bad" .. #case[1] .. ".lua", "return { " .. case[1] .. " }\n")
  local out, rc = H.sh(string.format("%s policy check %s", sbx_bin, q(bad)))
  tap.ok(rc ~= 0 and out:find(case[2], 1, true), "refused: " .. case[1] .. " (" .. out:gsub("\n$", "") .. ")")
end

IH.cleanup()
tap.done()

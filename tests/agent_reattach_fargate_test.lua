-- needs: docker, python3
-- A dropped ECS Exec session under the agent (the AWS stand-in cuts the
-- websocket and, as the SSM agent does when it cancels a session, kills the
-- process the session started): the agent, which runs beside that process,
-- keeps its commands; sbx opens a new session to it and every byte arrives
-- once. The PTY and the SSM agent's output rules (it holds back output
-- ending in bytes that are not whole UTF-8) are in the way the whole time.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"

local standin = assert(H.standin())
sbx.use_policy {
  fargate = {
    endpoint_url = standin.url, region = "us-east-1", credentials = standin.credentials,
    subnets = { "subnet-standin" }, security_groups = { "sg-standin" },
  },
  agent = { reattach_timeout = 30, attach_timeout = 10 },
}

-- What the stand-in's sessions say (their pauses, acks and input) when a
-- box could not be made, to tell a stall on the wire from a slow box.
local function dump_sessions()
  local st = standin:state()
  for _, ses in pairs(st and st.sessions or {}) do
    local keep = {}
    for k, v in pairs(ses) do if type(v) ~= "table" then keep[#keep + 1] = k .. "=" .. tostring(v) end end
    table.sort(keep)
    tap.diag("stand-in session: " .. table.concat(keep, " "))
  end
end

-- The agent's own session is cut after 40 output messages; later sessions
-- (the way back) are not.
assert(standin:faults { drop_ws_after = 40, kill_on_drop = true })
local box, berr = sbx.box { backend = "fargate", image = H.image, transport = "agent" }
if not box then dump_sessions() error(berr) end
assert(standin:faults { drop_ws_after = 0 })
tap.is(box.transport, "agent", "a task on the agent")
local st = box.tstate
local agent_pid = st.agent_pid

local bg = assert(box:spawn("i=0; while [ $i -lt 30 ]; do i=$((i+1)); echo tick $i; sleep 0.05; done"))
local want = (H.sh("seq 1 200000 | md5sum"):gsub("%s+$", ""))
local r = box:exec("seq 1 200000 | md5sum; seq 1 200000", { timeout = 120 })
tap.is(r and r.stdout:match("^[^\n]+"), want, "200,000 lines across the cut session: every byte once (md5)")
tap.is(r and r.stdout_bytes, #want + 1 + 1288895, "and all of them arrived (" .. tostring(r and r.stdout_bytes) .. " bytes)")
tap.is(r and r.exit_code, 0, "with the exit status")
tap.ok((st.reattached or 0) >= 1, "the channel was opened again through a new session (" .. tostring(st.reattached) .. ")")
tap.is(st.agent_pid, agent_pid, "to the same agent")

local state = standin:state()
local cut, killed = 0, 0
for _, s in ipairs(state.sessions or {}) do
  if s.dropped then cut = cut + 1 end
  if s.processKilled then killed = killed + 1 end
end
tap.ok(cut >= 1, "the stand-in cut the agent's session (" .. cut .. ")")
tap.ok(killed >= 1, "and killed the process it had started, as the SSM agent does")

local view = box:wait(bg, 30)
tap.is(view and view.exit_code, 0, "the background process ran on")
local out = box:output(bg, { max_bytes = 100000 })
local n, in_order = 0, true
for line in out.text:gmatch("[^\n]+") do
  n = n + 1
  if line ~= "tick " .. n then in_order = false end
end
tap.ok(n == 30 and in_order, "its log is whole (" .. n .. " ticks in order)")

-- Binary output whose end is not UTF-8 (the SSM agent would hold it back
-- on a bare PTY): it arrives at once and exact.
r = box:exec("printf 'a\\342\\202' | tee /tmp/tail", { timeout = 30 })
tap.is(r and r.stdout_bytes, 3, "output ending inside a UTF-8 sequence arrives whole")
tap.is(box:read_file("/tmp/tail"), "a\226\130", "byte for byte")
tap.is(box:exec("echo fine").stdout, "fine\n", "commands go on")
box:close()

-- An image without stty (Debian's, with stty removed: busybox's shell has
-- it built in): the PTY stays cooked while the agent is uploaded as text,
-- then the agent makes it raw itself; every byte value goes both ways, and
-- a cut session comes back through a relay placed the same way.
do
  local image = "sbx-test-nostty:" .. sbx.core.pid()
  local name = "sbx-nostty-build-" .. sbx.core.pid()
  -- On the daemon where the stand-in runs its tasks.
  local out, code = H.sh(string.format("export DOCKER_HOST=%s; docker rm -f %s >/dev/null 2>&1; " ..
    "docker run --name %s %s rm /usr/bin/stty && docker commit %s %s >/dev/null && docker rm %s >/dev/null",
    standin.docker_host, name, name, H.image, name, image, name))
  assert(code == 0, "cannot build an image without stty: " .. out)
  local nb, nerr = sbx.box { backend = "fargate", image = image, transport = "agent" }
  tap.ok(nb and nb.transport == "agent", "no stty in the image: the agent is placed all the same", tostring(nerr))
  if nb then
    tap.is(nb:exec("command -v stty || echo none").stdout, "none\n", "(the image has no stty)")
    local bytes = {}
    for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
    bytes = table.concat(bytes):rep(4)
    tap.ok(nb:write_file("/tmp/all.bin", bytes), "every byte value into the box")
    local back = nb:exec("cat /tmp/all.bin /tmp/all.bin > /tmp/two.bin; cat /tmp/two.bin")
    tap.is(back and back.stdout_bytes, 2 * #bytes, "and out of a command, as many as went in")
    tap.is(nb:read_file("/tmp/two.bin"), bytes .. bytes, "and back byte for byte (the PTY is raw)")
    tap.is(nb:exec("exit 9").exit_code, 9, "exit statuses travel in the protocol")
    nb:close()
    -- A second box whose agent session is cut once a command prints a
    -- word (the stand-in watches its output for it).
    assert(standin:faults { drop_ws_on = "CUT-THE-SESSION-NOW", kill_on_drop = true })
    local cb, cerr = sbx.box { backend = "fargate", image = image, transport = "agent" }
    assert(standin:faults { drop_ws_on = sbx.json.null, kill_on_drop = false })
    if not cb then dump_sessions() end
    tap.ok(cb ~= nil, "a second box, its session to be cut by a word in its output", tostring(cerr))
    if cb then
      local want_bytes = tonumber((H.sh("seq 1 300000 | wc -c"):match("%d+")))
      cb:exec("seq 1 300000 > /tmp/seq.txt")
      local rr = cb:exec("echo CUT-THE-SESSION-NOW; cat /tmp/seq.txt; md5sum < /tmp/seq.txt >&2", { timeout = 120 })
      local want5 = (H.sh("seq 1 300000 | md5sum"):gsub("%s+$", ""))
      want_bytes = want_bytes + #"CUT-THE-SESSION-NOW\n"
      tap.ok(rr and rr.stdout_bytes == want_bytes and rr.stdout:sub(-7) == "300000\n",
        "2 MB of output across the cut: every byte once (" .. tostring(rr and rr.stdout_bytes) .. " of " .. want_bytes .. ")")
      tap.is(rr and rr.stderr, want5 .. "\n", "and the command's own checksum of them")
      tap.ok((cb.tstate.reattached or 0) >= 1, "after a re-attach through a relay placed as text (" ..
        tostring(cb.tstate.reattached) .. ")")
      tap.is(cb:exec("echo fine").stdout, "fine\n", "commands go on")
      cb:close()
    end
  end
  H.sh("DOCKER_HOST=" .. standin.docker_host .. " docker rmi -f " .. image .. " >/dev/null 2>&1")
end

standin:stop()
tap.done()

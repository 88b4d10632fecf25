-- needs: docker, python3
-- The Kubernetes backend against the stand-in in its strict modes, each a
-- rule of the real servers (docs/kubernetes.md, "Where the stand-in was
-- lenient"): an exec upgrade whose Accept is not */* gets 406 (the
-- kubelet's go-restful route); every websocket frame is a message of its
-- own (wsstream over golang.org/x/net/websocket), so sbx must never send a
-- continuation frame; the scheduler accounts the node's allocatable cpu and
-- memory (Pending, "Insufficient cpu"); NetworkPolicy is not enforced
-- unless the stand-in is started with --network-policy enforce. And what a
-- real cluster does to a running box: its pod deleted or past its
-- lifetime is box_gone, for the running command and the next one, on both
-- transports. No assertion here times anything: counts and codes only
-- (the one lower bound, "not before start_timeout", cannot flake).
local tap = require "tap"
local H = require "helper"
local K = require "k8s_helper"
local sbx = require "sbx"
local kbackend = require "sbx.backends.kubernetes"

-- A node with one CPU: boxes of cpus = 1 request 250m, so four fit.
local standin = assert(K.standin { "--node-cpu", "1" })
sbx.use_policy { kubernetes = { kubeconfig = standin.kubeconfig } }
local function state() return assert(standin:state()) end
local function box(opts)
  opts = opts or {}
  opts.backend, opts.image, opts.transport = "kubernetes", opts.image or H.busybox, opts.transport or "exec"
  return sbx.box(opts)
end
-- A client as the backend makes them: policy.kubernetes, in full.
local function kspec()
  local k = {}
  for key, v in pairs(sbx.policy.kubernetes) do k[key] = v end
  k.in_cluster = false
  return k
end
local client = assert(kbackend.client(kspec()))
local function delete_pod(name)
  return client:call("DELETE", "/api/v1/namespaces/default/pods/" .. name, { query = { gracePeriodSeconds = "0" },
    ok = { [404] = true } })
end

-- Accept ---------------------------------------------------------------------------------------

do
  local conn = assert(require("sbx.kubernetes.config").resolve { kubeconfig = standin.kubeconfig, in_cluster = false })
  local cred = assert(require("sbx.kubernetes.config").credentials(conn, sbx.policy.kubernetes))
  local b = assert(box())
  local url = standin.url:gsub("^https", "wss") .. "/api/v1/namespaces/default/pods/" .. b.id ..
    "/exec?command=true&stdout=true"
  local function try(accept)
    return sbx.core.ws.connect { url = url, headers = { Accept = accept }, protocols = { "v4.channel.k8s.io" },
      ca_data = conn.tls.ca_data, cert_data = cred.cert_data, key_data = cred.key_data, timeout = 30 }
  end
  local ws, err = try("application/json")
  tap.ok(ws == nil and tostring(err):find("406", 1, true), "the stand-in, as the kubelet: Accept application/json on exec is 406", err)
  ws = try("application/json, */*;q=0.8")
  tap.ok(ws ~= nil, "an Accept that lists */* is served")
  if ws then ws:close() end
  local refused = state().execs.refused_accept
  tap.is(assert(b:exec("echo hi")).stdout, "hi\n", "sbx's exec upgrade is accepted")
  tap.is(state().execs.refused_accept, refused, "sbx never sent a refused Accept")
  b:close()
end

-- A refusal in the server's own words, with the request that caused it.
do
  local ex, err, code = client:exec("default", "nope", "box", { "true" })
  tap.ok(ex == nil and code == "not_found" and tostring(err):find('pods "nope" not found', 1, true)
    and tostring(err):find("GET /api/v1/namespaces/default/pods/nope/exec", 1, true),
    "a refused exec upgrade: the server's Status message and the request", err)
  local msg = require("sbx.kubernetes.client").status_error(406, "406: Not Acceptable")
  tap.like(msg, "406: Not Acceptable", "a refusal that is not a Status keeps the server's text")
end

-- No fragments --------------------------------------------------------------------------------

do
  local ok, err = pcall(function()
    local ws = assert(sbx.core.ws.connect { url = standin.url:gsub("^https", "wss") .. "/version", timeout = 5, max_send = 8,
      insecure = true })
    ws:send("123456789")
  end)
  tap.ok(not ok, "core.ws refuses (raises) a message longer than max_send instead of fragmenting it", err)
  local big = {}
  for i = 0, 199999 do big[#big + 1] = string.char(i % 251) end
  big = table.concat(big)
  for _, transport in ipairs { "exec", "agent" } do
    local b = assert(box { transport = transport })
    local before = state().execs.continuations
    local r = assert(b:exec({ "sh", "-c", "head -c 200000 | md5sum" }, { stdin = big, timeout = 120 }))
    local want = assert(b:exec({ "sh", "-c", "printf '' | md5sum" })).stdout
    tap.ok(r.exit_code == 0 and r.stdout ~= want and #r.stdout > 32, transport .. ": 200,000 bytes of stdin arrive (head -c ends)")
    local r2 = assert(b:exec({ "wc", "-c" }, { stdin = big, timeout = 120 }))
    tap.is(r2.stdout:match("%d+"), "200000", transport .. ": every byte of a 200,000-byte stdin")
    assert(b:write_file("/tmp/big", big))
    tap.ok(b:read_file("/tmp/big") == big, transport .. ": write_file of 200,000 bytes is exact")
    tap.is(state().execs.continuations - before, 0, transport .. ": not one continuation frame reached the exec server")
    b:close()
  end
end

-- The node's allocatable -----------------------------------------------------------------------

do
  local seen_before = state().unschedulable_seen
  local waits = {}
  local running, most = 0, 0
  local tasks = {}
  for i = 1, 6 do
    tasks[i] = sbx.spawn(function()
      local b, err, code = box { policy = { kubernetes = { start_timeout = 300,
        on_wait = function(name, msg) waits[#waits + 1] = msg end } } }
      if not b then return { err = err, code = code } end
      running = running + 1
      most = math.max(most, running)
      b:exec("sleep 1")
      running = running - 1
      b:close()
      return { ok = true }
    end)
  end
  local res = sbx.gather(tasks)
  local okn = 0
  for _, r in ipairs(res) do if r.ok then okn = okn + 1 end end
  tap.is(okn, 6, "six boxes on a node with room for four: all six run (each waits for a slot)")
  tap.ok(most <= 4, "never more than four at once (most: " .. most .. ")")
  tap.ok(state().unschedulable_seen > seen_before, "some pods were Pending, Unschedulable, on the way")
  tap.ok(#waits > 0 and waits[1]:find("Insufficient cpu", 1, true), "on_wait says what the box waits for", waits[1])

  local t0 = sbx.now()
  local b, err, code = box { cpus = 8, policy = { kubernetes = { start_timeout = 2 } } }
  tap.ok(b == nil and code == "unschedulable" and tostring(err):find("Insufficient cpu", 1, true),
    "a box larger than the node fails with the scheduler's message", err)
  tap.ok(sbx.now() - t0 >= 2, "once start_timeout has passed, not before")
  local nb, nerr, ncode = box { node_selector = { disktype = "ssd" }, policy = { kubernetes = { start_timeout = 300 } } }
  tap.ok(nb == nil and ncode == "unschedulable" and tostring(nerr):find("node affinity/selector", 1, true),
    "a selector no node meets still fails at once", nerr)
  local bad = box { policy = { kubernetes = { requests = { cpu = "2" } } } }
  tap.ok(bad == nil, "a request above its limit is refused by validation")
  tap.is(#state().pods, 0, "nothing of the failed boxes is left")
end

-- A pod that is gone ----------------------------------------------------------------------------

for _, transport in ipairs { "exec", "agent" } do
  local b = assert(box { transport = transport })
  local t = sbx.spawn(function() return { b:exec("sleep 100", { timeout = 90 }) } end)
  sbx.sleep(1)
  assert(delete_pod(b.id))
  local r = sbx.wait(t)
  tap.ok(r[1] == nil and r[3] == "box_gone", transport .. ": the running command of a deleted pod is box_gone", r[2])
  local _, err, code = b:exec("echo x")
  tap.is(code, "box_gone", transport .. ": and so is the next command", err)
  b:close()

  local lb = assert(box { transport = transport, lifetime = 10 })
  local lr = { lb:exec("sleep 100", { timeout = 90 }) }
  tap.ok(lr[1] == nil and lr[3] == "box_gone" and tostring(lr[2]):find("lifetime", 1, true), tostring(lr[2]) .. " " .. tostring(lr[3]) .. " " ..
    transport .. ": a command running when the pod's lifetime ends is box_gone, saying so " .. (type(lr[1]) == "table" and tostring(lr[1].exit_code) or ""))
  local _, lerr, lcode = lb:exec("echo x")
  tap.is(lcode, "box_gone", transport .. ": and the next one", lerr)
  lb:close()
end

-- NetworkPolicy not enforced: the box finds out ----------------------------------------------------

do
  local b = assert(box())
  tap.is(b.limits.network.check, "not enforced by this cluster", "network none on a cluster that ignores NetworkPolicy: said")
  tap.ok(state().kubelet.accepted >= 1, "the box's check reached the node's kubelet port")
  b:close()
  local r, err, code = box { policy = { kubernetes = { network_check = "refuse" } } }
  tap.ok(r == nil and code == "network_not_enforced", "network_check = refuse: the box is refused", err)
  local st = state()
  tap.ok(#st.pods == 0 and #st.networkpolicies == 0, "and deleted with its NetworkPolicy")
end
standin:stop()

local enforcing = assert(K.standin { "--network-policy", "enforce" })
sbx.use_policy { kubernetes = { kubeconfig = enforcing.kubeconfig, network_check = "refuse" } }
do
  local b, err = box()
  tap.ok(b and b.limits.network.check == "verified" and b.limits.network.enforced == "cluster",
    "a cluster that enforces it: verified from inside the box", err)
  if b then b:close() end
  local d = assert(box { image = H.image })
  tap.is(d.limits.network.check, "verified", "also with bash's /dev/tcp (the Debian image)")
  d:close()
end
enforcing:stop()
tap.done()

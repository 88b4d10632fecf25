-- k8s-real-check.lua: issue 16's Kubernetes items against a REAL cluster
-- (kube-apiserver, kube-scheduler, kubelet, containerd), such as the
-- one-node cluster scripts/k8s-kit builds from source. CI has no
-- cluster: this is run by hand and its output is recorded in
-- docs/kubernetes.md ("Checked against a real cluster").
--
--   KUBECONFIG=/tmp/kprobe/admin.kubeconfig build/sbx run scripts/k8s-real-check.lua [image]
--
-- Each line says ok or FAIL and what was seen; the exit status is the
-- number of FAILs. It prints counts and codes, and times only as
-- information.
local sbx = require "sbx"
local image = arg and arg[1] or os.getenv("SBX_CHECK_IMAGE") or "sbx-busybox:latest"
local fails = 0
local function check(ok, what, seen)
  if not ok then fails = fails + 1 end
  print(string.format("%s - %s%s", ok and "ok" or "FAIL", what, seen and ("  [" .. tostring(seen) .. "]") or ""))
end
local function box(opts)
  opts = opts or {}
  opts.backend, opts.image = "kubernetes", opts.image or image
  opts.pull = opts.pull or "never"
  return sbx.box(opts)
end
local kb = require "sbx.backends.kubernetes"
local kspec = {}
for key, v in pairs(sbx.policy.kubernetes) do kspec[key] = v end
kspec.in_cluster = false
local client = assert(kb.client(kspec))
local function pods()
  local _, list = assert(client:call("GET", "/api/v1/namespaces/" .. client.namespace .. "/pods",
    { query = { labelSelector = "sbx.owner.pid=" .. sbx.core.pid() } }))
  return list.items
end

print("# server: " .. client.conn.server .. ", image " .. image)

-- 0. A refusal in the server's own words, with the request.
do
  local ex, err, code = client:exec(client.namespace, "no-such-pod", "box", { "true" })
  check(ex == nil and code == "not_found" and tostring(err):find('pods "no-such-pod" not found', 1, true),
    "a refused exec upgrade says the server's words and the request", err)
end

-- 1. Accept and unfragmented messages, on both transports.
local big = {}
for i = 0, 199999 do big[#big + 1] = string.char(i % 251) end
big = table.concat(big)
for _, transport in ipairs { "exec", "agent" } do
  local t0 = sbx.now()
  local b, err, code = box { transport = transport }
  check(b, transport .. ": a box is made and its first command runs", b and string.format("%.1fs", sbx.now() - t0) or (tostring(err) .. " " .. tostring(code)))
  if b then
    local r, e, c = b:exec("echo hi")
    check(r and r.stdout == "hi\n", transport .. ": exec upgrade accepted (Accept */*)", r and r.stdout or (tostring(e) .. " " .. tostring(c)))
    r, e, c = b:exec({ "wc", "-c" }, { stdin = big, timeout = 120 })
    check(r and r.stdout:match("%d+") == "200000", transport .. ": 200,000 bytes of stdin all arrive", r and r.stdout:gsub("%s+$", "") or (tostring(e) .. " " .. tostring(c)))
    r, e, c = b:exec({ "sh", "-c", "head -c 70000 | wc -c" }, { stdin = big:sub(1, 70000), timeout = 120 })
    check(r and r.stdout:match("%d+") == "70000", transport .. ": head -c 70000 ends (a 70 KB stdin)", r and r.stdout:gsub("%s+$", "") or (tostring(e) .. " " .. tostring(c)))
    local okw, we = b:write_file("/tmp/f", big:sub(1, 100000))
    local back = okw and b:read_file("/tmp/f")
    check(back == big:sub(1, 100000), transport .. ": write_file of 100 KB is exact", okw and (back and #back) or we)
    b:close()
  end
end

-- 2. A full node: boxes wait for room; impossible placements fail at once.
do
  local _, node = client:call("GET", "/api/v1/nodes")
  local alloc = node and node.items and node.items[1] and node.items[1].status.allocatable or {}
  print("# node allocatable: cpu " .. tostring(alloc.cpu) .. ", memory " .. tostring(alloc.memory))
  local n, waits, done, running, most = 12, 0, 0, 0, 0
  local msgs = {}
  local tasks = {}
  local t0 = sbx.now()
  for i = 1, n do
    tasks[i] = sbx.spawn(function()
      local b, err, code = box { transport = "exec", cpus = 1, memory = 128 * 2 ^ 20, policy = { kubernetes = {
        start_timeout = 300, on_wait = function(_, m) waits = waits + 1 msgs[#msgs + 1] = m end } } }
      if not b then return tostring(err) .. " " .. tostring(code) end
      running = running + 1
      most = math.max(most, running)
      b:exec("sleep 3")
      running = running - 1
      b:close()
      done = done + 1
      return true
    end)
  end
  local res = sbx.gather(tasks)
  local errs = {}
  for _, r in ipairs(res) do if r ~= true then errs[#errs + 1] = r end end
  check(done == n, string.format("%d boxes of cpus = 1 (requests 250m) on this node: all ran", n),
    string.format("%d ran, %d waited (on_wait calls), most at once %d, %.1fs; %s", done, waits, most, sbx.now() - t0,
      errs[1] or "no error"))
  if msgs[1] then print("# on_wait said: " .. msgs[1]) end
  local t1 = sbx.now()
  local b, err, code = box { cpus = 64, policy = { kubernetes = { start_timeout = 5 } } }
  check(b == nil and code == "unschedulable" and tostring(err):find("Insufficient cpu", 1, true) and sbx.now() - t1 >= 5,
    "cpus = 64: fails with the scheduler's message once start_timeout (5 s) passed", string.format("%.1fs: %s", sbx.now() - t1, tostring(err)))
  t1 = sbx.now()
  b, err, code = box { policy = { kubernetes = { start_timeout = 60, node_selector = { disktype = "ssd" } } } }
  check(b == nil and code == "unschedulable", "a node selector no node meets fails at once", string.format("%.1fs: %s", sbx.now() - t1, tostring(err)))
  b, err, code = box { policy = { kubernetes = { runtime_class = "no-such-class" } } }
  check(b == nil, "an unknown RuntimeClass fails at once", tostring(err) .. " " .. tostring(code))
  b, err, code = box { image = "sbx.local/no-such-image:1", pull = "missing" }
  check(b == nil and code == "image_unavailable", "an image that cannot be pulled fails", tostring(err) .. " " .. tostring(code))
  check(#pods() == 0, "nothing of these boxes is left", #pods() .. " pods")
end

-- 3. A pod that is gone: deleted by someone else, or past its lifetime.
for _, transport in ipairs { "exec", "agent" } do
  local b = box { transport = transport }
  if b then
    local t = sbx.spawn(function() return { b:exec("sleep 100", { timeout = 90 }) } end)
    sbx.sleep(2)
    local t0 = sbx.now()
    client:call("DELETE", "/api/v1/namespaces/" .. client.namespace .. "/pods/" .. b.id, { query = { gracePeriodSeconds = "0" } })
    local r = sbx.wait(t)
    check(r[1] == nil and r[3] == "box_gone", transport .. ": a deleted pod's running command is box_gone",
      string.format("%.1fs after the delete: %s %s", sbx.now() - t0, tostring(r[2]), tostring(r[3])))
    local _, e, c = b:exec("echo x")
    check(c == "box_gone", transport .. ": and the next command", tostring(e) .. " " .. tostring(c))
    b:close()
  end
  local lb = box { transport = transport, lifetime = 8 }
  if lb then
    local t0 = sbx.now()
    local r = { lb:exec("sleep 100", { timeout = 90 }) }
    check(r[1] == nil and r[3] == "box_gone", transport .. ": a command running when the lifetime (8 s) ends is box_gone",
      string.format("%.1fs: %s %s", sbx.now() - t0, tostring(r[2]), tostring(r[3])))
    local _, e, c = lb:exec("echo x")
    check(c == "box_gone", transport .. ": and the next command", tostring(e) .. " " .. tostring(c))
    lb:close()
  end
end

-- 4. network = "none" on a cluster whose plugin ignores NetworkPolicy.
do
  local b, err = box { transport = "exec" }
  check(b and b.limits.network.check, "network none: box.limits.network.check is " .. tostring(b and b.limits.network.check),
    b and b.limits.network.note or err)
  if b then b:close() end
  local r, e, c = box { policy = { kubernetes = { network_check = "refuse" } } }
  check(r == nil and c == "network_not_enforced" or (r and r.limits.network.check == "verified"),
    "network_check = refuse: refused where not enforced", tostring(e) .. " " .. tostring(c))
  if r then r:close() end
  local _, nps = client:call("GET", "/apis/networking.k8s.io/v1/namespaces/" .. client.namespace .. "/networkpolicies",
    { query = { labelSelector = "sbx.owner.pid=" .. sbx.core.pid() } })
  check(#pods() == 0 and nps and #nps.items == 0, "and nothing is left (pods, NetworkPolicies)",
    #pods() .. " pods, " .. tostring(nps and #nps.items) .. " policies")
end

print(string.format("# %d FAIL", fails))
os.exit(fails)

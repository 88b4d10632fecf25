-- needs: docker, python3
-- Kubernetes configuration as kubectl and client-go find it, against the
-- stand-in: the YAML of kubeconfig files, merged files (KUBECONFIG and the
-- policy's list), contexts and namespaces, relative paths, and every way to
-- log in (client certificate as data or files, bearer token, token file
-- re-read as it rotates, exec credential plugins v1 and v1beta1 with a
-- token or a certificate, in-cluster service account, insecure-skip-tls-
-- verify). No secret appears in a message.
local tap = require "tap"
local H = require "helper"
local K = require "k8s_helper"
local sbx = require "sbx"
local yaml = require "sbx.kubernetes.yaml"
local config = require "sbx.kubernetes.config"
local client = require "sbx.kubernetes.client"

-- The YAML subset ---------------------------------------------------------------------

local doc = assert(yaml.decode([[
# a comment
apiVersion: v1
clusters:
- cluster:
    server: https://127.0.0.1:6443   # trailing comment
    insecure-skip-tls-verify: true
  name: "quoted name"
users:
- name: 'it''s'
  user:
    exec:
      args: [--region, "us east", 'x y']
      env: null
      command: aws
contexts: []
preferences: {}
current-context: ctx # here
]]))
tap.is(doc.clusters[1].cluster.server, "https://127.0.0.1:6443", "yaml: a sequence at its key's indentation, nested mappings")
tap.is(doc.clusters[1].cluster["insecure-skip-tls-verify"], true, "yaml: booleans")
tap.is(doc.clusters[1].name, "quoted name", "yaml: double quotes")
tap.is(doc.users[1].name, "it's", "yaml: single quotes with ''")
tap.is(table.concat(doc.users[1].user.exec.args, "|"), "--region|us east|x y", "yaml: a flow sequence")
tap.is(doc.users[1].user.exec.env, nil, "yaml: null")
tap.is(#doc.contexts, 0, "yaml: an empty flow sequence")
tap.is(doc["current-context"], "ctx", "yaml: a comment after a value")
tap.is(assert(yaml.decode('{"kind": "Config", "clusters": [{"name": "a"}]}')).clusters[1].name, "a", "yaml: a JSON document")
local _, yerr = yaml.decode("a: 1\nb: &anchor 2\n")
tap.like(yerr, "^line 2: anchors", "yaml: anchors are refused with their line")
_, yerr = yaml.decode("a: |\n  x\n")
tap.like(yerr, "block scalars", "yaml: block scalars are refused")

-- The stand-in and kubeconfigs written here ---------------------------------------------

local standin = assert(K.standin { "--token", "tok-A-0123456789" })
local dir = standin.base
local certs = standin.dir
local function b64(path) return config.base64(assert(K.slurp(path))) end

local function kubeconfig(path, t)
  local lines = { "apiVersion: v1", "kind: Config" }
  for _, section in ipairs { "clusters", "users", "contexts" } do
    if t[section] then
      lines[#lines + 1] = section .. ":"
      for _, e in ipairs(t[section]) do
        lines[#lines + 1] = "- name: " .. e.name
        local key = section == "clusters" and "cluster" or section == "users" and "user" or "context"
        lines[#lines + 1] = "  " .. key .. ":"
        for _, kv in ipairs(e) do lines[#lines + 1] = "    " .. kv end
      end
    end
  end
  if t.current then lines[#lines + 1] = "current-context: " .. t.current end
  K.write(path, table.concat(lines, "\n") .. "\n", "600")
  return path
end

local function pol(over)
  local p = sbx.deep_copy(sbx.policy.kubernetes)
  for k, v in pairs(over) do p[k] = v end
  return p
end

-- GET the pods of the namespace through a client made from pol: status | nil, message, code
local function list_pods(p)
  local conn, err, code = config.resolve(p)
  if not conn then return nil, err, code end
  local c = client.new(conn, p)
  local st, body, bcode = c:call("GET", "/api/v1/namespaces/" .. conn.namespace .. "/pods")
  if not st then return nil, body, bcode end
  return st, conn
end

-- Client certificate as data: the stand-in's own kubeconfig.
local st, conn = list_pods(pol { kubeconfig = standin.kubeconfig })
tap.is(st, 200, "client certificate and key as data (the stand-in's kubeconfig)")
tap.is(conn and conn.namespace, "default", "the context's namespace")

-- core.http's TLS options themselves (what the client above builds on).
local http = require "sbx.http"
local pods_url = standin.url .. "/api/v1/namespaces/default/pods"
local r = http.request { url = pods_url, ca_file = certs .. "/ca.crt", cert_file = certs .. "/client.crt",
  key_file = certs .. "/client.key" }
tap.is(r and r.status, 200, "core.http: ca_file, cert_file and key_file")
r = http.request { url = pods_url, ca_data = K.slurp(certs .. "/ca.crt") }
tap.is(r and r.status, 401, "core.http: ca_data verifies the server; no client certificate is a 401")
r = http.request { url = pods_url, insecure = true, cert_data = K.slurp(certs .. "/client.crt"),
  key_data = K.slurp(certs .. "/client.key") }
tap.is(r and r.status, 200, "core.http: insecure skips verification; cert_data and key_data log in")
local _, herr, hcode = http.request { url = pods_url }
tap.ok(hcode == "tls", "core.http: the system's CAs do not know the stand-in's", herr)
tap.checkerr("ca_data must be a string", http.request, { url = pods_url, ca_data = 1 })

-- Files, relative to the kubeconfig that names them.
os.execute("mkdir -p " .. dir .. "/rel")
kubeconfig(dir .. "/rel/config", {
  clusters = { { name = "c", "server: " .. standin.url, "certificate-authority: ../certs/ca.crt" } },
  users = { { name = "u", "client-certificate: ../certs/client.crt", "client-key: ../certs/client.key" } },
  contexts = { { name = "x", "cluster: c", "user: u", "namespace: files-ns" } },
  current = "x",
})
st, conn = list_pods(pol { kubeconfig = dir .. "/rel/config" })
tap.is(st, 200, "certificate-authority, client-certificate and client-key files, relative to their kubeconfig")
tap.is(conn and conn.namespace, "files-ns", "the namespace of the current context")

-- Merged files: the first to name a cluster, user or context wins; the
-- current context is the first file's.
local A = kubeconfig(dir .. "/a.yaml", {
  clusters = { { name = "c1", "server: " .. standin.url, "certificate-authority-data: " .. b64(certs .. "/ca.crt") } },
  contexts = { { name = "ctx-a", "cluster: c1", "user: u1", "namespace: team-a" } },
  current = "ctx-a",
})
local B = kubeconfig(dir .. "/b.yaml", {
  clusters = { { name = "c1", "server: https://127.0.0.1:1", "certificate-authority-data: " .. b64(certs .. "/ca.crt") } },
  users = { { name = "u1", "token: tok-A-0123456789" } },
  contexts = { { name = "ctx-b", "cluster: c1", "user: u1", "namespace: team-b" }, { name = "ctx-a", "cluster: nowhere" } },
  current = "ctx-b",
})
st, conn = list_pods(pol { kubeconfig = A .. ":" .. B })
tap.is(st, 200, "two files merged: cluster and context from the first, the user (a bearer token) from the second")
tap.is(conn and conn.context .. "/" .. conn.namespace, "ctx-a/team-a", "current-context from the first file that has one")
st, conn = list_pods(pol { kubeconfig = { A, B }, context = "ctx-b" })
tap.is(conn and conn.namespace, "team-b", "policy.kubernetes.context picks another context, and its namespace")
st, conn = list_pods(pol { kubeconfig = { A, B }, context = "ctx-b", namespace = "mine" })
tap.is(conn and conn.namespace, "mine", "policy.kubernetes.namespace wins over the context's")
local _, err, code = list_pods(pol { kubeconfig = A, context = "nope" })
tap.ok(code == "kubeconfig" and err:find('no context "nope"', 1, true) and err:find("ctx-a", 1, true),
  "an unknown context: an error naming the known ones", err)
_, err, code = list_pods(pol { kubeconfig = dir .. "/missing.yaml" })
tap.ok(code == "kubeconfig" and err:find("missing.yaml", 1, true), "a missing kubeconfig named by policy is an error", err)

-- KUBECONFIG in a child process: a list, a missing file in it skipped.
local child = dir .. "/child.lua"
K.write(child, string.format([[
local sbx = require "sbx"
local config = require "sbx.kubernetes.config"
local c, err = config.resolve(sbx.policy.kubernetes)
print(c and (c.context .. " " .. c.namespace .. " " .. c.server) or ("ERR " .. tostring(err)))
]]))
local out = H.sh(string.format("KUBECONFIG=%s/none.yaml:%s:%s %s run %s", dir, B, A, H.sbx_bin, child))
tap.is(out, "ctx-b team-b https://127.0.0.1:1\n", "KUBECONFIG: files merged in order, a missing one skipped")
-- Without KUBECONFIG: ~/.kube/config, as kubectl reads it.
assert(os.execute(string.format("mkdir -p %s/home/.kube && cp %s %s/home/.kube/config", dir, B, dir)))
out = H.sh(string.format("env -u KUBECONFIG HOME=%s/home %s run %s", dir, H.sbx_bin, child))
tap.is(out, "ctx-b team-b https://127.0.0.1:1\n", "no KUBECONFIG: ~/.kube/config")

-- Bearer tokens; no secret in messages.
kubeconfig(dir .. "/badtoken.yaml", {
  clusters = { { name = "c", "server: " .. standin.url, "certificate-authority: " .. certs .. "/ca.crt" } },
  users = { { name = "u", "token: wrong-secret-token-987" } },
  contexts = { { name = "x", "cluster: c", "user: u" } }, current = "x",
})
_, err, code = list_pods(pol { kubeconfig = dir .. "/badtoken.yaml" })
tap.ok(code == "unauthorized" and not err:find("wrong-secret-token-987", 1, true), "a wrong token: unauthorized, the token not in the message", err)
local box, berr, bcode = sbx.box { backend = "kubernetes", image = H.busybox, kubeconfig = dir .. "/badtoken.yaml" }
tap.ok(box == nil and bcode == "unauthorized" and not tostring(berr):find("wrong-secret", 1, true),
  "sbx.box with a wrong token: unauthorized, no secret in the message", berr)

-- A token file, re-read after a 401 (as a rotated service account token).
K.write(dir .. "/token", "tok-A-0123456789\n", "600")
kubeconfig(dir .. "/tokenfile.yaml", {
  clusters = { { name = "c", "server: " .. standin.url, "certificate-authority: " .. certs .. "/ca.crt" } },
  users = { { name = "u", "tokenFile: token" } },
  contexts = { { name = "x", "cluster: c", "user: u" } }, current = "x",
})
local tp = pol { kubeconfig = dir .. "/tokenfile.yaml" }
local tconn = assert(config.resolve(tp))
local tc = client.new(tconn, tp)
local tst, terr, tcode = tc:call("GET", "/api/v1/namespaces/default/pods")
tap.ok(tst == 200, "tokenFile (relative to the kubeconfig)", tostring(tst) .. ": " .. tostring(terr) .. " (" .. tostring(tcode) .. ")")
K.write(dir .. "/token", "tok-B-rotated-4567\n", "600")
assert(standin:tokens { "tok-B-rotated-4567" })
tap.is((tc:call("GET", "/api/v1/namespaces/default/pods")), 200, "a rotated token file is read again after a 401")
assert(standin:tokens { "tok-A-0123456789" })

-- Exec credential plugins.
local function plugin(name, body)
  local path = dir .. "/" .. name
  K.write(path, "#!/bin/sh\n" .. body, "700")
  return path
end
local function plugin_config(file, exec_lines)
  return kubeconfig(dir .. "/" .. file, {
    clusters = { { name = "c", "server: " .. standin.url, "certificate-authority: " .. certs .. "/ca.crt" } },
    users = { { name = "u", "exec:", table.unpack(exec_lines) } },
    contexts = { { name = "x", "cluster: c", "user: u" } }, current = "x",
  })
end
plugin("plugin-v1.sh", string.format([[
echo run >> %s/v1.count
printf '%%s' "$KUBERNETES_EXEC_INFO" > %s/v1.info
echo "$PLUGIN_ENV" > %s/v1.env
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok-A-0123456789","expirationTimestamp":"2099-01-01T00:00:00Z"}}'
]], dir, dir, dir))
local pf = plugin_config("plugin-v1.yaml", { "      apiVersion: client.authentication.k8s.io/v1",
  "      command: ./plugin-v1.sh", "      interactiveMode: Never", "      env:", "      - name: PLUGIN_ENV", "        value: from-kubeconfig" })
local pp = pol { kubeconfig = pf }
local pconn = assert(config.resolve(pp))
local pc = client.new(pconn, pp)
tap.is((pc:call("GET", "/api/v1/namespaces/default/pods")), 200, "an exec plugin (v1, relative command) gives a token")
pc:call("GET", "/api/v1/namespaces/default/pods")
tap.is(select(2, K.slurp(dir .. "/v1.count"):gsub("\n", "")), 1, "its token is kept until it expires: the plugin ran once for two calls")
local info = sbx.json.decode(K.slurp(dir .. "/v1.info") or "") or {}
tap.ok(info.apiVersion == "client.authentication.k8s.io/v1" and info.kind == "ExecCredential" and info.spec.interactive == false,
  "the plugin gets KUBERNETES_EXEC_INFO (v1, not interactive)", K.slurp(dir .. "/v1.info"))
tap.is(K.slurp(dir .. "/v1.env"), "from-kubeconfig\n", "and the kubeconfig's env")

plugin("plugin-beta.sh", string.format([[
echo run >> %s/beta.count
cat <<EOF
{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{
 "clientCertificateData": "$(awk '{printf "%%s\\n", $0}' %s/client.crt)",
 "clientKeyData": "$(awk '{printf "%%s\\n", $0}' %s/client.key)",
 "expirationTimestamp":"2001-01-01T00:00:00Z"}}
EOF
]], dir, certs, certs))
pf = plugin_config("plugin-beta.yaml", { "      apiVersion: client.authentication.k8s.io/v1beta1", "      command: " .. dir .. "/plugin-beta.sh" })
pp = pol { kubeconfig = pf }
pc = client.new(assert(config.resolve(pp)), pp)
tap.is((pc:call("GET", "/api/v1/namespaces/default/pods")), 200, "an exec plugin (v1beta1) gives a client certificate and key")
pc:call("GET", "/api/v1/namespaces/default/pods")
tap.is(select(2, K.slurp(dir .. "/beta.count"):gsub("\n", "")), 2, "an expired credential runs the plugin again")

plugin("plugin-fail.sh", "echo 'cannot log in: boom' >&2; exit 3\n")
pf = plugin_config("plugin-fail.yaml", { "      apiVersion: client.authentication.k8s.io/v1", "      command: " .. dir .. "/plugin-fail.sh",
  "      interactiveMode: IfAvailable" })
_, err, code = list_pods(pol { kubeconfig = pf })
tap.ok(code == "credentials" and err:find("exit 3", 1, true) and err:find("boom", 1, true), "a failing plugin: its exit and its words", err)
pf = plugin_config("plugin-missing.yaml", { "      apiVersion: client.authentication.k8s.io/v1", "      command: no-such-auth-plugin",
  "      interactiveMode: IfAvailable", "      installHint: install no-such-auth-plugin from your cloud" })
_, err, code = list_pods(pol { kubeconfig = pf })
tap.ok(code == "credentials" and err:find("install no-such-auth-plugin", 1, true), "a missing plugin: its installHint", err)
pf = plugin_config("plugin-always.yaml", { "      apiVersion: client.authentication.k8s.io/v1", "      command: " .. dir .. "/plugin-v1.sh",
  "      interactiveMode: Always" })
_, err, code = list_pods(pol { kubeconfig = pf })
tap.is(code, "unsupported", "a plugin that must be interactive is refused")

-- insecure-skip-tls-verify: works, and says so once on stderr.
kubeconfig(dir .. "/insecure.yaml", {
  clusters = { { name = "risky", "server: " .. standin.url, "insecure-skip-tls-verify: true" } },
  users = { { name = "u", "token: tok-A-0123456789" } },
  contexts = { { name = "x", "cluster: risky", "user: u" } }, current = "x",
})
K.write(child, [[
local sbx = require "sbx"
local config = require "sbx.kubernetes.config"
local client = require "sbx.kubernetes.client"
local p = sbx.policy.kubernetes
local c = assert(config.resolve(p))
print((client.new(c, p):call("GET", "/api/v1/namespaces/" .. c.namespace .. "/pods")))
]])
out = H.sh(string.format("KUBECONFIG=%s/insecure.yaml %s run %s", dir, H.sbx_bin, child))
tap.ok(out:find("200", 1, true) and out:find('cluster "risky" is used without verifying its TLS certificate', 1, true),
  "insecure-skip-tls-verify: the call works, with a warning", out)
kubeconfig(dir .. "/noca.yaml", {
  clusters = { { name = "c", "server: " .. standin.url } },
  users = { { name = "u", "token: tok-A-0123456789" } },
  contexts = { { name = "x", "cluster: c", "user: u" } }, current = "x",
})
_, err, code = list_pods(pol { kubeconfig = dir .. "/noca.yaml" })
tap.is(code, "tls", "without the cluster's CA the server's certificate is refused")
H.sh(string.format("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=other " ..
  "-keyout %s/other.key -out %s/other.crt", dir, dir))
kubeconfig(dir .. "/otherca.yaml", {
  clusters = { { name = "c", "server: " .. standin.url, "certificate-authority-data: " .. b64(dir .. "/other.crt") } },
  users = { { name = "u", "token: tok-A-0123456789" } },
  contexts = { { name = "x", "cluster: c", "user: u" } }, current = "x",
})
_, err, code = list_pods(pol { kubeconfig = dir .. "/otherca.yaml" })
tap.is(code, "tls", "another CA's certificate-authority-data: the server's certificate is refused")
local ex_ok = client.new(assert(config.resolve(pol { kubeconfig = dir .. "/otherca.yaml" })), pol {}):exec("default", "none", "box", { "true" })
tap.ok(ex_ok == nil, "and the exec websocket refuses it too")

-- In a pod: the service account, its token re-read as it rotates.
os.execute("mkdir -p " .. dir .. "/sa")
K.write(dir .. "/sa/token", "tok-A-0123456789")
K.write(dir .. "/sa/ca.crt", K.slurp(certs .. "/ca.crt"))
K.write(dir .. "/sa/namespace", "sa-ns")
K.write(child, string.format([[
local sbx = require "sbx"
sbx.use_policy { kubernetes = { service_account_dir = %q } }
local config = require "sbx.kubernetes.config"
local client = require "sbx.kubernetes.client"
local p = sbx.policy.kubernetes
local c = assert(config.resolve(p))
print(c.source, c.namespace, c.server)
local cl = client.new(c, p)
print((cl:call("GET", "/api/v1/namespaces/default/pods")))
local f = io.open(%q, "w") f:write("tok-C-rotated-0000") f:close()
assert(require("sbx.httpc").json { url = %q, json = { tokens = sbx.json.array { "tok-C-rotated-0000" } }, ca_file = %q })
print((cl:call("GET", "/api/v1/namespaces/default/pods")))
]], dir .. "/sa", dir .. "/sa/token", standin.url .. "/_standin/tokens", certs .. "/ca.crt"))
out = H.sh(string.format("KUBECONFIG=%s/none.yaml KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=%d %s run %s",
  dir, standin.port, H.sbx_bin, child))
tap.is(out, string.format("in-cluster service account\tsa-ns\thttps://127.0.0.1:%d\n200\n200\n", standin.port),
  "in-cluster: KUBERNETES_SERVICE_HOST/PORT, the namespace file, the CA; a rotated token is read again")
assert(standin:tokens { "tok-A-0123456789" })

-- A whole box with token login (the merged files), traced: no token in
-- the trace, nor in a failure's record.
local trace_file = dir .. "/trace.jsonl"
sbx.trace.start(trace_file)
box, berr = sbx.box { backend = "kubernetes", image = H.busybox, kubeconfig = A .. ":" .. B }
tap.ok(box and box:exec("echo ok").stdout == "ok\n", "a box through the merged files, bearer token", berr)
local state = assert(standin:state())
tap.is(state.pods[1] and state.pods[1].metadata.namespace, "team-a", "in the context's namespace")
if box then box:close() end
local bad_box = sbx.box { backend = "kubernetes", image = H.busybox, kubeconfig = dir .. "/badtoken.yaml" }
tap.ok(bad_box == nil, "a box with a wrong token fails (traced)")
sbx.trace.stop()
local traced = K.read and K.read(trace_file) or H.sh("cat " .. trace_file)
tap.ok(#traced > 0 and traced:find('"op":"create"', 1, true), "the trace recorded the boxes", traced:sub(1, 300))
tap.ok(not traced:find("tok-A-0123456789", 1, true) and not traced:find("wrong-secret-token-987", 1, true),
  "and holds no bearer token")
standin:stop()
tap.done()

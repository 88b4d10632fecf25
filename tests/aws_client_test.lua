-- needs: docker, python3
-- sbx.aws.client: ECS (JSON 1.1) and IAM (Query) against the AWS stand-in,
-- which checks SigV4 on every request and runs real containers for RunTask.
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"
local aws = require "sbx.aws.client"
local xml = require "sbx.aws.xml"

local json = sbx.json

-- No .aws directory and no IMDS: nothing outside this test is ever read.
local home = os.tmpname()
os.remove(home)
os.execute("mkdir -p " .. home)

local function env(t)
  t = t or {}
  t.HOME = home
  t.AWS_EC2_METADATA_DISABLED = "true"
  return t
end

local function find(list, pred)
  for _, v in ipairs(list or {}) do if pred(v) then return v end end
end

---------------------------------------------------------------------------
-- The XML reader

local doc = assert(xml.parse([==[<?xml version="1.0" encoding="UTF-8"?>
<!-- a comment -->
<R xmlns="urn:x" a='1 &amp; 2'><a:B xmlns:a="urn:a">x &lt;y&gt; &amp;&quot;z&quot;&apos;</a:B><C/><D><![CDATA[<raw> &amp;]]></D>
<E>&#65;&#x42;&#x20AC;&#x1F600;&unknown;</E></R>]==]))
tap.is(doc.tag, "R", "xml: the root element")
tap.is(doc.attrs.a, "1 & 2", "xml: attribute values are entity-decoded")
tap.is(xml.child(doc, "B").text, 'x <y> &"z"\'', "xml: the five predefined entities")
tap.is(xml.child(doc, "B").name, "a:B", "xml: the name keeps its prefix, tag drops it")
tap.is(xml.child(doc, "D").text, "<raw> &amp;", "xml: CDATA is taken as written")
tap.is(xml.child(doc, "E").text, "AB\u{20AC}\u{1F600}&unknown;", "xml: numeric references as UTF-8; unknown entities kept")
local bad = {
  { "<a><b></a>", "does not match" },
  { "<a>", "not closed" },
  { "<a></a><b/>", "second root" },
  { "text<a/>", "before the root" },
  { '<!DOCTYPE a [<!ENTITY x "y">]><a>&x;</a>', "DOCTYPE" },
  { "", "no root" },
  { "<a b=1/>", "malformed start tag" },
}
for _, case in ipairs(bad) do
  local v, err = xml.parse(case[1])
  tap.ok(v == nil and tostring(err):find(case[2], 1, true), "xml: refuses " .. case[1], err)
end

local v = xml.value(assert(xml.parse([[<X><L><member><K>a</K></member><member><K>b</K></member></L>
<One><member>only</member></One><M><entry><key>k1</key><value>v1</value></entry></M><Empty/><S>t</S></X>]])))
tap.is(#v.L, 2, "xml.value: <member> children are a list")
tap.is(v.L[2].K, "b", "xml.value: list items are structures")
tap.is(v.One[1], "only", "xml.value: a one-member list is still a list")
tap.is(v.M.k1, "v1", "xml.value: <entry> key/value children are a map")
tap.is(json.encode(v.Empty), "{}", "xml.value: an empty element is an empty table")
tap.is(v.S, "t", "xml.value: a text element is its text")

---------------------------------------------------------------------------
-- Query parameters, times, contract errors

local flat = aws.flatten { RoleName = "r", Tags = { { Key = "a", Value = "b" }, { Key = "c", Value = "d" } },
  Max = 3600, Flag = true, List = json.array {}, ["Pre.member.1"] = "x" }
tap.is(flat["Tags.member.2.Key"], "c", "flatten: lists become Name.member.N.Field")
tap.is(flat.Max, "3600", "flatten: integers as text")
tap.is(flat.Flag, "true", "flatten: booleans as true/false")
tap.is(flat.List, "", "flatten: an empty marked list is sent as Name=")
tap.is(flat["Pre.member.1"], "x", "flatten: flat names pass through")
tap.is(aws.form_body("CreateRole", "2010-05-08", { RoleName = "a b", Doc = '{"x":"&=+/~"}' }),
  "Action=CreateRole&Version=2010-05-08&Doc=%7B%22x%22%3A%22%26%3D%2B%2F~%22%7D&RoleName=a%20b",
  "form body: Action, Version, then sorted and RFC 3986 encoded")

tap.is(aws.parse_time("1970-01-02T00:00:01Z"), 86401, "parse_time: ISO 8601 UTC")
tap.is(aws.parse_time("2024-02-29T12:00:00.5+02:00"), 1709200800, "parse_time: fraction and offset")
tap.is(aws.parse_time("yesterday"), nil, "parse_time: unreadable is nil")

local creds = { access_key = "AKIDSTANDIN", secret_key = "standin-secret" }
tap.checkerr("unknown service", aws.new, "s3", {})
tap.checkerr("service must be a string", aws.new, 42)
tap.checkerr("opts.credentials", aws.new, "ecs", { region = "eu-west-1", credentials = { access_key = 1 } })
tap.checkerr("retry.max_attempts", aws.new, "ecs", { region = "eu-west-1", credentials = creds, retry = 0 })

---------------------------------------------------------------------------
-- Regions and endpoints (no request needed)

local c, err, code = aws.new("ecs", { credentials = creds, env = env() })
tap.ok(c == nil and code == "no_region", "ECS without a region: no_region", err)
tap.like(err, "^ECS: no AWS region", "the message names the service")

c = assert(aws.new("ecs", { region = "eu-west-1", credentials = creds, env = env() }))
tap.is(c.endpoint, "https://ecs.eu-west-1.amazonaws.com/", "ECS default endpoint")
tap.is(c.signing_region, "eu-west-1", "ECS signs with the client's region")
c = assert(aws.new("ecs", { region = "cn-north-1", credentials = creds, env = env() }))
tap.is(c.endpoint, "https://ecs.cn-north-1.amazonaws.com.cn/", "ECS endpoint in the China partition")
c = assert(aws.new("iam", { region = "eu-west-1", credentials = creds, env = env() }))
tap.is(c.endpoint, "https://iam.amazonaws.com/", "IAM default endpoint is global")
tap.is(c.signing_region, "us-east-1", "IAM signs with us-east-1 whatever the region")
c = assert(aws.new("iam", { credentials = creds, env = env() }))
tap.is(c.signing_region, "us-east-1", "IAM needs no region")
c = assert(aws.new("ecs", { region = "eu-west-1", credentials = creds,
  env = env { AWS_ENDPOINT_URL = "http://general:1", AWS_IGNORE_CONFIGURED_ENDPOINT_URLS = "true" } }))
tap.is(c.endpoint, "https://ecs.eu-west-1.amazonaws.com/", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true ignores the env")
c, err, code = aws.new("ecs", { region = "eu-west-1", credentials = creds, endpoint = "ftp://x" })
tap.is(code, "bad_endpoint", "an endpoint that is not http(s) is refused")

c, err, code = aws.new("ecs", { region = "eu-west-1", env = env() })
tap.is(code, "no_credentials", "no credentials anywhere: no_credentials")

---------------------------------------------------------------------------
-- Against the stand-in

local SESSION = "FQoGZXIvYXdzSESSIONTOKEN-" .. tostring(os.time())
local s = assert(H.standin { "--any-token" })
local dead = "http://127.0.0.1:1"     -- nothing listens on port 1

local function ecs_client(extra)
  local o = { region = "eu-west-1", endpoint = s.url, credentials = s.credentials, env = env() }
  for k, val in pairs(extra or {}) do o[k] = val end
  return assert(aws.new("ecs", o))
end
local function iam_client(extra)
  local o = { region = "eu-west-1", endpoint = s.url, credentials = s.credentials, env = env() }
  for k, val in pairs(extra or {}) do o[k] = val end
  return assert(aws.new("iam", o))
end
local function calls(key)
  local st = assert(s:state())
  return st.calls[key] or 0
end

local ecs = ecs_client()
local iam = iam_client()

-- Watch the wire: every request the client sends.
local sent = {}
local real_request = aws.http_request
aws.http_request = function(o)
  sent[#sent + 1] = o
  return real_request(o)
end
local function header(o, name)
  for _, line in ipairs(o.headers) do
    local k, val = line:match("^([^:]+):%s*(.*)$")
    if k and k:lower() == name:lower() then return val end
  end
end

-- ECS round trips
local out, info
out, err, code, info = ecs:call("CreateCluster", { clusterName = "sbx-client-test",
  settings = json.array { { name = "containerInsights", value = "disabled" } } })
tap.is(out and out.cluster.status, "ACTIVE", "CreateCluster", err)
tap.is(info.status, 200, "success: info.status")
tap.ok(type(info.request_id) == "string" and #info.request_id > 10, "success: info.request_id from x-amzn-RequestId")
tap.is(info.attempts, 1, "success: one attempt")
local req = sent[#sent]
tap.is(req.method, "POST", "ECS: POST")
tap.is(req.url, s.url .. "/", "ECS: path /")
tap.is(header(req, "Content-Type"), "application/x-amz-json-1.1", "ECS: Content-Type")
tap.is(header(req, "X-Amz-Target"), "AmazonEC2ContainerServiceV20141113.CreateCluster", "ECS: X-Amz-Target")
tap.like(header(req, "Authorization"), "^AWS4%-HMAC%-SHA256 Credential=AKIDSTANDIN/%d+/eu%-west%-1/ecs/aws4_request",
  "ECS: signed for ecs in the client's region")
tap.is(json.decode(req.body).clusterName, "sbx-client-test", "ECS: the body is the JSON of the params")

out, err = ecs:call("DescribeClusters", { clusters = json.array { "sbx-client-test", "sbx-missing" } })
tap.is(out and out.clusters[1].status, "ACTIVE", "DescribeClusters: the cluster", err)
tap.is(out and out.failures[1].reason, "MISSING", "DescribeClusters: the missing one fails")
out, err = ecs:call("DescribeClusters")
tap.is(sent[#sent].body, "{}", "no params: the body is {}")
tap.is(out and out.failures and out.failures[1].reason, "MISSING", "DescribeClusters with no params: default", err)

out, err = ecs:call("RegisterTaskDefinition", {
  family = "sbx-client-test",
  networkMode = "awsvpc",
  requiresCompatibilities = json.array { "FARGATE" },
  cpu = "256", memory = "512",
  containerDefinitions = json.array { {
    name = "main", image = H.busybox, essential = true,
    command = json.array { "sleep", "60" },
    linuxParameters = { initProcessEnabled = true },
  } },
})
local td = out and out.taskDefinition
tap.ok(td and td.taskDefinitionArn:find(":task%-definition/sbx%-client%-test:%d+$"), "RegisterTaskDefinition", err)

out, err = ecs:call("RunTask", {
  cluster = "sbx-client-test", taskDefinition = td and td.taskDefinitionArn, launchType = "FARGATE",
  enableExecuteCommand = true, startedBy = "sbx-client-test",
  networkConfiguration = { awsvpcConfiguration = { subnets = json.array { "subnet-0abc" },
    securityGroups = json.array { "sg-0abc" }, assignPublicIp = "DISABLED" } },
})
local task = out and out.tasks and out.tasks[1]
tap.ok(task and task.taskArn and #out.failures == 0, "RunTask starts a task", err)
local arn = task and task.taskArn

local running
local deadline = sbx.now() + 60
while arn and sbx.now() < deadline do
  out, err = ecs:call("DescribeTasks", { cluster = "sbx-client-test", tasks = json.array { arn } })
  running = out and out.tasks[1]
  if not running or running.lastStatus == "RUNNING" or running.lastStatus == "STOPPED" then break end
  sbx.sleep(0.25)
end
tap.is(running and running.lastStatus, "RUNNING", "DescribeTasks: the task runs", err)
local runtime_id = running and running.containers[1].runtimeId
-- The stand-in's own daemon, which need not be the one DOCKER_HOST names.
local ctr = runtime_id and H.container(runtime_id, s.docker_host)
tap.ok(ctr and ctr.State.Running, "the task is a running container")
tap.is(ctr and table.concat(ctr.Config.Cmd, " "), "sleep 60", "the container runs the task's command")

out, err = ecs:call("StopTask", { cluster = "sbx-client-test", task = arn, reason = "test over" })
tap.is(out and out.task.desiredStatus, "STOPPED", "StopTask", err)
out = ecs:call("DescribeTasks", { cluster = "sbx-client-test", tasks = json.array { arn } })
tap.is(out and out.tasks[1].lastStatus, "STOPPED", "DescribeTasks: stopped")
tap.ok(runtime_id and H.container(runtime_id, s.docker_host) == nil, "the container is gone")

out, err = ecs:call("DeregisterTaskDefinition", { taskDefinition = td and td.taskDefinitionArn })
tap.is(out and out.taskDefinition.status, "INACTIVE", "DeregisterTaskDefinition", err)

out, err, code, info = ecs:call("DescribeTasks", { cluster = "sbx-nowhere", tasks = json.array { "x" } })
tap.is(code, "ClusterNotFoundException", "an ECS error: the code from __type")
tap.is(err, "ECS DescribeTasks: ClusterNotFoundException: Cluster not found.", "an ECS error: the message")
tap.is(info.status, 400, "an ECS error: info.status")
tap.ok(info.request_id ~= nil, "an ECS error: info.request_id")
tap.is(info.attempts, 1, "a client error is not retried")

-- IAM round trips
local TRUST = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ecs-tasks.amazonaws.com"},"Action":"sts:AssumeRole"}]}'
local ROLE = "sbx-client-test-role"
out, err, code, info = iam:call("GetRole", { RoleName = ROLE })
tap.is(code, "NoSuchEntity", "GetRole of a missing role: NoSuchEntity")
tap.is(info.status, 404, "GetRole of a missing role: 404")
tap.is(err, "IAM GetRole: NoSuchEntity: The role with name " .. ROLE .. " cannot be found.", "an IAM error: the message")
tap.ok(info.request_id ~= nil, "an IAM error: info.request_id")
req = sent[#sent]
tap.is(req.body, "Action=GetRole&Version=2010-05-08&RoleName=" .. ROLE, "IAM: the form body")
tap.is(header(req, "Content-Type"), "application/x-www-form-urlencoded; charset=utf-8", "IAM: Content-Type")
tap.is(header(req, "X-Amz-Target"), nil, "IAM: no X-Amz-Target")

local DESC = [[sbx <test> & "quotes" 'too']]
out, err = iam:call("CreateRole", { RoleName = ROLE, AssumeRolePolicyDocument = TRUST, Description = DESC,
  Tags = { { Key = "owner", Value = "a&b<c>" } } })
tap.is(out and out.Role.Arn, "arn:aws:iam::000000000000:role/" .. ROLE, "CreateRole: Role.Arn", err)
out, err, code = iam:call("CreateRole", { RoleName = ROLE, AssumeRolePolicyDocument = TRUST })
tap.is(code, "EntityAlreadyExists", "CreateRole twice: EntityAlreadyExists")
out, err = iam:call("PutRolePolicy", { RoleName = ROLE, PolicyName = "exec",
  PolicyDocument = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"ssmmessages:*","Resource":"*"}]}' })
tap.ok(out and next(out) == nil, "PutRolePolicy: an empty result", err)
out, err = iam:call("AttachRolePolicy", { RoleName = ROLE,
  PolicyArn = "arn:aws:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy" })
tap.ok(out and next(out) == nil, "AttachRolePolicy: an empty result", err)
out, err = iam:call("GetRole", { RoleName = ROLE })
local role = out and out.Role
tap.is(role and role.Arn, "arn:aws:iam::000000000000:role/" .. ROLE, "GetRole: Role.Arn", err)
tap.is(role and role.AssumeRolePolicyDocument, TRUST, "GetRole: the percent-encoded trust policy comes back as sent")
tap.is(role and role.Description, DESC, "GetRole: XML entities decoded (&amp; &lt; &gt;)")
tap.is(role and role.Tags[1].Value, "a&b<c>", "GetRole: tags are a list of structures")
local st = assert(s:state())
local r = find(st.roles, function(x) return x.RoleName == ROLE end)
tap.ok(r and r.InlinePolicies.exec and r.AttachedPolicies[1]:find("AmazonECSTaskExecutionRolePolicy"),
  "the stand-in holds the inline and the attached policy")
tap.like(header(sent[#sent], "Authorization"), "/us%-east%-1/iam/aws4_request", "IAM: signed for iam in us-east-1")

-- IAM is accepted only when signed for us-east-1: the same client signing
-- for its own region is refused.
local iam_eu = iam_client()
iam_eu.signing_region = "eu-west-1"
out, err, code = iam_eu:call("GetRole", { RoleName = ROLE })
tap.is(code, "SignatureDoesNotMatch", "IAM signed for eu-west-1 is refused by the stand-in")

-- Wrong secret: the signature error, and no secret in the message even
-- though the server echoes the canonical request (with the token in it).
local WRONG = "wrong-secret-" .. tostring(os.time())
local bad_ecs = ecs_client { credentials = { access_key = "AKIDSTANDIN", secret_key = WRONG, session_token = SESSION } }
out, err, code, info = bad_ecs:call("DescribeClusters", { clusters = json.array { "sbx-client-test" } })
tap.is(code, "SignatureDoesNotMatch", "wrong secret: SignatureDoesNotMatch")
tap.is(info.status, 403, "wrong secret: 403")
tap.ok(not err:find(WRONG, 1, true) and not err:find(SESSION, 1, true) and not err:find("Signature=", 1, true),
  "wrong secret: the message holds no secret, token or Authorization", err)
tap.like(err, "%[redacted%]", "wrong secret: the echoed token was scrubbed")
local bad_iam = iam_client { credentials = { access_key = "AKIDSTANDIN", secret_key = WRONG } }
out, err, code = bad_iam:call("GetRole", { RoleName = ROLE })
tap.is(code, "SignatureDoesNotMatch", "wrong secret on IAM: SignatureDoesNotMatch")
tap.ok(not tostring(bad_ecs):find(WRONG, 1, true), "tostring(client) shows no secret")
local leak = false
for _, fv in pairs(bad_ecs) do
  if fv == WRONG or fv == SESSION or (type(fv) == "table" and (fv.secret_key or fv.session_token)) then leak = true end
end
tap.ok(not leak, "the client table holds no secret")

-- Throttling: retried, then success; every attempt signed afresh.
local real_random = aws.random
aws.random = function() return 1 end            -- the full backoff, so the clock moves
local slow = ecs_client { retry = { backoff_base = 1.05, backoff_cap = 1.05 } }
assert(s:faults { throttle = 1 })
local n0 = #sent
out, err, code, info = slow:call("DescribeClusters", { clusters = json.array { "sbx-client-test" } })
aws.random = real_random
tap.ok(out and out.clusters[1], "throttled once: succeeds", err)
tap.is(info.attempts, 2, "throttled once: two attempts")
local a1, a2 = sent[n0 + 1], sent[n0 + 2]
tap.ok(a1 and a2 and header(a1, "X-Amz-Date") ~= header(a2, "X-Amz-Date")
  and header(a1, "Authorization") ~= header(a2, "Authorization"), "each attempt has a fresh X-Amz-Date and signature")

local fast = ecs_client { retry = { backoff_base = 0.01, backoff_cap = 0.05 } }
local before = calls("ecs.DescribeClusters")
assert(s:faults { throttle = 3 })
out, err, code, info = fast:call("DescribeClusters", { clusters = json.array { "sbx-client-test" } })
tap.ok(out and out.clusters[1], "throttled 3 times: succeeds", err)
tap.is(info.attempts, 4, "throttled 3 times: attempts = 4")
tap.is(#info.retry_delays, 3, "throttled 3 times: three backoff delays")
tap.ok(info.retry_delays[3] <= 0.05, "the delays are capped by backoff_cap")
tap.is(calls("ecs.DescribeClusters") - before, 4, "the stand-in saw 4 requests")

-- 5xx beyond max_attempts: the last error, after exactly max_attempts.
assert(s:faults { error5xx = 10 })
local three = ecs_client { retry = { max_attempts = 3, backoff_base = 0.01, backoff_cap = 0.05 } }
before = calls("ecs.DescribeClusters")
out, err, code, info = three:call("DescribeClusters", { clusters = json.array { "sbx-client-test" } })
tap.is(code, "ServerException", "5xx every time: the code")
tap.is(info.status, 500, "5xx every time: the status")
tap.is(info.attempts, 3, "5xx every time: attempts = max_attempts")
tap.like(err, "^ECS DescribeClusters: ServerException: .*%(3 attempts%)$", "5xx: the message says how many attempts")
tap.is(calls("ecs.DescribeClusters") - before, 3, "the stand-in saw 3 requests")
-- The numbers come from policy.aws when the client sets none.
local saved = sbx.policy.aws
sbx.policy.aws = sbx.merge_policy({}, saved)
sbx.policy.aws.max_attempts, sbx.policy.aws.backoff_base = 2, 0.01
local iam_default = iam_client()
out, err, code, info = iam_default:call("GetRole", { RoleName = ROLE })
tap.is(code, "ServiceFailure", "IAM 5xx: ServiceFailure from <Error><Code>")
tap.is(info.attempts, 2, "max_attempts from policy.aws")
sbx.policy.aws = saved
assert(s:faults { error5xx = 0, throttle = 0 })

-- Transport failures: bounded retries, then the transport code.
local closed = ecs_client { endpoint = dead, retry = { max_attempts = 3, backoff_base = 0.01, backoff_cap = 0.05 } }
local t0 = sbx.now()
out, err, code, info = closed:call("DescribeClusters")
tap.is(code, "ECONNREFUSED", "a closed port: ECONNREFUSED")
tap.is(info.attempts, 3, "a closed port: retried up to max_attempts")
tap.is(info.status, nil, "a closed port: no status")
tap.like(err, "^ECS DescribeClusters: ", "a closed port: the message names service and operation")
tap.ok(sbx.now() - t0 < 5, "a closed port: fails fast")

local mute_url, _, stop_mute = H.start_python_server([[
import os, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        time.sleep(3)
    def log_message(self, *a):
        pass
]])
local mute = ecs_client { endpoint = mute_url, timeout = 0.5, retry = { max_attempts = 2, backoff_base = 0.01 } }
out, err, code, info = mute:call("DescribeClusters")
tap.is(code, "timeout", "a server that never answers: timeout")
tap.is(info.attempts, 2, "a timeout is retried")
stop_mute()

-- Endpoint precedence, seen by which server answered.
local function try(e, service)
  local o = { region = "eu-west-1", env = env(e) }
  o.env.AWS_ACCESS_KEY_ID, o.env.AWS_SECRET_ACCESS_KEY = s.credentials.access_key, s.credentials.secret_key
  local cl = assert(aws.new(service or "ecs", o))
  cl.max_attempts, cl.backoff_base = 1, 0.01
  if service == "iam" then return cl, cl:call("GetRole", { RoleName = ROLE }) end
  return cl, cl:call("DescribeClusters", { clusters = json.array { "sbx-client-test" } })
end
local cl, res, e2, c2 = try { AWS_ENDPOINT_URL_ECS = s.url, AWS_ENDPOINT_URL = dead }
tap.ok(res ~= nil, "AWS_ENDPOINT_URL_ECS beats AWS_ENDPOINT_URL", e2)
tap.is(cl.endpoint, s.url .. "/", "the client reports the endpoint it uses")
cl, res, e2, c2 = try { AWS_ENDPOINT_URL_ECS = dead, AWS_ENDPOINT_URL = s.url }
tap.is(c2, "ECONNREFUSED", "the ECS-specific variable is the one requested")
cl, res, e2 = try { AWS_ENDPOINT_URL = s.url }
tap.ok(res ~= nil, "AWS_ENDPOINT_URL alone is used", e2)
cl, res, e2 = try({ AWS_ENDPOINT_URL_IAM = s.url, AWS_ENDPOINT_URL_ECS = dead, AWS_ENDPOINT_URL = dead }, "iam")
tap.ok(res ~= nil, "AWS_ENDPOINT_URL_IAM for IAM", e2)
cl = assert(aws.new("ecs", { region = "eu-west-1", endpoint = s.url, credentials = creds,
  env = env { AWS_ENDPOINT_URL_ECS = dead, AWS_ENDPOINT_URL = dead } }))
tap.ok(cl:call("DescribeClusters") ~= nil, "the endpoint option beats both variables")
cl = assert(aws.new("ecs", { region = "eu-west-1", credentials = creds, env = env { AWS_ENDPOINT_URL_IAM = s.url } }))
tap.is(cl.endpoint, "https://ecs.eu-west-1.amazonaws.com/", "another service's variable is not used")

-- 50 concurrent calls on one client.
before = calls("ecs.DescribeClusters")
local tasks = {}
for i = 1, 50 do
  tasks[i] = sbx.spawn(function()
    local o, e = ecs:call("DescribeClusters", { clusters = json.array { "sbx-client-test" } })
    return o and o.clusters[1] and o.clusters[1].status or e
  end)
end
local results = sbx.gather(tasks)
local all = 0
for i = 1, 50 do if results[i] == "ACTIVE" then all = all + 1 end end
tap.is(all, 50, "50 concurrent DescribeClusters all succeed")
tap.is(calls("ecs.DescribeClusters") - before, 50, "the stand-in saw 50 requests")

-- Credentials: refreshed inside the advisory window, once for many callers.
local fetched = 0
local function provider(expires_in, fail_after)
  return function()
    fetched = fetched + 1
    sbx.sleep(0.05)
    if fail_after and fetched > fail_after then return nil, "provider down", "no_credentials" end
    return { access_key = "AKIDSTANDIN", secret_key = "standin-secret",
             expiration = os.date("!%Y-%m-%dT%H:%M:%SZ", os.time() + expires_in) }
  end
end
local lasting = ecs_client { credentials = provider(3600) }
lasting:call("DescribeClusters")
lasting:call("DescribeClusters")
tap.is(fetched, 1, "credentials an hour from expiry are fetched once")

fetched = 0
local expiring = ecs_client { credentials = provider(700) }
tap.is(fetched, 1, "new() fetches the credentials")
tasks = {}
for i = 1, 10 do
  tasks[i] = sbx.spawn(function() return (expiring:call("DescribeClusters")) ~= nil end)
end
results = sbx.gather(tasks)
tap.ok(find(results, function(x) return x ~= true end) == nil, "10 calls with expiring credentials succeed")
tap.is(fetched, 2, "credentials within 15 min of expiry: one refresh shared by 10 calls")

fetched = 0
local flaky = ecs_client { credentials = provider(700, 1) }
out, err = flaky:call("DescribeClusters")
tap.ok(out ~= nil, "a failed refresh in the advisory window keeps the old credentials", err)
fetched = 0
local dying = ecs_client { credentials = provider(300, 1) }
out, err, code = dying:call("DescribeClusters")
tap.is(code, "no_credentials", "a failed refresh in the mandatory window fails the call")
tap.like(err, "^ECS DescribeClusters: provider down", "the message says why")

aws.http_request = real_request
tap.is(s:stop(), 0, "the stand-in stops cleanly")
os.execute("rm -rf " .. home)
tap.done()

-- needs: python3
-- sbx.aws.credentials: the credential and region chain (env, profiles,
-- container, IMDSv2) with no network beyond loopback.
local tap = require "tap"
local sbx = require "sbx"
local H = require "helper"
local C = require "sbx.aws.credentials"

local SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY"
local TOKEN = "FQoGZXIvYXdzSESSIONTOKENVALUE"

-- A home directory with no .aws in it, so the real one is never read.
local home = os.tmpname()
os.remove(home)
os.execute("mkdir -p " .. home)

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

local function env(t)
  t = t or {}
  t.HOME = t.HOME or home
  t.AWS_EC2_METADATA_DISABLED = t.AWS_EC2_METADATA_DISABLED or "true"
  return t
end

local function no_secret(s, name)
  s = tostring(s)
  tap.ok(not s:find(SECRET, 1, true) and not s:find(TOKEN, 1, true), name, s)
end

-- env only
local c = assert(C.resolve { env = env { AWS_ACCESS_KEY_ID = "AKIAENV", AWS_SECRET_ACCESS_KEY = SECRET,
  AWS_SESSION_TOKEN = TOKEN } })
tap.is(c.access_key, "AKIAENV", "env: access key")
tap.is(c.secret_key, SECRET, "env: secret key")
tap.is(c.session_token, TOKEN, "env: session token")
tap.is(c.source, "env", "env: source")
no_secret(tostring(c), "tostring masks the secret and the token")
tap.like(tostring(c), "AKIAENV", "tostring shows the access key")

c = assert(C.resolve { env = env { AWS_ACCESS_KEY_ID = "AKIAENV", AWS_SECRET_ACCESS_KEY = SECRET,
  AWS_SECURITY_TOKEN = TOKEN } })
tap.is(c.session_token, TOKEN, "legacy AWS_SECURITY_TOKEN")

local r, msg, code = C.resolve { env = env { AWS_ACCESS_KEY_ID = "AKIAENV" } }
tap.ok(r == nil and code == "no_credentials", "partial env keys are an error")
tap.like(msg, "AWS_SECRET_ACCESS_KEY", "the message names the missing variable")

-- explicit beats env
c = assert(C.resolve { access_key = "AKIAX", secret_key = "sx", env = env { AWS_ACCESS_KEY_ID = "AKIAENV",
  AWS_SECRET_ACCESS_KEY = SECRET } })
tap.is(c.access_key, "AKIAX", "explicit keys beat env")
tap.is(c.source, "explicit", "explicit: source")

-- files: credentials + config with comments, continuation lines, profiles
local dir = home .. "/aws"
os.execute("mkdir -p " .. dir)
local credfile = write(dir .. "/credentials", [[
# a comment
; another comment
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = ]] .. SECRET .. "\n" .. [[

[work]
  # an indented comment
aws_access_key_id=AKIAWORK
aws_secret_access_key =   ]] .. SECRET .. "   \n" .. [[
aws_session_token = ]] .. TOKEN .. "\n" .. [[
region = eu-west-3
]])
local conffile = write(dir .. "/config", [[
[default]
region = us-west-2
s3 =
    max_concurrent_requests = 20
    aws_access_key_id = AKIANESTED

[profile work]
region = eu-central-1
aws_access_key_id = AKIACONFWORK
aws_secret_access_key = config-secret

[profile conf-only]
; only in the config file
region = ap-south-1
aws_access_key_id = AKIACONFONLY
aws_secret_access_key = ]] .. SECRET .. "\n" .. [[
aws_security_token = ]] .. TOKEN .. "\n" .. [[

[profile nokeys]
region = sa-east-1
]])
local files = { AWS_SHARED_CREDENTIALS_FILE = credfile, AWS_CONFIG_FILE = conffile }
local function fenv(extra)
  local t = env()
  for k, v in pairs(files) do t[k] = v end
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

c = assert(C.resolve { env = fenv() })
tap.is(c.access_key, "AKIADEFAULT", "default profile from the credentials file")
tap.is(c.source, "shared-credentials-file", "credentials file: source")
tap.is(c.session_token, nil, "no token in the default profile")

c = assert(C.resolve { env = fenv { AWS_PROFILE = "work" } })
tap.is(c.access_key, "AKIAWORK", "AWS_PROFILE selects a profile; credentials file beats config")
tap.is(c.secret_key, SECRET, "values are trimmed")
tap.is(c.session_token, TOKEN, "session token from the profile")

c = assert(C.resolve { env = fenv { AWS_PROFILE = "work", AWS_DEFAULT_PROFILE = "conf-only" } })
tap.is(c.access_key, "AKIACONFONLY", "AWS_DEFAULT_PROFILE beats AWS_PROFILE")
tap.is(c.source, "config-file", "static keys from the config file")
tap.is(c.session_token, TOKEN, "legacy aws_security_token in a file")

c = assert(C.resolve { profile = "work", env = fenv { AWS_DEFAULT_PROFILE = "conf-only" } })
tap.is(c.access_key, "AKIAWORK", "opts.profile beats the profile variables")

-- an explicit profile skips env; AWS_PROFILE alone does not
local envkeys = { AWS_ACCESS_KEY_ID = "AKIAENV", AWS_SECRET_ACCESS_KEY = SECRET }
c = assert(C.resolve { profile = "work", env = fenv(envkeys) })
tap.is(c.access_key, "AKIAWORK", "an explicit profile skips env")
local e = fenv(envkeys)
e.AWS_PROFILE = "work"
c = assert(C.resolve { env = e })
tap.is(c.access_key, "AKIAENV", "AWS_PROFILE alone does not skip env")

-- continuation lines are not keys
local ini = C.parse_ini("[a]\nk =\n  x = 1\n  aws_access_key_id = NO\nj: 2\n  ; c\n")
tap.is(ini.a.aws_access_key_id, nil, "an indented continuation line is not a key")
tap.is(ini.a.j, "2", "a colon delimiter")
tap.is(ini.a.k, "\nx = 1\naws_access_key_id = NO", "the continuation belongs to its key")

-- a missing profile
r, msg, code = C.resolve { profile = "nope", env = fenv(envkeys) }
tap.ok(r == nil and code == "no_credentials", "a missing profile is an error")
tap.like(msg, '"nope"', "the message names the profile")
tap.ok(msg and msg:find(credfile, 1, true) and msg:find(conffile, 1, true), "the message names both files", msg)
no_secret(msg, "no secret in the missing-profile message")

-- a profile with no keys falls through to a final error
r, msg, code = C.resolve { profile = "nokeys", env = fenv() }
tap.ok(r == nil and code == "no_credentials", "no keys anywhere: no_credentials")
no_secret(msg, "no secret in the no-credentials message")

-- partial keys in a file do not leak
write(dir .. "/partial", "[default]\naws_access_key_id = AKIAP\naws_session_token = " .. TOKEN .. "\n")
r, msg = C.resolve { env = env { AWS_SHARED_CREDENTIALS_FILE = dir .. "/partial", AWS_CONFIG_FILE = conffile } }
tap.ok(r == nil and msg:find("partial"), "partial keys in a file are an error", msg)
no_secret(msg, "no secret in the partial-keys message")

-- region precedence
tap.is(C.region { region = "us-east-2", env = fenv { AWS_REGION = "eu-west-1", AWS_DEFAULT_REGION = "eu-west-2" } },
  "us-east-2", "region: explicit first")
tap.is(C.region { env = fenv { AWS_REGION = "eu-west-1", AWS_DEFAULT_REGION = "eu-west-2" } },
  "eu-west-1", "region: AWS_REGION before AWS_DEFAULT_REGION")
tap.is(C.region { env = fenv { AWS_DEFAULT_REGION = "eu-west-2" } }, "eu-west-2", "region: AWS_DEFAULT_REGION")
tap.is(C.region { env = fenv() }, "us-west-2", "region: the default profile")
tap.is(C.region { profile = "conf-only", env = fenv() }, "ap-south-1", "region: a named profile")
tap.is(C.region { profile = "work", env = fenv() }, "eu-west-3", "region: the credentials file overrides the config")
r, msg, code = C.region { env = env() }
tap.ok(r == nil and code == "no_region", "no region anywhere: no_region", msg)
r, msg, code = C.region { region = "us-east-1\r\nX: y" }
tap.ok(r == nil and code == "no_region", "an invalid region is refused")

-- container credentials and IMDSv2 against a loopback server
local base, _, stop = H.start_python_server([=[
import os, sys, threading, time, json
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
SECRET = "]=] .. SECRET .. [=["
TOKEN = "]=] .. TOKEN .. [=["
def creds(key):
    return json.dumps({"Code": "Success", "AccessKeyId": key, "SecretAccessKey": SECRET,
                       "Token": TOKEN, "Expiration": "2099-01-01T00:00:00Z"}).encode()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def send(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_PUT(self):
        if self.path == "/latest/api/token" and self.headers.get("x-aws-ec2-metadata-token-ttl-seconds") == "21600":
            self.send(200, b"imds-session-token")
        else:
            self.send(400)
    def do_GET(self):
        if self.path == "/container":
            if self.headers.get("Authorization") == "Bearer good":
                self.send(200, creds("AKIACONTAINER"))
            else:
                self.send(401, b'{"message":"denied"}')
        elif self.path.startswith("/latest/meta-data/iam/security-credentials/"):
            if self.headers.get("x-aws-ec2-metadata-token") != "imds-session-token":
                self.send(401)
            elif self.path == "/latest/meta-data/iam/security-credentials/":
                self.send(200, b"my-role")
            elif self.path == "/latest/meta-data/iam/security-credentials/my-role":
                self.send(200, creds("AKIAIMDS"))
            else:
                self.send(404)
        else:
            self.send(404)
]=])
tap.ok(base, "the metadata server started")
if base then
  local tokfile = write(dir .. "/token", "Bearer good")
  c, msg = C.resolve { env = env { AWS_CONTAINER_CREDENTIALS_FULL_URI = base .. "/container",
    AWS_CONTAINER_AUTHORIZATION_TOKEN = "Bearer good" } }
  tap.is(c and c.access_key, "AKIACONTAINER", "container credentials with a token", msg)
  tap.is(c and c.session_token, TOKEN, "container: session token")
  tap.is(c and c.expiration, "2099-01-01T00:00:00Z", "container: expiration")
  tap.is(c and c.source, "container-role", "container: source")
  no_secret(tostring(c), "container: tostring masks")

  c, msg = C.resolve { env = env { AWS_CONTAINER_CREDENTIALS_FULL_URI = base:gsub("127%.0%.0%.1", "localhost") .. "/container",
    AWS_CONTAINER_AUTHORIZATION_TOKEN = "wrong", AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE = tokfile } }
  tap.is(c and c.access_key, "AKIACONTAINER", "the token file beats the token variable; localhost allowed", msg)

  r, msg = C.resolve { env = env { AWS_CONTAINER_CREDENTIALS_FULL_URI = base .. "/container",
    AWS_CONTAINER_AUTHORIZATION_TOKEN = "Bearer bad" } }
  tap.ok(r == nil and msg:find("401"), "a refused container token is an error", msg)

  -- A FULL_URI to a non-loopback http host: refused with no request at all.
  local calls = 0
  local function counting(o) calls = calls + 1 return sbx.core.http.request(o) end
  r, msg, code = C.resolve { http_request = counting, env = env {
    AWS_CONTAINER_CREDENTIALS_FULL_URI = "http://10.1.2.3:" .. base:match(":(%d+)$") .. "/container" } }
  tap.ok(r == nil and code == "no_credentials" and msg:find("refused"), "a non-loopback http FULL_URI is refused", msg)
  tap.is(calls, 0, "... without any request")
  r = C.resolve { http_request = counting, env = env {
    AWS_CONTAINER_CREDENTIALS_FULL_URI = "http://127.0.0.1.evil.example/container" } }
  tap.ok(r == nil and calls == 0, "a host that only starts like loopback is refused")

  -- CR/LF in the token: refused, no request, no token in the message.
  r, msg = C.resolve { http_request = counting, env = env { AWS_CONTAINER_CREDENTIALS_FULL_URI = base .. "/container",
    AWS_CONTAINER_AUTHORIZATION_TOKEN = TOKEN .. "\r\nX-Injected: 1" } }
  tap.ok(r == nil and msg:find("CR or LF") and calls == 0, "a CR/LF token is refused", msg)
  no_secret(msg, "the CR/LF message does not contain the token")
  write(tokfile, "Bearer good\n")
  r, msg = C.resolve { http_request = counting, env = env { AWS_CONTAINER_CREDENTIALS_FULL_URI = base .. "/container",
    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE = tokfile } }
  tap.ok(r == nil and msg:find("CR or LF") and calls == 0, "a token file with LF is refused (as botocore)", msg)

  -- IMDSv2
  c, msg = C.resolve { env = env { AWS_EC2_METADATA_DISABLED = "false", AWS_EC2_METADATA_SERVICE_ENDPOINT = base .. "/" } }
  tap.is(c and c.access_key, "AKIAIMDS", "IMDSv2 credentials", msg)
  tap.is(c and c.source, "iam-role", "IMDS: source")
  tap.is(c and c.session_token, TOKEN, "IMDS: session token")
  no_secret(tostring(c), "IMDS: tostring masks")

  calls = 0
  r, msg = C.resolve { http_request = counting, env = env { AWS_EC2_METADATA_DISABLED = "TRUE",
    AWS_EC2_METADATA_SERVICE_ENDPOINT = base } }
  tap.ok(r == nil and calls == 0, "AWS_EC2_METADATA_DISABLED=true: no IMDS request", msg)

  -- env still beats the container and IMDS
  c = assert(C.resolve { env = env { AWS_ACCESS_KEY_ID = "AKIAENV", AWS_SECRET_ACCESS_KEY = "s",
    AWS_CONTAINER_CREDENTIALS_FULL_URI = base .. "/container", AWS_EC2_METADATA_DISABLED = "false",
    AWS_EC2_METADATA_SERVICE_ENDPOINT = base } })
  tap.is(c.source, "env", "env beats the container and IMDS")
  stop()
end

-- IMDS unreachable (a closed loopback port) gives a plain no_credentials.
r, msg, code = C.resolve { env = env { AWS_EC2_METADATA_DISABLED = "false",
  AWS_EC2_METADATA_SERVICE_ENDPOINT = "http://127.0.0.1:1" } }
tap.ok(r == nil and code == "no_credentials", "unreachable IMDS: no_credentials", msg)

os.execute("rm -rf " .. home)
tap.done()

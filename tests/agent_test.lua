-- needs: docker, python3
-- The example agent loop (lua/examples/agent.lua) against a local replay
-- server that answers in OpenAI's Chat Completions and Anthropic's Messages
-- wire formats from a recorded script. The example runs as a child process
-- (build/sbx run ...) with a real box; the server records every request so
-- the test checks what the example sent: the tools, the tool results with
-- their ids, the auth headers. An HTTP 401 must end in exit 1 with the status
-- and the provider's message, never the key.
local tap = require "tap"
local H = require "helper"
local sbx = require "sbx"
local json = sbx.json

local SERVER = [=[
import json, os, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

requests = []
lock = threading.Lock()

def tool_call(id, name, arguments):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}

def openai_reply(n, model):
    if n == 1:
        msg = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            tool_call("call_bash1", "bash", json.dumps({"command": "echo hello > /work/x.txt && cat /work/x.txt"})),
            tool_call("call_ps1", "list_processes", "{}")]}
        finish = "tool_calls"
    elif n == 2:
        msg = {"role": "assistant", "content": None, "refusal": None,
               "tool_calls": [tool_call("call_bad", "bash", '{"command": "ls"')]}
        finish = "tool_calls"
    else:
        msg = {"role": "assistant", "content": "Done: /work/x.txt says hello.", "refusal": None}
        finish = "stop"
    return {"id": "chatcmpl-%d" % n, "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": msg, "logprobs": None,
            "finish_reason": finish}], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
            "total_tokens": 15}}

def anthropic_reply(n, model):
    if n == 1:
        content = [{"type": "text", "text": "Let me check."},
                   {"type": "tool_use", "id": "toolu_bash1", "name": "bash",
                    "input": {"command": "echo hello > /work/x.txt && cat /work/x.txt"}},
                   {"type": "tool_use", "id": "toolu_ps1", "name": "list_processes", "input": {}}]
        stop = "tool_use"
    elif n == 2:
        content = [{"type": "tool_use", "id": "toolu_bad", "name": "bash", "input": {"cmd": "ls"}}]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": "Finished: the file says hello."}]
        stop = "end_turn"
    return {"id": "msg_%d" % n, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5}}

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass

    def send(self, code, value):
        body = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_requests":
            with lock: self.send(200, requests)
        else:
            self.send(404, {"error": {"message": "no such endpoint"}})

    def do_POST(self):
        n = self.headers.get("Content-Length")
        raw = self.rfile.read(int(n)) if n else b""
        try: body = json.loads(raw)
        except ValueError: body = None
        with lock:
            requests.append({"path": self.path, "body": body,
                             "headers": {k.lower(): v for k, v in self.headers.items()}})
        # The turn is 1 + the assistant messages already in the conversation.
        turn = 1 + sum(1 for m in (body or {}).get("messages", []) if m.get("role") == "assistant")
        model = (body or {}).get("model", "")
        if self.path == "/denied/v1/chat/completions":
            key = self.headers.get("Authorization", "").replace("Bearer ", "")
            self.send(401, {"error": {"message": "Incorrect API key provided: %s. You can find your API key at https://platform.openai.com/account/api-keys." % key,
                                      "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}})
        elif self.path == "/ok/v1/chat/completions":
            self.send(200, openai_reply(turn, model))
        elif self.path == "/ok/v1/messages":
            self.send(200, anthropic_reply(turn, model))
        else:
            self.send(404, {"error": {"message": "no such endpoint " + self.path}})

]=]

local errfile = os.tmpname()
local base, port, stop_server = H.start_python_server(SERVER)
if not base then
  tap.ok(false, "the replay server started")
  tap.done()
end
local OPENAI_KEY, ANTHROPIC_KEY = "sk-test-0penai-S3CRET-4417", "sk-ant-test-S3CRET-9921"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs the example as a child; returns stdout, stderr, exit status, child pid.
-- The shell prints its pid and then execs sbx, so the pid is sbx's own.
local function run_agent(env, args)
  local parts = { "env -u OPENAI_API_KEY -u OPENAI_BASE_URL -u ANTHROPIC_API_KEY -u ANTHROPIC_BASE_URL" }
  for k, v in pairs(env) do parts[#parts + 1] = k .. "=" .. q(v) end
  parts[#parts + 1] = q(H.sbx_bin) .. " run lua/examples/agent.lua"
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  local cmd = "echo $$; exec " .. table.concat(parts, " ") .. " 2> " .. q(errfile)
  local p = io.popen("sh -c " .. q(cmd))
  local pid = tonumber(p:read("l"))
  local out = p:read("a")
  local _, _, status = p:close()
  local f = io.open(errfile)
  local err = f and f:read("a") or ""
  if f then f:close() end
  return out, err, status, pid
end

local function requests(path)
  local all = assert(sbx.httpc.json { url = base .. "/_requests" })
  local out = {}
  for _, r in ipairs(all) do if r.path == path then out[#out + 1] = r end end
  return out
end

-- Containers labelled as owned by pid (running or not).
local function boxes_of(pid)
  local ok, list = pcall(H.containers, { "sbx.owner.pid=" .. pid })
  return ok and #list or -1
end

local function names(tools, get)
  local t = {}
  for _, x in ipairs(tools or {}) do t[#t + 1] = get(x) end
  return table.concat(t, ",")
end

local function tests()
  local want_names = names(sbx.tools.export("openai"), function(x) return x["function"].name end)
  tap.is(want_names, "bash,list_processes,process_output,kill_process", "the policy's tools")

  -- The label query itself finds a box of this process.
  do
    local b <close> = H.box { image = H.busybox }
    tap.ok(boxes_of(sbx.core.pid()) >= 1, "the sbx.owner.pid label query finds a live box")
  end

  -- OpenAI -----------------------------------------------------------------
  local out, err, status, pid = run_agent({ OPENAI_API_KEY = OPENAI_KEY, OPENAI_BASE_URL = base .. "/ok/v1" },
    { "make a file", "--provider", "openai", "--model", "gpt-test", "--image", H.busybox, "--max-turns", "5" })
  tap.is(status, 0, "openai: exit status 0")
  tap.is(out, "Done: /work/x.txt says hello.\n", "openai: stdout is the final text")
  tap.ok(not (out .. err):find(OPENAI_KEY, 1, true), "openai: the key is never printed")
  tap.is(boxes_of(pid), 0, "openai: no container of the child (pid " .. tostring(pid) .. ") is left")
  local reqs = requests("/ok/v1/chat/completions")
  tap.is(#reqs, 3, "openai: three requests")
  if #reqs < 3 then tap.diag(err) return end
  local r1, r2, r3 = reqs[1], reqs[2], reqs[3]
  tap.is(r1.headers.authorization, "Bearer " .. OPENAI_KEY, "openai: Authorization carries the key")
  tap.is(r1.headers["content-type"], "application/json", "openai: JSON body")
  tap.is(r1.body.model, "gpt-test", "openai: --model is sent")
  tap.is(names(r1.body.tools, function(x) return x.type == "function" and x["function"].name end), want_names,
    "openai: tools in Chat Completions shape ({type=function, function={name,...}})")
  local bash = r1.body.tools[1]["function"]
  tap.ok(bash.parameters and bash.parameters.type == "object" and bash.parameters.properties.command
    and bash.description ~= nil, "openai: tools carry description and parameters schema")
  tap.is(r1.body.messages[1].role, "system", "openai: a system message first")
  tap.ok(r1.body.messages[2].role == "user" and r1.body.messages[2].content == "make a file",
    "openai: then the task as the user message")

  local m = r2.body.messages
  tap.is(#m, 5, "openai turn 2: system, user, assistant, two tool results")
  local a = m[3]
  tap.ok(a.role == "assistant" and a.tool_calls and #a.tool_calls == 2 and a.tool_calls[1].id == "call_bash1"
    and a.tool_calls[2].id == "call_ps1" and a.tool_calls[1]["function"].name == "bash",
    "openai turn 2: the assistant message with its tool_calls comes back")
  tap.ok(m[4].role == "tool" and m[4].tool_call_id == "call_bash1", "openai turn 2: bash result with its tool_call_id")
  tap.is(m[4].content, "hello\n", "openai turn 2: the bash output")
  tap.ok(m[5].role == "tool" and m[5].tool_call_id == "call_ps1", "openai turn 2: list_processes result, in order")
  tap.is(m[5].content, "No background processes have been started.", "openai turn 2: the process list text")

  m = r3.body.messages
  tap.is(#m, 7, "openai turn 3: one more assistant message and tool result")
  tap.is(m[6].tool_calls and m[6].tool_calls[1]["function"].arguments, '{"command": "ls"',
    "openai turn 3: the malformed arguments are sent back as they came")
  tap.ok(m[7].role == "tool" and m[7].tool_call_id == "call_bad", "openai turn 3: result for call_bad")
  tap.like(m[7].content, "^Error: .*not valid JSON", "openai turn 3: the model reads an error message")

  -- Anthropic ----------------------------------------------------------------
  out, err, status, pid = run_agent({ ANTHROPIC_API_KEY = ANTHROPIC_KEY, ANTHROPIC_BASE_URL = base .. "/ok/" },
    { "make a file", "--provider", "anthropic", "--image", H.busybox })
  tap.is(status, 0, "anthropic: exit status 0")
  tap.is(out, "Finished: the file says hello.\n", "anthropic: stdout is the final text")
  tap.ok(not (out .. err):find(ANTHROPIC_KEY, 1, true), "anthropic: the key is never printed")
  tap.is(boxes_of(pid), 0, "anthropic: no container of the child is left")
  reqs = requests("/ok/v1/messages")
  tap.is(#reqs, 3, "anthropic: three requests (a trailing slash in the base URL is fine)")
  if #reqs < 3 then tap.diag(err) return end
  r1, r2, r3 = reqs[1], reqs[2], reqs[3]
  tap.is(r1.headers["x-api-key"], ANTHROPIC_KEY, "anthropic: x-api-key carries the key")
  tap.is(r1.headers["anthropic-version"], "2023-06-01", "anthropic: anthropic-version")
  tap.is(r1.headers.authorization, nil, "anthropic: no Authorization header")
  tap.ok(math.type(r1.body.max_tokens) == "integer" and r1.body.max_tokens > 0, "anthropic: max_tokens")
  tap.is(names(r1.body.tools, function(x) return x.input_schema and x.input_schema.type == "object" and x.name end),
    want_names, "anthropic: tools in Messages shape ({name, description, input_schema})")
  tap.ok(type(r1.body.system) == "string" and r1.body.messages[1].role == "user"
    and r1.body.messages[1].content == "make a file", "anthropic: system prompt apart, the task as the user message")

  m = r2.body.messages
  tap.is(#m, 3, "anthropic turn 2: user, assistant, user")
  tap.ok(m[2].role == "assistant" and #m[2].content == 3 and m[2].content[2].type == "tool_use"
    and m[2].content[2].id == "toolu_bash1", "anthropic turn 2: the assistant content blocks come back")
  tap.is(json.encode(m[2].content[3].input), "{}", "anthropic turn 2: an empty input stays an object")
  local blocks = m[3].content
  tap.ok(m[3].role == "user" and #blocks == 2 and blocks[1].type == "tool_result" and blocks[2].type == "tool_result",
    "anthropic turn 2: a user message of two tool_result blocks")
  tap.ok(blocks[1].tool_use_id == "toolu_bash1" and blocks[2].tool_use_id == "toolu_ps1",
    "anthropic turn 2: tool_use_ids in order")
  tap.is(blocks[1].content, "hello\n", "anthropic turn 2: the bash output")
  tap.is(blocks[2].content, "No background processes have been started.", "anthropic turn 2: the process list text")
  tap.ok(blocks[1].is_error == nil, "anthropic turn 2: no is_error on success")

  blocks = r3.body.messages[5].content
  tap.ok(blocks and blocks[1].tool_use_id == "toolu_bad" and blocks[1].is_error == true,
    "anthropic turn 3: invalid input comes back as an error tool_result")
  tap.like(blocks and blocks[1].content, "^Error: invalid arguments for bash: .*'command'",
    "anthropic turn 3: with a message the model can act on")

  -- HTTP 401 -------------------------------------------------------------------
  out, err, status, pid = run_agent({ OPENAI_API_KEY = OPENAI_KEY, OPENAI_BASE_URL = base .. "/denied/v1" },
    { "anything", "--image", H.busybox })
  tap.is(status, 1, "401: exit status 1")
  tap.like(err, "HTTP 401", "401: the status is printed")
  tap.like(err, "Incorrect API key provided", "401: the provider's message is printed")
  tap.ok(not (out .. err):find(OPENAI_KEY, 1, true), "401: the key is not printed (the server echoed it)", err)
  tap.is(out, "", "401: nothing on stdout")
  tap.is(#requests("/denied/v1/chat/completions"), 1, "401: not retried")
  tap.is(boxes_of(pid), 0, "401: no container of the child is left")
end

local ok, e = xpcall(tests, debug.traceback)
tap.ok(ok, "the agent tests ran to the end", e)
stop_server()
os.remove(errfile)
tap.done()

-- An LLM agent loop: a model gets sbx's tools (bash, list_processes,
-- process_output, kill_process) bound to one fresh box and works on a task
-- until it stops calling tools. Plain HTTP + JSON, no SDK.
--
--   export OPENAI_API_KEY=...          # OPENAI_BASE_URL optional
--   build/sbx run lua/examples/agent.lua "Write fizzbuzz in Python and run it"
--
--   export ANTHROPIC_API_KEY=...       # ANTHROPIC_BASE_URL optional
--   build/sbx run lua/examples/agent.lua "TASK" --provider anthropic
--
-- Options: --provider openai|anthropic (default: openai, or anthropic when
-- only ANTHROPIC_API_KEY is set), --model M, --image I (default
-- sbx-debian:12), --max-turns N (default 20). Progress goes to stderr, the
-- model's final answer to stdout. Exit status: 0 when the model finished,
-- 1 on API errors (or when max turns ran out), 2 on usage errors.
local sbx = require "sbx"
local json = sbx.json

local function log(...) io.stderr:write(string.format(...), "\n") end

-- Command line ---------------------------------------------------------------

local opts = { image = "sbx-debian:12", max_turns = 20 }
local task
local i = 1
while i <= #arg do
  local a, v = arg[i], arg[i + 1]
  if a == "--provider" or a == "--model" or a == "--image" or a == "--max-turns" then
    if not v then log("agent: %s needs a value", a) os.exit(2) end
    opts[a:sub(3):gsub("-", "_")] = v
    i = i + 2
  else
    task = task and (task .. " " .. a) or a
    i = i + 1
  end
end
opts.max_turns = math.tointeger(tonumber(opts.max_turns))
if not task or not opts.max_turns then
  log('usage: sbx run lua/examples/agent.lua "TASK" [--provider openai|anthropic] [--model M] [--image I] [--max-turns N]')
  os.exit(2)
end
if not opts.provider then
  local only_anthropic = os.getenv("ANTHROPIC_API_KEY") and not os.getenv("OPENAI_API_KEY")
  opts.provider = only_anthropic and "anthropic" or "openai"
end

local SYSTEM = "You are an agent working in a Linux sandbox (working directory /work). " ..
  "Use the tools to run commands; when the task is done, reply with a short final answer."

-- Providers: each builds a request, reads a reply into
-- { text, calls = { {id, name, args} }, done }, and formats tool results. ------

local providers = {}

providers.openai = {
  env = "OPENAI_API_KEY", base = os.getenv("OPENAI_BASE_URL") or "https://api.openai.com/v1",
  model = "gpt-4.1",
  tools = sbx.tools.export("openai"),
}

function providers.openai:request(key, messages)
  return {
    url = self.base .. "/chat/completions",
    headers = { ["Authorization"] = "Bearer " .. key },
    json = { model = self.model, tools = self.tools, messages = messages },
  }
end

function providers.openai:read(reply, messages)
  local choice = reply.choices[1]
  local msg = choice.message
  local calls = {}
  for _, tc in ipairs(msg.tool_calls or {}) do
    -- arguments arrive as a JSON string; sbx.tools.call decodes and checks it
    calls[#calls + 1] = { id = tc.id, name = tc["function"].name, args = tc["function"].arguments }
  end
  local content = msg.content
  messages[#messages + 1] = { role = "assistant", content = content or json.null,
                              tool_calls = #calls > 0 and msg.tool_calls or nil }
  return { text = type(content) == "string" and content or "", calls = calls,
           done = #calls == 0, why = choice.finish_reason }
end

function providers.openai:results(calls, outputs, messages)
  for k, call in ipairs(calls) do
    messages[#messages + 1] = { role = "tool", tool_call_id = call.id, content = outputs[k].text }
  end
end

providers.anthropic = {
  env = "ANTHROPIC_API_KEY", base = os.getenv("ANTHROPIC_BASE_URL") or "https://api.anthropic.com",
  model = "claude-sonnet-4-5",
  tools = sbx.tools.export("anthropic"),
}

function providers.anthropic:request(key, messages)
  return {
    url = self.base .. "/v1/messages",
    headers = { ["x-api-key"] = key, ["anthropic-version"] = "2023-06-01" },
    json = { model = self.model, max_tokens = 4096, system = SYSTEM, tools = self.tools, messages = messages },
  }
end

function providers.anthropic:read(reply, messages)
  local texts, calls = {}, {}
  for _, block in ipairs(reply.content) do
    if block.type == "text" then texts[#texts + 1] = block.text end
    -- input arrives as an object (a table); sbx.tools.call takes it as it is
    if block.type == "tool_use" then calls[#calls + 1] = { id = block.id, name = block.name, args = block.input } end
  end
  messages[#messages + 1] = { role = "assistant", content = reply.content }
  return { text = table.concat(texts, "\n"), calls = calls,
           done = reply.stop_reason ~= "tool_use", why = reply.stop_reason }
end

function providers.anthropic:results(calls, outputs, messages)
  local blocks = {}
  for k, call in ipairs(calls) do
    blocks[k] = { type = "tool_result", tool_use_id = call.id, content = outputs[k].text,
                  is_error = outputs[k].is_error or nil }
  end
  messages[#messages + 1] = { role = "user", content = blocks }
end

-- One API call: the decoded reply, or nil and a message with the HTTP status
-- and the provider's own error text (both providers send {error = {message}}).
local function call_api(p, key, messages)
  local req = p:request(key, messages)
  req.retries, req.timeout = 2, 600 -- 429 and 5xx are retried with backoff
  local reply, err, code, resp = sbx.httpc.json(req)
  if reply then return reply end
  if code == "status" then
    local body = json.decode(resp.body)
    local detail = type(body) == "table" and type(body.error) == "table" and body.error.message
    err = string.format("HTTP %d: %s", resp.status, detail or resp.body:sub(1, 300))
  end
  return nil, (tostring(err):gsub(key:gsub("%p", "%%%0"), "[key]")) -- never echo the key
end

-- The loop -----------------------------------------------------------------------

local function main()
  local p = providers[opts.provider]
  if not p then log("agent: unknown provider '%s' (openai or anthropic)", opts.provider) return 2 end
  p.base = p.base:gsub("/+$", "")
  p.model = opts.model or p.model
  local key = os.getenv(p.env)
  if not key or key == "" then log("agent: set %s", p.env) return 2 end

  local box <close>, berr = sbx.box { image = opts.image }
  if not box then log("agent: no box: %s", berr) return 1 end
  local tools = box:tools()
  log("agent: %s %s, box %s (%s)", opts.provider, p.model, box.id:sub(1, 12), opts.image)

  local messages = {}
  if opts.provider == "openai" then messages[1] = { role = "system", content = SYSTEM } end
  messages[#messages + 1] = { role = "user", content = task }

  for turn = 1, opts.max_turns do
    local reply, err = call_api(p, key, messages)
    if not reply then log("agent: %s API error: %s", opts.provider, err) return 1 end
    local r = p:read(reply, messages)
    if r.done then
      if r.why ~= "stop" and r.why ~= "end_turn" then log("agent: the model stopped: %s", tostring(r.why)) end
      print(r.text)
      return 0
    end
    -- Every tool call of this turn runs as its own task; gather keeps the order.
    local tasks = {}
    for k, c in ipairs(r.calls) do
      log("[turn %d] %s %s", turn, c.name, type(c.args) == "string" and c.args or json.encode(c.args))
      tasks[k] = sbx.spawn(function()
        local text, is_error = sbx.tools.call(tools, c.name, c.args)
        return { text = text, is_error = is_error }
      end)
    end
    p:results(r.calls, sbx.gather(tasks), messages)
  end
  log("agent: no final answer after %d turns", opts.max_turns)
  return 1
end

local status = main() -- the box is closed when main returns
if status ~= 0 then os.exit(status) end

-- lm-deluge 0.0.89 DockerSandbox, exactly: its tool names, descriptions and
-- schemas, its output strings and limits. What it got wrong stays fixed
-- underneath (timeouts kill the command tree, background output is kept,
-- boxes stop in milliseconds and are labelled for the reaper, bash runs the
-- bash tool), because those are not strings a model or a harness compares.
--   sbx --policy lm-deluge run harness.lua
local MAX_CHARS = 5000

local policy = {}

policy.box = {
  image = "ghcr.io/astral-sh/uv:python3.12-bookworm-slim",
  workdir = "/workspace",
  memory = 512 * 1024 * 1024,   -- mem_limit="512m"
  cpus = false,                 -- cpu_quota=None: no CPU limit
  network = "bridge",
}

policy.exec = {
  timeout = 60,
  -- Enough tail for the last 5000 characters even at 4 bytes each.
  capture = {
    stdout = { head = 0, tail = 4 * MAX_CHARS + 4 },
    stderr = { head = 0, tail = 4 * MAX_CHARS + 4 },
    output = { head = 0, tail = 4 * MAX_CHARS + 4 },
  },
}

-- The model sees the last 5000 characters (output.tail_chars), no head.
policy.output = { head_chars = 0, tail_chars = MAX_CHARS }

local function last_chars(s, n)
  local len = utf8.len(s)
  if not len or len <= n then return s, len and len > n end
  return s:sub(utf8.offset(s, len - n + 1)), true
end

-- `[Exit code: N]` first when non-zero, the last 5000 characters after
-- `...[truncated]...`, `(no output)` when empty, `[Timeout after Ns]`.
function policy.format_result(r, pol)
  -- By hand without a policy: the live one. This file never loads
  -- sbx.config (sbx.config loads it: sbx.load_policy); until sbx.config is
  -- loaded the live policy would be a fresh copy of the defaults.
  local config = package.loaded["sbx.config"]
  pol = pol or (config and config.policy) or require("sbx.policy")
  if r.timed_out then
    return string.format("[Timeout after %ss]", tostring(r.timeout))
  end
  local part = r.parts.output
  -- The command's bytes as the original shows them (invalid UTF-8 as
  -- U+FFFD, as Python's errors="replace"; no line about it).
  local text = (require("sbx.util").model_text(part.head .. part.tail))
  local cut = part.omitted > 0
  local tail, longer = last_chars(text, pol.output.tail_chars)
  if cut or longer then text = "...[truncated]...\n" .. tail end
  if r.exit_code ~= 0 then
    text = string.format("[Exit code: %s]\n%s", r.exit_code == nil and "None" or tostring(r.exit_code), text)
  end
  return text ~= "" and text or "(no output)"
end

function policy.format_started(p, pol)
  return string.format("Started background process '%s'.\nCommand: %s\nUse list_processes() to check status.", p.name, p.command)
end

local function exit_text(p)
  return p.exit_code == nil and "None" or tostring(p.exit_code)
end

function policy.format_processes(list, name, pol)
  if #list == 0 then return "No background processes have been started." end
  if name then
    for _, p in ipairs(list) do
      if p.name == name then
        local status = p.status == "running" and "running" or ("completed (exit code: " .. exit_text(p) .. ")")
        return string.format("Process: %s\nCommand: %s\nStatus: %s\nRunning for: %.1fs", p.name, p.command, status, p.elapsed)
      end
    end
    local names = {}
    for _, p in ipairs(list) do names[#names + 1] = p.name end
    return string.format("Process '%s' not found. Available: %s", name, table.concat(names, ", "))
  end
  local rows = { string.format("%-8s %-19s %s", "NAME", "STATUS", "COMMAND") }
  for _, p in ipairs(list) do
    local status = p.status == "running" and "running" or ("exit " .. exit_text(p))
    local cmd = p.command
    if (utf8.len(cmd) or #cmd) > 40 then cmd = cmd:sub(1, (utf8.offset(cmd, 41) or 41) - 1) .. "..." end
    rows[#rows + 1] = string.format("%-8s %-19s %s", p.name, status, cmd)
  end
  return table.concat(rows, "\n")
end

-- Exceptions reach the model as "Error: <message>", as in the default policy.

-- bash(wait=false) is the default tool's run_in_background.
local function run_bash(box, a, ctx, pol)
  local tools = require "sbx.tools"
  local args = {}
  for k, v in pairs(a) do args[k] = v end
  args.wait = nil
  if a.wait ~= nil and tools.opt(a.wait) == false then args.run_in_background = true end
  return tools.handlers.bash(box, args, ctx, pol)
end

policy.tools = {
  bash = {
    run = run_bash,
    description = "Execute a bash command in the Docker sandbox environment. The sandbox has Python 3.12 and uv pre-installed. Use 'apt-get update && apt-get install -y <package>' for system packages. Set wait=false to run servers or long-running processes in background.",
    parameters = {
      { "command", { type = "string", description = "The shell command to execute" }, required = true },
      { "timeout", { type = "integer", description = function(pol)
        return string.format("Timeout in seconds (default: %s, only for wait=true)", tostring(pol.exec.timeout))
      end } },
      { "wait", { type = "boolean", description = "If true (default), wait for completion. If false, run in background." } },
      { "name", { type = "string", description = "Name for background process (e.g., 'server'). Only used with wait=false." } },
    },
  },
  list_processes = {
    description = "Check status of background processes started with wait=false.",
    parameters = {
      { "name", { type = "string", description = "Process name to check, or omit to see all processes" } },
    },
  },
  process_output = false,
  kill_process = false,
}
policy.tool_order = { "bash", "list_processes" }

return policy

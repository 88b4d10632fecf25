-- A policy that acts, not only talks: it refuses commands that match a deny
-- list, caps what each box may use, and logs every command (refused ones
-- too) to a JSON Lines file.
--
--   sbx --policy lua/examples/guard_policy.lua eval tasks.jsonl
--   SBX_GUARD_LOG=/tmp/commands.jsonl sbx --policy lua/examples/guard_policy.lua run agent.lua
--
-- A policy file is trusted code (unlike a task file): it may read the
-- environment and write files. Its hooks get the live policy as `pol`, so a
-- later overlay can change the deny list (user.deny) or the log path.
local json = require("sbx").json

local function log(pol, record)
  local f = io.open(pol.user.log, "a")
  if not f then return end
  f:write(json.encode(record), "\n")
  f:close()
end

local function text_of(command)
  return type(command) == "table" and table.concat(command, " ") or command
end

return {
  -- Per box: at most 50 commands, 10 minutes of command time, 64 MiB of output.
  budget = { commands = 50, seconds = 600, output_bytes = 64 * 1024 * 1024 },
  user = {
    log = os.getenv("SBX_GUARD_LOG") or "sbx-commands.jsonl",
    -- Lua patterns; a command matching any of them is refused.
    deny = { "rm%s+%-[rf]+%s+/%s*$", "rm%s+%-[rf]+%s+/[%s;]", "%f[%w]curl%f[%W]", "%f[%w]wget%f[%W]", ":%(%)%s*{" },
  },
  hooks = {
    before_exec = function(box, req, pol)
      local text = text_of(req.command)
      for _, pattern in ipairs(pol.user.deny) do
        if text:find(pattern) then
          log(pol, { t = os.time(), box = box.id, source = req.source, command = text, refused = pattern })
          return false, string.format("refused by policy: commands matching %q are not allowed here", pattern)
        end
      end
    end,
    after_exec = function(box, req, result, pol)
      log(pol, {
        t = os.time(), box = box.id, source = req.source, command = text_of(req.command),
        background = req.background, exit_code = result.exit_code, status = result.status,
        timed_out = result.timed_out, duration = result.duration or result.elapsed,
        output_bytes = result.output_bytes or ((result.stdout_bytes or 0) + (result.stderr_bytes or 0)),
        usage = box.usage,
      })
    end,
  },
}

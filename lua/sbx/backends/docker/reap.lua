-- The Docker backend's reaper: removes the boxes of owners that are gone.
local json = require("sbx.core").json
local owner = require "sbx.owner"
local client = require "sbx.backends.docker.client"
local call = client.call

local M = {}

-- reap(opts) -> { removed = {...}, kept = n }: removes boxes whose owner
-- process is gone (same host: pid and start time no longer match) or whose
-- deadline has passed (any host). opts.all removes every sbx box; opts.dry_run
-- only reports what would go.
function M.reap(opts)
  opts = opts or {}
  local d, err, code = client.connect(opts.docker_host, opts.deadline)
  if not d then return nil, err, code end
  local st, list, lcode = client.list(d, { label = json.array { "sbx.owner.pid" } }, { deadline = opts.deadline })
  if not st then return nil, list, lcode end
  local now = os.time()
  return owner.reap_each(list, opts, {
    reason = function(c) return owner.reap_reason(c.Labels or {}, opts, now) end,
    name = function(c) return c.Id, ((c.Names and c.Names[1] or c.Id):gsub("^/", "")) end,
    remove = function(c)
      call(d, "DELETE", "/containers/" .. c.Id .. "?force=true&v=true", nil,
        { ok = { [404] = true, [409] = true }, deadline = opts.deadline })
    end,
  })
end

return M

-- The Fargate backend's reaper: the tasks of owners that are gone.
local json = require("sbx.core").json
local owner = require "sbx.owner"
local clients = require "sbx.backends.fargate.clients"
local lifecycle = require "sbx.backends.fargate.lifecycle"
local fspec = clients.fspec
local get_clients = clients.get_clients
local stop_task = lifecycle.stop_task
local task_id = lifecycle.task_id

local M = {}

-- Reaper --------------------------------------------------------------------------------------

-- reap(opts) -> { removed = {...}, kept = n }: stops sbx tasks (startedBy
-- policy.fargate.started_by) whose owner process is gone (same host) or
-- whose deadline has passed. opts.all stops every sbx task of the cluster;
-- opts.dry_run only reports.
function M.reap(opts)
  opts = opts or {}
  local f = fspec(opts)
  local c, err, code = get_clients(f)
  if not c then return nil, err, code end
  local arns, token = {}, nil
  repeat
    local out, lerr, lcode = c.ecs:call("ListTasks", {
      cluster = f.cluster, startedBy = f.started_by, desiredStatus = "RUNNING", nextToken = token,
    })
    if not out then
      if lcode == "ClusterNotFoundException" then return { removed = {}, kept = 0 } end
      return nil, lerr, lcode
    end
    for _, a in ipairs(out.taskArns or {}) do arns[#arns + 1] = a end
    token = out.nextToken
  until not token
  local all = {}
  for i = 1, #arns, 100 do
    local batch = table.move(arns, i, math.min(i + 99, #arns), 1, {})
    local out, derr, dcode = c.ecs:call("DescribeTasks", { cluster = f.cluster, tasks = json.array(batch), include = json.array { "TAGS" } })
    if not out then return nil, derr, dcode end
    for _, t in ipairs(out.tasks or {}) do all[#all + 1] = t end
  end
  local now = os.time()
  return owner.reap_each(all, opts, {
    reason = function(t)
      local tg = {}
      for _, kv in ipairs(t.tags or {}) do tg[kv.key] = kv.value end
      return tg["sbx"] == "1" and owner.reap_reason(tg, opts, now) or nil
    end,
    name = function(t) return t.taskArn, task_id(t.taskArn) end,
    remove = function(t) stop_task(c, f, t.taskArn) end,
  })
end

return M

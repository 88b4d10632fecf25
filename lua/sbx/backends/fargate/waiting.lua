-- The Fargate backend's wait for tasks: one DescribeTasks per cluster and
-- poll for every waiting box.
local core = require "sbx.core"
local json = require("sbx.core").json

local M = {}

-- Waiting for tasks: one DescribeTasks per cluster and poll for every waiting box ------

local pollers = {}              -- client key|cluster -> { waiting = { arn -> entry } }

local function agent_running(t)
  for _, ct in ipairs(t.containers or {}) do
    for _, a in ipairs(ct.managedAgents or {}) do
      if a.name == "ExecuteCommandAgent" and a.lastStatus == "RUNNING" then return true end
    end
  end
  return false
end

local function poll(c, f, key)
  local p = pollers[key]
  while next(p.waiting) do
    core.sleep(f.poll_interval)
    local arns = {}
    for arn in pairs(p.waiting) do arns[#arns + 1] = arn end
    for i = 1, #arns, 100 do
      local batch = table.move(arns, i, math.min(i + 99, #arns), 1, {})
      local out, err, code = c.ecs:call("DescribeTasks", { cluster = f.cluster, tasks = json.array(batch) })
      if not out then
        for _, arn in ipairs(batch) do
          if p.waiting[arn] then p.waiting[arn].last_error = { err, code } end
        end
      end
      for _, t in ipairs(out and out.tasks or {}) do
        local w = p.waiting[t.taskArn]
        if w then
          w.task = t
          if t.lastStatus == "STOPPED" then
            w.result = { nil, "the task stopped before it ran: " .. tostring(t.stoppedReason or t.stopCode), "task_stopped" }
          elseif t.lastStatus == "RUNNING" and agent_running(t) then
            w.result = { t }
          end
          if w.result then
            p.waiting[t.taskArn] = nil
            w.done:set()
          end
        end
      end
    end
  end
  pollers[key] = nil
end

local function wait_running(c, f, arn)
  local key = c.key .. "|" .. f.cluster
  local p = pollers[key]
  local w = { done = core.event() }
  if not p then
    p = { waiting = {} }
    pollers[key] = p
    p.waiting[arn] = w
    core.spawn(poll, c, f, key)
  else
    p.waiting[arn] = w
  end
  if not w.done:wait(f.start_timeout) then
    p.waiting[arn] = nil
    local t = w.task
    if t and t.lastStatus == "RUNNING" then
      return nil, string.format("the task runs but its ExecuteCommandAgent did not connect within %gs " ..
        "(the task role needs the ssmmessages permissions and a network path to the SSM endpoints)", f.start_timeout),
        "agent_not_connected"
    end
    local last = w.last_error and (": last DescribeTasks error: " .. tostring(w.last_error[1])) or ""
    return nil, string.format("the task did not reach RUNNING within %gs (last status %s)%s", f.start_timeout,
      t and t.lastStatus or "unknown", last), "timeout"
  end
  return table.unpack(w.result, 1, 3)
end

M.wait_running = wait_running

return M

-- Who owns a box: the host, the pid and the pid's start time. Every backend
-- writes these on what it starts (labels, tags) and its reaper compares them
-- with the live process table, so a crashed sbx's boxes are found and removed.
local M = {}
local read_file = require("sbx.fs").read

-- The start time of a process (clock ticks since boot), which tells a live
-- owner from a new process that reuses its pid. nil when it is gone.
function M.proc_start(pid)
  local stat = read_file("/proc/" .. tostring(pid) .. "/stat")
  if not stat then return nil end
  local rest = stat:match("^.*%)%s+(.*)$")
  -- A zombie keeps its pid and start time but is no owner any more.
  if not rest or rest:match("^[ZX]") then return nil end
  local i = 0
  for field in rest:gmatch("%S+") do
    i = i + 1
    if i == 20 then return field end
  end
end

function M.hostname()
  return (read_file("/proc/sys/kernel/hostname") or "unknown"):gsub("%s+$", "")
end

local me
-- { pid, start, host } of this process (strings).
function M.identity()
  if not me then
    local pid = tostring(require("sbx.core").pid())
    me = { pid = pid, start = M.proc_start(pid) or "0", host = M.hostname() }
  end
  return me
end

-- The labels (Docker) or tags (ECS) every box carries: owner, creation
-- time, deadline (creation + lifetime seconds), sbx version, then extra.
function M.labels(lifetime, extra)
  local o = M.identity()
  local now = os.time()
  local t = {
    ["sbx"] = "1",
    ["sbx.owner.pid"] = o.pid,
    ["sbx.owner.start"] = o.start,
    ["sbx.owner.host"] = o.host,
    ["sbx.created"] = tostring(now),
    ["sbx.deadline"] = tostring(now + math.floor(lifetime)),
    ["sbx.version"] = require("sbx.core").version,
  }
  for k, v in pairs(extra or {}) do t[k] = tostring(v) end
  return t
end

-- Why a box with these owner fields is an orphan, or nil when it is not.
-- deadline is epoch seconds (or nil); a box of another host is judged only
-- by its deadline, because its owner's process table is not ours to read.
function M.orphan_reason(host, pid, start, deadline, now)
  now = now or os.time()
  deadline = tonumber(deadline or "")
  if deadline and deadline < now then return "past its deadline" end
  if host == M.hostname() and pid then
    if M.proc_start(pid) ~= start then return "owner process " .. pid .. " is gone" end
  end
  return nil
end

-- Why a box carrying labels (Docker labels or ECS tags, the same keys) is
-- to be reaped: "all" under opts.all, an orphan reason, or nil.
function M.reap_reason(labels, opts, now)
  if opts.all then return "all" end
  return M.orphan_reason(labels["sbx.owner.host"], labels["sbx.owner.pid"], labels["sbx.owner.start"],
    labels["sbx.deadline"], now)
end

-- reap_each(items, opts, how) -> { removed = { { id, name, reason } },
-- kept = n }: the one reap loop of every backend. how.reason(item) ->
-- why it goes (owner gone, deadline passed, ended) | nil; how.name(item)
-- -> id, name; how.remove(item) removes it (each in a task of its own, all
-- joined before this returns; one after the other with how.serial; none
-- with opts.dry_run).
function M.reap_each(items, opts, how)
  local report, tasks = { removed = {}, kept = 0 }, {}
  for _, item in ipairs(items) do
    local reason = how.reason(item)
    if reason then
      local id, name = how.name(item)
      report.removed[#report.removed + 1] = { id = id, name = name or id, reason = reason }
      if opts.dry_run then -- reported, not removed
      elseif how.serial then how.remove(item)
      else tasks[#tasks + 1] = require("sbx.core").spawn(how.remove, item) end
    else
      report.kept = report.kept + 1
    end
  end
  for _, t in ipairs(tasks) do t:join() end
  return report
end

return M

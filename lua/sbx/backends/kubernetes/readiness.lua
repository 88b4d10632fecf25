-- The Kubernetes backend's readiness: waiting for a pod to run, what a
-- pending or failed pod means, and a pod that is gone.
local core = require "sbx.core"
local owner = require "sbx.owner"
local clients = require "sbx.backends.kubernetes.clients"
local ns_path = clients.ns_path

local M = {}

-- Readiness ------------------------------------------------------------------------------------

local PULL_REASONS = { ErrImagePull = true, ImagePullBackOff = true, InvalidImageName = true, ErrImageNeverPull = true }
local FATAL_REASONS = { CreateContainerConfigError = true, CreateContainerError = true, RunContainerError = true,
  CrashLoopBackOff = true }

-- Whether a scheduler message says "full for now" (policy.kubernetes.wait_unschedulable).
local function transient_unschedulable(msg, k)
  for _, pat in ipairs(k.wait_unschedulable or {}) do
    if tostring(msg):find(pat, 1, true) then return true end
  end
  return false
end

-- What a pod's state means for a waiting box: "ready" | nil, what it waits
-- for (or nil) | false, message, code.
function M.pod_state(pod, k)
  local st = type(pod) == "table" and pod.status or {}
  st = type(st) == "table" and st or {}
  if st.phase == "Failed" or st.phase == "Succeeded" then
    return false, string.format("the pod %s: %s%s", st.phase == "Failed" and "failed" or "ended",
      tostring(st.reason or "no reason given"), st.message and (": " .. st.message) or ""), "pod_failed"
  end
  for _, cs in ipairs(type(st.containerStatuses) == "table" and st.containerStatuses or {}) do
    local w = type(cs.state) == "table" and cs.state.waiting
    if type(w) == "table" and w.reason then
      if PULL_REASONS[w.reason] then
        return false, string.format("the pod cannot pull its image: %s%s", w.reason,
          w.message and (": " .. w.message) or ""), "image_unavailable"
      elseif FATAL_REASONS[w.reason] then
        return false, string.format("the pod's container cannot start: %s%s", w.reason,
          w.message and (": " .. w.message) or ""), "pod_failed"
      end
    end
    local t = type(cs.state) == "table" and cs.state.terminated
    if type(t) == "table" then
      return false, string.format("the pod's container ended: %s (exit %s)", tostring(t.reason), tostring(t.exitCode)), "pod_failed"
    end
  end
  local waiting_for
  for _, c in ipairs(type(st.conditions) == "table" and st.conditions or {}) do
    if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" then
      if k.fail_unschedulable and not transient_unschedulable(c.message, k) then
        return false, "the pod cannot be scheduled: Unschedulable: " .. tostring(c.message), "unschedulable"
      end
      waiting_for = "a node with room (the scheduler: " .. tostring(c.message) .. ")"
    end
  end
  if st.phase == "Running" then
    for _, cs in ipairs(type(st.containerStatuses) == "table" and st.containerStatuses or {}) do
      if type(cs.state) == "table" and cs.state.running then return "ready" end
    end
  end
  return nil, waiting_for
end

-- Waiting for pods: one watch per client (cluster and namespace) for every
-- box of this process that waits, as the Fargate backend has one poller:
-- a hundred boxes starting at once cost the API server one watch, not a
-- hundred. The watch selects this process's pods (label sbx.owner.pid) and
-- starts without a resourceVersion (the current state as ADDED events,
-- then every change); a watch that ends or breaks goes on from the last
-- resourceVersion seen, one that expired (410) starts over. A box joins
-- before its pod is posted, so no event of its pod can be missed.

local watchers = {}              -- client -> { waiting = name -> waiter, task }

local function settle(wt, w, ok, msg, code)
  if w.result then return end
  w.result = { ok, msg, code }
  wt.waiting[w.name] = nil
  w.done:set()
end

-- Why a running box's pod is gone (deleted, being deleted, ended: the
-- lifetime, an eviction), or nil while it runs.
function M.gone_reason(pod)
  if type(pod) ~= "table" then return nil end
  local meta = type(pod.metadata) == "table" and pod.metadata or {}
  local st = type(pod.status) == "table" and pod.status or {}
  if meta.deletionTimestamp then return "the box's pod is being deleted (since " .. tostring(meta.deletionTimestamp) .. ")" end
  if st.phase == "Failed" or st.phase == "Succeeded" then
    local why = st.reason == "DeadlineExceeded" and "it reached its lifetime (activeDeadlineSeconds)"
      or st.reason == "Evicted" and "it was evicted" or tostring(st.reason or st.phase)
    return string.format("the box's pod ended: %s%s", why, st.message and (": " .. st.message) or "")
  end
  for _, cs in ipairs(type(st.containerStatuses) == "table" and st.containerStatuses or {}) do
    local t = type(cs.state) == "table" and cs.state.terminated
    if type(t) == "table" then
      return string.format("the box's container ended: %s (exit %s)", tostring(t.reason), tostring(t.exitCode))
    end
  end
  return nil
end

-- A box whose pod is gone: every command after this is box_gone, and its
-- open exec streams (running commands, the agent's channel) are cut.
local function mark_gone(h, why)
  if h.gone or h.destroyed then return end
  h.gone = why
  for ex in pairs(h.streams) do pcall(ex.close, ex) end
end
M.mark_gone = mark_gone

local function watch_loop(c, wt)
  local rv
  local selector = "sbx.owner.pid=" .. owner.identity().pid
  while next(wt.waiting) do
    local res, _, code = c:watch(ns_path(c, "pods"), {
      labelSelector = selector, resourceVersion = rv, allowWatchBookmarks = "true",
      timeoutSeconds = c.pol.watch_timeout,
    }, function(etype, obj)
      local meta = type(obj) == "table" and type(obj.metadata) == "table" and obj.metadata or {}
      rv = meta.resourceVersion or rv
      local w = meta.name and wt.waiting[meta.name]
      if w and etype == "DELETED" then
        settle(wt, w, false, "the pod was deleted before it ran", "pod_failed")
      elseif w and etype ~= "BOOKMARK" then
        w.last = obj
        local s, m, cd = M.pod_state(obj, w.k)
        if s ~= nil then
          settle(wt, w, s == "ready", m, cd)
        elseif m ~= w.waiting_for then
          w.waiting_for = m
          if m and w.k.on_wait then pcall(w.k.on_wait, meta.name, m) end
        end
      end
      if not next(wt.waiting) then return false end
    end)
    if not res then
      if code == "expired" then rv = nil end
      if next(wt.waiting) then core.sleep(0.1) end
    end
  end
end

local function watcher_of(c)
  local wt = watchers[c]
  if not wt then
    wt = { waiting = {} }
    watchers[c] = wt
  end
  return wt
end

local function ensure_task(c, wt)
  if wt.task then return end
  wt.task = core.spawn(function()
    pcall(watch_loop, c, wt)
    wt.task = nil
    -- Boxes that joined while the loop was ending get a new loop.
    if next(wt.waiting) then ensure_task(c, wt) end
  end)
end

local function join_watch(c, name, k)
  local wt = watcher_of(c)
  local w = { name = name, k = k, done = core.event() }
  wt.waiting[name] = w
  ensure_task(c, wt)
  return w
end

local function stop_if_idle(wt)
  if not next(wt.waiting) and wt.task then
    local t = wt.task
    wt.task = nil
    t:cancel()
  end
end

local function leave_watch(c, w)
  local wt = watchers[c]
  if not wt then return end
  wt.waiting[w.name] = nil
  stop_if_idle(wt)
end

-- Looks at a box's pod after an exec stream failed or ended oddly: the
-- reason it is gone (h.gone is set), or nil (it runs, or it could not be
-- seen).
local function check_gone(h)
  if h.gone then return h.gone end
  if h.destroyed then return nil end
  local c = h.client
  local st, pod, code = c:call("GET", ns_path(c, "pods", h.name), { timeout = h.k.gone_check_timeout, retries = 1 })
  if not st then
    if code == "not_found" then mark_gone(h, "the box's pod was deleted") end
    return h.gone
  end
  local why = M.gone_reason(pod)
  if why then mark_gone(h, why) end
  return h.gone
end
M.check_gone = check_gone

-- A stream that ended oddly (cut, without an exit code, or with a
-- SIGKILL nobody sent) may be the pod's end seen before its status says so
-- (the kubelet kills the containers and posts the status about together):
-- look at the pod, and again every gone_poll seconds for gone_grace. No
-- task watches an idle box (one would keep `sbx run` from ending).
-- -> why it is gone | nil
local function gone_after_stream(h, expected)
  if h.destroyed then return nil end
  if check_gone(h) then return h.gone end
  if expected then return nil end
  local until_t = core.now() + h.k.gone_grace
  while not h.gone and not h.destroyed and core.now() < until_t do
    core.sleep(h.k.gone_poll)
    check_gone(h)
  end
  return h.gone
end

-- Waits for a joined pod until it runs, fails or the deadline: true | nil,
-- message, code.
local function wait_ready(c, w, k, deadline)
  if not w.done:wait(math.max(0.001, deadline - core.now())) then
    leave_watch(c, w)
    local st = type(w.last) == "table" and type(w.last.status) == "table" and w.last.status or {}
    local why = st.phase or "not seen yet"
    for _, cond in ipairs(type(st.conditions) == "table" and st.conditions or {}) do
      if cond.status == "False" and cond.reason then
        why = why .. ", " .. cond.type .. ": " .. cond.reason .. (cond.message and (" (" .. cond.message .. ")") or "")
      end
    end
    for _, cs in ipairs(type(st.containerStatuses) == "table" and st.containerStatuses or {}) do
      local wt = type(cs.state) == "table" and cs.state.waiting
      if type(wt) == "table" and wt.reason then why = why .. ", " .. wt.reason end
    end
    if w.waiting_for then
      return nil, string.format("the pod did not run within %gs (policy.kubernetes.start_timeout): it waited for %s",
        k.start_timeout, w.waiting_for), "unschedulable"
    end
    return nil, string.format("the pod did not run within %gs (policy.kubernetes.start_timeout; last: %s)",
      k.start_timeout, why), "timeout"
  end
  local ok, msg, code = table.unpack(w.result, 1, 3)
  if ok then return true end
  return nil, msg, code
end

M.gone_after_stream = gone_after_stream
M.join_watch = join_watch
M.leave_watch = leave_watch
M.wait_ready = wait_ready

return M

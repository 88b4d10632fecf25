-- The Docker backend: box lifecycle and command transport over the Engine
-- API (libcurl for requests, a raw hijacked socket for exec streams).
-- Works against Docker and Podman's Docker-compatible service; see
-- docs/docker-api.md for the measured behaviour this follows.
--
-- One concern per file: client (the daemon and one API call), images,
-- isolation (limits, disk quota and watcher), lifecycle (create, destroy,
-- restart, clear), exec (per-command functions: the exec transport),
-- channel (the agent's channel) and reap. This module is the backend
-- contract's face (sbx.backend): it only gathers them.
local owner = require "sbx.owner"
local client = require "sbx.backends.docker.client"
local isolation = require "sbx.backends.docker.isolation"
local lifecycle = require "sbx.backends.docker.lifecycle"
local exec = require "sbx.backends.docker.exec"
local channel = require "sbx.backends.docker.channel"
local reap = require "sbx.backends.docker.reap"

local M = {}
-- Exec create takes its argv, env, cwd and user in JSON: UTF-8 text only.
M.text_argv = "Docker's exec API is JSON"

-- Box options only this backend takes (sbx.policy_check rules).
function M.options(check)
  -- Raw HostConfig fields merged over what sbx sets: trusted code only
  -- (a task file may never set it).
  return { host_config = check.map(check.ANY) }
end

M.candidates, M.connect, M.seconds_left, M.call = client.candidates, client.connect, client.seconds_left, client.call
M.list = client.list
M.proc_start = owner.proc_start
M.disk_quota_of, M.quota_refused, M.limits = isolation.disk_quota_of, isolation.quota_refused, isolation.limits
M.create, M.destroy, M.restart, M.clear = lifecycle.create, lifecycle.destroy, lifecycle.restart, lifecycle.clear
M.pending_removals = lifecycle.pending_removals
M.start, M.finish, M.ping, M.stream_error = exec.start, exec.finish, exec.ping, exec.stream_error
M.oom_check, M.cpu_seconds, M.host_kill = exec.oom_check, exec.cpu_seconds, exec.host_kill
M.tar_one, M.agent_channel, M.agent_attach = channel.tar_one, channel.agent_channel, channel.agent_attach
M.reap = reap.reap

return M

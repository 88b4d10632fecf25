-- The Kubernetes backend: a box is a pod whose one container sleeps for the
-- box's lifetime; commands run through the pods/exec subresource on a
-- websocket (one stream per command on the exec transport, one stream for
-- sbx-agent on the agent transport). The box contract is box.lua's;
-- protocol notes with their sources are in docs/kubernetes.md.
--
-- The pod: restartPolicy Never; activeDeadlineSeconds = the box's lifetime
-- (an orphan ends by itself, and so does its sleep); the owner labels and
-- annotations Docker boxes carry; resources from the box's memory, cpus
-- and disk (limits, and requests as policy.kubernetes.requests says);
-- automountServiceAccountToken false (a box never holds cluster
-- credentials); a hardened securityContext (allowPrivilegeEscalation
-- false, the box's capabilities dropped and added, RuntimeDefault
-- seccomp); runtimeClassName, nodeSelector, tolerations and
-- imagePullSecrets from policy; terminationGracePeriodSeconds 0 and a
-- delete with gracePeriodSeconds=0, so a close is immediate.
--
-- network = "none" is a NetworkPolicy that selects the pod and allows
-- nothing in and nothing out, made before the pod; the cluster's network
-- plugin enforces it (box.limits.network says so).
--
-- One concern per file: clients (one per configuration, kspec, paths),
-- isolation (the pod spec, sbx.limits), readiness (a pod that runs, waits
-- or is gone), netcheck (network = "none" checked from inside), lifecycle
-- (create, destroy, restart), exec (per-command functions: the exec
-- transport), channel (the agent's channel) and reap. This module is the
-- backend contract's face (sbx.backend): it only gathers them.
local clients = require "sbx.backends.kubernetes.clients"
local isolation = require "sbx.backends.kubernetes.isolation"
local readiness = require "sbx.backends.kubernetes.readiness"
local netcheck = require "sbx.backends.kubernetes.netcheck"
local lifecycle = require "sbx.backends.kubernetes.lifecycle"
local exec = require "sbx.backends.kubernetes.exec"
local channel = require "sbx.backends.kubernetes.channel"
local reap = require "sbx.backends.kubernetes.reap"

local M = {}

-- Box options only this backend takes: every policy.kubernetes knob.
function M.options(check) return check.section_rules("kubernetes") end

M.client = clients.client
M.limits, M.pod_body = isolation.limits, isolation.pod_body
M.pod_state, M.gone_reason = readiness.pod_state, readiness.gone_reason
M.mark_gone, M.check_gone = readiness.mark_gone, readiness.check_gone
M.network_check = netcheck.network_check
M.create, M.destroy, M.restart = lifecycle.create, lifecycle.destroy, lifecycle.restart
M.start, M.finish, M.clear = exec.start, exec.finish, exec.clear
M.agent_channel, M.agent_attach = channel.agent_channel, channel.agent_attach
M.reap = reap.reap

return M

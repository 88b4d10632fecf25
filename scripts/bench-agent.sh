#!/usr/bin/env bash
# The agent transport's numbers (issue: commands at the speed of fork):
# sequential exec of /bin/true on the agent beside the exec transport, the
# docker CLI and the physical floor (fork+exec inside the box), the timeout
# kill, 16 boxes x 200 execs, host memory per idle box, 1 GiB through one
# command; then exec `true` on Fargate boxes over the AWS stand-in.
# Usage: scripts/bench-agent.sh [N]   (N sequential samples, default 300)
# Env: BENCH_IMAGE (default sbx-busybox:latest), BENCH_IDLE (default 200), SBX
set -euo pipefail
cd "$(dirname "$0")/.."
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make -j2 >/dev/null
export BENCH_RUN_ID=agent-$$
cleanup() { docker rm -f $(docker ps -aq --filter label=sbx-bench=$BENCH_RUN_ID) >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "# $(uname -m), $(nproc) CPUs, $(docker version --format '{{.Server.Version}}' 2>/dev/null), $(date -u +%FT%TZ)"
"$SBX" run scripts/bench/agent.lua "${1:-300}"
echo
"$SBX" run scripts/bench/agent_fargate.lua "${2:-100}"

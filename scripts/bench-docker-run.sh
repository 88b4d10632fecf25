#!/usr/bin/env bash
# A Docker box's whole life (create + one exec + destroy) on each transport
# beside `docker run --rm`, on this machine, in one run (issue 18 item 8).
# Prints the machine, the load average and a markdown table.
# Usage: scripts/bench-docker-run.sh [N]   (N rounds, default 20)
# Env: BENCH_IMAGE (default sbx-busybox:latest), SBX
set -euo pipefail
cd "$(dirname "$0")/.."
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make -j2 >/dev/null
export BENCH_RUN_ID=dockerrun-$$
cleanup() { docker rm -f $(docker ps -aq --filter label=sbx-bench=$BENCH_RUN_ID) >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "# $(uname -m), $(nproc) CPUs, dockerd $(docker version --format '{{.Server.Version}}' 2>/dev/null), $(date -u +%FT%TZ)"
"$SBX" run scripts/bench/docker_run.lua "${1:-20}"

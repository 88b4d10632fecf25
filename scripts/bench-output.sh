#!/usr/bin/env bash
# One command's output beside its peers, in one run (issue 18, item 8):
# 1 GiB through the Docker backend (agent and exec transports) beside the
# docker CLI, and through the local backend beside the host's pipes.
# Usage: scripts/bench-output.sh [IMAGE] [BYTES] [RUNS]
#   (default sbx-debian:12, 1073741824, 5)
set -euo pipefail
cd "$(dirname "$0")/.."
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make -j2 >/dev/null
export BENCH_RUN_ID=output-$$
cleanup() { docker rm -f $(docker ps -aq --filter label=sbx-bench=$BENCH_RUN_ID) >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "# $(uname -m), $(nproc) CPUs, kernel $(uname -r), $(docker version --format '{{.Server.Version}}' 2>/dev/null || echo no daemon), $(date -u +%FT%TZ)"
"$SBX" run scripts/bench/output_peers.lua "${1:-sbx-debian:12}" "${2:-1073741824}" "${3:-5}"

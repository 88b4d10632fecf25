#!/usr/bin/env bash
# The two backends backend = "auto" chooses between, on this machine:
# create + one exec + destroy per box, one after another and as N tasks at
# concurrency C (scripts/bench/auto.lua). Prints a markdown table.
# Usage: scripts/bench-auto.sh [IMAGE] [SEQ_N] [TASKS] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make -j2 >/dev/null
echo "# $(uname -m), $(nproc) CPUs, kernel $(uname -r), $(bwrap --version), user $(id -un), $(date -u +%FT%TZ)"
"$SBX" run scripts/bench/auto.lua "${1:-sbx-debian:12}" "${2:-20}" "${3:-64}" "${4:-8}"

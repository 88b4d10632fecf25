#!/usr/bin/env bash
# The harness's overhead: N tasks (echo + check, each in its own box) at
# concurrency C through `sbx.harness`, beside the same boxes and commands
# driven directly from Lua tasks. Prints both lines and the difference.
#   scripts/bench-harness.sh [N] [C] [IMAGE]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200} c=${2:-16} image=${3:-sbx-busybox:latest}
[ -x build/sbx ] || make -s
echo "# sbx harness bench: $n tasks at concurrency $c, image $image; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
bare=$(build/sbx run scripts/bench/harness.lua "$n" "$c" "$image" bare)
harn=$(build/sbx run scripts/bench/harness.lua "$n" "$c" "$image" harness)
echo "$bare"
echo "$harn"
get() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
awk -v bw="$(get wall "$bare")" -v hw="$(get wall "$harn")" -v bm="$(get per_task_median "$bare")" \
    -v hm="$(get per_task_median "$harn")" -v n="$n" -v c="$c" 'BEGIN {
  printf "harness overhead: wall %+.2f s for %d tasks (%+.1f ms per task at concurrency %d); per-task median %+.1f ms\n",
    hw - bw, n, (hw - bw) * 1000 * c / n, c, (hm - bm) * 1000 }'

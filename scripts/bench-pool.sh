#!/usr/bin/env bash
# Warm pools: the latency of pool:take() from a warm pool of SIZE (beside
# making a box when it is needed), `sbx eval` of N one-command tasks at
# concurrency C with a pool of P beside the same run without one, and the
# same below the daemon's capacity: S tasks one at a time, with a pool of 2
# and without. Runs alternate, R of each; medians reported.
#   scripts/bench-pool.sh [N] [C] [P] [R] [IMAGE]     (defaults 100 16 16 3)
# Env: BENCH_TAKES (50), BENCH_SIZE (8), BENCH_SEQ (S, 30; 0 skips it).
# Every box is named sbx-bench-* and labelled sbx-bench=<run id>; what is
# left is removed on exit or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100} c=${2:-16} p=${3:-16} runs=${4:-3} image=${5:-sbx-busybox:latest}
takes=${BENCH_TAKES:-50} size=${BENCH_SIZE:-8} seq=${BENCH_SEQ:-30}
[ -x build/sbx ] || make -s
export BENCH_RUN_ID="pool-$$"
out=$(mktemp)
cleanup() {
  rm -f "$out"
  ids=$(curl -s --unix-socket /var/run/docker.sock \
    "http://localhost/containers/json?all=1&filters=%7B%22label%22%3A%5B%22sbx-bench%3D$BENCH_RUN_ID%22%5D%7D" |
    grep -o '"Id":"[0-9a-f]*"' | cut -d'"' -f4 || true)
  for id in $ids; do curl -s -X DELETE --unix-socket /var/run/docker.sock "http://localhost/containers/$id?force=1" >/dev/null || true; done
}
trap cleanup EXIT INT TERM
echo "# sbx pool bench: $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); image $image"
build/sbx run scripts/bench/pool.lua take "$takes" "$size" "$image"
for i in $(seq 1 "$runs"); do
  build/sbx run scripts/bench/pool.lua eval "$n" "$c" 0 "$image"
  build/sbx run scripts/bench/pool.lua eval "$n" "$c" "$p" "$image"
  if [ "$seq" -gt 0 ]; then
    build/sbx run scripts/bench/pool.lua eval "$seq" 1 0 "$image"
    build/sbx run scripts/bench/pool.lua eval "$seq" 1 2 "$image"
  fi
done | tee "$out"
# med TASKS CONCURRENCY POOL KEY: the median of KEY over those runs.
med() { grep "tasks=$1 concurrency=$2 pool=$3 " "$out" | sed -n "s/.* $4=\([0-9.]*\).*/\1/p" | sort -n |
  awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "eval of $n tasks at concurrency $c, median of $runs: no pool $(med "$n" "$c" 0 wall) s wall" \
  "($(med "$n" "$c" 0 per_task_median) s per task); pool $p: $(med "$n" "$c" "$p" wall) s ($(med "$n" "$c" "$p" per_task_median) s)"
if [ "$seq" -gt 0 ]; then
  echo "eval of $seq tasks one at a time, median of $runs: no pool $(med "$seq" 1 0 wall) s wall" \
    "($(med "$seq" 1 0 per_task_median) s per task); pool 2: $(med "$seq" 1 2 wall) s ($(med "$seq" 1 2 per_task_median) s)"
fi

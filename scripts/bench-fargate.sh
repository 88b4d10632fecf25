#!/usr/bin/env bash
# Fargate boxes from sbx against the local AWS stand-in (scripts/aws-standin:
# real ECS/IAM wire formats, RunTask into real containers, the SSM data
# channel over a websocket). Prints medians of create, create-to-first-command,
# per-command latency, and what BOXES concurrent boxes cost one sbx process.
#
# Usage: scripts/bench-fargate.sh [N] [COMMANDS] [BOXES]   (defaults 5 50 100)
# Env: BENCH_IMAGE (default sbx-busybox:latest), BENCH_POLL (DescribeTasks
#      interval, default 0.1 s), SBX (default build/sbx)
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make >/dev/null
out=$(mktemp); log=$(mktemp)
scripts/aws-standin --port 0 --no-limits >"$out" 2>"$log" & standin=$!
trap 'kill -TERM $standin 2>/dev/null; wait $standin 2>/dev/null; rm -f "$out" "$log" "$res"' EXIT
for _ in $(seq 100); do grep -q '^http' "$out" && break; sleep 0.1; done
url=$(head -1 "$out")
echo "stand-in at $url" >&2
res=$(mktemp)
/usr/bin/time -f "sbx process: %e s wall, %U s user, %S s sys, max RSS %M KB" \
  "$SBX" run scripts/bench/fargate.lua "$url" "${1:-5}" "${2:-50}" "${3:-100}" >"$res"
echo "| measure | median | min | max | n |"
echo "|---|---|---|---|---|"
awk '{ v[$1] = v[$1] " " $2 } END { for (k in v) print k, v[k] }' "$res" | sort | while read -r key vals; do
  sorted=$(tr ' ' '\n' <<<"$vals" | grep -v '^$' | sort -g)
  cnt=$(wc -l <<<"$sorted")
  med=$(sed -n "$(( (cnt + 1) / 2 ))p" <<<"$sorted")
  printf '| %s | %s | %s | %s | %s |\n' "$key" "$med" "$(head -1 <<<"$sorted")" "$(tail -1 <<<"$sorted")" "$cnt"
done

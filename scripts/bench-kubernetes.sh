#!/usr/bin/env bash
# Kubernetes boxes from sbx against the local stand-in (scripts/k8s-standin:
# the API over TLS with a client certificate, pods as real containers, the
# exec subresource on websockets). Prints medians of create, create to the
# first command, per-command latency on the exec and agent transports, and
# what BOXES concurrent boxes (create, 2 commands, close) cost one sbx
# process.
#
# Usage: scripts/bench-kubernetes.sh [N] [COMMANDS] [BOXES]   (defaults 5 200 100)
# Env: BENCH_IMAGE (default sbx-busybox:latest), SBX (default build/sbx)
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make >/dev/null
dir=$(mktemp -d)
scripts/k8s-standin --port 0 --dir "$dir/certs" --kubeconfig "$dir/kubeconfig" >"$dir/out" 2>"$dir/log" & standin=$!
trap 'kill -TERM $standin 2>/dev/null; wait $standin 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do grep -q '^https' "$dir/out" && break; sleep 0.1; done
echo "stand-in at $(head -1 "$dir/out")" >&2
/usr/bin/time -f "sbx process: %e s wall, %U s user, %S s sys, max RSS %M KB" \
  "$SBX" run scripts/bench/kubernetes.lua "$dir/kubeconfig" "${1:-5}" "${2:-200}" "${3:-100}" >"$dir/res"
echo "| measure | median | min | max | n |"
echo "|---|---|---|---|---|"
awk '{ v[$1] = v[$1] " " $2 } END { for (k in v) print k, v[k] }' "$dir/res" | sort | while read -r key vals; do
  sorted=$(tr ' ' '\n' <<<"$vals" | grep -v '^$' | sort -g)
  cnt=$(wc -l <<<"$sorted")
  med=$(sed -n "$(( (cnt + 1) / 2 ))p" <<<"$sorted")
  printf '| %s | %s | %s | %s | %s |\n' "$key" "$med" "$(head -1 <<<"$sorted")" "$(tail -1 <<<"$sorted")" "$cnt"
done

#!/usr/bin/env bash
# The local backend's numbers beside plain bubblewrap, `docker run --rm`
# and the Docker backend, on this machine, in one run: create + destroy,
# create + one exec + destroy, 16 boxes x 200 execs, 200 boxes alive in one
# sbx (RSS). Prints the machine, the load average and a markdown table.
# Usage: scripts/bench-local.sh [N]   (N sequential samples, default 50)
# Env: BENCH_IMAGE (default sbx-busybox:latest; its root filesystem is
#      exported once into $BENCH_ROOTFS_DIR, default /var/tmp/sbx-bench-rootfs),
#      BENCH_DOCKER=0 (skip the Docker rows), BENCH_DOCKER_N (default 10), SBX
set -euo pipefail
cd "$(dirname "$0")/.."
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make -j2 >/dev/null
export BENCH_IMAGE=${BENCH_IMAGE:-sbx-busybox:latest}
export BENCH_RUN_ID=local-$$
cleanup() { docker rm -f $(docker ps -aq --filter label=sbx-bench=$BENCH_RUN_ID) >/dev/null 2>&1 || true; }
trap cleanup EXIT
id=$(docker image inspect -f '{{.Id}}' "$BENCH_IMAGE" | sed 's/^sha256://' | cut -c1-12)
rootfs=${BENCH_ROOTFS_DIR:-/var/tmp/sbx-bench-rootfs}/${id}
if [ ! -d "$rootfs" ]; then
    mkdir -p "$rootfs.tmp"
    c=$(docker create "$BENCH_IMAGE" true)
    docker export "$c" | tar -x -C "$rootfs.tmp"
    docker rm "$c" >/dev/null
    mv "$rootfs.tmp" "$rootfs"
fi
echo "# $(uname -m), $(nproc) CPUs, kernel $(uname -r), $(bwrap --version), user $(id -un), $(date -u +%FT%TZ)"
"$SBX" run scripts/bench/local.lua "$rootfs" "${1:-50}"
"$SBX" run scripts/bench/local_alive.lua "$rootfs" 200

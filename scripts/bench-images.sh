#!/usr/bin/env bash
# The image cache's numbers (issue: boxes without a daemon): the first pull
# of a 30 MB image from a loopback registry (Debian's docker-registry, the
# test fixtures' image) and a local box from that image once cached.
# Then eight local boxes at once from an image no cache holds (sbx-debian:12
# through the daemon) against one box.
# Usage: scripts/bench-images.sh [N]   (N first pulls, default 5; 4N boxes)
set -euo pipefail
cd "$(dirname "$0")/.."
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make -j2 >/dev/null
echo "# $(uname -m), $(nproc) CPUs, kernel $(uname -r), user $(id -un), $(date -u +%FT%TZ)"
LUA_PATH="$PWD/tests/lib/?.lua;;" "$SBX" run scripts/bench/images.lua "${1:-5}"
LUA_PATH="$PWD/tests/lib/?.lua;;" "$SBX" run scripts/bench/images_shared.lua 3

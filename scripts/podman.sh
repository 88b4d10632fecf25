#!/usr/bin/env bash
# Runs the same test suite against Podman's Docker-compatible API: installs
# podman (and catatonit, its init), starts `podman system service` on a
# private socket, imports the test images there, runs tests/run.sh with
# DOCKER_HOST pointing at it, and stops the service.
#   scripts/podman.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sock_dir=/run/sbx-podman
sock=$sock_dir/podman.sock

scripts/setup.sh --podman --no-images
mkdir -p "$sock_dir"
started=
if ! curl -sf --unix-socket "$sock" http://localhost/_ping >/dev/null 2>&1; then
  # From its own directory: conmon writes an "oom" file into its working
  # directory when a container's process is OOM-killed, and the checkout
  # must stay clean (tests/run.sh checks it).
  (cd "$sock_dir" && exec podman system service --time=0 "unix://$sock") >/var/log/sbx-podman.log 2>&1 &
  started=$!
  trap '[ -n "$started" ] && kill "$started" 2>/dev/null; true' EXIT
  for _ in $(seq 1 100); do
    curl -sf --unix-socket "$sock" http://localhost/_ping >/dev/null 2>&1 && break
    sleep 0.1
  done
fi
curl -sf --unix-socket "$sock" http://localhost/_ping >/dev/null || { echo "podman service did not start" >&2; exit 1; }
export DOCKER_HOST=unix://$sock
# Podman's images are not Docker's (other ids): their archives go elsewhere,
# so /var/lib/sbx/images stays the Docker daemon's own.
SBX_ARCHIVES=/var/lib/sbx/images-podman scripts/build-images.sh
tests/run.sh "$build"

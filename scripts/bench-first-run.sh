#!/usr/bin/env bash
# The README's first command where a new user without Docker meets it: a
# fresh Debian 12 container (sbx-debian:12, which setup builds with
# debootstrap: Debian and nothing else) started with only seccomp and
# AppArmor unconfined, a clean copy of this tree (git archive of HEAD), and
# this host's package sources (/etc/apt and npm's global configuration,
# read-only, with the certificate authorities npm is told to trust: where
# this machine gets Debian packages and the test SDKs).
# Prints the wall time of
#   scripts/setup.sh && make && build/sbx run lua/examples/hello.lua
# as root (setup installs packages), and its last lines.
# Usage: scripts/bench-first-run.sh   (needs a Docker daemon to start it)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git archive HEAD | tar -x -C "$src"
sources=(-v /etc/apt:/etc/apt:ro)
for f in /etc/npmrc /usr/etc/npmrc /root/.npmrc; do [ -f "$f" ] && sources+=(-v "$f:$f:ro"); done
# npm's certificate authorities, where its configuration names a file: the
# container's own bundle is Debian's (setup writes it), so the host's goes
# beside it and npm is pointed there.
if ca=$(npm config get cafile 2>/dev/null) && [ -f "$ca" ]; then
  sources+=(-v "$ca:/run/host-npm-ca.crt:ro" -e npm_config_cafile=/run/host-npm-ca.crt)
fi
echo "# $(uname -m), $(nproc) CPUs, $(date -u +%FT%TZ), tree $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
docker run --rm --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
  -v "$src:/src:ro" "${sources[@]}" sbx-debian:12 sh -c '
    cp -a /src /root/sbx && cd /root/sbx
    t0=$(date +%s.%N)
    if scripts/setup.sh >/tmp/setup.log 2>&1 && make >/tmp/make.log 2>&1 &&
       build/sbx run lua/examples/hello.lua >/tmp/run.log 2>&1; then rc=0; else rc=$?; fi
    t1=$(date +%s.%N)
    tail -n 3 /tmp/run.log
    [ "$rc" = 0 ] || { grep -v "level=" /tmp/setup.log | tail -n 20; tail -n 20 /tmp/make.log 2>/dev/null; }
    echo "first command: exit $rc, $(echo "$t1 - $t0" | bc 2>/dev/null || awk "BEGIN{print $t1-$t0}") s"'

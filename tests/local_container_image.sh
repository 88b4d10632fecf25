#!/bin/sh
# Builds the image tests/local_container_test.lua runs sbx in: the locally
# built sbx-debian:12 (scripts/setup.sh; no registry) with this tree's
# build/sbx, bubblewrap and uidmap (newuidmap setuid, as Debian installs
# it) and the shared libraries they need that the image lacks, the example
# scripts, the image archive setup.sh wrote, and a plain user made by
# `useradd -m` (Debian gives it an /etc/subuid range).
#   tests/local_container_image.sh BUILD_DIR TAG
set -eu
# Docker's daemon, whatever DOCKER_HOST says (make test-podman sets it).
unset DOCKER_HOST
build=$1 tag=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/bin"
cp "$build/sbx" /usr/bin/bwrap /usr/bin/newuidmap /usr/bin/newgidmap "$stage/bin/"
docker run --rm --network none sbx-debian:12 sh -c 'ls /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu' >"$stage/base.txt"
for b in "$build/sbx" /usr/bin/bwrap /usr/bin/newuidmap; do ldd "$b" | awk '/=> \//{print $3}'; done | sort -u |
  while read -r l; do grep -qx "$(basename "$l")" "$stage/base.txt" || cp -L "$l" "$stage/lib/"; done
cp -r lua/examples "$stage/examples"
ln "/var/lib/sbx/images/sbx-debian:12.tar" "$stage/sbx-debian.tar" 2>/dev/null ||
  cp "/var/lib/sbx/images/sbx-debian:12.tar" "$stage/sbx-debian.tar"
cat >"$stage/Dockerfile" <<'EOD'
FROM sbx-debian:12
COPY lib/ /usr/lib/x86_64-linux-gnu/
COPY bin/bwrap bin/newuidmap bin/newgidmap /usr/bin/
COPY sbx-debian.tar /var/lib/sbx/images/sbx-debian:12.tar
RUN chmod 4755 /usr/bin/newuidmap /usr/bin/newgidmap && useradd -m -s /bin/sh plain && ldconfig \
 && grep -q '^plain:' /etc/subuid
COPY examples /sbx/lua/examples
COPY bin/sbx /usr/local/bin/sbx
WORKDIR /sbx
EOD
docker build -q -t "$tag" "$stage" >/dev/null

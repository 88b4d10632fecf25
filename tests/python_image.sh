#!/bin/sh
# Builds a Python 3 image for tests that run the README's snippets as
# written (they name python:3.12): the locally built sbx-debian:12
# (scripts/setup.sh; no registry) with this host's Debian python3 (the same
# release: bookworm), its standard library and the one library the image
# lacks. Nothing is downloaded.
#   tests/python_image.sh TAG
set -eu
tag=$1
py=$(readlink -f /usr/bin/python3)
ver=$(basename "$py")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/stdlib"
cp "$py" "$stage/bin/"
# The libraries the image has, read from its files (no attached run: the
# docker CLI cannot attach to Podman's service, which make test-podman uses).
c=$(docker create sbx-debian:12 true)
docker export "$c" | tar -tf - | sed -n 's|^\(usr/\)\{0,1\}lib/x86_64-linux-gnu/\([^/]*\)$|\2|p' >"$stage/base.txt"
docker rm "$c" >/dev/null
ldd "$py" | awk '/=> \//{print $3}' | sort -u |
  while read -r l; do grep -qx "$(basename "$l")" "$stage/base.txt" || cp -L "$l" "$stage/lib/"; done
tar -C /usr/lib -cf - --exclude=__pycache__ --exclude="$ver/test" --exclude="$ver/idlelib" \
  --exclude="$ver/tkinter" --exclude="$ver/lib2to3" "$ver" | tar -C "$stage/stdlib" -xf -
cat >"$stage/Dockerfile" <<EOD
FROM sbx-debian:12
COPY lib/ /usr/lib/x86_64-linux-gnu/
COPY stdlib/ /usr/lib/
COPY bin/$ver /usr/bin/$ver
RUN ln -s $ver /usr/bin/python3 && ldconfig && python3 -c 'print(6*7)'
EOD
docker build -q -t "$tag" "$stage" >/dev/null

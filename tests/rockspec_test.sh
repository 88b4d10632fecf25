#!/usr/bin/env bash
# needs: luarocks
# The rockspec: `luarocks make` in the source directory builds sbx.so from
# scratch (a fresh build directory, no network) into a fresh rock tree, and a
# stock lua5.4 given only that tree's paths loads it and uses it. TAP output.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0 fail=0
t() { n=$((n + 1)); if "$@" >"$tmp/out" 2>&1; then echo "ok $n - $desc"; else echo "not ok $n - $desc"; sed 's/^/#   /' "$tmp/out"; fail=$((fail + 1)); fi; }

version=$(sed -n 's/^#define SBX_VERSION "\(.*\)"/\1/p' src/sbx.h)
spec=sbx-$version-1.rockspec
desc="the rockspec is named after SBX_VERSION ($version)"; t test -f "$spec"
desc="its version field says $version-1"; t grep -qx "version = \"$version-1\"" "$spec"
desc="exactly one rockspec at the top level"; t test "$(ls ./*.rockspec | wc -l)" -eq 1

# A proxy that refuses every connection: any download would fail the build.
desc="luarocks make into a fresh tree, offline"
t env BUILD="$tmp/build" http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 \
  luarocks --lua-version 5.4 --tree "$tmp/tree" make "$spec"
desc="the module was built in the fresh build directory"; t test -f "$tmp/build/sbx.so"
desc="the module is deployed into the tree's Lua library directory"; t test -f "$tmp/tree/lib/lua/5.4/sbx.so"
desc="luarocks lists the rock in the tree"
t sh -c "luarocks --lua-version 5.4 --tree '$tmp/tree' list --porcelain | grep -q '^sbx	$version-1	installed'"

# Only the tree's paths: nothing from this checkout or the environment.
paths=$(luarocks --lua-version 5.4 --tree "$tmp/tree" path 2>/dev/null)
desc="lua5.4 with the tree's paths requires sbx and uses it"
t env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4 -u SBX_LUA_DIR sh -c "
  $paths
  cd '$tmp' && lua5.4 -e '
    local sbx = require \"sbx\"
    local where = package.searchpath(\"sbx\", package.cpath)
    assert(where == \"$tmp/tree/lib/lua/5.4/sbx.so\", \"loaded from \" .. tostring(where))
    assert(sbx.version == \"$version\", \"version \" .. tostring(sbx.version))
    assert(sbx.core.commit ~= \"\", \"empty commit\")
    assert(sbx.json.encode(sbx.json.decode(\"{\\\"a\\\":[1,2]}\")) == \"{\\\"a\\\":[1,2]}\", \"json round trip\")
    local task = sbx.spawn(function() sbx.sleep(0.01) return \"ran\" end)
    assert(sbx.wait(task) == \"ran\", \"a task on the loop\")'"
echo "1..$n"
[ "$fail" -eq 0 ]

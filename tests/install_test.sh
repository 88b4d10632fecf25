#!/usr/bin/env bash
# needs: nothing
# make install PREFIX=... lays out a working sbx: the binary, the libraries,
# the header, sbx.pc (a C program builds from `pkg-config --cflags --libs sbx`
# alone, against the shared and against the static library), the man page and
# the module for a stock lua5.4. DESTDIR stages the same files. TAP output.
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
prefix=$(mktemp -d)
stage=$(mktemp -d)
trap 'rm -rf "$prefix" "$stage"' EXIT
n=0 fail=0
t() { n=$((n + 1)); if "$@" >"$stage/.out" 2>&1; then echo "ok $n - $desc"; else echo "not ok $n - $desc"; sed 's/^/#   /' "$stage/.out"; fail=$((fail + 1)); fi; }
version=$(sed -n 's/^#define SBX_VERSION "\(.*\)"/\1/p' src/sbx.h)

desc="make install PREFIX=$prefix"; t make -s install BUILD="$build" PREFIX="$prefix"
for f in bin/sbx lib/libsbx.a lib/libsbx.so include/sbx.h lib/pkgconfig/sbx.pc share/man/man1/sbx.1 lib/lua/5.4/sbx.so; do
  desc="installed $f"; t test -s "$prefix/$f"
done

desc="DESTDIR stages under DESTDIR, and sbx.pc names the real prefix"
t sh -c "make -s install BUILD='$build' PREFIX=/opt/sbx DESTDIR='$stage' &&
  test -x '$stage/opt/sbx/bin/sbx' && test -s '$stage/opt/sbx/share/man/man1/sbx.1' &&
  test -s '$stage/opt/sbx/lib/lua/5.4/sbx.so' && grep -qx 'prefix=/opt/sbx' '$stage/opt/sbx/lib/pkgconfig/sbx.pc'"

# sbx --version: the version and the commit this checkout is at.
commit=unknown
if [ -e .git ] && command -v git >/dev/null; then commit=$(git rev-parse --short HEAD); fi
desc="the installed sbx --version names version $version and commit $commit"
t sh -c "'$prefix/bin/sbx' --version | grep -Ex 'sbx $version \\(commit $commit(-dirty)?\\)'"

# Only pkg-config, only the installed files: nothing points into this tree.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
desc="pkg-config --modversion sbx is $version"; t test "$(pkg-config --modversion sbx)" = "$version"
desc="pkg-config's flags name no path in the source tree"
t sh -c "! pkg-config --cflags --libs --static sbx | grep -qF '$PWD'"
cat > "$stage/embed.c" <<'C'
#include <sbx.h>
#include <stdio.h>
/* The embedding API and the Lua API side by side, as an embedder uses them. */
int main(void) {
  lua_State *L = sbx_new();
  if (!L) return 1;
  int rc = sbx_dostring(L, "local sbx = require 'sbx'\n"
                           "assert(sbx.json.encode{1} == '[1]')\n"
                           "version = sbx.version", "=embed");
  lua_getglobal(L, "version");
  printf("%s\n", lua_tostring(L, -1));
  lua_pop(L, 1);
  sbx_close(L);
  return rc;
}
C
desc="a C program builds from pkg-config --cflags --libs sbx and runs against libsbx.so"
t sh -c "cc '$stage/embed.c' \$(pkg-config --cflags --libs sbx) -o '$stage/embed' &&
  LD_LIBRARY_PATH='$prefix/lib' ldd '$stage/embed' | grep -qF '$prefix/lib/libsbx.so' &&
  test \"\$(LD_LIBRARY_PATH='$prefix/lib' '$stage/embed')\" = '$version'"
# With only the archive installed, sbx.pc's private requirements are what it
# needs beside it. (Not the full --static closure: Debian's libcurl lists
# libraries whose static or -dev packages are not installed.)
desc="the same program links against libsbx.a plus sbx.pc's Requires.private"
t sh -c "mv '$prefix/lib/libsbx.so' '$stage/libsbx.so' &&
  cc '$stage/embed.c' \$(pkg-config --cflags --libs sbx) \$(pkg-config --libs \$(pkg-config --print-requires-private sbx)) \
    -o '$stage/embed-static';
  rc=\$?; mv '$stage/libsbx.so' '$prefix/lib/libsbx.so'; [ \$rc -eq 0 ] &&
  ! ldd '$stage/embed-static' | grep -q libsbx && test \"\$('$stage/embed-static')\" = '$version'"

man=$prefix/share/man/man1/sbx.1
desc="man -l renders sbx(1) with its sections, every command and the version"
t sh -c "MANWIDTH=80 man -l '$man' > '$stage/man.txt' 2>/dev/null &&
  for w in NAME SYNOPSIS DESCRIPTION COMMANDS 'EXIT STATUS' ENVIRONMENT FILES EXAMPLES \
    'sbx run' 'sbx reap' 'sbx tools' 'sbx mcp' 'sbx eval' --policy --version SBX_POLICY SBX_TRACE \
    DOCKER_HOST SBX_MCP_TRACE AWS_ACCESS_KEY_ID 'sbx $version'; do
    grep -qF -- \"\$w\" '$stage/man.txt' || { echo \"missing: \$w\"; exit 1; }; done"
desc="groff formats the page without a warning"
t sh -c "test -z \"\$(groff -man -ww -z '$man' 2>&1)\""
desc="man finds sbx(1) under the prefix's man directory"
t sh -c "test \"\$(man --manpath='$prefix/share/man' -w sbx)\" = '$man'"

desc="lua5.4 loads the installed module"
t env LUA_CPATH="$prefix/lib/lua/5.4/?.so" lua5.4 -e "assert(require('sbx').version == '$version')"
echo "1..$n"
[ "$fail" -eq 0 ]

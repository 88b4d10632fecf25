#!/usr/bin/env bash
# make install PREFIX=... lays out a working sbx: the binary, the libraries,
# the header (a C program compiles and links against them) and the module
# for a stock lua5.4. TAP output.
set -u
build=${1:-build}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
n=0 fail=0
t() { n=$((n + 1)); if "$@" >/dev/null 2>&1; then echo "ok $n - $desc"; else echo "not ok $n - $desc"; fail=$((fail + 1)); fi; }

desc="make install PREFIX=$prefix"; t make -s install BUILD="$build" PREFIX="$prefix"
desc="the binary runs from the prefix"; t sh -c "'$prefix/bin/sbx' --version | grep -q '^sbx '"
desc="a C program builds against the installed header and library"
cat > "$prefix/embed.c" <<'C'
#include <sbx.h>
int main(void) {
  lua_State *L = sbx_new();
  int rc = sbx_dostring(L, "assert(require('sbx').json.encode{1} == '[1]')", "=t");
  sbx_close(L);
  return rc;
}
C
t sh -c "cc -I'$prefix/include' \$(pkg-config --cflags lua5.4) '$prefix/embed.c' -L'$prefix/lib' -lsbx \$(pkg-config --libs lua5.4) -o '$prefix/embed' && LD_LIBRARY_PATH='$prefix/lib' '$prefix/embed'"
desc="lua5.4 loads the installed module"
t env LUA_CPATH="$prefix/lib/lua/5.4/?.so" lua5.4 -e "assert(require('sbx').version)"
echo "1..$n"
[ "$fail" -eq 0 ]

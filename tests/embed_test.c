/* needs: nothing */
/*
** Embedding: a C program links libsbx, runs Lua that uses the sbx module
** (tasks on the loop included) and reads a value back. TAP output.
*/
#include "sbx.h"

#include <lauxlib.h>
#include <stdio.h>
#include <string.h>

int
main(void)
{
  lua_State *L = sbx_new();
  int rc, n = 0, failed = 0;
  const char *got;
  if (!L)
    return 1;
  rc = sbx_dostring(L,
                    "local sbx = require 'sbx'\n"
                    "local t = sbx.spawn(function(x) sbx.sleep(0.01) return x * 2 end, 21)\n"
                    "result = tostring(sbx.wait(t)) .. ' ' .. sbx.json.encode({ok = true})\n",
                    "=embed");
  n++;
  printf("%sok %d - sbx_dostring runs a chunk with tasks\n", rc == 0 ? "" : "not ", n);
  failed += rc != 0;
  lua_getglobal(L, "result");
  got = lua_tostring(L, -1);
  n++;
  rc = got && strcmp(got, "42 {\"ok\":true}") == 0;
  printf("%sok %d - the host reads the result back (%s)\n", rc ? "" : "not ", n, got ? got : "nil");
  failed += !rc;
  lua_pop(L, 1);
  sbx_close(L);
  printf("1..%d\n", n);
  return failed ? 1 : 0;
}

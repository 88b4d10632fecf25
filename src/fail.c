/* nil, message, code: see fail.h. */
#include "fail.h"

#include <stdarg.h>

int
sbx_pushfail(lua_State *L, const char *code, const char *fmt, ...)
{
  va_list ap;
  lua_pushnil(L);
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_pushstring(L, code);
  return 3;
}

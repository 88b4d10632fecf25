/*
** Text hygiene for what a model or a JSON document will read: invalid UTF-8
** becomes U+FFFD, and cut points never split a character.
*/
#include "host.h"
#include "capture.h"

#include <stdlib.h>
#include <string.h>

/* text.sanitize(s) -> s as valid UTF-8, and the number of bytes replaced */
static int
text_sanitize(lua_State *L)
{
  size_t n, o, i, bad = 0;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, 3 * n + 1);
  o = sbx_utf8_sanitize(s, n, out, 1, NULL);
  luaL_pushresultsize(&b, o);
  if (o != n) {
    /* Count replacements: each U+FFFD written where the input had none. */
    const char *r = lua_tostring(L, -1);
    for (i = 0; i + 2 < o; i++)
      if ((unsigned char)r[i] == 0xEF && (unsigned char)r[i + 1] == 0xBF &&
          (unsigned char)r[i + 2] == 0xBD)
        bad++;
  }
  lua_pushinteger(L, (lua_Integer)bad);
  return 2;
}

/* text.valid(s) -> true when s is valid UTF-8 */
static int
text_valid(lua_State *L)
{
  size_t n, o;
  const char *s = luaL_checklstring(L, 1, &n);
  char *out = malloc(3 * n + 1);
  if (!out)
    return luaL_error(L, "out of memory");
  o = sbx_utf8_sanitize(s, n, out, 1, NULL);
  lua_pushboolean(L, o == n && memcmp(out, s, n) == 0);
  free(out);
  return 1;
}

/* text.head_cut(s) -> s without an incomplete character at its end, dropped */
static int
text_head_cut(lua_State *L)
{
  size_t n, k;
  const char *s = luaL_checklstring(L, 1, &n);
  k = sbx_utf8_incomplete_suffix(s, n);
  lua_pushlstring(L, s, n - k);
  lua_pushinteger(L, (lua_Integer)k);
  return 2;
}

/* text.tail_cut(s) -> s without continuation bytes at its start, dropped */
static int
text_tail_cut(lua_State *L)
{
  size_t n, k;
  const char *s = luaL_checklstring(L, 1, &n);
  k = sbx_utf8_lead_continuations(s, n);
  lua_pushlstring(L, s + k, n - k);
  lua_pushinteger(L, (lua_Integer)k);
  return 2;
}

static const luaL_Reg text_funcs[] = {
  { "sanitize", text_sanitize },
  { "valid", text_valid },
  { "head_cut", text_head_cut },
  { "tail_cut", text_tail_cut },
  { NULL, NULL }
};

int
sbx_open_text(lua_State *L)
{
  luaL_newlib(L, text_funcs);
  return 1;
}

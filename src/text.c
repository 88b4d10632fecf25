/*
** Text hygiene for what a model or a JSON document will read: invalid UTF-8
** becomes U+FFFD, and cut points never split a character.
*/
#include "fail.h"
#include "modules.h"
#include "capture.h"

/*
** text.sanitize(s) -> s as valid UTF-8, and the number of U+FFFD written
** for invalid bytes (one per maximal invalid subsequence; a U+FFFD that s
** already had is not counted)
*/
static int
text_sanitize(lua_State *L)
{
  size_t n, o, bad;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, 3 * n + 1);
  o = sbx_utf8_repair(s, n, out, 1, NULL, &bad);
  luaL_pushresultsize(&b, o);
  lua_pushinteger(L, (lua_Integer)bad);
  return 2;
}

/* text.valid(s) -> true when s is valid UTF-8 */
static int
text_valid(lua_State *L)
{
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  lua_pushboolean(L, sbx_utf8_valid_prefix(s, n) == n);
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

static const luaL_Reg text_funcs[] = { { "sanitize", text_sanitize },
                                       { "valid", text_valid },
                                       { "head_cut", text_head_cut },
                                       { "tail_cut", text_tail_cut },
                                       { NULL, NULL } };

int
sbx_open_text(lua_State *L)
{
  luaL_newlib(L, text_funcs);
  return 1;
}

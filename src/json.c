/*
** JSON <-> Lua through cJSON, with a depth limit, a null sentinel and
** explicit array/object marks for the cases a Lua table cannot tell apart.
** Strings are encoded as valid UTF-8 whatever bytes they hold, so command
** output never produces invalid JSON downstream.
**
** Object keys come out sorted (deterministic output), except that keys named
** in the metatable field __jsonorder come first, in that order.
*/
#define _GNU_SOURCE
#include "fail.h"
#include "modules.h"
#include "capture.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define JSON_MAX_DEPTH 200
static const char ARRAY_MT_KEY = 'a';
static const char OBJECT_MT_KEY = 'o';

static void
push_mark(lua_State *L, const void *key, const char *kind)
{
  lua_rawgetp(L, LUA_REGISTRYINDEX, key);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_createtable(L, 0, 1);
    lua_pushstring(L, kind);
    lua_setfield(L, -2, "__jsontype");
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, key);
  }
}

static cJSON *to_json(lua_State *L, int idx, int depth, const char **err);

static int
is_array(lua_State *L, int idx, size_t *len)
{
  const char *kind = NULL;
  size_t n = 0;
  if (luaL_getmetafield(L, idx, "__jsontype") != LUA_TNIL) {
    kind = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  if (kind && strcmp(kind, "object") == 0)
    return 0;
  /* An array: keys exactly 1..n. */
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1) {
      lua_pop(L, 1);
      return 0;
    }
    n++;
  }
  if (n != lua_rawlen(L, idx))
    return 0;
  if (n == 0 && !(kind && strcmp(kind, "array") == 0))
    return 0;
  *len = n;
  return 1;
}

static cJSON *
string_to_json(lua_State *L, int idx)
{
  size_t n, rest, o;
  const char *s = lua_tolstring(L, idx, &n);
  char *buf;
  cJSON *j;
  buf = malloc(3 * n + 1);
  if (!buf)
    return NULL;
  o = sbx_utf8_sanitize(s, n, buf, 1, &rest);
  buf[o] = '\0';
  /* An embedded NUL would end the C string early: escape it ourselves. */
  if (memchr(buf, '\0', o)) {
    size_t i, k = 0;
    char *b2 = malloc(o * 6 + 1);
    if (!b2) {
      free(buf);
      return NULL;
    }
    for (i = 0; i < o; i++) {
      if (buf[i] == '\0') {
        memcpy(b2 + k, "\xEF\xBF\xBD", 3);
        k += 3;
      }
      else
        b2[k++] = buf[i];
    }
    b2[k] = '\0';
    free(buf);
    buf = b2;
  }
  j = cJSON_CreateString(buf);
  free(buf);
  return j;
}

struct keyref {
  const char *key;
  int order;
};

static int
cmp_keys(const void *a, const void *b)
{
  const struct keyref *x = a, *y = b;
  if (x->order != y->order)
    return x->order - y->order;
  return strcmp(x->key, y->key);
}

static cJSON *
table_to_json(lua_State *L, int idx, int depth, const char **err)
{
  size_t n, i, count = 0;
  cJSON *out;
  struct keyref *keys;
  if (is_array(L, idx, &n)) {
    out = cJSON_CreateArray();
    for (i = 1; out && i <= n; i++) {
      cJSON *item;
      lua_rawgeti(L, idx, (lua_Integer)i);
      item = to_json(L, lua_gettop(L), depth + 1, err);
      lua_pop(L, 1);
      if (!item) {
        cJSON_Delete(out);
        return NULL;
      }
      cJSON_AddItemToArray(out, item);
    }
    return out;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING && !lua_isinteger(L, -1)) {
      lua_pop(L, 1);
      *err = "object keys must be strings or integers";
      return NULL;
    }
    count++;
  }
  keys = calloc(count ? count : 1, sizeof *keys);
  out = cJSON_CreateObject();
  if (!keys || !out) {
    free(keys);
    cJSON_Delete(out);
    *err = "out of memory";
    return NULL;
  }
  /* Keys as strings; they stay alive in a scratch table. */
  lua_newtable(L); /* [scratch] */
  i = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    keys[i].key = lua_tostring(L, -1); /* converts integer copies */
    keys[i].order = 1 << 30;
    lua_rawseti(L, -3, (lua_Integer)(i + 1));
    i++;
  }
  int ordt = luaL_getmetafield(L, idx, "__jsonorder");
  if (ordt == LUA_TTABLE) {
    size_t m = lua_rawlen(L, -1), k;
    for (k = 1; k <= m; k++) {
      lua_rawgeti(L, -1, (lua_Integer)k);
      if (lua_type(L, -1) == LUA_TSTRING) {
        const char *name = lua_tostring(L, -1);
        for (i = 0; i < count; i++)
          if (strcmp(keys[i].key, name) == 0)
            keys[i].order = (int)k;
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  else if (ordt != LUA_TNIL)
    lua_pop(L, 1);
  qsort(keys, count, sizeof *keys, cmp_keys);
  for (i = 0; i < count; i++) {
    cJSON *item;
    lua_pushstring(L, keys[i].key);
    if (lua_rawget(L, idx) == LUA_TNIL) {
      /* An integer key: look it up as a number. */
      lua_pop(L, 1);
      lua_pushstring(L, keys[i].key);
      lua_pushinteger(L, lua_tointeger(L, -1));
      lua_remove(L, -2);
      lua_rawget(L, idx);
    }
    item = to_json(L, lua_gettop(L), depth + 1, err);
    lua_pop(L, 1);
    if (!item) {
      cJSON_Delete(out);
      free(keys);
      lua_pop(L, 1);
      return NULL;
    }
    cJSON_AddItemToObject(out, keys[i].key, item);
  }
  lua_pop(L, 1); /* [] */
  free(keys);
  return out;
}

static cJSON *
to_json(lua_State *L, int idx, int depth, const char **err)
{
  if (depth > JSON_MAX_DEPTH) {
    *err = "nested too deeply (or a cycle)";
    return NULL;
  }
  luaL_checkstack(L, 8, "json encode");
  switch (lua_type(L, idx)) {
  case LUA_TNIL:
    return cJSON_CreateNull();
  case LUA_TBOOLEAN:
    return cJSON_CreateBool(lua_toboolean(L, idx));
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) {
      char buf[32];
      snprintf(buf, sizeof buf, LUA_INTEGER_FMT, lua_tointeger(L, idx));
      return cJSON_CreateRaw(buf);
    }
    else {
      double d = lua_tonumber(L, idx);
      if (isnan(d) || isinf(d))
        return cJSON_CreateNull();
      char buf[40];
      int prec;
      if (d == floor(d) && fabs(d) < 1e15) {
        snprintf(buf, sizeof buf, "%.1f", d);
        return cJSON_CreateRaw(buf);
      }
      /* The shortest text that reads back as the same double (cJSON's own
      ** printer accepts a nearby value and loses the last digits). */
      for (prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
          break;
      }
      return cJSON_CreateRaw(buf);
    }
  case LUA_TSTRING:
    return string_to_json(L, idx);
  case LUA_TTABLE:
    return table_to_json(L, idx, depth, err);
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) == NULL)
      return cJSON_CreateNull();
    /* fall through */
  default:
    *err = lua_pushfstring(L, "cannot encode a %s", luaL_typename(L, idx));
    lua_pop(L, 1);
    return NULL;
  }
}

/* json.encode(value) -> string. Raises on values JSON cannot hold. */
static int
json_encode(lua_State *L)
{
  const char *err = "out of memory";
  cJSON *j;
  char *s;
  luaL_checkany(L, 1);
  lua_settop(L, 1);
  j = to_json(L, 1, 0, &err);
  if (!j)
    return luaL_error(L, "json.encode: %s", err);
  s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!s)
    return luaL_error(L, "json.encode: out of memory");
  lua_pushstring(L, s);
  cJSON_free(s);
  return 1;
}

/*
** cJSON ends its strings at a NUL byte, so a "\u0000" escape would cut a
** string short without a word. Before parsing, each such escape is
** rewritten in place to "\uFFFF" (the same length), which the text must
** not hold already, and decoded strings turn U+FFFF back into NUL.
** Returns how many escapes were rewritten, or -1 when the text holds both.
*/
#define NUL_STANDIN "\xEF\xBF\xBF" /* U+FFFF in UTF-8 */

static long
rewrite_nul_escapes(char *s, size_t n)
{
  long nul = 0;
  int standin = memmem(s, n, NUL_STANDIN, 3) != NULL, in_str = 0;
  size_t i;
  for (i = 0; i < n; i++) {
    if (!in_str) {
      in_str = s[i] == '"';
      continue;
    }
    if (s[i] == '"')
      in_str = 0;
    else if (s[i] == '\\' && i + 1 < n) {
      if (s[i + 1] == 'u' && i + 5 < n) {
        if (strncmp(s + i + 2, "0000", 4) == 0) {
          memcpy(s + i + 2, "FFFF", 4);
          nul++;
        }
        else if (strncasecmp(s + i + 2, "ffff", 4) == 0)
          standin = 1;
        i += 5;
      }
      else
        i++;
    }
  }
  return nul && standin ? -1 : nul;
}

/* Pushes a decoded string; with nul set, U+FFFF stands for a NUL byte. */
static void
push_decoded(lua_State *L, const char *s, int nul)
{
  luaL_Buffer b;
  const char *p;
  if (!nul || (p = strstr(s, NUL_STANDIN)) == NULL) {
    lua_pushstring(L, s);
    return;
  }
  luaL_buffinit(L, &b);
  do {
    luaL_addlstring(&b, s, (size_t)(p - s));
    luaL_addchar(&b, '\0');
    s = p + 3;
  } while ((p = strstr(s, NUL_STANDIN)) != NULL);
  luaL_addstring(&b, s);
  luaL_pushresult(&b);
}

static int
from_json(lua_State *L, const cJSON *j, int depth, int nul)
{
  const cJSON *c;
  lua_Integer i = 1;
  if (depth > JSON_MAX_DEPTH)
    return -1;
  luaL_checkstack(L, 4, "json decode");
  if (cJSON_IsNull(j))
    lua_pushlightuserdata(L, NULL);
  else if (cJSON_IsFalse(j))
    lua_pushboolean(L, 0);
  else if (cJSON_IsTrue(j))
    lua_pushboolean(L, 1);
  else if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (d == floor(d) && fabs(d) < 9.2e18)
      lua_pushinteger(L, (lua_Integer)d);
    else
      lua_pushnumber(L, d);
  }
  else if (cJSON_IsString(j))
    push_decoded(L, j->valuestring, nul);
  else if (cJSON_IsArray(j)) {
    lua_createtable(L, cJSON_GetArraySize(j), 0);
    push_mark(L, &ARRAY_MT_KEY, "array");
    lua_setmetatable(L, -2);
    cJSON_ArrayForEach(c, j)
    {
      if (from_json(L, c, depth + 1, nul) < 0)
        return -1;
      lua_rawseti(L, -2, i++);
    }
  }
  else if (cJSON_IsObject(j)) {
    lua_newtable(L);
    push_mark(L, &OBJECT_MT_KEY, "object");
    lua_setmetatable(L, -2);
    cJSON_ArrayForEach(c, j)
    {
      push_decoded(L, c->string, nul); /* [t, key] */
      if (from_json(L, c, depth + 1, nul) < 0)
        return -1;
      lua_rawset(L, -3); /* [t] */
    }
  }
  else
    lua_pushnil(L);
  return 0;
}

/* json.decode(s) -> value | nil, message, "json". null decodes to json.null. */
static int
json_decode(lua_State *L)
{
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  const char *end = NULL;
  cJSON *j;
  int top = lua_gettop(L);
  long nul = 0;
  if (memmem(s, n, "\\u0000", 6)) {
    /* A copy to rewrite, owned by the stack: freed even if a push raises. */
    char *copy = lua_newuserdatauv(L, n ? n : 1, 0);
    memcpy(copy, s, n);
    nul = rewrite_nul_escapes(copy, n);
    if (nul < 0)
      return sbx_pushfail(L, "json",
                          "a JSON text with both \\u0000 and U+FFFF in its strings is not supported");
    s = copy;
  }
  j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
  if (!j) {
    size_t at = end ? (size_t)(end - s) : 0;
    return sbx_pushfail(L, "json", "invalid JSON near byte %d", (int)at);
  }
  if (from_json(L, j, 0, nul > 0) < 0) {
    cJSON_Delete(j);
    lua_settop(L, top);
    return sbx_pushfail(L, "json", "JSON nested deeper than %d levels", JSON_MAX_DEPTH);
  }
  cJSON_Delete(j);
  return 1;
}

/* json.array(t) / json.object(t): marks t so an empty table keeps its kind. */
static int
json_array(lua_State *L)
{
  if (lua_isnone(L, 1))
    lua_newtable(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  push_mark(L, &ARRAY_MT_KEY, "array");
  lua_setmetatable(L, 1);
  return 1;
}

static int
json_object(lua_State *L)
{
  if (lua_isnone(L, 1))
    lua_newtable(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  push_mark(L, &OBJECT_MT_KEY, "object");
  lua_setmetatable(L, 1);
  return 1;
}

static const luaL_Reg json_funcs[] = { { "encode", json_encode },
                                       { "decode", json_decode },
                                       { "array", json_array },
                                       { "object", json_object },
                                       { NULL, NULL } };

int
sbx_open_json(lua_State *L)
{
  luaL_newlib(L, json_funcs);
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  return 1;
}

/*
** core.tar: a task's outputs, checked on the host before a check box sees
** them (the codec is tar.c). The limits come from Lua (policy.grade); the
** work is synchronous and bounded by the input, which the caller already
** bounded when it read it.
*/
#include "fail.h"
#include "modules.h"
#include "tar.h"

#include <stdlib.h>
#include <string.h>

#define TARBUF_MT "sbx.tar.buffer"

/* A malloc'd block owned by a userdata, so a raise (out of memory while
** pushing the result) frees it (lauxlib's UBox). */
struct tarbuf {
  void *p;
};

static int
tarbuf_gc(lua_State *L)
{
  struct tarbuf *b = luaL_checkudata(L, 1, TARBUF_MT);
  void *p = b->p;
  b->p = NULL;
  free(p);
  return 0;
}

static const char *
code_name(int rc)
{
  switch (rc) {
  case SBX_TAR_MALFORMED:
    return "malformed";
  case SBX_TAR_OUTSIDE:
    return "outside";
  case SBX_TAR_LINK:
    return "link";
  case SBX_TAR_TYPE:
    return "type";
  case SBX_TAR_TOO_LARGE:
    return "too_large";
  default:
    return "nomem";
  }
}

static uint64_t
limit_field(lua_State *L, int idx, const char *name)
{
  lua_Integer v = 0;
  lua_getfield(L, idx, name);
  if (!lua_isinteger(L, -1) || (v = lua_tointeger(L, -1)) < 0)
    luaL_error(L, "limits.%s must be an integer >= 0", name);
  lua_pop(L, 1);
  return (uint64_t)v;
}

/*
** core.tar.filter(data, roots, limits) -> clean_archive, entries |
** nil, message, code. roots: a list of clean relative paths ("work/out");
** limits: { max_bytes, max_entries, max_path }. code: "malformed",
** "outside", "link", "type", "too_large" or "nomem". Raises on misuse.
*/
static int
tar_filter(lua_State *L)
{
  size_t inlen, nroots, i, outlen = 0;
  const char *in = luaL_checklstring(L, 1, &inlen);
  const char **roots;
  struct sbx_tar_limits lim;
  struct tarbuf *box;
  uint64_t entries = 0;
  char err[512];
  int rc;
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  lim.max_bytes = limit_field(L, 3, "max_bytes");
  lim.max_entries = limit_field(L, 3, "max_entries");
  lim.max_path = (size_t)limit_field(L, 3, "max_path");
  if (lim.max_path == 0 || lim.max_path > 65536)
    return luaL_argerror(L, 3, "max_path must be 1..65536");
  nroots = lua_rawlen(L, 2);
  if (nroots == 0)
    return luaL_argerror(L, 2, "no output paths");
  roots = lua_newuserdatauv(L, nroots * sizeof *roots, 0); /* [.., roots] */
  for (i = 0; i < nroots; i++) {
    const char *s;
    if (lua_rawgeti(L, 2, (lua_Integer)i + 1) != LUA_TSTRING)
      return luaL_argerror(L, 2, "output paths must be relative, clean strings");
    s = lua_tostring(L, -1);
    if (!*s || s[0] == '/')
      return luaL_argerror(L, 2, "output paths must be relative, clean strings");
    roots[i] = s; /* anchored by the roots table */
    lua_pop(L, 1);
  }
  box = lua_newuserdatauv(L, sizeof *box, 0); /* [.., roots, box] */
  box->p = NULL;
  luaL_setmetatable(L, TARBUF_MT);
  rc = sbx_tar_filter(in, inlen, roots, nroots, &lim, &box->p, &outlen, &entries, err, sizeof err);
  if (rc != SBX_TAR_OK)
    return sbx_pushfail(L, code_name(rc), "%s", err);
  lua_pushlstring(L, box->p ? box->p : "", outlen);
  free(box->p); /* now, not at the next collection */
  box->p = NULL;
  lua_pushinteger(L, (lua_Integer)entries);
  return 2;
}

static const luaL_Reg tar_funcs[] = {
  { "filter", tar_filter },
  { NULL, NULL },
};

static const luaL_Reg tarbuf_meta[] = {
  { "__gc", tarbuf_gc },
  { "__close", tarbuf_gc },
  { NULL, NULL },
};

int
sbx_open_tar(lua_State *L)
{
  luaL_newmetatable(L, TARBUF_MT);
  luaL_setfuncs(L, tarbuf_meta, 0);
  lua_pop(L, 1);
  luaL_newlib(L, tar_funcs);
  return 1;
}

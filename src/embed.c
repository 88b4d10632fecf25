/*
** Module loading: the sbx Lua modules are compiled into the binary (see
** scripts/embed.lua) and found by a searcher placed right after
** package.preload. When SBX_LUA_DIR is set, a file there wins over the
** embedded copy, so a team can override any module without rebuilding.
*/
#include "host.h"
#include "sbx.h"

#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sbx_blob {
  const char *name, *path;
  const char *src;
  size_t len;
};
extern const struct sbx_blob sbx_blobs[];

static int
load_from_dir(lua_State *L, const char *dir, const char *name)
{
  char path[4096];
  char rel[1024];
  size_t i;
  FILE *f;
  snprintf(rel, sizeof rel, "%s", name);
  for (i = 0; rel[i]; i++)
    if (rel[i] == '.')
      rel[i] = '/';
  snprintf(path, sizeof path, "%s/%s.lua", dir, rel);
  f = fopen(path, "r");
  if (!f) {
    snprintf(path, sizeof path, "%s/%s/init.lua", dir, rel);
    f = fopen(path, "r");
  }
  if (!f)
    return 0;
  fclose(f);
  if (luaL_loadfilex(L, path, "t") != LUA_OK)
    return lua_error(L);
  lua_pushstring(L, path);
  return 2;
}

/* A package.searchers entry: returns a loader for an embedded module. */
static int
embedded_searcher(lua_State *L)
{
  const char *name = luaL_checkstring(L, 1);
  const char *dir = getenv("SBX_LUA_DIR");
  const struct sbx_blob *b;
  if (dir && *dir) {
    int n = load_from_dir(L, dir, name);
    if (n)
      return n;
  }
  for (b = sbx_blobs; b->name; b++) {
    if (strcmp(b->name, name) == 0) {
      if (luaL_loadbufferx(L, b->src, b->len, b->path, "t") != LUA_OK)
        return lua_error(L);
      lua_pushstring(L, b->path + 1);
      return 2;
    }
  }
  lua_pushfstring(L, "no embedded sbx module '%s'", name);
  return 1;
}

void
sbx_preload(lua_State *L)
{
  int n;
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_sbx_core);
  lua_setfield(L, -2, "sbx.core");
  lua_pop(L, 1);
  /* Insert the searcher at position 2 (after preload) once. */
  lua_getglobal(L, "package");
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  lua_getfield(L, -1, "searchers");
  lua_getfield(L, -2, "sbx_searcher_installed");
  if (lua_toboolean(L, -1) || !lua_istable(L, -2)) {
    lua_pop(L, 3);
    return;
  }
  lua_pop(L, 1);
  n = (int)lua_rawlen(L, -1);
  for (; n >= 2; n--) {
    lua_rawgeti(L, -1, n);
    lua_rawseti(L, -2, n + 1);
  }
  lua_pushcfunction(L, embedded_searcher);
  lua_rawseti(L, -2, 2);
  lua_pop(L, 1);
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "sbx_searcher_installed");
  lua_pop(L, 1);
}

/* require "sbx" from a stock interpreter lands here (sbx.so). */
int
luaopen_sbx(lua_State *L)
{
  sbx_preload(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "sbx");
  lua_call(L, 1, 1);
  /* Make later require "sbx" calls return the same table. */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, "sbx");
  lua_pop(L, 1);
  return 1;
}

static int
msghandler(lua_State *L)
{
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int
report(lua_State *L, int status)
{
  if (status != LUA_OK) {
    fprintf(stderr, "sbx: %s\n", lua_tostring(L, -1));
    fflush(stderr);
    lua_pop(L, 1);
    return 1;
  }
  return 0;
}

static int
pcall_traced(lua_State *L, int nargs, int nres)
{
  int base = lua_gettop(L) - nargs;
  int st;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  st = lua_pcall(L, nargs, nres, base);
  lua_remove(L, base);
  return st;
}

/* Runs sbx.core.drain() so tasks spawned by the chunk finish. */
static int
drain(lua_State *L)
{
  int st;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "sbx");
  st = pcall_traced(L, 1, 1);
  if (st != LUA_OK)
    return report(L, st);
  lua_getfield(L, -1, "drain");
  lua_remove(L, -2);
  return report(L, pcall_traced(L, 0, 0));
}

lua_State *
sbx_new(void)
{
  lua_State *L = luaL_newstate();
  if (!L)
    return NULL;
  luaL_openlibs(L);
  sbx_preload(L);
  return L;
}

int
sbx_dofile(lua_State *L, const char *path, int argc, char **argv)
{
  int i, st;
  lua_createtable(L, argc, 1);
  lua_pushstring(L, path);
  lua_rawseti(L, -2, 0);
  for (i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setglobal(L, "arg");
  st = luaL_loadfilex(L, path, "t");
  if (st != LUA_OK)
    return report(L, st);
  for (i = 0; i < argc; i++)
    lua_pushstring(L, argv[i]);
  st = pcall_traced(L, argc, 0);
  if (report(L, st))
    return 1;
  return drain(L);
}

int
sbx_dostring(lua_State *L, const char *chunk, const char *name)
{
  int st = luaL_loadbufferx(L, chunk, strlen(chunk), name, "t");
  if (st != LUA_OK)
    return report(L, st);
  st = pcall_traced(L, 0, 0);
  if (report(L, st))
    return 1;
  return drain(L);
}

void
sbx_close(lua_State *L)
{
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_getfield(L, -1, "sbx");
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "shutdown");
    if (lua_isfunction(L, -1))
      report(L, pcall_traced(L, 0, 0));
    else
      lua_pop(L, 1);
  }
  lua_pop(L, 2);
  lua_close(L);
}

/*
** sbx: the embedding API. A C program links libsbx, makes a state with
** sbx_new, runs Lua with sbx_dofile/sbx_dostring (the loop is driven until
** every task has finished) and ends with sbx_close, which removes every box
** the state still owns.
*/
#ifndef SBX_H
#define SBX_H

#include <lua.h>

#define SBX_VERSION "0.1.0"

/* A new Lua state with the standard libraries and the sbx modules
** preloaded (require "sbx" works). NULL when out of memory. */
lua_State *sbx_new(void);

/* Makes the sbx modules loadable in an existing state (package.preload).
** luaopen_sbx does this and returns the sbx module. */
void sbx_preload(lua_State *L);

/* Runs a file (or a string) with arg = {[0]=path, ...}, then drives the loop
** until all tasks finish. Returns 0, or 1 with the error printed to stderr. */
int sbx_dofile(lua_State *L, const char *path, int argc, char **argv);
int sbx_dostring(lua_State *L, const char *chunk, const char *name);

/* Closes boxes still open and frees the state. */
void sbx_close(lua_State *L);

int luaopen_sbx(lua_State *L);
int luaopen_sbx_core(lua_State *L);

#endif

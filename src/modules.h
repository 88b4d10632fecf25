/*
** The C modules of sbx.core (the table that assembles them: core.c). Each
** pushes its table; none needs the others.
*/
#ifndef SBX_MODULES_H
#define SBX_MODULES_H

#include <lua.h>
#include <lauxlib.h>

int sbx_open_http(lua_State *L);
int sbx_open_json(lua_State *L);
int sbx_open_stream(lua_State *L);
int sbx_open_text(lua_State *L);
int sbx_open_sigv4(lua_State *L);
int sbx_open_ssm(lua_State *L);
int sbx_open_lines(lua_State *L);
int sbx_open_ws(lua_State *L);
int sbx_open_proc(lua_State *L);
int sbx_open_agent(lua_State *L);
int sbx_open_layer(lua_State *L);
int sbx_open_sandbox(lua_State *L);
int sbx_open_tar(lua_State *L);
int sbx_open_random(lua_State *L);

#endif

/*
** The one shape of an environmental failure for Lua: nil, message, code
** (code a stable short string: "timeout", "closed", ...). Misuse raises
** instead. Pure code uses this without knowing the scheduler.
*/
#ifndef SBX_FAIL_H
#define SBX_FAIL_H

#include <lua.h>

/* Pushes nil, message, code and returns 3. */
int sbx_pushfail(lua_State *L, const char *code, const char *fmt, ...);

#endif

/*
** require "sbx.core": the scheduler's table (host.c) and every C module in
** it, by name. Adding a module is a line in this table; the scheduler is
** not touched.
*/
#include "host.h"
#include "modules.h"
#include "sbx.h"

#ifndef SBX_COMMIT
#define SBX_COMMIT "unknown"
#endif

static const struct {
  const char *name;
  lua_CFunction open;
} modules[] = {
  { "http", sbx_open_http },   { "json", sbx_open_json },     { "stream", sbx_open_stream },
  { "text", sbx_open_text },   { "sigv4", sbx_open_sigv4 },   { "ssm", sbx_open_ssm },
  { "lines", sbx_open_lines }, { "ws", sbx_open_ws },         { "proc", sbx_open_proc },
  { "agent", sbx_open_agent }, { "layer", sbx_open_layer },   { "sandbox", sbx_open_sandbox },
  { "tar", sbx_open_tar },     { "random", sbx_open_random }, { NULL, NULL },
};

int
luaopen_sbx_core(lua_State *L)
{
  int i;
  sbx_open_host(L); /* [core] */
  for (i = 0; modules[i].name; i++) {
    modules[i].open(L); /* [core, module] */
    lua_setfield(L, -2, modules[i].name);
  }
  lua_pushstring(L, SBX_VERSION);
  lua_setfield(L, -2, "version");
  lua_pushstring(L, SBX_COMMIT);
  lua_setfield(L, -2, "commit");
  return 1;
}

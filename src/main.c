/*
** The sbx command: a Lua host whose command line lives in lua/sbx/cli.lua.
** main only builds the state and hands over argv; the exit status comes
** back from cli.main.
*/
#include "init.h"
#include "sbx.h"

#include <lauxlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* Does nothing: its only job is that a write to a closed pipe fails with
** EPIPE (which cli.lua turns into an interruption that removes the boxes)
** instead of killing sbx with its boxes still running. A handler rather
** than SIG_IGN because exec resets a handler to the default but passes
** SIG_IGN on: a command started with io.popen or os.execute still gets the
** usual SIGPIPE. */
static void
on_sigpipe(int signum)
{
  (void)signum;
}

static int
pmain(lua_State *L)
{
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  int i;
  /* SIGINT and SIGTERM are taken before anything else loads: a signal that
  ** comes while the command line's modules load must still end the run and
  ** its boxes (a job started from sh ignores SIGINT until a handler is
  ** set, so one sent that early would otherwise be lost). */
  lua_getglobal(L, "require");
  lua_pushliteral(L, "sbx.core");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "handle_signals");
  lua_call(L, 0, 0);
  lua_pop(L, 1);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "sbx.cli");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "main");
  lua_createtable(L, argc, 0);
  for (i = 1; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  lua_call(L, 1, 1);
  return 1;
}

int
main(int argc, char **argv)
{
  lua_State *L;
  int status, code = 1;
  struct sigaction sa;
  sbx_init(); /* as PID 1: an init that reaps and forwards, then sbx */
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigpipe;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPIPE, &sa, NULL);
  L = sbx_new();
  if (!L) {
    fprintf(stderr, "sbx: out of memory\n");
    return 1;
  }
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  status = lua_pcall(L, 2, 1, 0);
  if (status != LUA_OK)
    fprintf(stderr, "sbx: %s\n", lua_tostring(L, -1));
  else
    code = (int)luaL_optinteger(L, -1, 0);
  lua_pop(L, 1);
  sbx_close(L);
  return code;
}

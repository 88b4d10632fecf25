/*
** Host processes: signals to processes by pid, for the targeted kill of a
** box's runaway tree from the host when the box itself cannot fork (its
** pids limit is full). Only what the kill needs; policy (which pids, which
** signals, in which order) stays in Lua.
*/
#include "host.h"
#include "modules.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/types.h>

static const struct {
  const char *name;
  int sig;
} signals[] = {
  { "KILL", SIGKILL }, { "STOP", SIGSTOP }, { "CONT", SIGCONT }, { "TERM", SIGTERM },
  { "INT", SIGINT },   { "HUP", SIGHUP },   { "QUIT", SIGQUIT }, { NULL, 0 },
};

/*
** proc.signal(pid, name) -> true | nil, message, code. name: KILL, STOP,
** CONT, TERM, INT, HUP, QUIT (with or without "SIG"). A pid <= 1 is a
** contract error: never a process group, never init.
*/
static int
proc_signal(lua_State *L)
{
  lua_Integer pid = luaL_checkinteger(L, 1);
  const char *name = luaL_checkstring(L, 2);
  int i;
  if (pid <= 1)
    return luaL_argerror(L, 1, "a process id above 1");
  if (strncmp(name, "SIG", 3) == 0)
    name += 3;
  for (i = 0; signals[i].name; i++) {
    if (strcmp(signals[i].name, name) == 0)
      break;
  }
  if (!signals[i].name)
    return luaL_argerror(L, 2, "KILL, STOP, CONT, TERM, INT, HUP or QUIT");
  if (kill((pid_t)pid, signals[i].sig) != 0) {
    int e = errno;
    return sbx_pushfail(L, e == ESRCH ? "ESRCH" : e == EPERM ? "EPERM" : "error",
                        "cannot signal process %d: %s", (int)pid, strerror(e));
  }
  lua_pushboolean(L, 1);
  return 1;
}

static const luaL_Reg proc_funcs[] = {
  { "signal", proc_signal },
  { NULL, NULL }
};

int
sbx_open_proc(lua_State *L)
{
  luaL_newlib(L, proc_funcs);
  return 1;
}

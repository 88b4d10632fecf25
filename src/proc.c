/*
** Host processes. proc.signal: signals to processes by pid, for the
** targeted kill of a box's runaway tree from the host when the box itself
** cannot fork (its pids limit is full). proc.spawn: a process started on
** the shared loop whose pipes are an sbx.stream (stream.c), so that its
** stdin and stdout behave as any channel does (a local box's agent channel:
** sbx-launch, then bubblewrap, then sbx-agent, all one process chain).
** Only the mechanism; which programs, arguments and signals is Lua's.
**
** Processes start with posix_spawn, which glibc runs as a vfork (no copy
** of sbx's page tables: a box costs one less fork of sbx), and their end
** is a pidfd the loop polls (Linux >= 5.4), reaped with waitid: only this
** process's own children, so libuv's children are left to libuv.
*/
#define _GNU_SOURCE
#include "host.h"
#include "modules.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

extern char **environ;

#define PROCESS_MT "sbx.process"
#define MAX_FD 64

static const struct {
  const char *name;
  int sig;
} signals[] = {
  { "KILL", SIGKILL }, { "STOP", SIGSTOP }, { "CONT", SIGCONT }, { "TERM", SIGTERM }, { "INT", SIGINT },
  { "HUP", SIGHUP },   { "QUIT", SIGQUIT }, { "USR1", SIGUSR1 }, { "USR2", SIGUSR2 }, { NULL, 0 },
};

/* The signal at arg: a name (with or without "SIG") or a number. Raises. */
static int
check_signal(lua_State *L, int arg)
{
  const char *name;
  int i;
  if (lua_type(L, arg) == LUA_TNUMBER) {
    lua_Integer n = luaL_checkinteger(L, arg);
    luaL_argcheck(L, n > 0 && n < 65, arg, "a signal number 1-64");
    return (int)n;
  }
  name = luaL_checkstring(L, arg);
  if (strncmp(name, "SIG", 3) == 0)
    name += 3;
  for (i = 0; signals[i].name; i++) {
    if (strcmp(signals[i].name, name) == 0)
      return signals[i].sig;
  }
  return luaL_argerror(L, arg, "KILL, STOP, CONT, TERM, INT, HUP, QUIT, USR1, USR2 or a number");
}

/*
** proc.signal(pid, name) -> true | nil, message, code. name: KILL, STOP,
** CONT, TERM, INT, HUP, QUIT (with or without "SIG"). A pid <= 1 is a
** contract error: never a process group, never init.
*/
static int
proc_signal(lua_State *L)
{
  lua_Integer pid = luaL_checkinteger(L, 1);
  int sig;
  if (pid <= 1)
    return luaL_argerror(L, 1, "a process id above 1");
  sig = check_signal(L, 2);
  if (kill((pid_t)pid, sig) != 0) {
    int e = errno;
    return sbx_pushfail(L,
                        e == ESRCH   ? "ESRCH"
                        : e == EPERM ? "EPERM"
                                     : "error",
                        "cannot signal process %d: %s", (int)pid, strerror(e));
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* Spawned processes ------------------------------------------------------------ */

/*
** The C side outlives the userdata while the process runs: the loop must
** keep watching its pidfd until it has exited and been reaped, so the poll
** handle is closed only then, and the struct freed when both are done.
*/
struct process {
  uv_poll_t h; /* on the pidfd */
  struct sbx_host *host;
  int refs; /* the userdata, and the handle until closed */
  int pidfd;
  int pid;
  int exited;
  int64_t status;
  int term_signal;
  int close_kills;           /* close() and the collector end it */
  struct sbx_waiter *waiter; /* a :wait in progress */
};

struct process_ud {
  struct process *p;
};

static void
process_unref(struct process *p)
{
  if (--p->refs == 0)
    free(p);
}

static void
process_closed(uv_handle_t *h)
{
  process_unref(h->data);
}

/* The pidfd is readable: the process exited. Reap it, wake its waiter. */
static void
exit_cb(uv_poll_t *h, int status, int events)
{
  struct process *p = h->data;
  siginfo_t si;
  (void)status;
  (void)events;
  int r;
  memset(&si, 0, sizeof si);
  r = waitid((idtype_t)P_PIDFD, (id_t)p->pidfd, &si, WEXITED | WNOHANG);
  if ((r == 0 && si.si_pid == 0) || (r != 0 && (errno == EAGAIN || errno == EINTR)))
    return; /* not yet */
  p->exited = 1;
  if (r != 0)
    p->status = -1; /* reaped by someone else: no status to tell */
  else if (si.si_code == CLD_EXITED)
    p->status = si.si_status;
  else {
    p->term_signal = si.si_status;
    p->status = 128 + si.si_status;
  }
  if (p->waiter)
    sbx_wake(p->waiter); /* detach clears p->waiter */
  uv_poll_stop(h);
  uv_close((uv_handle_t *)h, process_closed);
  close(p->pidfd);
  p->pidfd = -1;
}

/* Sends sig to the process, through its pidfd while it is ours: 0 or an errno. */
static int
process_signal(struct process *p, int sig)
{
  if (p->exited)
    return ESRCH;
  if (pidfd_send_signal(p->pidfd, sig, NULL, 0) != 0)
    return errno;
  return 0;
}

static struct process *
check_process(lua_State *L)
{
  struct process_ud *ud = luaL_checkudata(L, 1, PROCESS_MT);
  if (!ud->p)
    luaL_error(L, "attempt to use a closed process");
  return ud->p;
}

/* fds of a spawn in the making, closed when it fails (or the parent's
** copies of the child's ends, once it started). */
struct fdset {
  int fd[3 * MAX_FD];
  int n;
};

static void
fdset_close(struct fdset *f)
{
  int i;
  for (i = 0; i < f->n; i++) {
    if (f->fd[i] >= 0)
      close(f->fd[i]);
  }
  f->n = 0;
}

static int
fdset_add(struct fdset *f, int fd)
{
  if (f->n < (int)(sizeof f->fd / sizeof *f->fd))
    f->fd[f->n++] = fd;
  return fd;
}

/* Strings of the list at index t as a NULL-terminated array whose memory
** belongs to a userdata left on the stack (freed by the collector, even
** when a later check raises). */
static char **
string_list(lua_State *L, int t, const char *what)
{
  lua_Integer n = luaL_len(L, t), i;
  char **v = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
  for (i = 1; i <= n; i++) {
    lua_geti(L, t, i);
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "%s[%d] must be a string", what, (int)i);
    v[i - 1] = (char *)lua_tostring(L, -1);
    lua_pop(L, 1); /* the table keeps the string alive */
  }
  v[n] = NULL;
  return v;
}

static int
opt_bool(lua_State *L, int t, const char *field, int dflt)
{
  int v;
  lua_getfield(L, t, field);
  v = lua_isnil(L, -1) ? dflt : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* A memfd holding bytes, at offset 0, or -1 (errno set). */
static int
memfd_with(const char *p, size_t n)
{
  int fd = memfd_create("sbx", MFD_CLOEXEC);
  size_t done = 0;
  if (fd < 0)
    return -1;
  while (done < n) {
    ssize_t w = write(fd, p + done, n - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    done += (size_t)w;
  }
  if (lseek(fd, 0, SEEK_SET) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/*
** proc.spawn{ argv, env, cwd, stdin, stdout, stderr, sync, files, capture,
**   chunks, chunk_limit } -> process, stream [, sync] | nil, message, code
**   argv    the program (a path, or a name looked up in env's PATH) and its
**           arguments
**   env     a list of "NAME=value"; nil: sbx's own environment
**   stdin   true: a pipe the stream writes (stream:write, close_stdin)
**   stdout, stderr  true (default): pipes into the stream's "stdout" and
**           "stderr"; false: /dev/null
**   sync    true: fd 3 is one end of a socket pair whose other end is the
**           third result, a stream of its own (write, wait, take)
**   files   { [fd] = bytes }: fd (4 to 63) is a memfd holding the bytes
**   close_kills  false: process:close() and the collector let it run (a
**           program that cleans up after itself when sbx goes); true by
**           default
**   capture, chunks, chunk_limit: the stream's, as core.stream.open's
** Never blocks. The process is not bound to sbx's life: a program that
** must die with sbx arranges it itself (sbx-launch does). It inherits
** what sbx holds without close-on-exec (a script's io.open files): a
** program that must not hold them closes them (sbx-launch does). A name
** without a slash is looked up in sbx's PATH. Misuse raises.
*/
static int
proc_spawn(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  int stdio[MAX_FD];
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  sigset_t none, all;
  pid_t pid;
  struct fdset child, parent;
  int in[2] = { -1, -1 }, out[2] = { -1, -1 }, err[2] = { -1, -1 }, sv[2] = { -1, -1 };
  int want_in, want_out, want_err, want_sync, nstdio = 3, i, rc;
  struct process_ud *ud;
  struct process *p;
  const char *cwd;
  char **argv, **env = NULL;
  int base;

  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  child.n = parent.n = 0;
  lua_getfield(L, 1, "argv"); /* [opts, argv] */
  luaL_argcheck(L, lua_istable(L, 2) && luaL_len(L, 2) > 0, 1, "argv must be a non-empty list");
  argv = string_list(L, 2, "argv"); /* [opts, argv, argv*] */
  lua_getfield(L, 1, "env");        /* [.., env] */
  if (!lua_isnil(L, 4)) {
    luaL_argcheck(L, lua_istable(L, 4), 1, "env must be a list of NAME=value");
    env = string_list(L, 4, "env"); /* [.., env, env*] */
  }
  else
    lua_pushnil(L);
  lua_getfield(L, 1, "cwd"); /* [.., cwd] */
  cwd = luaL_optstring(L, -1, NULL);
  want_in = opt_bool(L, 1, "stdin", 0);
  want_out = opt_bool(L, 1, "stdout", 1);
  want_err = opt_bool(L, 1, "stderr", 1);
  want_sync = opt_bool(L, 1, "sync", 0);
  lua_getfield(L, 1, "files"); /* [.., files] */
  luaL_argcheck(L, lua_isnil(L, -1) || lua_istable(L, -1), 1, "files must be a table fd = bytes");
  base = lua_gettop(L);

  for (i = 0; i < MAX_FD; i++)
    stdio[i] = -1;
  /* Pipes: the child's end inherited at 0, 1, 2; ours wrapped in the stream. */
  if ((want_in && uv_pipe(in, 0, 0) != 0) || (want_out && uv_pipe(out, 0, 0) != 0) ||
      (want_err && uv_pipe(err, 0, 0) != 0) ||
      (want_sync && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)) {
    int e = errno;
    for (i = 0; i < 2; i++) {
      if (in[i] >= 0)
        close(in[i]);
      if (out[i] >= 0)
        close(out[i]);
      if (err[i] >= 0)
        close(err[i]);
    }
    return sbx_pushfail(L, "EMFILE", "cannot make the process's pipes: %s", strerror(e));
  }
  if (want_in) {
    stdio[0] = fdset_add(&child, in[0]);
    fdset_add(&parent, in[1]);
  }
  if (want_out) {
    stdio[1] = fdset_add(&child, out[1]);
    fdset_add(&parent, out[0]);
  }
  if (want_err) {
    stdio[2] = fdset_add(&child, err[1]);
    fdset_add(&parent, err[0]);
  }
  if (want_sync) {
    stdio[3] = fdset_add(&child, sv[1]);
    fdset_add(&parent, sv[0]);
    nstdio = 4;
  }
  if (!lua_isnil(L, base)) {
    lua_pushnil(L);
    while (lua_next(L, base)) {
      lua_Integer fd = lua_isinteger(L, -2) ? lua_tointeger(L, -2) : -1;
      size_t n;
      const char *bytes;
      int mfd;
      if (fd < 4 || fd >= MAX_FD || lua_type(L, -1) != LUA_TSTRING) {
        fdset_close(&child);
        fdset_close(&parent);
        return luaL_argerror(L, 1, "files: keys are fds 4-63, values bytes");
      }
      bytes = lua_tolstring(L, -1, &n);
      mfd = memfd_with(bytes, n);
      if (mfd < 0) {
        int e = errno;
        fdset_close(&child);
        fdset_close(&parent);
        return sbx_pushfail(L, "EMFILE", "cannot make a file for fd %d: %s", (int)fd, strerror(e));
      }
      stdio[fd] = fdset_add(&child, mfd);
      if (fd + 1 > nstdio)
        nstdio = (int)fd + 1;
      lua_pop(L, 1);
    }
  }

  p = calloc(1, sizeof *p);
  if (!p) {
    fdset_close(&child);
    fdset_close(&parent);
    return luaL_error(L, "out of memory");
  }
  p->host = h;
  p->pidfd = -1;
  /* The child's fds: each wanted one dup2'ed into place (which clears its
  ** close-on-exec flag), /dev/null for a missing 0-2; every other fd of
  ** sbx's is close-on-exec already. The fds being dup2'ed from are all
  ** above the stdio range (pipes and sockets made after 0-2 exist), so an
  ** earlier dup2 never overwrites a later source... unless one is below
  ** nstdio: then it is moved up first. */
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  rc = 0;
  for (i = 0; i < nstdio && rc == 0; i++) {
    if (stdio[i] >= 0 && stdio[i] < nstdio) {
      int moved = fcntl(stdio[i], F_DUPFD_CLOEXEC, nstdio);
      if (moved < 0)
        rc = errno;
      else {
        fdset_add(&child, moved);
        stdio[i] = moved;
      }
    }
  }
  for (i = 0; i < nstdio && rc == 0; i++) {
    if (stdio[i] >= 0)
      rc = posix_spawn_file_actions_adddup2(&fa, stdio[i], i);
    else if (i <= 2)
      rc = posix_spawn_file_actions_addopen(&fa, i, "/dev/null", i == 0 ? O_RDONLY : O_WRONLY, 0);
  }
  if (rc == 0 && cwd)
    rc = posix_spawn_file_actions_addchdir_np(&fa, cwd);
  /* Default dispositions and an empty mask, whatever sbx set for itself. */
  sigemptyset(&none);
  sigfillset(&all);
  sigdelset(&all, SIGKILL);
  sigdelset(&all, SIGSTOP);
  if (rc == 0)
    rc = posix_spawnattr_setsigmask(&attr, &none);
  if (rc == 0)
    rc = posix_spawnattr_setsigdefault(&attr, &all);
  if (rc == 0)
    rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  if (rc == 0)
    rc = strchr(argv[0], '/') ? posix_spawn(&pid, argv[0], &fa, &attr, argv, env ? env : environ)
                              : posix_spawnp(&pid, argv[0], &fa, &attr, argv, env ? env : environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  fdset_close(&child);
  if (rc == 0) {
    p->pid = (int)pid;
    p->pidfd = pidfd_open(pid, 0);
    if (p->pidfd < 0) {
      rc = errno;
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
    }
  }
  if (rc == 0 && uv_poll_init(&h->loop, &p->h, p->pidfd) != 0) {
    rc = EINVAL;
    close(p->pidfd);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  if (rc != 0) {
    free(p);
    fdset_close(&parent);
    return sbx_pushfail(L, uv_err_name(-rc), "cannot start %s: %s", argv[0], strerror(rc));
  }
  p->h.data = p;
  uv_poll_start(&p->h, UV_READABLE, exit_cb);
  p->refs = 2;
  p->close_kills = opt_bool(L, 1, "close_kills", 1);
  ud = lua_newuserdatauv(L, sizeof *ud, 0); /* [.., process] */
  ud->p = p;
  luaL_setmetatable(L, PROCESS_MT);
  /* The parent's ends now belong to the streams. */
  sbx_stream_pipes(L, 1, want_in ? in[1] : -1, want_out ? out[0] : -1, want_err ? err[0] : -1);
  if (want_sync) {
    int wfd = fcntl(sv[0], F_DUPFD_CLOEXEC, 0);
    lua_createtable(L, 0, 2);
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "chunks");
    sbx_stream_pipes(L, -1, wfd, sv[0], -1); /* [.., process, stream, t, sync] */
    lua_remove(L, -2);
    return 3;
  }
  return 2;
}

static int
process_pid(lua_State *L)
{
  lua_pushinteger(L, check_process(L)->pid);
  return 1;
}

/* process:kill([signal]) -> true | nil, message, code (KILL by default) */
static int
process_kill(lua_State *L)
{
  struct process *p = check_process(L);
  int sig = lua_isnoneornil(L, 2) ? SIGKILL : check_signal(L, 2);
  int rc;
  if (p->exited)
    return sbx_pushfail(L, "ESRCH", "process %d has exited", p->pid);
  rc = process_signal(p, sig);
  if (rc != 0)
    return sbx_pushfail(L, uv_err_name(-rc), "cannot signal process %d: %s", p->pid, strerror(rc));
  lua_pushboolean(L, 1);
  return 1;
}

/* { pid, running, status, signal }: once it exited, status (its exit
** status, or 128 + the signal that ended it) and signal. */
static void
push_info(lua_State *L, struct process *p)
{
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, p->pid);
  lua_setfield(L, -2, "pid");
  lua_pushboolean(L, !p->exited);
  lua_setfield(L, -2, "running");
  if (p->exited) {
    lua_pushinteger(L, (lua_Integer)p->status);
    lua_setfield(L, -2, "status");
    if (p->term_signal) {
      lua_pushinteger(L, p->term_signal);
      lua_setfield(L, -2, "signal");
    }
  }
}

static int
process_info(lua_State *L)
{
  push_info(L, check_process(L));
  return 1;
}

static void
waiter_detach(struct sbx_waiter *w)
{
  struct process *p = w->source;
  if (p && p->waiter == w)
    p->waiter = NULL;
  w->source = NULL;
}

static int
wait_k(lua_State *L, int status, lua_KContext ctx)
{
  struct sbx_waiter *w = lua_touserdata(L, -1);
  struct process_ud *ud = luaL_checkudata(L, 1, PROCESS_MT);
  (void)status;
  (void)ctx;
  if (w->cancelled)
    return sbx_raise_cancelled(L);
  if (!ud->p || !ud->p->exited)
    return sbx_pushfail(L, "timeout", "the process is still running");
  push_info(L, ud->p);
  return 1;
}

/*
** process:wait([timeout]) -> info (as process:info(), once it exited) |
** nil, message, "timeout". May yield.
*/
static int
process_wait(lua_State *L)
{
  struct process *p = check_process(L);
  double timeout = luaL_optnumber(L, 2, -1);
  struct sbx_waiter *w;
  lua_settop(L, 1);
  if (p->exited) {
    push_info(L, p);
    return 1;
  }
  if (p->waiter)
    return luaL_error(L, "another task is already waiting for this process");
  w = sbx_op_new(L, sizeof *w, NULL);
  w->source = p;
  w->detach = waiter_detach;
  p->waiter = w;
  sbx_waiter_deadline(w, timeout);
  return sbx_await(L, w, wait_k, 0);
}

/*
** process:close(): kills the process if it still runs (SIGKILL; not when
** spawned with close_kills = false) and lets go of it; libuv still reaps
** it. Idempotent; also __gc and __close.
*/
static int
process_close(lua_State *L)
{
  struct process_ud *ud = luaL_checkudata(L, 1, PROCESS_MT);
  struct process *p = ud->p;
  if (p) {
    ud->p = NULL;
    if (p->waiter) {
      p->waiter->source = NULL;
      p->waiter = NULL;
    }
    if (!p->exited && p->close_kills)
      process_signal(p, SIGKILL);
    process_unref(p);
  }
  return 0;
}

static int
process_tostring(lua_State *L)
{
  struct process_ud *ud = luaL_checkudata(L, 1, PROCESS_MT);
  if (!ud->p)
    lua_pushliteral(L, "sbx.process (closed)");
  else
    lua_pushfstring(L, "sbx.process %d (%s)", ud->p->pid, ud->p->exited ? "exited" : "running");
  return 1;
}

static const luaL_Reg proc_funcs[] = { { "signal", proc_signal }, { "spawn", proc_spawn }, { NULL, NULL } };

static const luaL_Reg process_methods[] = { { "pid", process_pid },     { "kill", process_kill },
                                            { "info", process_info },   { "wait", process_wait },
                                            { "close", process_close }, { NULL, NULL } };

static const luaL_Reg process_meta[] = { { "__gc", process_close },
                                         { "__close", process_close },
                                         { "__tostring", process_tostring },
                                         { "__index", NULL },
                                         { NULL, NULL } };

int
sbx_open_proc(lua_State *L)
{
  luaL_newmetatable(L, PROCESS_MT);
  luaL_setfuncs(L, process_meta, 0);
  luaL_newlibtable(L, process_methods);
  luaL_setfuncs(L, process_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, proc_funcs);
  return 1;
}

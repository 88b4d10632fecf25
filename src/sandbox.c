/*
** core.sandbox: the mechanism of daemon-free boxes (the local backend,
** lua/sbx/backends/local.lua). Policy decides what a box may do; this
** file only carries it out:
**
**   sandbox.seccomp{ deny =, enosys =, deny_namespaces = } -> BPF program
**       bytes (for bubblewrap's --seccomp FD) | nil, message, code
**   sandbox.launcher() -> the bytes of sbx-launch (src/sbx_launch.c), the
**       static program that starts a box, or nil in a build without it
**   sandbox.write(path, data), mkdir(path [, mode]), rmdir(path),
**   unlink(path) -> true | nil, message, code (an errno name: "EEXIST",
**       "EBUSY", ...); write is one write(2) to an existing file (cgroup
**       files, /proc/PID/uid_map), never a create
**   sandbox.list(dir) -> names | nil, message, code
**   sandbox.stat(path) -> { type, uid, mode, mtime, target } | nil, message,
**       code: lstat(2); type "file", "dir", "link" (target: where it
**       points), "socket", "other"
**   sandbox.install(path, bytes, mode) -> true | nil, message, code: a file
**       written under a temporary name and renamed into place, so a reader
**       never sees it half written
**   sandbox.ids() -> uid, gid, user name (or nil)
**   sandbox.rlimit(resource) -> soft, hard: this process's limits (a
**       RLIMIT_* number; math.huge for none)
*/
#define _GNU_SOURCE
#include "host.h"
#include "fail.h"
#include "modules.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int
push_errno(lua_State *L, int e, const char *what, const char *path)
{
  return sbx_pushfail(L, uv_err_name(-e), "cannot %s %s: %s", what, path, strerror(e));
}

/* Seccomp ------------------------------------------------------------------------ */

/*
** The syscall numbers of the names in the list field of the table at index
** t, into a userdata left on the stack (so a bad name raises before any
** filter exists): its length in *n.
*/
static int *
syscalls(lua_State *L, int t, const char *field, int *n)
{
  lua_Integer len, i;
  int *nrs;
  lua_getfield(L, t, field);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    *n = 0;
    return lua_newuserdatauv(L, sizeof(int), 0);
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "%s must be a list of syscall names", field);
  len = luaL_len(L, -1);
  nrs = lua_newuserdatauv(L, sizeof(int) * (size_t)(len + 1), 0); /* [.., list, nrs] */
  for (i = 1; i <= len; i++) {
    const char *name;
    lua_geti(L, -2, i);
    name = lua_tostring(L, -1);
    if (!name)
      luaL_error(L, "%s[%d] must be a syscall name", field, (int)i);
    nrs[i - 1] = seccomp_syscall_resolve_name(name);
    if (nrs[i - 1] == __NR_SCMP_ERROR)
      luaL_error(L, "%s[%d]: no syscall is named '%s'", field, (int)i, name);
    lua_pop(L, 1);
  }
  lua_remove(L, -2);
  *n = (int)len;
  return nrs;
}

/*
** sandbox.seccomp{ deny = { names }, enosys = { names }, deny_namespaces =
** bool } -> the filter as BPF bytes. Everything not named is allowed: deny
** fails with EPERM, enosys with ENOSYS (clone3: libc then falls back to
** clone, whose flags a filter can read), deny_namespaces fails clone() with
** any CLONE_NEW* flag. On x86_64 the 32-bit ABIs (x86, x32) get the same
** rules; a call through any other ABI kills the process. An unknown
** syscall name raises.
*/
static int
sandbox_seccomp(lua_State *L)
{
  static const unsigned long ns_flags[] = {
    CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP,
  };
  scmp_filter_ctx ctx;
  int rc = 0, fd, ndeny, nenosys, namespaces, i;
  int *deny, *enosys;
  struct stat st;
  luaL_Buffer b;
  char *out;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  deny = syscalls(L, 1, "deny", &ndeny);       /* [t, deny] */
  enosys = syscalls(L, 1, "enosys", &nenosys); /* [t, deny, enosys] */
  lua_getfield(L, 1, "deny_namespaces");
  namespaces = lua_toboolean(L, -1);
  lua_pop(L, 1);
  /* Nothing below raises until the filter is released. */
  ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx)
    return sbx_pushfail(L, "seccomp", "libseccomp could not start a filter");
#if defined(__x86_64__)
  rc = seccomp_arch_add(ctx, SCMP_ARCH_X86);
  if (rc == 0)
    rc = seccomp_arch_add(ctx, SCMP_ARCH_X32);
#endif
  for (i = 0; rc == 0 && i < ndeny; i++) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), deny[i], 0);
    if (rc == -EEXIST)
      rc = 0;
  }
  for (i = 0; rc == 0 && i < nenosys; i++) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), enosys[i], 0);
    if (rc == -EEXIST)
      rc = 0;
  }
  for (i = 0; rc == 0 && namespaces && i < (int)(sizeof ns_flags / sizeof *ns_flags); i++)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
  if (rc != 0) {
    seccomp_release(ctx);
    return sbx_pushfail(L, "seccomp", "libseccomp refused a rule: %s", strerror(-rc));
  }
  fd = memfd_create("sbx-seccomp", MFD_CLOEXEC);
  if (fd < 0 || (rc = seccomp_export_bpf(ctx, fd)) != 0 || fstat(fd, &st) != 0) {
    int e = fd < 0 ? errno : rc ? -rc : errno;
    if (fd >= 0)
      close(fd);
    seccomp_release(ctx);
    return sbx_pushfail(L, "seccomp", "cannot export the seccomp filter: %s", strerror(e));
  }
  seccomp_release(ctx);
  out = luaL_buffinitsize(L, &b, (size_t)st.st_size + 1);
  if (pread(fd, out, (size_t)st.st_size, 0) != st.st_size) {
    int e = errno;
    close(fd);
    return sbx_pushfail(L, "seccomp", "cannot read the seccomp filter back: %s", strerror(e));
  }
  close(fd);
  luaL_pushresultsize(&b, (size_t)st.st_size);
  return 1;
}

/* Files ---------------------------------------------------------------------------- */

/* sandbox.write(path, data) -> true | nil, message, code: one write(2) to an
** existing file (O_WRONLY, no create, no truncate). */
static int
sandbox_write(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  size_t n;
  const char *data = luaL_checklstring(L, 2, &n);
  int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
  ssize_t w;
  if (fd < 0)
    return push_errno(L, errno, "open", path);
  w = write(fd, data, n);
  if (w != (ssize_t)n) {
    int e = w < 0 ? errno : EIO;
    close(fd);
    return push_errno(L, e, "write", path);
  }
  if (close(fd) != 0)
    return push_errno(L, errno, "write", path);
  lua_pushboolean(L, 1);
  return 1;
}

/* sandbox.mkdir(path [, mode]) -> true | nil, message, code (0700 by default) */
static int
sandbox_mkdir(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  mode_t mode = (mode_t)luaL_optinteger(L, 2, 0700);
  if (mkdir(path, mode) != 0)
    return push_errno(L, errno, "make", path);
  lua_pushboolean(L, 1);
  return 1;
}

static int
sandbox_rmdir(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  if (rmdir(path) != 0)
    return push_errno(L, errno, "remove", path);
  lua_pushboolean(L, 1);
  return 1;
}

static int
sandbox_unlink(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  if (unlink(path) != 0)
    return push_errno(L, errno, "remove", path);
  lua_pushboolean(L, 1);
  return 1;
}

/* sandbox.list(dir) -> { names } (without . and ..) | nil, message, code */
static int
sandbox_list(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  DIR *d = opendir(path);
  struct dirent *e;
  int n = 0;
  if (!d)
    return push_errno(L, errno, "list", path);
  lua_newtable(L);
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    lua_pushstring(L, e->d_name);
    lua_rawseti(L, -2, ++n);
  }
  closedir(d);
  return 1;
}

static int
sandbox_stat(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  const char *type;
  if (lstat(path, &st) != 0)
    return push_errno(L, errno, "stat", path);
  type = S_ISREG(st.st_mode)    ? "file"
         : S_ISDIR(st.st_mode)  ? "dir"
         : S_ISLNK(st.st_mode)  ? "link"
         : S_ISSOCK(st.st_mode) ? "socket"
                                : "other";
  lua_createtable(L, 0, 5);
  lua_pushstring(L, type);
  lua_setfield(L, -2, "type");
  lua_pushinteger(L, (lua_Integer)st.st_uid);
  lua_setfield(L, -2, "uid");
  lua_pushinteger(L, (lua_Integer)(st.st_mode & 07777));
  lua_setfield(L, -2, "mode");
  lua_pushinteger(L, (lua_Integer)st.st_mtime);
  lua_setfield(L, -2, "mtime");
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = readlink(path, target, sizeof target);
    if (n >= 0 && n < (ssize_t)sizeof target) {
      lua_pushlstring(L, target, (size_t)n);
      lua_setfield(L, -2, "target");
    }
  }
  return 1;
}

static int
sandbox_install(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  size_t n, done = 0;
  const char *data = luaL_checklstring(L, 2, &n);
  mode_t mode = (mode_t)luaL_checkinteger(L, 3);
  const char *tmp = lua_pushfstring(L, "%s.%d.tmp", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0)
    return push_errno(L, errno, "create", tmp);
  while (done < n) {
    ssize_t w = write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      close(fd);
      unlink(tmp);
      return push_errno(L, e, "write", tmp);
    }
    done += (size_t)w;
  }
  if (fchmod(fd, mode) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return push_errno(L, e, "install", path);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* sandbox.ids() -> uid, gid, user name (nil when the user has none) */
static int
sandbox_ids(lua_State *L)
{
  struct passwd pw, *res = NULL;
  char buf[4096];
  uid_t uid = getuid();
  lua_pushinteger(L, (lua_Integer)uid);
  lua_pushinteger(L, (lua_Integer)getgid());
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res)
    lua_pushstring(L, res->pw_name);
  else
    lua_pushnil(L);
  return 3;
}

static void
push_rlim(lua_State *L, rlim_t v)
{
  if (v == RLIM_INFINITY)
    lua_pushnumber(L, HUGE_VAL);
  else
    lua_pushinteger(L, (lua_Integer)v);
}

static int
sandbox_rlimit(lua_State *L)
{
  lua_Integer res = luaL_checkinteger(L, 1);
  struct rlimit rl;
  luaL_argcheck(L, res >= 0 && res < RLIM_NLIMITS, 1, "an RLIMIT_* number");
  if (getrlimit((int)res, &rl) != 0)
    return push_errno(L, errno, "read", "the rlimit");
  push_rlim(L, rl.rlim_cur);
  push_rlim(L, rl.rlim_max);
  return 2;
}

/* sbx-launch, built by the Makefile and carried in libsbx (agent_blob.S). */
#ifdef SBX_LAUNCHER
extern const char sbx_launch[], sbx_launch_end[];
#endif

static int
sandbox_launcher(lua_State *L)
{
#ifdef SBX_LAUNCHER
  lua_pushlstring(L, sbx_launch, (size_t)(sbx_launch_end - sbx_launch));
#else
  lua_pushnil(L);
#endif
  return 1;
}

static const luaL_Reg sandbox_funcs[] = { { "seccomp", sandbox_seccomp },   { "write", sandbox_write },
                                          { "mkdir", sandbox_mkdir },       { "rmdir", sandbox_rmdir },
                                          { "unlink", sandbox_unlink },     { "list", sandbox_list },
                                          { "ids", sandbox_ids },           { "rlimit", sandbox_rlimit },
                                          { "stat", sandbox_stat },         { "install", sandbox_install },
                                          { "launcher", sandbox_launcher }, { NULL, NULL } };

int
sbx_open_sandbox(lua_State *L)
{
  luaL_newlib(L, sandbox_funcs);
  return 1;
}

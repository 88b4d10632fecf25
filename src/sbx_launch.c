/*
** sbx-launch: the host half of a local box's start, a standalone static
** program (not part of libsbx; carried inside it like sbx-agent and
** written to sbx's state directory). sbx starts it with uv_spawn, and it
** ends by exec'ing bubblewrap, which builds the rest of the box. It does
** the three things Debian 12's bubblewrap (0.8) cannot:
**
**   * a user namespace whose id map has a range (as root: 65536 ids; as a
**     user with /etc/subuid: newuidmap's range). bubblewrap maps one id
**     unless it is setuid; here sbx writes the map from outside, at the
**     moment this program says it may (below), and bubblewrap then runs as
**     uid 0 of that namespace, with its capabilities there;
**   * a tmpfs of a given size for the box's writable layer, mounted in a
**     mount namespace of the box's own (the host never sees it, and it
**     goes away with the box's last process, even after kill -9 of sbx);
**   * an overlay (userxattr) of the image's layers under that tmpfs's
**     upper directory (bubblewrap 0.8 has no --overlay).
**
** Usage (sbx's private contract):
**   sbx-launch PARENT_PID [OPTION...] -- BWRAP [ARG...]
** Options, carried out in this order whatever their order here:
**   --map-self              write this process's own one-id map (0 -> uid,
**                           0 -> gid; setgroups denied): no range
**   --tmpfs DIR BYTES       a tmpfs of BYTES (mode 0755) on DIR
**   --mkdir PATH            a directory (mode 0755), after the tmpfs
**   --overlay LOWERS UPPER WORK MERGED
**                           an overlay on MERGED: LOWERS is "a:b" (top
**                           first), UPPER and WORK are made first
**   --rlimit RESOURCE SOFT HARD
**                           RESOURCE is a number (RLIMIT_*); set after the
**                           user namespace exists, so that RLIMIT_NPROC
**                           counts the box's processes, not the user's
**   --fd N                  keep fd N (N > 3) open for bubblewrap; every
**                           other fd above 2 is closed before the exec
** fd 3 is a socket to sbx: after unshare this program writes "u" and waits
** for one byte; "g" means the maps (and the cgroups) are in place. Any
** failure is one line on stderr and exit status 125. PARENT_PID is sbx:
** this program dies with it (PR_SET_PDEATHSIG, kept through the exec of
** bubblewrap, whose --die-with-parent carries it on to the box).
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <dirent.h>
#include <unistd.h>

#define MAX_OPS 64
#define MAX_KEEP 8

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void
die(const char *fmt, ...)
{
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  dprintf(2, "sbx-launch: %s\n", msg);
  _exit(125);
}

static void
write_file(const char *path, const char *data)
{
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  size_t n = strlen(data);
  if (fd < 0)
    die("cannot open %s: %s", path, strerror(errno));
  if (write(fd, data, n) != (ssize_t)n)
    die("cannot write %s: %s", path, strerror(errno));
  close(fd);
}

static void
make_dir(const char *path)
{
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    die("cannot make %s: %s", path, strerror(errno));
}

static unsigned long long
number(const char *s, const char *what)
{
  char *end;
  unsigned long long v;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || !*s || *end)
    die("%s must be a number, not '%s'", what, s);
  return v;
}

/* Every fd above 2 but keep[0..n) closed: nothing of sbx's leaks into the
** box (a Lua script's open files carry no close-on-exec flag). */
static void
close_others(const int *keep, int n)
{
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int fds[1024], nfds = 0, i, k;
  if (!d)
    die("cannot list /proc/self/fd: %s", strerror(errno));
  while ((e = readdir(d)) && nfds < 1024) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd > 2 && fd != dirfd(d))
      fds[nfds++] = fd;
  }
  closedir(d);
  for (i = 0; i < nfds; i++) {
    for (k = 0; k < n && keep[k] != fds[i]; k++)
      ;
    if (k == n)
      close(fds[i]);
  }
}

struct op {
  const char *name;
  char *const *args;
};

int
main(int argc, char **argv)
{
  struct op ops[MAX_OPS];
  int nops = 0, i, prog, map_self = 0, keep[MAX_KEEP], nkeep = 0;
  char b;
  uid_t uid = getuid();
  gid_t gid = getgid();
  pid_t parent;

  if (argc < 2)
    die("usage: sbx-launch PARENT_PID [OPTION...] -- BWRAP [ARG...] (started by sbx)");
  /* Dies with sbx; a parent already gone means there is nothing to do. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  parent = (pid_t)number(argv[1], "PARENT_PID");
  if (getppid() != parent)
    die("sbx (pid %d) is gone", (int)parent);
  for (i = 2; i < argc && strcmp(argv[i], "--") != 0; i++) {
    int want = 0;
    if (strcmp(argv[i], "--map-self") == 0)
      map_self = 1;
    else if (strcmp(argv[i], "--tmpfs") == 0)
      want = 2;
    else if (strcmp(argv[i], "--mkdir") == 0)
      want = 1;
    else if (strcmp(argv[i], "--overlay") == 0)
      want = 4;
    else if (strcmp(argv[i], "--rlimit") == 0)
      want = 3;
    else if (strcmp(argv[i], "--fd") == 0 && i + 1 < argc && nkeep < MAX_KEEP) {
      keep[nkeep] = (int)number(argv[++i], "--fd");
      if (keep[nkeep++] <= 3)
        die("--fd takes a descriptor above 3");
    }
    else
      die("unknown option %s", argv[i]);
    if (want) {
      if (i + want >= argc || nops == MAX_OPS)
        die("%s needs %d arguments", argv[i], want);
      ops[nops].name = argv[i];
      ops[nops].args = argv + i + 1;
      nops++;
      i += want;
    }
  }
  if (i + 1 >= argc)
    die("no program after --");
  prog = i + 1;

  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
    die("cannot make the box's user and mount namespaces: %s", strerror(errno));
  if (map_self) {
    char map[64];
    write_file("/proc/self/setgroups", "deny");
    snprintf(map, sizeof map, "0 %u 1\n", (unsigned)uid);
    write_file("/proc/self/uid_map", map);
    snprintf(map, sizeof map, "0 %u 1\n", (unsigned)gid);
    write_file("/proc/self/gid_map", map);
  }
  /* sbx writes the maps now (a range needs a writer outside) and moves
  ** this process into the box's cgroups: nothing runs before it says go. */
  if (write(3, "u", 1) != 1)
    die("cannot tell sbx: %s", strerror(errno));
  if (read(3, &b, 1) != 1 || b != 'g')
    die("sbx did not let the box start");
  close(3);
  if (getppid() != parent)
    die("sbx (pid %d) is gone", (int)parent);

  /* Nothing mounted here reaches the host's namespace. */
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
    die("cannot make the mounts private: %s", strerror(errno));
  for (i = 0; i < nops; i++) {
    if (strcmp(ops[i].name, "--tmpfs") == 0) {
      char data[64];
      snprintf(data, sizeof data, "size=%llu,mode=0755",
               number(ops[i].args[1], "the tmpfs size"));
      if (mount("tmpfs", ops[i].args[0], "tmpfs", MS_NOSUID | MS_NODEV, data) != 0)
        die("cannot mount a tmpfs on %s: %s", ops[i].args[0], strerror(errno));
    }
  }
  for (i = 0; i < nops; i++) {
    if (strcmp(ops[i].name, "--mkdir") == 0)
      make_dir(ops[i].args[0]);
  }
  for (i = 0; i < nops; i++) {
    if (strcmp(ops[i].name, "--overlay") == 0) {
      char data[4096];
      int n;
      make_dir(ops[i].args[1]);
      make_dir(ops[i].args[2]);
      make_dir(ops[i].args[3]);
      n = snprintf(data, sizeof data, "lowerdir=%s,upperdir=%s,workdir=%s,userxattr",
                   ops[i].args[0], ops[i].args[1], ops[i].args[2]);
      if (n < 0 || n >= (int)sizeof data)
        die("the image's layer paths are too long for one overlay mount (%d bytes)", n);
      if (mount("overlay", ops[i].args[3], "overlay", MS_NOSUID | MS_NODEV, data) != 0)
        die("cannot mount the image's overlay on %s: %s", ops[i].args[3], strerror(errno));
    }
  }
  for (i = 0; i < nops; i++) {
    if (strcmp(ops[i].name, "--rlimit") == 0) {
      struct rlimit rl;
      int res = (int)number(ops[i].args[0], "the rlimit resource");
      rl.rlim_cur = (rlim_t)number(ops[i].args[1], "the soft limit");
      rl.rlim_max = (rlim_t)number(ops[i].args[2], "the hard limit");
      if (setrlimit(res, &rl) != 0)
        die("cannot set rlimit %d to %llu/%llu: %s", res, (unsigned long long)rl.rlim_cur,
            (unsigned long long)rl.rlim_max, strerror(errno));
    }
  }
  close_others(keep, nkeep);
  execv(argv[prog], argv + prog);
  die("cannot run %s: %s", argv[prog], strerror(errno));
}

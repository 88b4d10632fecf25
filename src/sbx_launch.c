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
** It starts early, as a spare: sbx may start one before any box is asked
** for, so that joining the box's cgroups (under cgroup v1 the first
** migration after a quiet spell waits for an RCU grace period: milliseconds,
** more on a busy host) happens while nobody waits.
**
** Usage (sbx's private contract):
**   sbx-launch PARENT_PID [--cgroup DIR]... [--dir BOXDIR]
** PARENT_PID is sbx. fd 3 is a socket to sbx. The program
**   1. writes itself into each DIR/cgroup.procs, then says "r";
**   2. reads the box's options: "<count> <seccomp bytes>\n", count
**      NUL-terminated arguments, then the seccomp program (installed as fd
**      4 for bubblewrap's --seccomp 4). sbx gone before that (end of file):
**      it leaves the cgroups, removes them and BOXDIR's rw directory,
**      record and BOXDIR, and exits 0;
**   3. dies with sbx from then on (PR_SET_PDEATHSIG, kept through the exec
**      of bubblewrap, whose --die-with-parent carries it on to the box);
**   4. makes the box's user and mount namespaces and says "u"; sbx writes
**      the id maps and says "g";
**   5. carries out the options, in this order whatever their order:
**        --map-self              its own one-id map (0 -> uid, 0 -> gid;
**                                setgroups denied), before "u"
**        --tmpfs DIR BYTES       a tmpfs of BYTES (mode 0755) on DIR; 0: the
**                                kernel's default size (half the memory)
**        --mkdir PATH            a directory (mode 0755), after the tmpfs
**        --ro-dev PATH           PATH (a host device node) bound onto itself
**                                read-only, devices still allowed: what
**                                bubblewrap's --dev binds into the box from
**                                here is then a node the box can read and
**                                write but whose mode, owner and times it
**                                cannot change (box root may be host root);
**                                a PATH the host lacks is skipped
**        --overlay LOWERS UPPER WORK MERGED
**                                an overlay on MERGED: LOWERS is "a:b" (top
**                                first), UPPER and WORK are made first
**        --rlimit RESOURCE SOFT HARD
**                                RESOURCE is a number (RLIMIT_*); set after
**                                the user namespace exists, so that
**                                RLIMIT_NPROC counts the box's processes,
**                                not the user's
**        --remove DIR            instead of running bubblewrap: DIR and
**                                everything in it removed, as root of the
**                                new user namespace (a box's writable layer
**                                on disk holds files of every id mapped into
**                                the box, which its user cannot remove), then
**                                "x" and exit 0
**        --keep-proc             the host's /proc opened (a directory fd,
**                                before the namespaces) and left open as fd
**                                5 for the agent (--proc-fd 5), where the
**                                box gets no /proc of its own
**      and the arguments after "--" are bubblewrap's command line;
**   6. closes every fd above 3 but the seccomp program's and /proc's, says "x" (the
**      setup went well; fd 3 closes with the exec), and execs it.
** Any failure is one line on stderr and exit status 125.
**
**   sbx-launch --usage NSFILE DIR
** (no socket) enters the user namespace NSFILE (a box's, /proc/PID/ns/user)
** and prints the bytes DIR's files take on disk (st_blocks, one file
** system, hard links counted once per link): a box's writable layer, whose
** directories may belong to ids of the box that sbx's user cannot read.
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
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <dirent.h>
#include <ftw.h>
#include <unistd.h>

#define MAX_OPS 64
#define MAX_CGROUPS 8
#define MAX_MESSAGE (1 << 20)
#define SECCOMP_FD 4
#define PROC_FD 5

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

/* One write(2) to an existing file: 0, or -1 with errno. */
static int
put(const char *path, const char *data)
{
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  size_t n = strlen(data);
  int ok;
  if (fd < 0)
    return -1;
  ok = write(fd, data, n) == (ssize_t)n;
  close(fd);
  return ok ? 0 : -1;
}

static void
write_file(const char *path, const char *data)
{
  if (put(path, data) != 0)
    die("cannot write %s: %s", path, strerror(errno));
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

/* Every fd above 2 but keep closed: nothing of sbx's leaks into the box (a
** Lua script's open files carry no close-on-exec flag). */
static void
close_others(int keep, int keep2)
{
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int fds[1024], nfds = 0, i;
  if (!d)
    die("cannot list /proc/self/fd: %s", strerror(errno));
  while ((e = readdir(d)) && nfds < 1024) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd > 3 && fd != dirfd(d) && fd != keep && fd != keep2)
      fds[nfds++] = fd;
  }
  closedir(d);
  for (i = 0; i < nfds; i++)
    close(fds[i]);
}

/* The spare's own leftovers, when sbx went away before using it. */
static const char *cgroups[MAX_CGROUPS];
static int ncgroups;
static const char *boxdir;

static void __attribute__((noreturn)) leave(void)
{
  char path[4096];
  int i;
  for (i = 0; i < ncgroups; i++) {
    /* Out of the group (into its parent), then the group goes. */
    const char *slash = strrchr(cgroups[i], '/');
    if (slash && slash > cgroups[i]) {
      snprintf(path, sizeof path, "%.*s/cgroup.procs", (int)(slash - cgroups[i]), cgroups[i]);
      put(path, "0");
    }
    rmdir(cgroups[i]);
  }
  if (boxdir) {
    snprintf(path, sizeof path, "%s/rw", boxdir);
    rmdir(path);
    snprintf(path, sizeof path, "%s/owner", boxdir);
    unlink(path);
    rmdir(boxdir);
  }
  _exit(0);
}

/* Reads exactly n bytes from fd 3 into p: 0, or -1 at its end. */
static int
read_full(char *p, size_t n)
{
  while (n > 0) {
    ssize_t r = read(3, p, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* The box's options from sbx: args (NULL-terminated) and the seccomp
** program; at the end of the socket, the spare leaves. */
static char **
read_options(int *nargs, char **seccomp, size_t *seccomp_len)
{
  char head[64], *buf, **args;
  size_t i = 0, count, blen, len, n;
  unsigned long long c, s;
  for (;;) {
    if (i + 1 >= sizeof head || read_full(head + i, 1) != 0)
      leave();
    if (head[i++] == '\n')
      break;
  }
  head[i] = 0;
  if (sscanf(head, "%llu %llu", &c, &s) != 2 || c > MAX_OPS * 16 || s > MAX_MESSAGE)
    die("a malformed options header from sbx");
  count = (size_t)c;
  *seccomp_len = (size_t)s;
  /* The arguments' bytes: read until count NULs were seen. */
  blen = 0;
  len = 4096;
  buf = malloc(len);
  args = calloc(count + 1, sizeof *args);
  if (!buf || !args)
    die("out of memory");
  for (n = 0; n < count;) {
    if (blen == len) {
      if (len >= MAX_MESSAGE)
        die("the options from sbx are too long");
      len *= 2;
      if (!(buf = realloc(buf, len)))
        die("out of memory");
    }
    if (read_full(buf + blen, 1) != 0)
      leave();
    if (buf[blen++] == 0)
      n++;
  }
  for (i = 0, n = 0; n < count; n++) {
    args[n] = buf + i;
    i += strlen(buf + i) + 1;
  }
  *nargs = (int)count;
  *seccomp = NULL;
  if (*seccomp_len) {
    *seccomp = malloc(*seccomp_len);
    if (!*seccomp)
      die("out of memory");
    if (read_full(*seccomp, *seccomp_len) != 0)
      leave();
  }
  return args;
}

/* PATH bound onto itself, read-only: its inode's mode, owner and times are
** then out of every writer's reach (EROFS) while reads and writes of the
** device go on. The flags the mount has (some locked by the user
** namespace: nosuid, noexec, the atime ones) are kept, and nodev is never
** added. */
static void
ro_dev(const char *path)
{
  struct stat st;
  struct statvfs sv;
  unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY;
  if (stat(path, &st) != 0 && errno == ENOENT)
    return;
  if (mount(path, path, NULL, MS_BIND, NULL) != 0)
    die("cannot bind %s: %s", path, strerror(errno));
  if (statvfs(path, &sv) != 0)
    die("cannot read the mount flags of %s: %s", path, strerror(errno));
  if (sv.f_flag & ST_NOSUID)
    flags |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV)
    flags |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC)
    flags |= MS_NOEXEC;
  if (sv.f_flag & ST_NOATIME)
    flags |= MS_NOATIME;
  if (sv.f_flag & ST_NODIRATIME)
    flags |= MS_NODIRATIME;
  if (sv.f_flag & ST_RELATIME)
    flags |= MS_RELATIME;
  if (mount(NULL, path, NULL, flags, NULL) != 0)
    die("cannot make %s read-only: %s", path, strerror(errno));
}

/* --usage and --remove: nftw callbacks. */
static unsigned long long usage_bytes;

static int
add_usage(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
  (void)path;
  (void)type;
  (void)ftw;
  usage_bytes += (unsigned long long)st->st_blocks * 512ULL;
  return 0;
}

static int
remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
  (void)st;
  (void)ftw;
  if ((type == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT)
    die("cannot remove %s: %s", path, strerror(errno));
  return 0;
}

static void __attribute__((noreturn)) usage_of(const char *nsfile, const char *dir)
{
  int fd = open(nsfile, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    die("cannot open %s: %s", nsfile, strerror(errno));
  if (setns(fd, CLONE_NEWUSER) != 0)
    die("cannot enter the box's user namespace: %s", strerror(errno));
  close(fd);
  if (nftw(dir, add_usage, 32, FTW_PHYS | FTW_MOUNT) != 0)
    die("cannot measure %s: %s", dir, strerror(errno));
  printf("%llu\n", usage_bytes);
  exit(0);
}

struct op {
  const char *name;
  char *const *args;
};

int
main(int argc, char **argv)
{
  struct op ops[MAX_OPS];
  int nops = 0, i, prog = -1, map_self = 0, keep_proc = 0, nargs;
  char b, **args, *seccomp;
  size_t seccomp_len;
  uid_t uid = getuid();
  gid_t gid = getgid();
  pid_t parent;

  if (argc == 4 && strcmp(argv[1], "--usage") == 0)
    usage_of(argv[2], argv[3]);
  if (argc < 2)
    die("usage: sbx-launch PARENT_PID [--cgroup DIR]... [--dir BOXDIR] (started by sbx)");
  parent = (pid_t)number(argv[1], "PARENT_PID");
  /* sbx may go at any moment: a write to its socket then fails (and the
  ** spare leaves) instead of killing this program. Restored before exec. */
  signal(SIGPIPE, SIG_IGN);
  for (i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--cgroup") == 0 && i + 1 < argc && ncgroups < MAX_CGROUPS)
      cgroups[ncgroups++] = argv[++i];
    else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
      boxdir = argv[++i];
    else
      die("unknown argument %s", argv[i]);
  }
  if (getppid() != parent)
    leave();
  for (i = 0; i < ncgroups; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/cgroup.procs", cgroups[i]);
    if (put(path, "0") != 0)
      die("cannot join the box's cgroup %s: %s", cgroups[i], strerror(errno));
  }
  if (write(3, "r", 1) != 1)
    leave();
  args = read_options(&nargs, &seccomp, &seccomp_len);

  /* From here the program dies with sbx. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    die("sbx (pid %d) is gone", (int)parent);
  if (seccomp) {
    int fd = memfd_create("sbx-seccomp", 0);
    if (fd < 0 || write(fd, seccomp, seccomp_len) != (ssize_t)seccomp_len || lseek(fd, 0, SEEK_SET) != 0)
      die("cannot hold the seccomp program: %s", strerror(errno));
    if (fd != SECCOMP_FD && (dup2(fd, SECCOMP_FD) != SECCOMP_FD || close(fd) != 0))
      die("cannot place the seccomp program: %s", strerror(errno));
  }
  for (i = 0; i < nargs; i++) {
    int want = 0;
    if (strcmp(args[i], "--") == 0) {
      prog = i + 1;
      break;
    }
    if (strcmp(args[i], "--map-self") == 0)
      map_self = 1;
    else if (strcmp(args[i], "--keep-proc") == 0)
      keep_proc = 1;
    else if (strcmp(args[i], "--tmpfs") == 0)
      want = 2;
    else if (strcmp(args[i], "--mkdir") == 0 || strcmp(args[i], "--ro-dev") == 0 ||
             strcmp(args[i], "--remove") == 0)
      want = 1;
    else if (strcmp(args[i], "--overlay") == 0)
      want = 4;
    else if (strcmp(args[i], "--rlimit") == 0)
      want = 3;
    else
      die("unknown option %s", args[i]);
    if (want) {
      if (i + want >= nargs || nops == MAX_OPS)
        die("%s needs %d arguments", args[i], want);
      ops[nops].name = args[i];
      ops[nops].args = args + i + 1;
      nops++;
      i += want;
    }
  }
  if (prog < 0 || prog >= nargs)
    die("no program after --");

  if (keep_proc) {
    int fd = open("/proc", O_RDONLY | O_DIRECTORY);
    if (fd < 0)
      die("cannot open /proc: %s", strerror(errno));
    if (fd != PROC_FD && (dup2(fd, PROC_FD) != PROC_FD || close(fd) != 0))
      die("cannot place /proc's fd: %s", strerror(errno));
  }
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
  /* sbx writes the maps now (a range needs a writer outside): nothing runs
  ** in the namespace before it says go. */
  if (write(3, "u", 1) != 1)
    die("cannot tell sbx: %s", strerror(errno));
  if (read(3, &b, 1) != 1 || b != 'g')
    die("sbx did not let the box start");

  /* Nothing mounted here reaches the host's namespace. */
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
    die("cannot make the mounts private: %s", strerror(errno));
  for (i = 0; i < nops; i++) {
    if (strcmp(ops[i].name, "--remove") == 0) {
      struct stat st;
      if (lstat(ops[i].args[0], &st) == 0 &&
          nftw(ops[i].args[0], remove_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
        die("cannot remove %s: %s", ops[i].args[0], strerror(errno));
      if (write(3, "x", 1) != 1)
        die("cannot tell sbx: %s", strerror(errno));
      _exit(0);
    }
  }
  for (i = 0; i < nops; i++) {
    if (strcmp(ops[i].name, "--tmpfs") == 0) {
      char data[64];
      unsigned long long size = number(ops[i].args[1], "the tmpfs size");
      /* size=0 would be no limit at all. */
      if (size)
        snprintf(data, sizeof data, "size=%llu,mode=0755", size);
      else
        snprintf(data, sizeof data, "mode=0755");
      if (mount("tmpfs", ops[i].args[0], "tmpfs", MS_NOSUID | MS_NODEV, data) != 0)
        die("cannot mount a tmpfs on %s: %s", ops[i].args[0], strerror(errno));
    }
  }
  for (i = 0; i < nops; i++) {
    if (strcmp(ops[i].name, "--mkdir") == 0)
      make_dir(ops[i].args[0]);
    else if (strcmp(ops[i].name, "--ro-dev") == 0)
      ro_dev(ops[i].args[0]);
  }
  for (i = 0; i < nops; i++) {
    if (strcmp(ops[i].name, "--overlay") == 0) {
      char data[4096];
      int n;
      make_dir(ops[i].args[1]);
      make_dir(ops[i].args[2]);
      make_dir(ops[i].args[3]);
      n = snprintf(data, sizeof data, "lowerdir=%s,upperdir=%s,workdir=%s,userxattr", ops[i].args[0],
                   ops[i].args[1], ops[i].args[2]);
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
  close_others(seccomp ? SECCOMP_FD : -1, keep_proc ? PROC_FD : -1);
  signal(SIGPIPE, SIG_DFL);
  if (fcntl(3, F_SETFD, FD_CLOEXEC) != 0 || write(3, "x", 1) != 1)
    die("cannot tell sbx: %s", strerror(errno));
  execv(args[prog], args + prog);
  die("cannot run %s: %s", args[prog], strerror(errno));
}

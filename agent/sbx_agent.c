/*
** sbx-agent: the program sbx places into a box and starts once, so that
** every command after the first costs a fork instead of a daemon round trip.
** It speaks the protocol of src/agent_proto.h over its stdin/stdout (the
** channel), and treats the host as its only master: nothing it runs sees
** the channel.
**
** Processes:
**   agent       one event loop (poll) over the channel, every job's pipes
**               and a SIGCHLD self-pipe. Undumpable, so no other process of
**               its user can read its memory or open its fds.
**   supervisor  one per job, a child of the agent and a child subreaper
**               (PR_SET_CHILD_SUBREAPER): every process of the job, however
**               it daemonizes (setsid, double fork, env -i), stays its
**               descendant, so a tree kill reaches them all. It reports the
**               command's pid and exit status on a status pipe and exits
**               once the job's last process is gone. If the agent dies, it
**               kills its tree (PR_SET_PDEATHSIG) instead of leaving orphans.
**   command     a new session (setsid), stdin/stdout/stderr only, then exec.
**
**   relay       "sbx-agent attach NAME", or the channel's process in a
**               relay mode ('p', 'm'): copies bytes between its stdin/stdout
**               and the agent's socket, knows no key and no frame.
**
** A channel that ends is not the end of the box's commands when the host
** asked for GRACE: the agent keeps them and waits for the host to attach
** again (see "Re-attach" in agent_proto.h); what it sent is kept until the
** host acknowledges it, so the host gets every byte exactly once.
**
** Bounded memory: per stream at most `window` bytes are sent and not yet
** credited by the host; past it the agent stops reading that pipe and the
** command blocks on write. stdin is acknowledged with CREDIT the same way.
**
** Built static (musl on x86_64, the cross compiler for aarch64), so any
** image can run it; it needs nothing from the image.
*/
#define _GNU_SOURCE
#include "agent_proto.h"
#include "pty_escape.h"
#include "sha256.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#ifndef PR_SET_CHILD_SUBREAPER
#define PR_SET_CHILD_SUBREAPER 36
#endif

#define CHUNK (256 * 1024)
#define PIPE_SIZE (1024 * 1024) /* F_SETPIPE_SZ: fewer, larger reads (best effort) */
#define OUT_HIGH (1u << 20)     /* channel bytes queued or unacknowledged before pipes pause */
#define MAX_JOBS 4096
#define MAX_PENDING 4 /* connections proving the key at once */

/* A byte buffer that grows. */
struct buf {
  uint8_t *p;
  size_t len, cap, off;
};

static int
buf_reserve(struct buf *b, size_t more)
{
  if (b->off > 0 && b->off == b->len) {
    b->off = b->len = 0;
  }
  if (b->len + more <= b->cap)
    return 0;
  if (b->off > 0) {
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
    if (b->len + more <= b->cap)
      return 0;
  }
  size_t cap = b->cap ? b->cap : 65536;
  while (cap < b->len + more)
    cap *= 2;
  uint8_t *p = realloc(b->p, cap);
  if (!p)
    return -1;
  b->p = p;
  b->cap = cap;
  return 0;
}

static size_t
buf_size(const struct buf *b)
{
  return b->len - b->off;
}

enum { ST_OUT = 1, ST_ERR = 2 };
enum { KIND_CMD, KIND_READ, KIND_WRITE };

struct job {
  uint32_t id;
  int kind;
  pid_t sup, pid;
  int in_fd;          /* command stdin (write end), -1 when closed */
  int out_fd[3];      /* [1] stdout, [2] stderr read ends */
  int status_fd;      /* supervisor's reports */
  uint32_t unread[3]; /* sent, not yet credited */
  double quiet_until; /* a small read: the job's pipes gather until then
                         (both: the streams keep their relative order) */
  struct buf in;      /* stdin not yet written */
  int in_eof;         /* STDIN_EOF arrived: close once in is empty */
  uint64_t in_done;   /* stdin bytes written (for CREDIT) */
  uint64_t in_acked;
  int exited, done;
  struct job *next;
};

/* A connection to the attach socket that has not proved the key yet. */
struct pending {
  int fd; /* -1: a free slot */
  double until;
  uint8_t nonce[SBX_AP_NONCE];
  uint8_t got[2 * (SBX_AP_NONCE + SBX_AP_PROOF + 8)]; /* hex */
  size_t n;
};

static struct {
  int in, out; /* the channel; -1 while detached */
  int mac;
  uint8_t key[SBX_AP_KEY];
  uint64_t seq_in, seq_out;
  uint32_t window;
  struct buf rx;
  /* Frames out: tx.p[tx.off, tx_sent) were written and wait for the host's
  ** ACK (only with GRACE: else they are dropped once written); [tx_sent,
  ** tx.len) are not written yet. tx_abs counts the bytes before tx.off
  ** since the start. */
  struct buf tx;
  size_t tx_sent;
  uint64_t tx_abs;
  uint64_t rx_pos, rx_acked; /* bytes of whole frames taken from the host; last acknowledged */
  uint32_t grace, ack_every; /* from the host's HELLO */
  int listen_fd;             /* the attach socket, or -1 */
  struct pending pend[MAX_PENDING];
  double detached_since; /* > 0: no channel, waiting for the host */
  struct job *jobs;
  int njobs;
  int sig_pipe[2];
  int closing; /* the channel ended for good */
} A;

/* Output that trickles in small reads is left to gather for this long
** (seconds): a fast writer then goes out in large frames, which costs the
** box and the daemon's relay far fewer wakeups; an interactive command
** waits at most this much longer for its bytes. */
#define BATCH_DELAY 0.0005
#define BATCH_MIN 65536

static double
now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void
die(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  _exit(2);
}

static void
set_nonblock(int fd)
{
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0)
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void
set_cloexec(int fd)
{
  int fl = fcntl(fd, F_GETFD);
  if (fl >= 0)
    fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

/* Frames out --------------------------------------------------------------------- */

/* Queues a frame with payload parts a and b (either may be NULL). */
static void
send_frame(uint8_t type, uint32_t id, const void *a, size_t an, const void *b, size_t bn)
{
  uint32_t len = (uint32_t)(an + bn);
  size_t before = A.tx.off;
  if (buf_reserve(&A.tx, SBX_AP_HEADER + len + SBX_AP_TAG) != 0)
    die("sbx-agent: out of memory");
  A.tx_sent -= before - A.tx.off; /* buf_reserve moved the kept bytes down */
  uint8_t *h = A.tx.p + A.tx.len;
  sbx_ap_header(h, type, id, len);
  if (an)
    memcpy(h + SBX_AP_HEADER, a, an);
  if (bn)
    memcpy(h + SBX_AP_HEADER + an, b, bn);
  A.tx.len += SBX_AP_HEADER + len;
  if (A.mac) {
    sbx_ap_tag(A.key, A.seq_out, h, h + SBX_AP_HEADER, len, A.tx.p + A.tx.len);
    A.tx.len += SBX_AP_TAG;
  }
  A.seq_out++;
}

static void
send_u32(uint8_t type, uint32_t id, uint32_t v)
{
  uint8_t b[4];
  sbx_ap_put_be32(b, v);
  send_frame(type, id, b, 4, NULL, 0);
}

static void
send_error(uint32_t id, const char *code, const char *fmt, ...)
{
  char msg[512];
  uint8_t p[600];
  size_t n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  sbx_ap_put(p, sizeof p, &n, SBX_AF_CODE, code, (uint32_t)strlen(code));
  sbx_ap_put(p, sizeof p, &n, SBX_AF_MESSAGE, msg, (uint32_t)strlen(msg));
  send_frame(SBX_AP_ERROR, id, p, n, NULL, 0);
}

/*
** ERROR with code "exec_failed" for a command that could not start: the step
** (STAGE: "cwd", "user", "exec" or "stdio") and the system's reason; the
** host words the message (policy.format_exec_failed) from its request.
*/
static void
send_exec_failed(uint32_t id, char kind, int err)
{
  static const char code[] = "exec_failed";
  const char *stage = kind == 'D' ? "cwd" : kind == 'U' ? "user" : kind == 'E' ? "exec" : "stdio";
  const char *why = kind == 'U' && err == ESRCH ? "no such user" : strerror(err);
  uint8_t p[600];
  size_t n = 0;
  sbx_ap_put(p, sizeof p, &n, SBX_AF_CODE, code, (uint32_t)strlen(code));
  sbx_ap_put(p, sizeof p, &n, SBX_AF_MESSAGE, why, (uint32_t)strlen(why));
  sbx_ap_put(p, sizeof p, &n, SBX_AF_STAGE, stage, (uint32_t)strlen(stage));
  send_frame(SBX_AP_ERROR, id, p, n, NULL, 0);
}

/* Bytes queued and not yet acknowledged: what pauses the pipes. */
static size_t
tx_held(void)
{
  return buf_size(&A.tx);
}

static void detach(const char *why);
static void listen_attach(void);

/* On a PTY (MAC mode) a burst must not end in bytes the SSM agent would
** hold back (agent_proto.h, "Padding"): three zero bytes after a tail
** that is not ASCII. */
static void
pad_tail(void)
{
  size_t i;
  int ascii = 1;
  if (!A.mac || A.tx.len - A.tx_sent == 0 || A.tx.len < 3)
    return;
  for (i = A.tx.len - 3; i < A.tx.len; i++)
    if (A.tx.p[i] & 0x80)
      ascii = 0;
  if (ascii)
    return;
  size_t before = A.tx.off;
  if (buf_reserve(&A.tx, 3) != 0)
    die("sbx-agent: out of memory");
  A.tx_sent -= before - A.tx.off;
  memset(A.tx.p + A.tx.len, 0, 3);
  A.tx.len += 3;
}

static void
flush_tx(void)
{
  pad_tail();
  while (A.out >= 0 && A.tx_sent < A.tx.len) {
    ssize_t w = write(A.out, A.tx.p + A.tx_sent, A.tx.len - A.tx_sent);
    if (w > 0) {
      A.tx_sent += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    detach("the channel's write end closed");
    return;
  }
  if (!A.grace) {
    /* No re-attach: nothing is ever sent again, so nothing is kept. */
    A.tx_abs += A.tx_sent - A.tx.off;
    A.tx.off = A.tx_sent;
  }
}

/* The host has every byte before pos: they need not be kept. */
static void
acked_to(uint64_t pos)
{
  if (pos > A.tx_abs && pos - A.tx_abs <= A.tx_sent - A.tx.off) {
    A.tx.off += (size_t)(pos - A.tx_abs);
    A.tx_abs = pos;
  }
}

static void
send_ack(void)
{
  uint8_t b[8];
  sbx_ap_put_be64(b, A.rx_pos);
  send_frame(SBX_AP_AGENT_ACK, 0, b, 8, NULL, 0);
  A.rx_acked = A.rx_pos;
}

/* Jobs ------------------------------------------------------------------------------ */

static struct job *
find_job(uint32_t id)
{
  struct job *j;
  for (j = A.jobs; j; j = j->next)
    if (j->id == id)
      return j;
  return NULL;
}

static void
close_fd(int *fd)
{
  if (*fd >= 0) {
    close(*fd);
    *fd = -1;
  }
}

static void
free_job(struct job *j)
{
  struct job **pp;
  for (pp = &A.jobs; *pp; pp = &(*pp)->next) {
    if (*pp == j) {
      *pp = j->next;
      break;
    }
  }
  close_fd(&j->in_fd);
  close_fd(&j->out_fd[1]);
  close_fd(&j->out_fd[2]);
  close_fd(&j->status_fd);
  free(j->in.p);
  free(j);
  A.njobs--;
}

/* Every fd but keep[0..n) closed, in a child that will not exec (the
** supervisor) or before exec (belt and braces besides O_CLOEXEC). */
static void
close_others(const int *keep, int n)
{
  DIR *d = opendir("/proc/self/fd");
  int fds[1024], nfds = 0, i, k;
  struct dirent *e;
  if (!d) {
    for (i = 3; i < 1024; i++) {
      for (k = 0; k < n && keep[k] != i; k++)
        ;
      if (k == n)
        close(i);
    }
    return;
  }
  while ((e = readdir(d)) && nfds < 1024) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d))
      continue;
    fds[nfds++] = fd;
  }
  closedir(d);
  for (i = 0; i < nfds; i++) {
    for (k = 0; k < n && keep[k] != fds[i]; k++)
      ;
    if (k == n && fds[i] > 2)
      close(fds[i]);
  }
}

/* The user to run as: "name", "uid", "uid:gid" or "name:group". From the
** image's /etc/passwd and /etc/group: the agent links no NSS. */
static int
lookup_user(const char *spec, uid_t *uid, gid_t *gid, gid_t *groups, int *ngroups, char *name, size_t namelen)
{
  char user[256], group[256] = "", line[1024];
  const char *colon = strchr(spec, ':');
  FILE *f;
  int found = 0, max = *ngroups;
  *ngroups = 0;
  snprintf(user, sizeof user, "%.*s", colon ? (int)(colon - spec) : (int)strlen(spec), spec);
  if (colon)
    snprintf(group, sizeof group, "%s", colon + 1);
  name[0] = 0;
  char *end;
  long n = strtol(user, &end, 10);
  if (*user && !*end) {
    *uid = (uid_t)n;
    *gid = (gid_t)n;
    found = 1;
  }
  if ((f = fopen("/etc/passwd", "re"))) {
    while (fgets(line, sizeof line, f)) {
      char *fields[7], *s = line;
      int i;
      for (i = 0; i < 7; i++) {
        fields[i] = strsep(&s, ":");
        if (!fields[i])
          break;
      }
      if (i < 7)
        continue;
      if ((found && (uid_t)atol(fields[2]) == *uid) || (!found && strcmp(fields[0], user) == 0)) {
        *uid = (uid_t)atol(fields[2]);
        *gid = (gid_t)atol(fields[3]);
        snprintf(name, namelen, "%s", fields[0]);
        found = 1;
        break;
      }
    }
    fclose(f);
  }
  if (!found)
    return -1;
  if (*group) {
    n = strtol(group, &end, 10);
    if (!*end) {
      *gid = (gid_t)n;
    }
    else if ((f = fopen("/etc/group", "re"))) {
      int ok = 0;
      while (fgets(line, sizeof line, f)) {
        char *s = line, *gname = strsep(&s, ":");
        strsep(&s, ":");
        char *g = strsep(&s, ":");
        if (gname && g && strcmp(gname, group) == 0) {
          *gid = (gid_t)atol(g);
          ok = 1;
          break;
        }
      }
      fclose(f);
      if (!ok)
        return -1;
    }
    else {
      return -1;
    }
  }
  groups[(*ngroups)++] = *gid;
  if (name[0] && (f = fopen("/etc/group", "re"))) {
    while (fgets(line, sizeof line, f) && *ngroups < max) {
      char *s = line, *gname = strsep(&s, ":");
      strsep(&s, ":");
      char *g = strsep(&s, ":");
      char *members = strsep(&s, "\n");
      char *m;
      (void)gname;
      if (!g || !members)
        continue;
      while ((m = strsep(&members, ","))) {
        if (strcmp(m, name) == 0 && (gid_t)atol(g) != *gid)
          groups[(*ngroups)++] = (gid_t)atol(g);
      }
    }
    fclose(f);
  }
  return 0;
}

/* execvpe with the command's own PATH (or the usual default). */
static void
exec_path(char **argv, char **envp)
{
  const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  char full[PATH_MAX];
  int i, eacces = 0;
  for (i = 0; envp[i]; i++)
    if (strncmp(envp[i], "PATH=", 5) == 0)
      path = envp[i] + 5;
  if (strchr(argv[0], '/')) {
    execve(argv[0], argv, envp);
    return;
  }
  while (*path) {
    const char *c = strchr(path, ':');
    size_t n = c ? (size_t)(c - path) : strlen(path);
    if (snprintf(full, sizeof full, "%.*s/%s", (int)n, n ? path : ".", argv[0]) < (int)sizeof full) {
      execve(full, argv, envp);
      if (errno == EACCES)
        eacces = 1;
    }
    path += n + (c ? 1 : 0);
    if (!c)
      break;
  }
  errno = eacces ? EACCES : ENOENT;
}

/* What the supervisor tells the agent: a kind and a value. */
struct report {
  char kind; /* 'P' pid, 'X' exit status; the command could not
             ** start (value: errno): 'D' its directory, 'U' its
             ** user, 'E' its exec */
  int32_t value;
};

static volatile sig_atomic_t agent_gone;
static pid_t agent_pid;

static void
on_parent_death(int sig)
{
  (void)sig;
  agent_gone = 1;
}

/* The host's /proc, where the box has none of its own (a container that
** masks parts of its /proc: the kernel then refuses a new proc mount);
** sbx-launch opened it before the box's namespaces and bubblewrap passed it
** on ("--proc-fd N"). Its pids are the host's: each process's NSpid line
** names its pid in the box's namespace, the proc_depth-th entry. -1:
** the box's own /proc. */
static int proc_fd = -1, proc_depth;
static char proc_ns[64];

/* Reads at most n - 1 bytes of a file under the proc directory dir. */
static ssize_t
read_proc(int dir, const char *name, char *buf, size_t n)
{
  int fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
  ssize_t r;
  if (fd < 0)
    return -1;
  r = read(fd, buf, n - 1);
  close(fd);
  if (r >= 0)
    buf[r] = 0;
  return r;
}

/* A status file's NSpid entries: how many, and the one at index want. */
static int
nspid(const char *status, int want, pid_t *out)
{
  const char *p = strstr(status, "\nNSpid:");
  int n = 0;
  char *end;
  if (!p)
    return 0;
  p += 7;
  for (;;) {
    long v = strtol(p, &end, 10);
    if (end == p)
      break;
    if (n == want)
      *out = (pid_t)v;
    n++;
    p = end;
  }
  return n;
}

/* One process of a /proc listing: its id in the listing, its parent's
** there, and its pid in the box (what kill() takes): 0, or -1 when it is
** gone or not of the box. */
static int
proc_entry(int dir, const char *name, pid_t *id, pid_t *ppid, pid_t *boxpid)
{
  char path[64], line[4096];
  *id = (pid_t)atoi(name);
  if (proc_fd < 0) {
    snprintf(path, sizeof path, "%s/stat", name);
    if (read_proc(dir, path, line, sizeof line) <= 0)
      return -1;
    char *rp = strrchr(line, ')');
    if (!rp || sscanf(rp + 2, "%*c %d", ppid) != 1)
      return -1;
    *boxpid = *id;
    return 0;
  }
  snprintf(path, sizeof path, "%s/status", name);
  if (read_proc(dir, path, line, sizeof line) <= 0)
    return -1;
  const char *pp = strstr(line, "\nPPid:");
  if (!pp || sscanf(pp + 6, "%d", ppid) != 1 || nspid(line, proc_depth - 1, boxpid) < proc_depth)
    return -1;
  return 0;
}

/* Is the process id (in the host's /proc) in the box's PID namespace? */
static int
in_box(int dir, pid_t id)
{
  char path[64], ns[64];
  ssize_t r;
  snprintf(path, sizeof path, "%d/ns/pid", (int)id);
  r = readlinkat(dir, path, ns, sizeof ns - 1);
  if (r <= 0)
    return 0;
  ns[r] = 0;
  return strcmp(ns, proc_ns) == 0;
}

/* Kills every descendant of root (not root): stop them all, look again
** until no new one appears, then signal them and let them go on. Returns
** how many were signalled. Members are kept as ids of the /proc listing
** (the host's, with --proc-fd) and signalled by their pids in the box. */
static int
kill_tree(pid_t root, int sig)
{
  static pid_t members[8192], pids[8192];
  int n = 0, round, added, i, count = 0;
  pid_t root_id = root;
  int dfd = openat(proc_fd >= 0 ? proc_fd : AT_FDCWD, proc_fd >= 0 ? "." : "/proc",
                   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  struct dirent *e;
  if (!d) {
    if (dfd >= 0)
      close(dfd);
    return 0;
  }
  if (proc_fd >= 0) {
    /* root's id in the host's listing. */
    root_id = 0;
    while ((e = readdir(d))) {
      pid_t id, ppid, bp;
      if (e->d_name[0] >= '1' && e->d_name[0] <= '9' && proc_entry(dfd, e->d_name, &id, &ppid, &bp) == 0 &&
          bp == root && in_box(dfd, id)) {
        root_id = id;
        break;
      }
    }
    if (!root_id) {
      closedir(d);
      return 0;
    }
  }
  members[0] = root_id;
  pids[n++] = root;
  for (round = 0; round < 16; round++) {
    added = 0;
    /* Passes until no new child of a member turns up in this listing. */
    for (;;) {
      int grew = 0;
      rewinddir(d);
      while ((e = readdir(d))) {
        pid_t id, ppid, bp;
        int k;
        if (e->d_name[0] < '1' || e->d_name[0] > '9' || proc_entry(dfd, e->d_name, &id, &ppid, &bp) != 0 ||
            bp <= 1)
          continue;
        for (k = 0; k < n && members[k] != id; k++)
          ;
        if (k < n)
          continue;
        for (k = 0; k < n && members[k] != ppid; k++)
          ;
        if (k < n && n < (int)(sizeof members / sizeof *members)) {
          members[n] = id;
          pids[n++] = bp;
          if (sig == SIGKILL)
            kill(bp, SIGSTOP);
          grew = added = 1;
        }
      }
      if (!grew)
        break;
    }
    if (!added || sig != SIGKILL)
      break;
  }
  closedir(d);
  for (i = 1; i < n; i++)
    if (kill(pids[i], sig) == 0)
      count++;
  if (sig == SIGKILL || sig == SIGTERM || sig == SIGINT || sig == SIGHUP)
    for (i = 1; i < n; i++)
      kill(pids[i], SIGCONT);
  return count;
}

static void
report(int fd, char kind, int32_t value)
{
  struct report r = { kind, value };
  ssize_t w;
  do
    w = write(fd, &r, sizeof r);
  while (w < 0 && errno == EINTR);
}

/* mkdir -p of path's parent directories. */
static void
make_parents(const char *path)
{
  char p[PATH_MAX];
  char *s;
  snprintf(p, sizeof p, "%s", path);
  for (s = p + 1; (s = strchr(s, '/')); s++) {
    *s = 0;
    mkdir(p, 0755);
    *s = '/';
  }
}

/* The process of a READ_FILE job: the file to stdout. */
static int
run_reader(const char *path)
{
  uint8_t b[CHUNK];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t r;
  if (fd < 0) {
    fprintf(stderr, "cannot read %s: %s", path, strerror(errno));
    return errno;
  }
  while ((r = read(fd, b, sizeof b)) != 0) {
    if (r < 0) {
      if (errno == EINTR)
        continue;
      fprintf(stderr, "cannot read %s: %s", path, strerror(errno));
      return errno;
    }
    uint8_t *p = b;
    while (r > 0) {
      ssize_t w = write(1, p, (size_t)r);
      if (w < 0) {
        if (errno == EINTR)
          continue;
        return errno;
      }
      p += w;
      r -= w;
    }
  }
  return 0;
}

/* The process of a WRITE_FILE job: stdin to the file. */
static int
run_writer(const char *path, uint32_t mode, uint32_t flags)
{
  uint8_t b[CHUNK];
  ssize_t r;
  int fd;
  if (flags & SBX_AP_MKDIRS)
    make_parents(path);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode ? (mode_t)mode : 0644);
  if (fd < 0) {
    fprintf(stderr, "cannot write %s: %s", path, strerror(errno));
    return errno;
  }
  while ((r = read(0, b, sizeof b)) != 0) {
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return errno;
    }
    uint8_t *p = b;
    while (r > 0) {
      ssize_t w = write(fd, p, (size_t)r);
      if (w < 0) {
        if (errno == EINTR)
          continue;
        fprintf(stderr, "cannot write %s: %s", path, strerror(errno));
        return errno;
      }
      p += w;
      r -= w;
    }
  }
  if (close(fd) != 0) {
    fprintf(stderr, "cannot write %s: %s", path, strerror(errno));
    return errno;
  }
  return 0;
}

struct spawn_req {
  char **argv, **envp;
  int argc, envc;
  const char *cwd, *user, *path;
  uint32_t flags, mode;
  int kind;
};

/* The child's last word when its command cannot start: which step (stage)
** and errno, on the CLOEXEC pipe its supervisor reads. */
static void __attribute__((noreturn)) start_failed(int fd, char stage, int err)
{
  struct report why = { stage, err };
  ssize_t w = write(fd, &why, sizeof why);
  (void)w;
  _exit(127);
}

/* The supervisor: forks the command, reports, reaps, and goes when the
** job's last process is gone. Never returns. */
static void __attribute__((noreturn))
supervise(struct spawn_req *rq, int in_r, int out_w, int err_w, int status_w)
{
  int keep[] = { in_r, out_w, err_w, status_w, proc_fd };
  int errp[2];
  pid_t cmd;
  struct sigaction sa;
  sigset_t all;
  close_others(keep, 5);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_parent_death;
  sigaction(SIGUSR1, &sa, NULL);
  prctl(PR_SET_PDEATHSIG, SIGUSR1);
  if (getppid() != agent_pid)
    agent_gone = 1; /* the agent died before the death signal was armed */
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, NULL);
  signal(SIGCHLD, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  if (pipe2(errp, O_CLOEXEC) != 0)
    _exit(1);
  cmd = fork();
  if (cmd < 0) {
    report(status_w, 'E', errno);
    _exit(1);
  }
  if (cmd == 0) {
    int e = 0;
    char stage = 'I'; /* its stdio */
    close(errp[0]);
    close(status_w);
    setsid();
    if (dup2(in_r, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
      e = errno;
    if (in_r > 2)
      close(in_r);
    if (out_w > 2)
      close(out_w);
    if (err_w > 2)
      close(err_w);
    for (int s = 1; s < 32; s++)
      signal(s, SIG_DFL);
    if (!e && rq->cwd && chdir(rq->cwd) != 0) {
      e = errno;
      stage = 'D';
    }
    if (!e && rq->user) {
      uid_t uid;
      gid_t gid, groups[64];
      int ng = 64;
      char name[256];
      stage = 'U';
      if (lookup_user(rq->user, &uid, &gid, groups, &ng, name, sizeof name) != 0)
        e = ESRCH;
      else if (setgroups((size_t)ng, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
        e = errno;
    }
    if (e)
      start_failed(errp[1], stage, e);
    /* File requests run here: started, as far as the host is concerned. */
    if (rq->kind == KIND_READ) {
      close(errp[1]);
      _exit(run_reader(rq->path) ? 1 : 0);
    }
    if (rq->kind == KIND_WRITE) {
      close(errp[1]);
      _exit(run_writer(rq->path, rq->mode, rq->flags) ? 1 : 0);
    }
    /* The box's own environment (the image's and the box's variables: the
    ** agent inherited them, as a docker exec process does), then the
    ** command's on top. */
    for (char **ev = rq->envp; *ev; ev++)
      putenv(*ev);
    exec_path(rq->argv, environ);
    start_failed(errp[1], 'E', errno);
  }
  close(errp[1]);
  close(in_r);
  close(out_w);
  close(err_w);
  /* The command has started once errp closes on its exec (CLOEXEC) with
  ** nothing in it; otherwise the child says which step failed, and the
  ** host hears "exec_failed" instead of a pid (never an exit status a
  ** command could also have chosen). */
  {
    struct report why;
    ssize_t r;
    do
      r = read(errp[0], &why, sizeof why);
    while (r < 0 && errno == EINTR);
    if (r == (ssize_t)sizeof why)
      report(status_w, why.kind, why.value);
    else
      report(status_w, 'P', (int32_t)cmd);
    close(errp[0]);
  }
  /* Reap: the command first (its status), then whatever the job left. */
  for (;;) {
    int st;
    pid_t p = waitpid(-1, &st, 0);
    if (p < 0) {
      if (errno == EINTR) {
        if (agent_gone)
          kill_tree(getpid(), SIGKILL);
        continue;
      }
      break; /* ECHILD: the job's last process is gone */
    }
    if (p == cmd)
      report(status_w, 'X', WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    if (agent_gone)
      kill_tree(getpid(), SIGKILL);
  }
  _exit(0);
}

static void
start_job(uint32_t id, struct spawn_req *rq)
{
  int in_p[2] = { -1, -1 }, out_p[2], err_p[2], st_p[2];
  struct job *j;
  pid_t sup;
  if (find_job(id)) {
    send_error(id, "bad_request", "job %u exists", id);
    return;
  }
  if (A.njobs >= MAX_JOBS) {
    send_error(id, "too_many_jobs", "more than %d jobs at once", MAX_JOBS);
    return;
  }
  if (rq->kind == KIND_CMD && rq->argc == 0) {
    send_error(id, "bad_request", "a command needs argv");
    return;
  }
  if ((rq->flags & SBX_AP_STDIN_PIPE) || rq->kind == KIND_WRITE) {
    if (pipe2(in_p, O_CLOEXEC) != 0)
      goto fail;
  }
  else {
    in_p[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in_p[0] < 0)
      goto fail;
  }
  if (rq->kind == KIND_CMD && (rq->flags & SBX_AP_SOCK_OUTPUT)) {
    /* Output sockets: /proc/PID/fd/1 of the command opens nothing (ENXIO),
    ** so no other process of the box can write into this job's output.
    ** The agent's end only reads, the command's only writes. */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out_p) != 0)
      goto fail;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, err_p) != 0) {
      close(out_p[0]);
      close(out_p[1]);
      goto fail;
    }
    shutdown(out_p[0], SHUT_WR);
    shutdown(err_p[0], SHUT_WR);
    shutdown(out_p[1], SHUT_RD);
    shutdown(err_p[1], SHUT_RD);
  }
  else if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0) {
    goto fail;
  }
  if (pipe2(st_p, O_CLOEXEC) != 0)
    goto fail;
  sup = fork();
  if (sup < 0)
    goto fail;
  if (sup == 0)
    supervise(rq, in_p[0], out_p[1], err_p[1], st_p[1]);
  close(in_p[0]);
  close(out_p[1]);
  close(err_p[1]);
  close(st_p[1]);
  j = calloc(1, sizeof *j);
  if (!j)
    die("sbx-agent: out of memory");
  j->id = id;
  j->kind = rq->kind;
  j->sup = sup;
  j->in_fd = in_p[1];
  j->out_fd[1] = out_p[0];
  j->out_fd[2] = err_p[0];
  j->status_fd = st_p[0];
  set_nonblock(j->out_fd[1]);
  set_nonblock(j->out_fd[2]);
  set_nonblock(j->status_fd);
#ifdef F_SETPIPE_SZ
  fcntl(j->out_fd[1], F_SETPIPE_SZ, PIPE_SIZE);
  fcntl(j->out_fd[2], F_SETPIPE_SZ, PIPE_SIZE);
#endif
  if (j->in_fd >= 0)
    set_nonblock(j->in_fd);
  j->next = A.jobs;
  A.jobs = j;
  A.njobs++;
  return;
fail:
  send_error(id, "spawn_failed", "cannot start: %s", strerror(errno));
}

/* Requests ----------------------------------------------------------------------- */

static void
on_spawn(const struct sbx_ap_frame *f, int kind)
{
  struct sbx_ap_fields it;
  uint8_t tag;
  const uint8_t *v;
  uint32_t len;
  int r;
  struct spawn_req rq;
  char *strings = malloc((size_t)f->len + 64);
  char *s = strings;
  char **argv = calloc((size_t)f->len / 5 + 2, sizeof *argv);
  char **envp = calloc((size_t)f->len / 5 + 2, sizeof *envp);
  memset(&rq, 0, sizeof rq);
  rq.kind = kind;
  if (!strings || !argv || !envp)
    die("sbx-agent: out of memory");
  sbx_ap_fields_init(&it, f->payload, f->len);
  while ((r = sbx_ap_next(&it, &tag, &v, &len)) == 1) {
    uint64_t n;
    if (memchr(v, 0, len) && tag != SBX_AF_FLAGS && tag != SBX_AF_MODE) {
      send_error(f->id, "bad_request", "a field holds a NUL byte");
      goto out;
    }
    switch (tag) {
    case SBX_AF_ARGV:
    case SBX_AF_ENV:
    case SBX_AF_CWD:
    case SBX_AF_USER:
    case SBX_AF_PATH:
      memcpy(s, v, len);
      s[len] = 0;
      if (tag == SBX_AF_ARGV)
        argv[rq.argc++] = s;
      else if (tag == SBX_AF_ENV)
        envp[rq.envc++] = s;
      else if (tag == SBX_AF_CWD)
        rq.cwd = s;
      else if (tag == SBX_AF_USER)
        rq.user = s;
      else
        rq.path = s;
      s += len + 1;
      break;
    case SBX_AF_FLAGS:
      if (sbx_ap_uint(v, len, &n) == 0)
        rq.flags = (uint32_t)n;
      break;
    case SBX_AF_MODE:
      if (sbx_ap_uint(v, len, &n) == 0)
        rq.mode = (uint32_t)n;
      break;
    default:
      break; /* a newer host's field: ignored */
    }
  }
  if (r < 0) {
    send_error(f->id, "bad_request", "malformed fields");
    goto out;
  }
  if (kind != KIND_CMD && !rq.path) {
    send_error(f->id, "bad_request", "a file request needs a path");
    goto out;
  }
  argv[rq.argc] = NULL;
  envp[rq.envc] = NULL;
  rq.argv = argv;
  rq.envp = envp;
  start_job(f->id, &rq);
out:
  /* The supervisor has its own copy (fork); the agent needs none. */
  free(strings);
  free(argv);
  free(envp);
}

static void
write_stdin(struct job *j)
{
  while (buf_size(&j->in) > 0 && j->in_fd >= 0) {
    ssize_t w = write(j->in_fd, j->in.p + j->in.off, buf_size(&j->in));
    if (w > 0) {
      j->in.off += (size_t)w;
      j->in_done += (uint64_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    /* The command closed its stdin: drop what is left, as a pipe would. */
    j->in_done += buf_size(&j->in);
    j->in.off = j->in.len = 0;
    close_fd(&j->in_fd);
  }
  /* A forgotten job (id 0: FORGET, or it could not start) sends nothing. */
  if (j->id && j->in_done > j->in_acked) {
    send_u32(SBX_AP_CREDIT, j->id, (uint32_t)(j->in_done - j->in_acked));
    j->in_acked = j->in_done;
  }
  if (j->in_eof && buf_size(&j->in) == 0)
    close_fd(&j->in_fd);
}

static void
on_frame(const struct sbx_ap_frame *f)
{
  struct job *j = f->id ? find_job(f->id) : NULL;
  switch (f->type) {
  case SBX_AP_SPAWN:
    on_spawn(f, KIND_CMD);
    return;
  case SBX_AP_READ_FILE:
    on_spawn(f, KIND_READ);
    return;
  case SBX_AP_WRITE_FILE:
    on_spawn(f, KIND_WRITE);
    return;
  case SBX_AP_STDIN:
    if (!j)
      return; /* finished meanwhile: its stdin is gone */
    if (j->in_fd < 0) {
      send_u32(SBX_AP_CREDIT, j->id, f->len);
      return;
    }
    if (buf_reserve(&j->in, f->len) != 0)
      die("sbx-agent: out of memory");
    memcpy(j->in.p + j->in.len, f->payload, f->len);
    j->in.len += f->len;
    write_stdin(j);
    return;
  case SBX_AP_STDIN_EOF:
    if (j) {
      j->in_eof = 1;
      write_stdin(j);
    }
    return;
  case SBX_AP_SIGNAL:
    if (j && f->len >= 2) {
      int sig = f->payload[0], n = 0;
      if (f->payload[1] && j->sup > 0)
        n = kill_tree(j->sup, sig);
      else if (j->pid > 0 && kill(-j->pid, sig) == 0)
        n = 1;
      send_u32(SBX_AP_KILLED, f->id, (uint32_t)n);
    }
    else {
      send_u32(SBX_AP_KILLED, f->id, 0);
    }
    return;
  case SBX_AP_CREDIT:
    if (j && f->len >= 5) {
      int st = f->payload[0];
      uint32_t n = sbx_ap_be32(f->payload + 1);
      if (st == ST_OUT || st == ST_ERR)
        j->unread[st] = n > j->unread[st] ? 0 : j->unread[st] - n;
    }
    return;
  case SBX_AP_FORGET:
    if (j)
      j->id = 0; /* nothing more is sent for it; freed once its tree is gone */
    return;
  case SBX_AP_PING:
    /* The acknowledgement first: a host that pings right after its HELLO
    ** learns from it that the agent can be attached to again. */
    if (A.grace)
      send_ack();
    send_frame(SBX_AP_PONG, f->id, f->payload, f->len, NULL, 0);
    return;
  case SBX_AP_ACK:
    if (f->len == 8)
      acked_to(sbx_ap_be64(f->payload));
    return;
  case SBX_AP_HELLO: {
    struct sbx_ap_fields it;
    uint8_t tag;
    const uint8_t *v;
    uint32_t len;
    uint64_t n;
    sbx_ap_fields_init(&it, f->payload, f->len);
    while (sbx_ap_next(&it, &tag, &v, &len) == 1) {
      if (tag == SBX_AF_VERSION && sbx_ap_uint(v, len, &n) == 0 && n != SBX_AP_VERSION) {
        send_error(0, "version", "this agent speaks version %d, not %llu", SBX_AP_VERSION,
                   (unsigned long long)n);
        flush_tx();
        _exit(3);
      }
      if (tag == SBX_AF_WINDOW && sbx_ap_uint(v, len, &n) == 0 && n >= 4096 && n <= (1u << 30))
        A.window = (uint32_t)n;
      if (tag == SBX_AF_GRACE && sbx_ap_uint(v, len, &n) == 0 && n <= 86400)
        A.grace = (uint32_t)n;
      if (tag == SBX_AF_ACK && sbx_ap_uint(v, len, &n) == 0 && n >= 4096 && n <= OUT_HIGH / 2)
        A.ack_every = (uint32_t)n;
    }
    if (A.grace)
      listen_attach();
    return;
  }
  default:
    send_error(f->id, "bad_request", "unknown frame type %u", (unsigned)f->type);
  }
}

/* Job events -------------------------------------------------------------------------- */

/* Forwards what the pipe holds; 1 once it is empty (or ended), 0 when the
** window or the channel's queue stopped it. */
static int
pump_output_how(struct job *j, int st, int drain)
{
  uint8_t hdr = (uint8_t)st;
  uint8_t b[CHUNK];
  while (j->out_fd[st] >= 0 && j->unread[st] < A.window && tx_held() < OUT_HIGH) {

    size_t room = A.window - j->unread[st];
    ssize_t r = read(j->out_fd[st], b, room < sizeof b ? room : sizeof b);
    if (r > 0) {
      if (j->id) {
        send_frame(SBX_AP_OUT, j->id, &hdr, 1, b, (size_t)r);
        j->unread[st] += (uint32_t)r;
      }
      if (r < BATCH_MIN && !j->exited && !drain) {
        j->quiet_until = now_s() + BATCH_DELAY;
        return 1;
      }
      continue;
    }
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 1;
    close_fd(&j->out_fd[st]);
    if (j->id)
      send_frame(SBX_AP_EOF, j->id, &hdr, 1, NULL, 0);
  }
  return j->out_fd[st] < 0;
}

static int
pump_output(struct job *j, int st)
{
  return pump_output_how(j, st, 0);
}

static void
read_status(struct job *j)
{
  struct report r;
  ssize_t n;
  for (;;) {
    n = read(j->status_fd, &r, sizeof r);
    if (n < 0 && errno == EINTR)
      continue;
    if (n == (ssize_t)sizeof r) {
      if (r.kind == 'P') {
        j->pid = r.value;
        if (j->id)
          send_u32(SBX_AP_STARTED, j->id, (uint32_t)r.value);
      }
      else if (r.kind == 'X') {
        j->exited = 1;
        if (j->id)
          send_u32(SBX_AP_EXIT, j->id, (uint32_t)r.value);
      }
      else if (r.kind == 'D' || r.kind == 'U' || r.kind == 'E' || r.kind == 'I') {
        /* The command could not start: one EXEC_FAILED and nothing more
        ** for it (its supervisor still reaps the child). */
        if (j->id)
          send_exec_failed(j->id, r.kind, r.value);
        j->id = 0;
        /* Its stdin has no reader: what is queued and what comes is dropped. */
        j->in.off = j->in.len = 0;
        close_fd(&j->in_fd);
      }
      continue;
    }
    break;
  }
  if (n == 0) {
    close_fd(&j->status_fd);
    j->done = 1;
  }
}

static void
on_sigchld(int sig)
{
  int saved = errno;
  ssize_t w;
  (void)sig;
  w = write(A.sig_pipe[1], "c", 1);
  (void)w;
  errno = saved;
}

static void
reap(void)
{
  char b[64];
  while (read(A.sig_pipe[0], b, sizeof b) > 0)
    ;
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
}

/* Retires jobs whose supervisor is gone and whose pipes are drained. */
/* Retires jobs whose supervisor is gone and whose pipes are drained: DONE,
** and the agent keeps nothing of them. */
static void
retire(void)
{
  struct job *j, *next;
  for (j = A.jobs; j; j = next) {
    next = j->next;
    if (j->done && j->out_fd[1] < 0 && j->out_fd[2] < 0) {
      if (j->id)
        send_frame(SBX_AP_DONE, j->id, NULL, 0, NULL, 0);
      /* A finished command is a good moment to let the host drop what it
      ** kept for it (an idle box then keeps nothing). */
      if (A.grace && A.rx_pos > A.rx_acked)
        send_ack();
      free_job(j);
    }
  }
}

/* Channel in ----------------------------------------------------------------------------- */

static int
read_exact(int fd, void *p, size_t n)
{
  uint8_t *b = p;
  while (n > 0) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

static void
read_channel(void)
{
  int ended = 0;
  for (;;) {
    ssize_t r;
    if (buf_reserve(&A.rx, CHUNK) != 0)
      die("sbx-agent: out of memory");
    r = read(A.in, A.rx.p + A.rx.len, A.rx.cap - A.rx.len);
    if (r > 0) {
      A.rx.len += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    ended = 1; /* end of the channel: the frames before it still count */
    break;
  }
  for (;;) {
    struct sbx_ap_frame f;
    int used = sbx_ap_decode(A.rx.p + A.rx.off, buf_size(&A.rx), A.mac ? A.key : NULL, A.seq_in, &f);
    if (used == SBX_AP_NEED)
      break;
    if (used < 0) {
      send_error(0, used == SBX_AP_BAD_TAG ? "bad_tag" : "bad_frame",
                 used == SBX_AP_BAD_TAG ? "a frame failed authentication" : "a frame is too long");
      flush_tx();
      _exit(3);
    }
    A.rx.off += (size_t)used;
    A.rx_pos += (uint64_t)used;
    if (f.type == SBX_AP_PAD)
      continue;
    A.seq_in++;
    on_frame(&f);
  }
  if (A.grace && A.rx_pos - A.rx_acked >= A.ack_every)
    send_ack();
  if (ended)
    detach("the channel ended");
}

/* Re-attach ---------------------------------------------------------------------------- */

static void
to_hex(const uint8_t *b, size_t n, char *out)
{
  static const char digits[] = "0123456789abcdef";
  size_t i;
  for (i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
}

static int
hex_digit(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

/* n hex digits into n / 2 bytes; -1 on anything else. */
static int
from_hex(const char *h, size_t n, uint8_t *out)
{
  size_t i;
  for (i = 0; i + 1 < n; i += 2) {
    int a = hex_digit(h[i]), b = hex_digit(h[i + 1]);
    if (a < 0 || b < 0)
      return -1;
    out[i / 2] = (uint8_t)(a << 4 | b);
  }
  return 0;
}

static int
random_bytes(uint8_t *p, size_t n)
{
#ifdef SYS_getrandom
  if (syscall(SYS_getrandom, p, n, 0) == (long)n)
    return 0;
#endif
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  int ok = fd >= 0 && read_exact(fd, p, n) == 0;
  if (fd >= 0)
    close(fd);
  return ok ? 0 : -1;
}

static socklen_t
attach_address(struct sockaddr_un *a, const char *name)
{
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  /* Abstract (a leading NUL): no file a command could replace, and it
  ** exists on a read-only root. */
  memcpy(a->sun_path + 1, name, strlen(name));
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
}

/* Opens the attach socket (once). Without one the agent cannot be found
** again: it says why on stderr and ends with its channel, as without GRACE. */
static void
listen_attach(void)
{
  char name[SBX_AP_ATTACH_NAME];
  struct sockaddr_un a;
  socklen_t alen;
  int i;
  if (A.listen_fd >= 0)
    return;
  for (i = 0; i < MAX_PENDING; i++)
    A.pend[i].fd = -1;
  sbx_ap_attach_name(A.key, name);
  alen = attach_address(&a, name);
  A.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (A.listen_fd < 0 || bind(A.listen_fd, (struct sockaddr *)&a, alen) != 0 ||
      listen(A.listen_fd, MAX_PENDING) != 0) {
    fprintf(stderr, "sbx-agent: no attach socket (%s): a dropped channel ends the commands\n",
            strerror(errno));
    close_fd(&A.listen_fd);
    A.grace = 0;
  }
}

static void
drop_pending(struct pending *p)
{
  close_fd(&p->fd);
  p->n = 0;
}

/* A connection to the attach socket: only from the agent's own uid (the
** relay runs as root; a command of another user cannot even knock), then
** the challenge. When every slot is taken the oldest goes. */
static void
on_accept(void)
{
  struct pending *p = NULL;
  struct ucred cr;
  socklen_t crlen = sizeof cr;
  uint8_t hello[4 + 2 * SBX_AP_NONCE];
  int fd, i;
  while ((fd = accept4(A.listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0 || cr.uid != geteuid()) {
      close(fd);
      continue;
    }
    for (i = 0; i < MAX_PENDING; i++) {
      if (A.pend[i].fd < 0) {
        p = &A.pend[i];
        break;
      }
      if (!p || A.pend[i].until < p->until)
        p = &A.pend[i];
    }
    drop_pending(p);
    if (random_bytes(p->nonce, SBX_AP_NONCE) != 0) {
      close(fd);
      continue;
    }
    memcpy(hello, SBX_AP_ATTACH_HELLO, 4);
    to_hex(p->nonce, SBX_AP_NONCE, (char *)hello + 4);
    if (write(fd, hello, sizeof hello) != (ssize_t)sizeof hello) {
      close(fd);
      continue;
    }
    p->fd = fd;
    p->n = 0;
    p->until = now_s() + SBX_AP_ATTACH_AUTH_SECONDS;
  }
}

/* The host's answer to the challenge: on a good proof the connection
** becomes the channel and every frame from the host's rx on goes again. */
static void
on_pending(struct pending *p)
{
  uint8_t proof[SBX_AP_PROOF], answer[SBX_AP_PROOF + 8], got[SBX_AP_NONCE + SBX_AP_PROOF + 8];
  char reply[2 * sizeof answer];
  const uint8_t *nonce_h = got, *host_proof = got + SBX_AP_NONCE;
  uint64_t host_rx;
  ssize_t r = read(p->fd, p->got + p->n, sizeof p->got - p->n);
  if (r < 0 && (errno == EAGAIN || errno == EINTR))
    return;
  if (r <= 0) {
    drop_pending(p);
    return;
  }
  p->n += (size_t)r;
  if (p->n < sizeof p->got)
    return;
  if (from_hex((const char *)p->got, sizeof p->got, got) != 0) {
    drop_pending(p);
    return;
  }
  sbx_ap_attach_proof(A.key, "host", p->nonce, nonce_h, proof);
  host_rx = sbx_ap_be64(got + SBX_AP_NONCE + SBX_AP_PROOF);
  if (!sbx_ap_same(proof, host_proof, SBX_AP_PROOF) || host_rx < A.tx_abs ||
      host_rx - A.tx_abs > A.tx.len - A.tx.off) {
    /* Not the host, or a position the agent no longer has. */
    drop_pending(p);
    return;
  }
  if (A.in >= 0)
    detach("the host attached again");
  sbx_ap_attach_proof(A.key, "agent", p->nonce, nonce_h, answer);
  sbx_ap_put_be64(answer + SBX_AP_PROOF, A.rx_pos);
  to_hex(answer, sizeof answer, reply);
  if (write(p->fd, reply, sizeof reply) != (ssize_t)sizeof reply) {
    drop_pending(p);
    return;
  }
  /* The host has everything before host_rx: the rest goes again. */
  A.tx.off += (size_t)(host_rx - A.tx_abs);
  A.tx_abs = host_rx;
  A.tx_sent = A.tx.off;
  A.in = A.out = p->fd;
  p->fd = -1;
  p->n = 0;
  A.detached_since = 0;
  A.rx_acked = A.rx_pos;
  flush_tx();
}

/* The channel is gone. With GRACE the agent waits for the host (what it
** wrote and the host did not acknowledge goes again from where the host
** says); without, it ends every command and exits. */
static void
detach(const char *why)
{
  (void)why;
  if (A.in >= 0) {
    if (A.in != A.out)
      close(A.in);
    close(A.out);
  }
  A.in = A.out = -1;
  A.rx.off = A.rx.len = 0; /* a frame cut short comes again whole */
  if (A.grace && A.listen_fd >= 0) {
    A.tx_sent = A.tx.off;
    A.detached_since = now_s();
  }
  else {
    A.closing = 1;
    A.tx.off = A.tx.len = A.tx_sent = 0;
  }
}

/* Copies bytes both ways between (in, out) and sock until either side ends:
** the relay of "attach" and of the relay modes. Knows nothing of frames. */
static int escape_out; /* --escape: what goes to the channel is escaped (pty_escape.h) */

static int
relay(int in, int out, int sock)
{
  static uint8_t up[CHUNK], down[2 * CHUNK], raw[CHUNK];
  size_t up_n = 0, up_off = 0, down_n = 0, down_off = 0;
  int in_open = 1, sock_open = 1;
  set_nonblock(in);
  set_nonblock(out);
  set_nonblock(sock);
  while ((in_open || up_n > up_off) && (sock_open || down_n > down_off)) {
    struct pollfd fds[4];
    int n = 0, i;
    if (in_open && up_n == up_off)
      fds[n++] = (struct pollfd){ in, POLLIN, 0 };
    if (up_n > up_off)
      fds[n++] = (struct pollfd){ sock, POLLOUT, 0 };
    if (sock_open && down_n == down_off)
      fds[n++] = (struct pollfd){ sock, POLLIN, 0 };
    if (down_n > down_off)
      fds[n++] = (struct pollfd){ out, POLLOUT, 0 };
    if (poll(fds, (nfds_t)n, -1) < 0) {
      if (errno == EINTR)
        continue;
      return 2;
    }
    for (i = 0; i < n; i++) {
      ssize_t r;
      if (!fds[i].revents)
        continue;
      if (fds[i].fd == in && (fds[i].events & POLLIN)) {
        r = read(in, up, sizeof up);
        if (r > 0) {
          up_n = (size_t)r;
          up_off = 0;
        }
        else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          in_open = 0;
        }
      }
      else if (fds[i].fd == sock && (fds[i].events & POLLIN)) {
        r = escape_out ? read(sock, raw, sizeof raw) : read(sock, down, CHUNK);
        if (r > 0) {
          down_n = escape_out ? sbx_pty_escape(raw, (size_t)r, down) : (size_t)r;
          down_off = 0;
        }
        else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          sock_open = 0;
        }
      }
      else if (fds[i].events & POLLOUT) {
        int to_sock = fds[i].fd == sock && up_n > up_off;
        r =
          to_sock ? write(sock, up + up_off, up_n - up_off) : write(out, down + down_off, down_n - down_off);
        if (r > 0) {
          if (to_sock)
            up_off += (size_t)r;
          else
            down_off += (size_t)r;
        }
        else if (r < 0 && errno != EAGAIN && errno != EINTR) {
          return 0; /* that side is gone */
        }
      }
    }
    if (!in_open && up_n == up_off)
      break; /* the host went: the agent sees the end of this channel */
    if (!sock_open && down_n == down_off)
      break;
  }
  return 0;
}

/* A terminal on fd in raw mode (8-bit clean, no echo, no signals); with
** say_raw (the --say-raw argument), SBX_AP_RAW_LINE on out once it is. */
static int say_raw;

static void
make_raw(int fd, int out)
{
  if (isatty(fd)) {
    struct termios t;
    if (tcgetattr(fd, &t) == 0) {
      cfmakeraw(&t);
      tcsetattr(fd, TCSANOW, &t);
    }
  }
  if (say_raw) {
    const char *p = SBX_AP_RAW_LINE;
    size_t n = sizeof SBX_AP_RAW_LINE - 1;
    while (n > 0) {
      ssize_t w = write(out, p, n);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0)
        break;
      p += w;
      n -= (size_t)w;
    }
  }
}

/* "sbx-agent attach NAME": the way back to a running agent. */
static int
attach_main(const char *name)
{
  struct sockaddr_un a;
  socklen_t alen;
  int fd;
  prctl(PR_SET_DUMPABLE, 0);
  if (strlen(name) >= sizeof a.sun_path - 1)
    die("sbx-agent: attach: the name is too long");
  alen = attach_address(&a, name);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, alen) != 0) {
    fprintf(stderr, "sbx-agent: no agent to attach to: %s\n", strerror(errno));
    return 4;
  }
  make_raw(0, 1);
  signal(SIGPIPE, SIG_IGN);
  return relay(0, 1, fd);
}

/* Main ------------------------------------------------------------------------------------ */

static void
hello(void)
{
  uint8_t p[256];
  size_t n = 0;
  struct utsname u;
  uname(&u);
  sbx_ap_put_u32(p, sizeof p, &n, SBX_AF_VERSION, SBX_AP_VERSION);
  sbx_ap_put_u32(p, sizeof p, &n, SBX_AF_PID, (uint32_t)getpid());
  sbx_ap_put(p, sizeof p, &n, SBX_AF_ARCH, u.machine, (uint32_t)strlen(u.machine));
  send_frame(SBX_AP_HELLO, 0, p, n, NULL, 0);
}

/* Ends every job's tree: the host is gone for good. */
static void
end_all_jobs(void)
{
  struct job *j;
  for (j = A.jobs; j; j = j->next)
    if (j->sup > 0)
      kill_tree(j->sup, SIGKILL);
}

/* The relay modes: the process on the channel forks; the child goes on as
** the agent in a new session (a backend that kills the channel's process, or
** hangs up its terminal, leaves it running); the parent relays. */
static void
run_beside_channel(void)
{
  int sp[2];
  pid_t pid;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0)
    die("sbx-agent: socketpair: %s", strerror(errno));
  pid = fork();
  if (pid < 0)
    die("sbx-agent: fork: %s", strerror(errno));
  if (pid > 0) {
    close(sp[0]);
    _exit(relay(0, 1, sp[1]));
  }
  close(sp[1]);
  setsid();
  prctl(PR_SET_DUMPABLE, 0);
  /* The channel's fds stay the relay's: the agent keeps none of them (a
  ** runtime that waits for an exec's output to close must not wait for
  ** the agent). */
  close(0);
  close(1);
  close(2);
  if (open("/dev/null", O_RDWR) == 0) {
    dup2(0, 1);
    dup2(0, 2);
  }
  A.in = A.out = sp[0];
}

int
main(int argc, char **argv)
{
  struct sigaction sa;
  uint8_t mode;
  /* --say-raw and --escape, in any order, before the rest. */
  while (argc >= 2 && (strcmp(argv[1], SBX_AP_SAY_RAW) == 0 || strcmp(argv[1], SBX_AP_ESCAPE) == 0)) {
    if (strcmp(argv[1], SBX_AP_SAY_RAW) == 0)
      say_raw = 1;
    else
      escape_out = 1;
    argc--;
    argv++;
  }
  if (argc == 3 && strcmp(argv[1], "attach") == 0)
    return attach_main(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--proc-fd") == 0) {
    char st[4096];
    ssize_t r;
    proc_fd = atoi(argv[2]);
    if (proc_fd < 3 || fcntl(proc_fd, F_SETFD, FD_CLOEXEC) != 0)
      die("sbx-agent: --proc-fd %s is not an open fd", argv[2]);
    /* The box's PID namespace and its depth in that /proc. */
    r = readlinkat(proc_fd, "self/ns/pid", proc_ns, sizeof proc_ns - 1);
    if (r <= 0 || read_proc(proc_fd, "self/status", st, sizeof st) <= 0 ||
        (proc_depth = nspid(st, -1, NULL)) < 1)
      die("sbx-agent: cannot read the box's own entry in the /proc of --proc-fd");
    proc_ns[r] = 0;
    argc -= 2;
  }
  A.in = 0;
  A.out = 1;
  A.listen_fd = -1;
  agent_pid = getpid();
  A.window = 256 * 1024;
  A.ack_every = 256 * 1024;
  /* No process of the box's user may read our memory, fds or key. */
  prctl(PR_SET_DUMPABLE, 0);
  make_raw(A.in, A.out);
  if (read_exact(A.in, &mode, 1) != 0 ||
      ((mode & ~SBX_AP_MODE_RELAY) != SBX_AP_MODE_PLAIN && (mode & ~SBX_AP_MODE_RELAY) != SBX_AP_MODE_MAC))
    die("sbx-agent: expected a mode byte on stdin (this program is started by sbx)");
  if (read_exact(A.in, A.key, sizeof A.key) != 0)
    die("sbx-agent: expected the key");
  A.mac = (mode & ~SBX_AP_MODE_RELAY) == SBX_AP_MODE_MAC;
  signal(SIGPIPE, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  if (mode & SBX_AP_MODE_RELAY) {
    run_beside_channel();
    agent_pid = getpid();
  }
  if (pipe2(A.sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    die("sbx-agent: pipe: %s", strerror(errno));
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigchld;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  set_cloexec(A.in);
  set_cloexec(A.out);
  set_nonblock(A.in);
  set_nonblock(A.out);
#ifdef F_SETPIPE_SZ
  fcntl(A.out, F_SETPIPE_SZ, PIPE_SIZE);
#endif
  hello();
  /* The host's HELLO carries the window; until it comes, the default. */
  while (!A.closing || A.jobs) {
    struct pollfd fds[4 + MAX_PENDING + 5 * 256];
    struct job *map[4 + MAX_PENDING + 5 * 256];
    int kinds[4 + MAX_PENDING + 5 * 256];
    int n = 0, i, timeout_ms = -1;
    double now = now_s();
    struct job *j;
    if (A.closing) {
      /* The host is gone: end every job and leave. */
      end_all_jobs();
      break;
    }
    if (A.detached_since > 0 && now - A.detached_since >= A.grace) {
      /* The host did not come back in time. */
      end_all_jobs();
      break;
    }
    fds[n] = (struct pollfd){ A.sig_pipe[0], POLLIN, 0 };
    map[n] = NULL;
    kinds[n++] = 0;
    if (A.in >= 0) {
      fds[n] = (struct pollfd){ A.in, POLLIN, 0 };
      map[n] = NULL;
      kinds[n++] = 1;
    }
    if (A.out >= 0 && A.tx_sent < A.tx.len) {
      fds[n] = (struct pollfd){ A.out, POLLOUT, 0 };
      map[n] = NULL;
      kinds[n++] = 2;
    }
    if (A.listen_fd >= 0) {
      fds[n] = (struct pollfd){ A.listen_fd, POLLIN, 0 };
      map[n] = NULL;
      kinds[n++] = 3;
      for (i = 0; i < MAX_PENDING; i++) {
        double left;
        if (A.pend[i].fd < 0)
          continue;
        left = A.pend[i].until - now;
        if (left <= 0) {
          drop_pending(&A.pend[i]);
          continue;
        }
        if (timeout_ms < 0 || left * 1000 < timeout_ms)
          timeout_ms = (int)(left * 1000) + 1;
        fds[n] = (struct pollfd){ A.pend[i].fd, POLLIN, 0 };
        map[n] = NULL;
        kinds[n++] = 100 + i;
      }
    }
    if (A.detached_since > 0) {
      double left = A.detached_since + A.grace - now;
      if (timeout_ms < 0 || left * 1000 < timeout_ms)
        timeout_ms = (int)(left * 1000) + 1;
    }
    for (j = A.jobs; j && n < (int)(sizeof fds / sizeof *fds) - 5; j = j->next) {
      int st;
      for (st = 1; st <= 2; st++) {
        if (j->quiet_until > now) {
          double left = j->quiet_until - now;
          if (timeout_ms < 0 || left * 1000 < timeout_ms)
            timeout_ms = (int)(left * 1000) + 1;
          continue;
        }
        if (j->out_fd[st] >= 0 && j->unread[st] < A.window && tx_held() < OUT_HIGH) {
          fds[n] = (struct pollfd){ j->out_fd[st], POLLIN, 0 };
          map[n] = j;
          kinds[n++] = 10 + st;
        }
      }
      if (j->status_fd >= 0) {
        fds[n] = (struct pollfd){ j->status_fd, POLLIN, 0 };
        map[n] = j;
        kinds[n++] = 20;
      }
      if (j->in_fd >= 0 && buf_size(&j->in) > 0) {
        fds[n] = (struct pollfd){ j->in_fd, POLLOUT, 0 };
        map[n] = j;
        kinds[n++] = 30;
      }
    }
    if (poll(fds, (nfds_t)n, timeout_ms) < 0) {
      if (errno == EINTR)
        continue;
      die("sbx-agent: poll: %s", strerror(errno));
    }
    for (i = 0; i < n; i++) {
      if (!fds[i].revents)
        continue;
      switch (kinds[i]) {
      case 0:
        reap();
        break;
      case 1:
        if (A.in >= 0 && A.in == fds[i].fd)
          read_channel();
        break;
      case 2:
        flush_tx();
        break;
      case 3:
        on_accept();
        break;
      case 11:
        pump_output(map[i], 1);
        break;
      case 12:
        pump_output(map[i], 2);
        break;
      case 20:
        read_status(map[i]);
        break;
      case 30:
        write_stdin(map[i]);
        break;
      default:
        if (kinds[i] >= 100 && A.pend[kinds[i] - 100].fd == fds[i].fd)
          on_pending(&A.pend[kinds[i] - 100]);
      }
    }
    retire();
    flush_tx();
  }
  flush_tx();
  return 0;
}

/*
** sbx as PID 1. A container started with sbx as its entrypoint and no
** --init makes sbx the PID namespace's init: every orphan of the
** namespace (a local box's agent, once bubblewrap's monitor is gone;
** whatever a host process leaves) becomes sbx's child, and sbx, which
** waits only for the children it started (libuv), would leave each one a
** zombie. And the kernel drops signals that init has no handler for, so
** `docker stop` (SIGTERM) would not reach sbx's own handling.
**
** So the first thing the sbx command does as PID 1 is fork: the parent
** is the init (tini's job, in a few lines: reap, forward), the child is
** sbx. The parent exits with the child's status (128 + signal when a
** signal ended it), after which the kernel ends the namespace.
*/
#define _GNU_SOURCE
#include "init.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* The signals passed on to sbx (the ones a container runtime, a terminal
** or a user sends); the rest keep their default action. */
static const int forwarded[] = {
  SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT, SIGALRM,
};

void
sbx_init(void)
{
  sigset_t set, old;
  pid_t child;
  size_t i;
  if (getpid() != 1)
    return;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
    sigaddset(&set, forwarded[i]);
  /* Blocked before the fork: a signal that comes in between is pending in
  ** the parent (and forwarded), not lost. */
  sigprocmask(SIG_BLOCK, &set, &old);
  child = fork();
  if (child < 0)
    return; /* no init then: sbx runs as PID 1 itself */
  if (child == 0) {
    sigprocmask(SIG_SETMASK, &old, NULL);
    /* sbx dies with its init (only a SIGKILL from outside does that). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    return;
  }
  for (;;) {
    siginfo_t info;
    int sig = sigwaitinfo(&set, &info);
    if (sig < 0) {
      if (errno == EINTR)
        continue;
      _exit(125);
    }
    if (sig != SIGCHLD) {
      kill(child, sig);
      continue;
    }
    /* Every child that is done, sbx's last: its status is ours. */
    for (;;) {
      int st;
      pid_t p = waitpid(-1, &st, WNOHANG);
      if (p <= 0)
        break;
      if (p == child)
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
  }
}

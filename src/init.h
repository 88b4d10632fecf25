#ifndef SBX_INIT_H
#define SBX_INIT_H

/* When this process is PID 1 (a container's entrypoint without --init):
** forks, and the parent stays as the namespace's init (it reaps every
** orphan and forwards signals to sbx) until sbx ends, then exits with sbx's
** status. Returns in the child (sbx proper), and at once when not PID 1. */
void sbx_init(void);

#endif

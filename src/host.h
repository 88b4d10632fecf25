/*
** The host: one libuv loop, one Lua state, a coroutine scheduler and the
** waiters that connect event-loop completions to waiting Lua code.
** Internal to sbx; the embedding API is sbx.h.
*/
#ifndef SBX_HOST_H
#define SBX_HOST_H

#include <uv.h>
#include <lua.h>
#include <lauxlib.h>

struct sbx_task;
struct sbx_waiter;

/* Called when the waiting code is cancelled (interrupt): stop the operation. */
typedef void (*sbx_cancel_fn)(struct sbx_waiter *w);

/*
** One wait of one Lua thread. Blocking primitives embed it in their operation
** struct; the loop side calls sbx_wake and never touches Lua. Intrusive links
** let an event keep many waiters.
*/
struct sbx_waiter {
  struct sbx_host *host;
  struct sbx_task *task; /* the task that yielded, NULL when blocking */
  int woken;
  int timed_out;                  /* woken by its deadline */
  int cancelled;                  /* 0, or SBX_CANCEL_* when woken by a cancel */
  sbx_cancel_fn cancel;           /* stops the operation (cancel, interrupt, gc) */
  sbx_cancel_fn detach;           /* unregisters from its source on every wake */
  void *source;                   /* what it waits on (an event, a stream, ...) */
  uv_timer_t *timer;              /* optional deadline */
  lua_State *thread;              /* the thread that awaits it (sbx_await) */
  struct sbx_waiter *prev, *next; /* in the host's list of pending waits */
};

enum { SBX_CANCEL_INTERRUPT = 1, SBX_CANCEL_TASK = 2, SBX_CANCEL_CLOSE = 3, SBX_CANCEL_DEADLINE = 4 };
enum { SBX_DEADLINE_ARMED = 0, SBX_DEADLINE_TIMEOUT = 1, SBX_DEADLINE_SIGNAL = 2 };

/*
** What stops a thread (a task's, or the main thread) beyond its pending
** wait: a stop held for its next wait (a signal that came while it was not
** waiting, a task:cancel of a task not waiting), and core.shield: while a
** shield runs, an interrupt waits up to the shield's grace for it to end
** (an operation the daemon is answering, which would be left half made if
** cut off), then is delivered as usual.
*/
struct sbx_stops {
  struct sbx_host *host;
  int pending;                               /* SBX_CANCEL_* for the next wait, or 0 */
  int shield;                                /* core.shield calls running on this thread */
  int held;                                  /* an interrupt came while shielded */
  int expired;                               /* ... and the grace ran out */
  int delivered;                             /* ... and a wait ended with it */
  double grace;                              /* seconds (the outermost shield's) */
  uv_timer_t *timer;                         /* the grace, armed while held */
  struct sbx_stops *prev_armed, *next_armed; /* the host's, while armed */
};

#define SBX_HOST_SLOTS 8
#define SBX_HOST_HOOKS 8
enum { SBX_CLOSE_ABORT, SBX_CLOSE_DRAIN, SBX_CLOSE_FREE };
struct sbx_host;
typedef void (*sbx_close_fn)(struct sbx_host *h);

struct sbx_host {
  uv_loop_t loop;
  lua_State *L;
  struct sbx_task *ready_first, *ready_last;
  struct sbx_waiter pending; /* list head of every pending wait */
  int tasks_alive;
  int detached;                    /* operations nobody waits for (cleanup) */
  uv_async_t sig_async;            /* poked by the SIGINT/SIGTERM handler */
  int sig_taken;                   /* the handler's count already taken */
  double signal_at;                /* when the last signal was taken */
  double slice;                    /* core.scheduler{ slice }: 0 for none */
  struct sbx_deadline *deadlines;  /* armed core.deadline frames (deadline.c) */
  int signals;                     /* how many SIGINT/SIGTERM arrived */
  int interrupts;                  /* core.interrupt calls (a signal's effect without one) */
  int interrupt_pending;           /* an interrupt not yet delivered */
  int interrupt_cancelled;         /* ... whose waits were already cancelled */
  struct sbx_stops main_stops;     /* the main thread's (a task's are its own) */
  struct sbx_stops *armed_shields; /* every sbx_stops whose grace timer runs */
  int last_signal;
  /* What modules keep on the host, which knows none of them: state by
  ** their own key (sbx_host_slot), and what to do when it closes. */
  struct {
    const void *key;
    void *value;
  } slots[SBX_HOST_SLOTS];
  struct {
    int phase;
    sbx_close_fn fn;
  } hooks[SBX_HOST_HOOKS];
  int nhooks;
  int closed;
};

/*
** Module state on the host: the slot of key (any unique address of the
** module's, a static), NULL-initialised on first use. Raises only when
** every slot is taken (a build with more modules than SBX_HOST_SLOTS).
*/
void **sbx_host_slot(struct sbx_host *h, const void *key);

/*
** A hook run when the host closes, after every pending wait was cancelled,
** in phase order: SBX_CLOSE_ABORT (stop work in flight), SBX_CLOSE_DRAIN
** (just before the loop's last run: handles it must close), SBX_CLOSE_FREE
** (after that run: memory the loop no longer holds). Registering the same
** fn twice is harmless.
*/
void sbx_host_on_close(struct sbx_host *h, int phase, sbx_close_fn fn);

/* The host of a Lua state (created by luaopen_sbx_core). */
struct sbx_host *sbx_host_get(lua_State *L);

/*
** Pushes a new operation userdata of size bytes whose first member is a
** struct sbx_waiter, already pending (an interrupt reaches it). Its __gc
** cancels the operation if the thread waiting on it is collected.
*/
struct sbx_waiter *sbx_op_new(lua_State *L, size_t size, sbx_cancel_fn cancel);
/* Arms a deadline after seconds (< 0: none); firing wakes w with timed_out. */
int sbx_waiter_deadline(struct sbx_waiter *w, double seconds);
/* Marks w done and schedules its task; safe from any loop callback. */
void sbx_wake(struct sbx_waiter *w);

/*
** Waits for w. In a task it yields with continuation k; elsewhere (the main
** chunk, a plain coroutine, a non-yieldable call) it runs the loop until w is
** woken, then calls k. k must check w->cancelled. May yield, may raise.
*/
int sbx_await(lua_State *L, struct sbx_waiter *w, lua_KFunction k, lua_KContext ctx);

/*
** The wait of a read from a source with one reader slot (a stream, an HTTP
** body, a line reader, a websocket): raises with busy when *slot holds
** another reader; otherwise parks a waiter in *slot (cleared again however
** the wait ends), arms the deadline (timeout < 0: none) and awaits with k.
** The source must outlive the wait (its userdata is on the waiting stack).
** May yield, may raise.
*/
int sbx_await_read(lua_State *L, struct sbx_waiter **slot, double timeout, lua_KFunction k, const char *busy);

/* In a read's continuation: raises when the wait was cancelled (an
** interrupt, a task cancel); returns normally otherwise. */
void sbx_read_resumed(lua_State *L);

/* Runs the loop until *flag is set (or, for flag NULL, until nothing is left).
** Returns 0, or -1 on an interrupt, or -2 when nothing could ever set *flag. */
int sbx_drive(struct sbx_host *h, const int *flag);

/* Raises the error for a cancelled wait ("interrupted", "cancelled",
** "deadline exceeded"). */
int sbx_raise_cancelled(lua_State *L);

/* Cancels a pending wait (why: SBX_CANCEL_*), waking its task. */
void sbx_waiter_cancel(struct sbx_waiter *w, int why);

/* The host of L, or NULL when none was made (never raises). */
struct sbx_host *sbx_host_peek(lua_State *L);

/* Takes the signals the handler counted since the last call: counted,
** interrupt pending, every deadline frame ended. 1 when there were any. */
int sbx_host_poll_signals(struct sbx_host *h);

/* A signal taken while thread L ran (the count hook's): set 1, L gets the
** interruption at its next wait, as a queued task does; set 0, it was
** raised in L already. L a task's thread or the main thread (others: no
** effect). */
void sbx_host_stop_running(struct sbx_host *h, lua_State *L, int set);

/* core.shield(grace, fn, ...) -> fn's results: fn runs with interrupts
** held for at most grace seconds after one comes (see struct sbx_stops). */
int sbx_core_shield(lua_State *L);

/* Nonzero while the count hook has something to look at: a signal not
** taken yet, or one taken but not yet delivered to the waits. */
int sbx_host_attention(void);

/* deadline.c: core.deadline and core.scheduler, the count hook. */
int sbx_core_deadline(lua_State *L);
int sbx_core_scheduler(lua_State *L);
int sbx_core_xpcall(lua_State *L);
/* Raises in L when a deadline frame of L has ended (one past its time ends
** now) or a signal is to be taken: what the count hook does, for C code
** that runs long (pattern.c). */
void sbx_deadline_check(lua_State *L);
/* pattern.c: sets core.pattern (find, match, gmatch, gsub under deadlines)
** in the table on top of the stack. */
void sbx_pattern_open(lua_State *L);
void sbx_deadline_open(lua_State *L);
/* From the signal handler: the count hook on the main thread (lua_sethook
** is async-signal-safe), so code that never waits sees the signal. */
void sbx_deadline_signal_hook(lua_State *main);
/* SBX_DEADLINE_TIMEOUT or _SIGNAL when a frame of thread L has ended (one
** past its time ends now), else 0. */
int sbx_deadline_state(lua_State *L);
/* A signal: every frame ends. */
void sbx_deadline_signal(struct sbx_host *h);
/* The host closes: every frame's timer stops. */
void sbx_deadline_close_all(struct sbx_host *h);

#include "fail.h" /* sbx_pushfail: nil, message, code */
int sbx_open_host(lua_State *L);

double sbx_now(void);

/*
** Pushes an sbx.stream over a host process's pipes (stdout and stderr read,
** stdin written; -1 for none), taking ownership of the fds; options from
** the table at index opts (capture, chunks, chunk_limit). 0, or -1 when
** the stream could not open them (it is pushed, ended). stream.c.
*/
int sbx_stream_pipes(lua_State *L, int opts, int in_fd, int out_fd, int err_fd);

#endif

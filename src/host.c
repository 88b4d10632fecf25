/*
** The host: event loop, coroutine scheduler, waits, events, signals.
**
** Contract: loop callbacks never run Lua. They mark a waiter woken and queue
** its task; sbx_drive resumes queued tasks between uv_run passes. Because of
** that a task that must block where it cannot yield can run the driver again
** (nested) without re-entering uv_run from inside a callback.
*/
#include "host.h"
#include "sbx.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The source's git commit, passed by the Makefile; any other build says so. */

static const char HOST_KEY = 'h';
#define TASK_MT "sbx.task"
#define EVENT_MT "sbx.event"
#define OP_MT "sbx.op"

enum { TASK_READY, TASK_WAITING, TASK_DONE, TASK_FAILED };

/* Signals, process-wide (see on_signal). */
static volatile sig_atomic_t sig_count, sig_last;
static uv_async_t *sig_async;        /* the host's, while it lives */
static lua_State *volatile sig_main; /* its main thread (the handler hooks it) */
static int sig_taken;                /* the part of sig_count already taken */
static int undelivered;              /* taken, not yet delivered to waits */
static struct sigaction old_int, old_term;

struct sbx_task {
  struct sbx_host *host;
  lua_State *co;
  int co_ref;      /* anchors the thread while it runs */
  int self_ref;    /* anchors this userdata while it runs */
  int results_ref; /* table of results, or {false, error} */
  int status;
  int observed; /* someone asked for the result */
  int cancel_requested;
  struct sbx_stops stops; /* held stops, core.shield (host.h) */
  int unref;              /* core.drain does not wait for it (task:unref) */
  int in_queue;
  struct sbx_waiter *waiting;
  struct sbx_task *next_ready;
  int id;
};

struct sbx_event {
  struct sbx_host *host;
  int set;
};

/* ---------------------------------------------------------------- time */

double
sbx_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct sbx_host *
sbx_host_peek(lua_State *L)
{
  struct sbx_host *h;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &HOST_KEY);
  h = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return h;
}

struct sbx_host *
sbx_host_get(lua_State *L)
{
  struct sbx_host *h = sbx_host_peek(L);
  if (!h)
    luaL_error(L, "sbx host not initialised (require 'sbx' first)");
  return h;
}

/* ---------------------------------------------------------------- waits */

static void
pending_unlink(struct sbx_waiter *w)
{
  if (w->prev) {
    w->prev->next = w->next;
    w->next->prev = w->prev;
    w->prev = w->next = NULL;
  }
}

static void
timer_free_cb(uv_handle_t *t)
{
  free(t);
}

static void
waiter_stop_timer(struct sbx_waiter *w)
{
  if (w->timer) {
    uv_timer_stop(w->timer);
    uv_close((uv_handle_t *)w->timer, timer_free_cb);
    w->timer = NULL;
  }
}

static void
task_make_ready(struct sbx_task *t)
{
  struct sbx_host *h = t->host;
  if (t->in_queue)
    return;
  t->in_queue = 1;
  t->next_ready = NULL;
  if (h->ready_last)
    h->ready_last->next_ready = t;
  else
    h->ready_first = t;
  h->ready_last = t;
}

void
sbx_wake(struct sbx_waiter *w)
{
  if (w->woken)
    return;
  w->woken = 1;
  pending_unlink(w);
  waiter_stop_timer(w);
  if (w->detach)
    w->detach(w);
  if (w->task)
    task_make_ready(w->task);
  /* A wake from a timer callback would otherwise be followed, in the same
  ** uv_run pass, by a poll that may block forever: make this pass return
  ** so the driver resumes the woken code first. */
  uv_stop(&w->host->loop);
}

static void
deadline_cb(uv_timer_t *t)
{
  struct sbx_waiter *w = t->data;
  w->timed_out = 1;
  sbx_wake(w);
}

int
sbx_waiter_deadline(struct sbx_waiter *w, double seconds)
{
  uint64_t ms;
  if (seconds < 0 || w->woken)
    return 0;
  w->timer = malloc(sizeof *w->timer);
  if (!w->timer)
    return -1;
  uv_timer_init(&w->host->loop, w->timer);
  w->timer->data = w;
  ms = (uint64_t)(seconds * 1000.0 + 0.5);
  uv_timer_start(w->timer, deadline_cb, ms, 0);
  return 0;
}

static void
waiter_cancel(struct sbx_waiter *w, int why)
{
  if (w->woken)
    return;
  w->cancelled = why;
  if (w->cancel)
    w->cancel(w);
  sbx_wake(w);
}

void
sbx_waiter_cancel(struct sbx_waiter *w, int why)
{
  waiter_cancel(w, why);
}

static int
op_gc(lua_State *L)
{
  struct sbx_waiter *w = lua_touserdata(L, 1);
  if (w && !w->woken) {
    w->task = NULL; /* the thread is gone: nothing to resume */
    waiter_cancel(w, SBX_CANCEL_CLOSE);
  }
  return 0;
}

struct sbx_waiter *
sbx_op_new(lua_State *L, size_t size, sbx_cancel_fn cancel)
{
  struct sbx_host *h = sbx_host_get(L);
  struct sbx_waiter *w = lua_newuserdatauv(L, size, 1);
  memset(w, 0, size);
  w->host = h;
  w->cancel = cancel;
  luaL_setmetatable(L, OP_MT);
  w->next = h->pending.next;
  w->prev = &h->pending;
  h->pending.next->prev = w;
  h->pending.next = w;
  return w;
}

static const char THREADS_KEY = 't';

/*
** The task a thread runs, or NULL for the main thread and plain coroutines.
** A weak-keyed registry table maps task threads to their task: the extra
** space of threads made before sbx loaded holds garbage, so it is not used.
*/
static struct sbx_task *
task_of(lua_State *L)
{
  struct sbx_task *t;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &THREADS_KEY);
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    return NULL;
  }
  lua_pushthread(L);
  lua_rawget(L, -2);
  t = lua_touserdata(L, -1);
  lua_pop(L, 2);
  return t;
}

static int
is_main_thread(lua_State *L)
{
  int main = lua_pushthread(L);
  lua_pop(L, 1);
  return main;
}

/* The stops of thread L: its task's, the main thread's, or NULL (a plain
** coroutine). */
static struct sbx_stops *
stops_of(struct sbx_host *h, lua_State *L)
{
  struct sbx_task *t = task_of(L);
  if (t && t->co == L)
    return &t->stops;
  if (!t && is_main_thread(L))
    return &h->main_stops;
  return NULL;
}

/* The stops of the thread a pending wait belongs to. */
static struct sbx_stops *
waiter_stops(struct sbx_host *h, struct sbx_waiter *w)
{
  if (w->task)
    return &w->task->stops;
  if (w->thread && w->thread == h->L)
    return &h->main_stops;
  return NULL;
}

void
sbx_host_stop_running(struct sbx_host *h, lua_State *L, int set)
{
  struct sbx_stops *s = stops_of(h, L);
  if (!s)
    return;
  if (!set)
    s->pending = 0;
  else if (!s->pending)
    s->pending = SBX_CANCEL_INTERRUPT;
}

static void
shield_timer_free(struct sbx_stops *s)
{
  if (s->timer) {
    uv_timer_stop(s->timer);
    uv_close((uv_handle_t *)s->timer, timer_free_cb);
    s->timer = NULL;
    if (s->prev_armed)
      s->prev_armed->next_armed = s->next_armed;
    else
      s->host->armed_shields = s->next_armed;
    if (s->next_armed)
      s->next_armed->prev_armed = s->prev_armed;
    s->prev_armed = s->next_armed = NULL;
  }
}

/* The grace ran out: the shielded thread's wait ends with the interrupt
** (or its next one does, when it runs). */
static void
shield_expire_cb(uv_timer_t *timer)
{
  struct sbx_stops *s = timer->data;
  struct sbx_host *h = s->host;
  struct sbx_waiter *w, *next;
  shield_timer_free(s);
  s->expired = 1;
  for (w = h->pending.next; w != &h->pending; w = next) {
    next = w->next;
    if (!w->woken && waiter_stops(h, w) == s) {
      s->delivered = 1;
      waiter_cancel(w, SBX_CANCEL_INTERRUPT);
    }
  }
}

/* An interrupt for a shielded thread: held, and its grace starts. */
static void
shield_hold(struct sbx_host *h, struct sbx_stops *s)
{
  if (s->held)
    return;
  s->held = 1;
  s->host = h;
  s->timer = malloc(sizeof *s->timer);
  if (!s->timer) {
    s->expired = 1; /* no timer: no grace */
    return;
  }
  uv_timer_init(&h->loop, s->timer);
  s->timer->data = s;
  uv_timer_start(s->timer, shield_expire_cb, (uint64_t)(s->grace * 1000.0 + 0.5), 0);
  s->prev_armed = NULL;
  s->next_armed = h->armed_shields;
  if (h->armed_shields)
    h->armed_shields->prev_armed = s;
  h->armed_shields = s;
}

/* Whether an interrupt now would be held rather than delivered. */
static int
shielded(const struct sbx_stops *s)
{
  return s && s->shield > 0 && !s->expired;
}

/* A stop held for the next wait of thread L ends w at once. */
static void
await_stops(struct sbx_host *h, lua_State *L, struct sbx_waiter *w)
{
  struct sbx_stops *s = stops_of(h, L);
  if (!s || w->woken)
    return;
  if (s->shield > 0 && s->expired && s->held && !s->delivered) {
    s->delivered = 1;
    waiter_cancel(w, SBX_CANCEL_INTERRUPT);
  }
  else if (s->pending == SBX_CANCEL_INTERRUPT && shielded(s)) {
    s->pending = 0;
    shield_hold(h, s);
  }
  else if (s->pending) {
    int why = s->pending;
    s->pending = 0;
    waiter_cancel(w, why);
  }
}

int
sbx_await(lua_State *L, struct sbx_waiter *w, lua_KFunction k, lua_KContext ctx)
{
  struct sbx_task *t = task_of(L);
  w->thread = L;
  /* A thread whose deadline ended waits for nothing more. */
  if (!w->woken && sbx_deadline_state(L))
    waiter_cancel(w, SBX_CANCEL_DEADLINE);
  await_stops(w->host, L, w);
  if (w->woken)
    return k(L, LUA_OK, ctx);
  if (t && t->co == L && lua_isyieldable(L)) {
    w->task = t;
    t->waiting = w;
    t->status = TASK_WAITING;
    return lua_yieldk(L, 0, ctx, k);
  }
  for (;;) {
    int rc = sbx_drive(w->host, &w->woken);
    if (rc == -1) {
      /* An interrupt (core.interrupt's): held by a shield, or the end. */
      struct sbx_stops *s = stops_of(w->host, L);
      if (!w->woken && shielded(s)) {
        shield_hold(w->host, s);
        continue;
      }
      waiter_cancel(w, SBX_CANCEL_INTERRUPT);
    }
    else if (rc == -2) {
      waiter_cancel(w, SBX_CANCEL_CLOSE);
      return luaL_error(L, "deadlock: this wait can never end (no task, timer or I/O left to wake it)");
    }
    break;
  }
  return k(L, LUA_OK, ctx);
}

static void
slot_detach(struct sbx_waiter *w)
{
  struct sbx_waiter **slot = w->source;
  if (slot && *slot == w)
    *slot = NULL;
  w->source = NULL;
}

int
sbx_await_read(lua_State *L, struct sbx_waiter **slot, double timeout, lua_KFunction k, const char *busy)
{
  struct sbx_waiter *w;
  if (*slot)
    return luaL_error(L, "%s", busy);
  w = sbx_op_new(L, sizeof *w, NULL);
  w->source = slot;
  w->detach = slot_detach;
  *slot = w;
  sbx_waiter_deadline(w, timeout);
  return sbx_await(L, w, k, 0);
}

void
sbx_read_resumed(lua_State *L)
{
  struct sbx_waiter *w = lua_touserdata(L, -1);
  if (w && w->cancelled)
    sbx_raise_cancelled(L);
}

int
sbx_raise_cancelled(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  struct sbx_task *t = task_of(L);
  /* No position prefix: callers match these messages by their start. */
  if (sbx_deadline_state(L) == SBX_DEADLINE_TIMEOUT)
    lua_pushliteral(L, "deadline exceeded");
  else if (t && t->cancel_requested)
    lua_pushliteral(L, "cancelled");
  else
    lua_pushfstring(L, "interrupted (signal %d)", h->last_signal);
  return lua_error(L);
}

/*
** core.is_cancel(e) -> "cancelled" | "interrupted" | "deadline" | nil: what
** kind of stop an error is, if it is one of the host's own (above, and
** deadline.c's): a task:cancel(), a signal or core.interrupt, a deadline
** that ended. The one place that reads these messages back. A position
** ("file.lua:12: ", from error() rethrowing the message) and anything after
** the message's first line (a traceback) are allowed; other text before it
** is not: a command's output that says "interrupted" is not a stop.
*/
static int
core_is_cancel(lua_State *L)
{
  static const struct {
    const char *text;
    const char *kind;
  } kinds[] = {
    { "cancelled", "cancelled" },
    { "interrupted (signal ", "interrupted" },
    { "deadline exceeded", "deadline" },
  };
  const char *s, *p;
  size_t i, n;
  if (lua_type(L, 1) != LUA_TSTRING) {
    lua_pushnil(L);
    return 1;
  }
  s = lua_tostring(L, 1);
  /* Skip one "chunk:line: " position, as luaL_where writes it. */
  for (p = s; *p && *p != '\n' && *p != ':'; p++) {
  }
  if (*p == ':' && p[1] >= '0' && p[1] <= '9') {
    const char *q = p + 1;
    while (*q >= '0' && *q <= '9')
      q++;
    if (q[0] == ':' && q[1] == ' ')
      s = q + 2;
  }
  for (i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    n = strlen(kinds[i].text);
    if (strncmp(s, kinds[i].text, n) == 0) {
      const char *end = s + n;
      if (kinds[i].kind[0] == 'i') { /* "interrupted (signal N)" */
        const char *digits = end;
        while (*end >= '0' && *end <= '9')
          end++;
        if (end == digits || *end != ')')
          continue;
        end++;
      }
      if (*end == '\0' || *end == '\n') {
        lua_pushstring(L, kinds[i].kind);
        return 1;
      }
    }
  }
  lua_pushnil(L);
  return 1;
}

/* ---------------------------------------------------------------- tasks */

static void
task_finish(struct sbx_task *t, lua_State *co, int ok, int nres)
{
  struct sbx_host *h = t->host;
  int i;
  shield_timer_free(&t->stops); /* a thread left in a shield (never resumed) */
  lua_createtable(co, nres + 1, 1);
  lua_insert(co, -(nres + 1));
  lua_pushboolean(co, ok);
  lua_rawseti(co, -(nres + 2), 1);
  for (i = nres; i >= 1; i--)
    lua_rawseti(co, -(i + 1), i + 1);
  lua_pushinteger(co, nres + 1);
  lua_setfield(co, -2, "n");
  t->results_ref = luaL_ref(co, LUA_REGISTRYINDEX);
  t->status = ok ? TASK_DONE : TASK_FAILED;
  t->waiting = NULL;
  if (!t->unref)
    h->tasks_alive--;
  /* Wake everything joined on this task. */
  {
    struct sbx_waiter *w = h->pending.next, *next;
    for (; w != &h->pending; w = next) {
      next = w->next;
      if (w->source == t)
        sbx_wake(w);
    }
  }
  luaL_unref(co, LUA_REGISTRYINDEX, t->self_ref);
  t->self_ref = LUA_NOREF;
  /* The thread may be collected now; its results live in the table. */
  luaL_unref(co, LUA_REGISTRYINDEX, t->co_ref);
  t->co_ref = LUA_NOREF;
  t->co = NULL;
}

static void
task_resume(struct sbx_task *t)
{
  lua_State *co = t->co;
  int nres = 0, st, nargs;
  t->in_queue = 0;
  t->waiting = NULL;
  t->status = TASK_READY;
  nargs = lua_status(co) == LUA_OK ? lua_gettop(co) - 1 : 0;
  st = lua_resume(co, NULL, nargs, &nres);
  if (st == LUA_YIELD) {
    lua_pop(co, nres);
    if (!t->waiting)
      task_make_ready(t); /* a plain coroutine.yield: just let others run */
  }
  else if (st == LUA_OK)
    task_finish(t, co, 1, nres);
  else {
    const char *msg = lua_tostring(co, -1);
    if (!msg)
      msg = luaL_tolstring(co, -1, NULL);
    luaL_traceback(co, co, msg, 0);
    lua_replace(co, 1);
    lua_settop(co, 1);
#if LUA_VERSION_RELEASE_NUM >= 50406
    lua_closethread(co, NULL);
#else
    lua_resetthread(co);
#endif
    lua_settop(co, 1);
    task_finish(t, co, 0, 1);
  }
}

static void
run_ready(struct sbx_host *h)
{
  struct sbx_task *t;
  while ((t = h->ready_first)) {
    h->ready_first = t->next_ready;
    if (!h->ready_first)
      h->ready_last = NULL;
    if (t->co)
      task_resume(t);
  }
}

/*
** An interrupt reaches every task once: a waiting task at its wait, a task
** queued to run (not started yet, or woken by a wait that ended well) at its
** next one. The tasks are marked before the waits are cancelled, so a task
** this wakes is not marked again: its cleanup's waits go on, as do those of
** tasks spawned after the signal (box removals).
*/
static void
deliver_interrupt(struct sbx_host *h)
{
  struct sbx_waiter *w = h->pending.next, *next;
  struct sbx_task *t;
  h->interrupt_pending = 0;
  undelivered = 0;
  for (t = h->ready_first; t; t = t->next_ready)
    if (!t->stops.pending)
      t->stops.pending = SBX_CANCEL_INTERRUPT;
  for (; w != &h->pending; w = next) {
    struct sbx_stops *s = waiter_stops(h, w);
    next = w->next;
    if (shielded(s))
      shield_hold(h, s);
    else
      waiter_cancel(w, SBX_CANCEL_INTERRUPT);
  }
}

int
sbx_drive(struct sbx_host *h, const int *flag)
{
  for (;;) {
    sbx_host_poll_signals(h);
    run_ready(h);
    if (flag && *flag)
      return 0;
    if (h->interrupt_pending) {
      /* A signal was delivered when it was taken (sbx_host_poll_signals)
      ** to every wait pending then, this one among them if it was: a wait
      ** begun after that (the cleanup the signal started) goes on, and so
      ** does a drain (sbx run's, after an interrupt: it waits for the
      ** tasks' cleanup and the removal of their dropped boxes). */
      if (h->interrupt_cancelled) {
        h->interrupt_pending = h->interrupt_cancelled = 0;
        undelivered = 0;
        continue;
      }
      /* core.interrupt: delivered here, to every wait pending now. */
      deliver_interrupt(h);
      undelivered = 0;
      run_ready(h);
      return flag ? -1 : 0;
    }
    if (!flag && h->tasks_alive == 0 && h->detached == 0)
      return 0;
    if (!h->ready_first && !uv_loop_alive(&h->loop))
      return flag || h->tasks_alive ? -2 : 0;
    uv_run(&h->loop, UV_RUN_ONCE);
  }
}

static struct sbx_task *
check_task(lua_State *L, int i)
{
  return luaL_checkudata(L, i, TASK_MT);
}

/* core.spawn(fn, ...) -> task. The task starts on the next scheduler pass. */
static int
core_spawn(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  int n = lua_gettop(L);
  struct sbx_task *t;
  lua_State *co;
  static int next_id;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  t = lua_newuserdatauv(L, sizeof *t, 0);
  memset(t, 0, sizeof *t);
  t->host = h;
  t->co_ref = t->self_ref = t->results_ref = LUA_NOREF;
  t->id = ++next_id;
  luaL_setmetatable(L, TASK_MT);
  co = lua_newthread(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &THREADS_KEY);
  lua_pushvalue(L, -2);
  lua_pushlightuserdata(L, t);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  t->co = co;
  t->co_ref = luaL_ref(L, LUA_REGISTRYINDEX); /* [args.., task] */
  lua_pushvalue(L, -1);
  t->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, -1);
  lua_insert(L, 1); /* [task, fn, args.., task] */
  lua_pop(L, 1);
  lua_xmove(L, co, n); /* fn and args to the thread */
  h->tasks_alive++;
  task_make_ready(t);
  return 1;
}

static int join_k(lua_State *L, int status, lua_KContext ctx);

/* task:join([timeout]) -> true when finished, false on timeout. May yield. */
static int
task_join(lua_State *L)
{
  struct sbx_task *t = check_task(L, 1);
  double timeout = luaL_optnumber(L, 2, -1);
  struct sbx_waiter *w;
  if (t->status == TASK_DONE || t->status == TASK_FAILED) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if (t == task_of(L) && t->co == L)
    return luaL_error(L, "a task cannot wait for itself");
  w = sbx_op_new(L, sizeof *w, NULL);
  w->source = t;
  sbx_waiter_deadline(w, timeout);
  return sbx_await(L, w, join_k, 0);
}

static int
join_k(lua_State *L, int status, lua_KContext ctx)
{
  struct sbx_waiter *w = lua_touserdata(L, -1);
  struct sbx_task *t = check_task(L, 1);
  (void)status;
  (void)ctx;
  if (w->cancelled)
    return sbx_raise_cancelled(L);
  lua_pushboolean(L, t->status == TASK_DONE || t->status == TASK_FAILED);
  return 1;
}

/* task:result() -> true, results... | false, error | nil when still running */
static int
task_result(lua_State *L)
{
  struct sbx_task *t = check_task(L, 1);
  int n, i;
  if (t->results_ref == LUA_NOREF) {
    lua_pushnil(L);
    return 1;
  }
  t->observed = 1;
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->results_ref);
  lua_getfield(L, -1, "n");
  n = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  luaL_checkstack(L, n, "too many results");
  for (i = 1; i <= n; i++)
    lua_rawgeti(L, -i, i);
  return n;
}

static int
task_status(lua_State *L)
{
  static const char *const names[] = { "ready", "waiting", "done", "failed" };
  struct sbx_task *t = check_task(L, 1);
  lua_pushstring(L, names[t->status]);
  return 1;
}

static int
task_done(lua_State *L)
{
  struct sbx_task *t = check_task(L, 1);
  lua_pushboolean(L, t->status == TASK_DONE || t->status == TASK_FAILED);
  return 1;
}

/* task:cancel(): a waiting task wakes with the error "cancelled"; one not
** waiting (queued, not started) gets it at its next wait. */
static int
task_cancel(lua_State *L)
{
  struct sbx_task *t = check_task(L, 1);
  if (t->status == TASK_DONE || t->status == TASK_FAILED) {
    lua_pushboolean(L, 0);
    return 1;
  }
  t->cancel_requested = 1;
  if (t->waiting)
    waiter_cancel(t->waiting, SBX_CANCEL_TASK);
  else
    t->stops.pending = SBX_CANCEL_TASK;
  lua_pushboolean(L, 1);
  return 1;
}

/*
** task:unref() -> task. core.drain (the end of `sbx run`) no longer waits for
** it, as libuv's uv_unref: for a watcher that runs as long as boxes exist,
** which are removed only after the drain. It still runs while anything
** else does, and is cancelled when the host closes.
*/
static int
task_unref(lua_State *L)
{
  struct sbx_task *t = check_task(L, 1);
  if (!t->unref && t->status != TASK_DONE && t->status != TASK_FAILED) {
    t->unref = 1;
    t->host->tasks_alive--;
  }
  lua_settop(L, 1);
  return 1;
}

static int
task_observed(lua_State *L)
{
  struct sbx_task *t = check_task(L, 1);
  lua_pushboolean(L, t->observed);
  return 1;
}

static int
task_tostring(lua_State *L)
{
  struct sbx_task *t = check_task(L, 1);
  static const char *const names[] = { "ready", "waiting", "done", "failed" };
  lua_pushfstring(L, "sbx.task %d (%s)", t->id, names[t->status]);
  return 1;
}

static int
task_gc(lua_State *L)
{
  struct sbx_task *t = check_task(L, 1);
  if (t->results_ref != LUA_NOREF) {
    luaL_unref(L, LUA_REGISTRYINDEX, t->results_ref);
    t->results_ref = LUA_NOREF;
  }
  return 0;
}

static int
core_current(lua_State *L)
{
  struct sbx_task *t = task_of(L);
  if (t && t->co == L && t->self_ref != LUA_NOREF)
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
  else
    lua_pushnil(L);
  return 1;
}

/* ---------------------------------------------------------------- sleep, events */

static int sleep_k(lua_State *L, int status, lua_KContext ctx);

/* core.sleep(seconds). May yield. */
static int
core_sleep(lua_State *L)
{
  double s = luaL_checknumber(L, 1);
  struct sbx_waiter *w;
  luaL_argcheck(L, s >= 0, 1, "negative duration");
  w = sbx_op_new(L, sizeof *w, NULL);
  sbx_waiter_deadline(w, s);
  return sbx_await(L, w, sleep_k, 0);
}

static int
sleep_k(lua_State *L, int status, lua_KContext ctx)
{
  struct sbx_waiter *w = lua_touserdata(L, -1);
  (void)status;
  (void)ctx;
  if (w->cancelled)
    return sbx_raise_cancelled(L);
  return 0;
}

/* core.yield(): lets every other ready task run once. */
static int
core_yield(lua_State *L)
{
  lua_settop(L, 1);
  lua_pushnumber(L, 0);
  lua_replace(L, 1);
  return core_sleep(L);
}

static int
core_event(lua_State *L)
{
  struct sbx_event *e = lua_newuserdatauv(L, sizeof *e, 0);
  e->host = sbx_host_get(L);
  e->set = 0;
  luaL_setmetatable(L, EVENT_MT);
  return 1;
}

static int
event_set(lua_State *L)
{
  struct sbx_event *e = luaL_checkudata(L, 1, EVENT_MT);
  struct sbx_waiter *w, *next;
  e->set = 1;
  for (w = e->host->pending.next; w != &e->host->pending; w = next) {
    next = w->next;
    if (w->source == e)
      sbx_wake(w);
  }
  return 0;
}

static int
event_clear(lua_State *L)
{
  struct sbx_event *e = luaL_checkudata(L, 1, EVENT_MT);
  e->set = 0;
  return 0;
}

static int
event_is_set(lua_State *L)
{
  struct sbx_event *e = luaL_checkudata(L, 1, EVENT_MT);
  lua_pushboolean(L, e->set);
  return 1;
}

static int
event_wait_k(lua_State *L, int status, lua_KContext ctx)
{
  struct sbx_waiter *w = lua_touserdata(L, -1);
  struct sbx_event *e = luaL_checkudata(L, 1, EVENT_MT);
  (void)status;
  (void)ctx;
  if (w->cancelled)
    return sbx_raise_cancelled(L);
  lua_pushboolean(L, e->set);
  return 1;
}

/* ev:wait([timeout]) -> true once set, false on timeout. May yield. */
static int
event_wait(lua_State *L)
{
  struct sbx_event *e = luaL_checkudata(L, 1, EVENT_MT);
  double timeout = luaL_optnumber(L, 2, -1);
  struct sbx_waiter *w;
  lua_settop(L, 1);
  if (e->set) {
    lua_pushboolean(L, 1);
    return 1;
  }
  w = sbx_op_new(L, sizeof *w, NULL);
  w->source = e;
  sbx_waiter_deadline(w, timeout);
  return sbx_await(L, w, event_wait_k, 0);
}

/* ---------------------------------------------------------------- misc */

static int
core_now(lua_State *L)
{
  lua_pushnumber(L, sbx_now());
  return 1;
}

static int
core_pid(lua_State *L)
{
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

/* core.path_type(path) -> "file" | "dir" | "socket" | "other" | nil */
static int
core_path_type(lua_State *L)
{
  struct stat st;
  const char *path = luaL_checkstring(L, 1);
  if (stat(path, &st) != 0) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushstring(L, S_ISREG(st.st_mode)    ? "file"
                    : S_ISDIR(st.st_mode)  ? "dir"
                    : S_ISSOCK(st.st_mode) ? "socket"
                                           : "other");
  return 1;
}

/* core.drain(): runs until every task has finished. */
static int
core_drain(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  int rc;
  /* A drain is the script's cleanup: a signal the main thread's code was
  ** running into is not held for its waits (it ends the drain's tasks). */
  h->main_stops.pending = 0;
  rc = sbx_drive(h, NULL);
  if (rc == -2)
    return sbx_pushfail(L, "deadlock", "%d task(s) wait for something that can never happen", h->tasks_alive);
  lua_pushboolean(L, 1);
  return 1;
}

/* Leaves one core.shield: at the outermost, an interrupt it held and no
** wait got is kept for the thread's next wait. */
static void
shield_leave(struct sbx_stops *s)
{
  if (--s->shield > 0)
    return;
  shield_timer_free(s);
  if (s->held && !s->delivered && !s->pending)
    s->pending = SBX_CANCEL_INTERRUPT;
  s->held = s->expired = s->delivered = 0;
}

static int
shield_k(lua_State *L, int status, lua_KContext ctx)
{
  struct sbx_stops *s = stops_of(sbx_host_get(L), L);
  (void)ctx;
  if (s)
    shield_leave(s);
  if (status != LUA_OK && status != LUA_YIELD)
    return lua_error(L);
  return lua_gettop(L) - 1;
}

/*
** core.shield(grace, fn, ...) -> fn's results (fn's error raises through).
** While fn runs, a signal (or core.interrupt) does not end this thread's
** waits at once: it is held, and delivered when fn returns (at the next
** wait), or to the wait in progress once grace seconds have passed since it
** came. For an operation a server is answering that an interrupt would cut
** off half made (a container create): its answer names what to remove. A
** task:cancel() and a core.deadline that ends are not held. A plain
** coroutine is not shielded.
*/
int
sbx_core_shield(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  double grace = luaL_checknumber(L, 1);
  struct sbx_stops *s;
  luaL_argcheck(L, grace >= 0 && grace < 1e6, 1, "seconds, 0 or more");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  s = stops_of(h, L);
  if (s && s->shield++ == 0)
    s->grace = grace;
  return shield_k(L, lua_pcallk(L, lua_gettop(L) - 2, LUA_MULTRET, 0, 0, shield_k), 0);
}

/* core.signals() -> count (signals and core.interrupt calls), last signal number */
static int
core_signals(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  lua_pushinteger(L, h->signals + h->interrupts);
  lua_pushinteger(L, h->last_signal);
  return 2;
}

/*
** core.interrupt(signum): the interruption a signal brings, without the
** signal: counted by core.signals(), and every wait pending at the next
** scheduler pass ends with "interrupted (signal N)". For failures the
** caller treats like a signal (stdout gone: core.SIGPIPE). Not counted
** towards the third signal that exits without cleanup: that one is the
** user's.
*/
static int
core_interrupt(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  int signum = (int)luaL_checkinteger(L, 1);
  h->interrupts++;
  h->last_signal = signum;
  h->interrupt_pending = 1;
  uv_stop(&h->loop);
  return 0;
}

/* core.exit(code): leaves at once, for the CLI's last word. */
static int
core_exit(lua_State *L)
{
  int code = (int)luaL_optinteger(L, 1, 0);
  fflush(NULL);
  _exit(code);
  return 0;
}

/*
** SIGINT and SIGTERM: an own handler rather than uv_signal, whose callback
** runs only when the loop runs, so Lua code that never waits never saw
** one. The handler only counts and pokes the loop (uv_async_send is
** async-signal-safe); the count hook (deadline.c) and the loop take the
** count (sbx_host_poll_signals). The third signal leaves at once.
*/

static void
on_signal(int signum)
{
  int saved = errno;
  sig_count = sig_count + 1;
  sig_last = signum;
  if (sig_count >= 3) {
    /* The user insists: cleanup is not coming back. */
    static const char msg[] = "sbx: third signal, exiting without cleanup\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(128 + signum);
  }
  if (sig_async)
    uv_async_send(sig_async);
  sbx_deadline_signal_hook(sig_main);
  errno = saved;
}

int
sbx_host_attention(void)
{
  return undelivered || sig_count != sig_taken;
}

int
sbx_host_poll_signals(struct sbx_host *h)
{
  int n = sig_count;
  if (n == sig_taken)
    return 0;
  h->signals += n - sig_taken;
  sig_taken = n;
  h->last_signal = sig_last;
  h->signal_at = sbx_now();
  /* Every wait pending now ends at once, before any Lua code runs on
  ** (code that did not wait, stopped by the count hook, may clean up with
  ** new waits); the driver still sees the interrupt. */
  deliver_interrupt(h);
  h->interrupt_pending = h->interrupt_cancelled = 1;
  undelivered = 1;
  sbx_deadline_signal(h);
  uv_stop(&h->loop);
  return 1;
}

static void
sig_async_cb(uv_async_t *a)
{
  sbx_host_poll_signals(a->data);
}

static void
signals_start(struct sbx_host *h)
{
  uv_async_init(&h->loop, &h->sig_async, sig_async_cb);
  h->sig_async.data = h;
  uv_unref((uv_handle_t *)&h->sig_async);
}

/*
** core.handle_signals() -> true | false: SIGINT and SIGTERM from now on
** interrupt this host (above) instead of ending the process. Only when the
** program asks (the sbx command does, first thing): loading the module
** into an embedding program leaves its signal dispositions alone. False
** when another host of this process has them already. Undone when the
** host closes.
*/
static int
core_handle_signals(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  struct sigaction sa;
  if (sig_async) {
    lua_pushboolean(L, sig_async == &h->sig_async);
    return 1;
  }
  sig_async = &h->sig_async;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  sig_main = lua_tothread(L, -1);
  lua_pop(L, 1);
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  lua_pushboolean(L, 1);
  return 1;
}

static void
signals_stop(struct sbx_host *h)
{
  if (sig_async == &h->sig_async) {
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sig_async = NULL;
    sig_main = NULL;
  }
  uv_close((uv_handle_t *)&h->sig_async, NULL);
}

void **
sbx_host_slot(struct sbx_host *h, const void *key)
{
  int i;
  for (i = 0; i < SBX_HOST_SLOTS; i++) {
    if (h->slots[i].key == key)
      return &h->slots[i].value;
    if (!h->slots[i].key) {
      h->slots[i].key = key;
      h->slots[i].value = NULL;
      return &h->slots[i].value;
    }
  }
  luaL_error(h->L, "sbx host: more modules than SBX_HOST_SLOTS");
  return NULL;
}

void
sbx_host_on_close(struct sbx_host *h, int phase, sbx_close_fn fn)
{
  int i;
  for (i = 0; i < h->nhooks; i++)
    if (h->hooks[i].fn == fn && h->hooks[i].phase == phase)
      return;
  if (h->nhooks < SBX_HOST_HOOKS) {
    h->hooks[h->nhooks].phase = phase;
    h->hooks[h->nhooks].fn = fn;
    h->nhooks++;
  }
}

static void
run_hooks(struct sbx_host *h, int phase)
{
  int i;
  for (i = 0; i < h->nhooks; i++)
    if (h->hooks[i].phase == phase)
      h->hooks[i].fn(h);
}

static void
host_teardown(struct sbx_host *h)
{
  struct sbx_waiter *w, *next;
  if (h->closed)
    return;
  h->closed = 1;
  for (w = h->pending.next; w != &h->pending; w = next) {
    next = w->next;
    w->task = NULL;
    waiter_cancel(w, SBX_CANCEL_CLOSE);
  }
  while (h->armed_shields) /* threads left in a shield: never resumed now */
    shield_timer_free(h->armed_shields);
  sbx_deadline_close_all(h);
  run_hooks(h, SBX_CLOSE_ABORT);
  signals_stop(h);
  /* Modules that close through the running loop (lws frees itself only on
  ** a second destroy once the loop ran dry) do it in two phases. A wake
  ** above leaves a uv_stop pending that ends the first run at once: run
  ** again. */
  run_hooks(h, SBX_CLOSE_DRAIN);
  while (uv_run(&h->loop, UV_RUN_DEFAULT) != 0)
    ;
  run_hooks(h, SBX_CLOSE_FREE);
  if (uv_loop_close(&h->loop) != 0) {
    uv_run(&h->loop, UV_RUN_NOWAIT);
    uv_loop_close(&h->loop);
  }
}

static int
host_gc(lua_State *L)
{
  struct sbx_host *h = lua_touserdata(L, 1);
  host_teardown(h);
  return 0;
}

static const luaL_Reg core_funcs[] = { { "spawn", core_spawn },
                                       { "current", core_current },
                                       { "sleep", core_sleep },
                                       { "yield", core_yield },
                                       { "event", core_event },
                                       { "now", core_now },
                                       { "pid", core_pid },
                                       { "path_type", core_path_type },
                                       { "drain", core_drain },
                                       { "shield", sbx_core_shield },
                                       { "signals", core_signals },
                                       { "handle_signals", core_handle_signals },
                                       { "xpcall", sbx_core_xpcall },
                                       { "interrupt", core_interrupt },
                                       { "is_cancel", core_is_cancel },
                                       { "exit", core_exit },
                                       { "deadline", sbx_core_deadline },
                                       { "scheduler", sbx_core_scheduler },
                                       { NULL, NULL } };

static const luaL_Reg task_methods[] = { { "join", task_join },         { "result", task_result },
                                         { "status", task_status },     { "done", task_done },
                                         { "cancel", task_cancel },     { "unref", task_unref },
                                         { "observed", task_observed }, { NULL, NULL } };

static const luaL_Reg task_meta[] = { { "__gc", task_gc },
                                      { "__tostring", task_tostring },
                                      { "__index", NULL },
                                      { NULL, NULL } };

static const luaL_Reg event_methods[] = { { "set", event_set },
                                          { "clear", event_clear },
                                          { "is_set", event_is_set },
                                          { "wait", event_wait },
                                          { NULL, NULL } };

static const luaL_Reg event_meta[] = { { "__index", NULL }, { NULL, NULL } };

static void
create_meta(lua_State *L, const char *name, const luaL_Reg *meta, const luaL_Reg *methods)
{
  luaL_newmetatable(L, name);
  luaL_setfuncs(L, meta, 0);
  if (methods) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
}

static struct sbx_host *
host_create(lua_State *L)
{
  struct sbx_host *h;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &HOST_KEY);
  h = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (h)
    return h;
  h = lua_newuserdatauv(L, sizeof *h, 0);
  memset(h, 0, sizeof *h);
  if (uv_loop_init(&h->loop) != 0)
    luaL_error(L, "cannot initialise the event loop");
  h->L = L;
  h->pending.next = h->pending.prev = &h->pending;
  lua_newtable(L);
  lua_pushcfunction(L, host_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &HOST_KEY);
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &THREADS_KEY);
  signals_start(h);
  return h;
}

/*
** The scheduler's part of sbx.core: tasks, events, waits, time, signals.
** Pushes that table; src/core.c adds the modules to it. The scheduler knows
** none of them: they keep state in host slots and close through hooks.
*/
int
sbx_open_host(lua_State *L)
{
  host_create(L);
  create_meta(L, TASK_MT, task_meta, task_methods);
  create_meta(L, EVENT_MT, event_meta, event_methods);
  sbx_deadline_open(L);
  luaL_newmetatable(L, OP_MT);
  lua_pushcfunction(L, op_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newlib(L, core_funcs);
  sbx_pattern_open(L);
  /* The platform's numbers, for code that tells a closed pipe from other
  ** failures (file:write's third result is an errno). */
  lua_pushinteger(L, EPIPE);
  lua_setfield(L, -2, "EPIPE");
  lua_pushinteger(L, SIGPIPE);
  lua_setfield(L, -2, "SIGPIPE");
  return 1;
}

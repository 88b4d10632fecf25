/*
** Deadlines for Lua code, and signals that reach Lua code that never waits.
**
** core.deadline(seconds, fn, ...) runs fn(...) so that neither a loop that
** never waits nor a wait that never ends outlives seconds. A frame (one
** call) lives on its thread's stack and on the host's list of armed frames.
** It ends when
**   - the count hook, every SBX_HOOK_COUNT instructions of its thread,
**     finds the clock past it (code that never waits), or
**   - its timer fires while the thread waits (the wait is cancelled), or
**   - SIGINT/SIGTERM arrives (every frame ends).
** From then on the thread's hook runs at every instruction and raises, and
** every wait the thread starts ends at once, until the frame's own pcall
** returns: a pcall in the code under the deadline catches the error but
** cannot go on running (Redis's luaMaskCountHook re-arms the same way for a
** killed script). Finalizers run with hooks off (lgc.c GCTM), so code under
** a deadline must not be able to set __gc: the task environment refuses it.
**
** Outside any frame a signal is delivered at the next wait, as before; code
** of the main thread that runs on for more than the scheduler's slice after
** a signal (core.scheduler{ slice = }) gets "interrupted (signal N)" where
** it is (the signal handler hooks the main thread). The hook is on a thread
** only while it needs it (see sbx_deadline_signal_hook): a hooked thread
** pays a call per instruction.
**
** Mechanism only: what a deadline is for, and how long, is Lua's (sbx.deadline
** in init.lua, the policy). The C stack is not watched by the hook: C that
** runs long must ask itself (sbx_deadline_check; pattern.c does), and the
** handler of an error the hook raised runs with hooks off (core.xpcall).
*/
#include "host.h"

#include <stdlib.h>
#include <string.h>

#define DEADLINE_MT "sbx.deadline"

/* Instructions between two looks at the clock: a few microseconds of Lua. */
#define SBX_HOOK_COUNT 1000

struct sbx_deadline {
  struct sbx_host *host;
  lua_State *thread; /* anchored by the userdata's user value */
  double expires;    /* sbx_now() seconds */
  int state;         /* SBX_DEADLINE_{ARMED,TIMEOUT,SIGNAL} */
  int linked;        /* on the host's list */
  uv_timer_t *timer; /* wakes a waiting thread; freed by the loop */
  struct sbx_deadline *prev, *next;
};

/* Frames armed in this process: the hook's fast path reads only this. */
static int armed_frames;

static void count_hook(lua_State *L, lua_Debug *ar);

static void
timer_free_cb(uv_handle_t *t)
{
  free(t);
}

/* Takes d off the host's list and stops its timer. Idempotent. */
static void
frame_unlink(struct sbx_deadline *d)
{
  if (!d->linked)
    return;
  d->linked = 0;
  if (d->prev)
    d->prev->next = d->next;
  else
    d->host->deadlines = d->next;
  if (d->next)
    d->next->prev = d->prev;
  d->prev = d->next = NULL;
  armed_frames--;
  if (d->timer) {
    uv_timer_stop(d->timer);
    uv_close((uv_handle_t *)d->timer, timer_free_cb);
    d->timer = NULL;
  }
}

/*
** Ends frame d (why: TIMEOUT or SIGNAL): its thread raises at every
** instruction from now on, and a wait it is in is cancelled.
*/
static void
frame_expire(struct sbx_deadline *d, int why)
{
  struct sbx_host *h = d->host;
  struct sbx_waiter *w, *next;
  if (d->state != SBX_DEADLINE_ARMED)
    return;
  d->state = why;
  lua_sethook(d->thread, count_hook, LUA_MASKCOUNT, 1);
  for (w = h->pending.next; w != &h->pending; w = next) {
    next = w->next;
    if (w->thread == d->thread && !w->woken)
      sbx_waiter_cancel(w, SBX_CANCEL_DEADLINE);
  }
  uv_stop(&h->loop);
}

static void
frame_timer_cb(uv_timer_t *t)
{
  frame_expire(t->data, SBX_DEADLINE_TIMEOUT);
}

/*
** The state of thread L's frames: 0 when none has ended, else why the
** first ended one did. With check_clock, frames past their time end now.
*/
static int
thread_state(struct sbx_host *h, lua_State *L, int check_clock)
{
  struct sbx_deadline *d;
  double now = -1;
  int why = 0;
  for (d = h->deadlines; d; d = d->next) {
    if (d->thread != L)
      continue;
    if (d->state == SBX_DEADLINE_ARMED && check_clock) {
      if (now < 0)
        now = sbx_now();
      if (now >= d->expires)
        frame_expire(d, SBX_DEADLINE_TIMEOUT);
    }
    if (d->state != SBX_DEADLINE_ARMED && !why)
      why = d->state;
  }
  return why;
}

int
sbx_deadline_state(lua_State *L)
{
  struct sbx_host *h = sbx_host_peek(L);
  if (!h || !armed_frames)
    return 0;
  return thread_state(h, L, 1);
}

void
sbx_deadline_signal(struct sbx_host *h)
{
  struct sbx_deadline *d;
  for (d = h->deadlines; d; d = d->next)
    frame_expire(d, SBX_DEADLINE_SIGNAL);
}

void
sbx_deadline_close_all(struct sbx_host *h)
{
  while (h->deadlines)
    frame_unlink(h->deadlines);
}

/* Raises the error of an ended frame (why) in L. Does not return. */
static int
raise_ended(lua_State *L, struct sbx_host *h, int why)
{
  if (why == SBX_DEADLINE_SIGNAL)
    sbx_host_stop_running(h, L, 0); /* delivered here */
  if (why == SBX_DEADLINE_TIMEOUT)
    lua_pushliteral(L, "deadline exceeded");
  else
    lua_pushfstring(L, "interrupted (signal %d)", h->last_signal);
  return lua_error(L);
}

/*
** The count hook of every thread made after the host: signals first, then
** the thread's frames. Raises; never yields.
*/
static void
count_hook(lua_State *L, lua_Debug *ar)
{
  (void)ar;
  sbx_deadline_check(L);
}

void
sbx_deadline_check(lua_State *L)
{
  struct sbx_host *h;
  int why;
  if (!armed_frames && !sbx_host_attention())
    return;
  h = sbx_host_peek(L);
  if (!h)
    return;
  if (sbx_host_poll_signals(h))
    sbx_host_stop_running(h, L, 1); /* L was not waiting: its next wait */
  why = thread_state(h, L, 1);
  if (why)
    raise_ended(L, h, why);
  if (h->interrupt_pending && h->slice > 0) {
    double now = sbx_now();
    if (now - h->signal_at > h->slice) {
      h->signal_at = now; /* once per slice, as code may catch it */
      raise_ended(L, h, SBX_DEADLINE_SIGNAL);
    }
  }
}

/*
** The count hook costs every instruction of a hooked thread a call
** (lvm.c's trap), so a thread carries it only while it runs under a
** deadline (sbx_core_deadline sets it, deadline_k takes it off), and the
** main thread from a signal on (sbx_deadline_signal_hook, from the signal
** handler: lua_sethook is safe there, as lua.c's own SIGINT handler uses
** it) for code that never waits. A thread made while the hook is on
** inherits it.
*/
void
sbx_deadline_signal_hook(lua_State *main)
{
  if (main && lua_gethook(main) == NULL)
    lua_sethook(main, count_hook, LUA_MASKCOUNT, SBX_HOOK_COUNT);
}

/* Whether a frame of thread L is still on the host's list. */
static int
thread_has_frames(struct sbx_host *h, lua_State *L)
{
  struct sbx_deadline *d;
  for (d = h->deadlines; d; d = d->next)
    if (d->thread == L)
      return 1;
  return 0;
}

static int
deadline_k(lua_State *L, int status, lua_KContext ctx)
{
  struct sbx_deadline *d = luaL_checkudata(L, 1, DEADLINE_MT);
  struct sbx_host *h = d->host;
  int why = d->state;
  (void)ctx;
  frame_unlink(d);
  if (!thread_has_frames(h, L) && !h->interrupt_pending && !sbx_host_attention())
    lua_sethook(L, NULL, 0, 0);
  else if (!thread_state(h, L, 0))
    lua_sethook(L, count_hook, LUA_MASKCOUNT, SBX_HOOK_COUNT);
  if (why == SBX_DEADLINE_ARMED && (status == LUA_OK || status == LUA_YIELD)) {
    lua_pushboolean(L, 1);
    lua_replace(L, 1); /* [true, results...] */
    return lua_gettop(L);
  }
  if (why != SBX_DEADLINE_ARMED) {
    /* Whatever fn did with the error (a pcall in a tail call returns it
    ** as a value), the frame ended. */
    lua_settop(L, 0);
    lua_pushboolean(L, 0);
    if (why == SBX_DEADLINE_TIMEOUT) {
      lua_pushliteral(L, "deadline exceeded");
      lua_pushliteral(L, "timeout");
    }
    else {
      lua_pushfstring(L, "interrupted (signal %d)", h->last_signal);
      lua_pushliteral(L, "interrupted");
    }
    return 3;
  }
  /* An error of fn's own. A value other than a string or a number is not
  ** converted by its metamethods: they are fn's code, and its frame is
  ** gone. */
  if (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER) {
    const char *tn = luaL_typename(L, -1);
    lua_pushfstring(L, "(error object is a %s value)", tn);
    lua_replace(L, -2);
  }
  lua_pushboolean(L, 0);
  lua_insert(L, -2);
  lua_pushliteral(L, "error"); /* [false, err, "error"] */
  return 3;
}

/*
** core.deadline(seconds, fn, ...) -> true, results... | false, message,
** code: code "timeout" (the deadline passed), "interrupted" (SIGINT or
** SIGTERM) or "error" (fn raised; the message a string). May yield (fn
** may); raises only on bad arguments, or at once when an enclosing frame
** of this thread has already ended.
*/
int
sbx_core_deadline(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  double s = luaL_checknumber(L, 1);
  struct sbx_deadline *d;
  uv_timer_t *timer;
  int why;
  luaL_argcheck(L, s > 0 && s < 1e9, 1, "a positive number of seconds");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  why = thread_state(h, L, 1);
  if (why)
    return raise_ended(L, h, why);
  if (lua_gethook(L) != count_hook)
    lua_sethook(L, count_hook, LUA_MASKCOUNT, SBX_HOOK_COUNT);
  d = lua_newuserdatauv(L, sizeof *d, 1);
  memset(d, 0, sizeof *d);
  luaL_setmetatable(L, DEADLINE_MT);
  lua_pushthread(L);
  lua_setiuservalue(L, -2, 1); /* the frame keeps its thread */
  lua_replace(L, 1);           /* [frame, fn, args...] */
  timer = malloc(sizeof *timer);
  if (!timer)
    return luaL_error(L, "not enough memory");
  d->host = h;
  d->thread = L;
  d->expires = sbx_now() + s;
  d->state = SBX_DEADLINE_ARMED;
  d->next = h->deadlines;
  if (h->deadlines)
    h->deadlines->prev = d;
  h->deadlines = d;
  d->linked = 1;
  armed_frames++;
  uv_timer_init(&h->loop, timer);
  timer->data = d;
  uv_timer_start(timer, frame_timer_cb, (uint64_t)(s * 1000.0) + 1, 0);
  d->timer = timer;
  return deadline_k(L, lua_pcallk(L, lua_gettop(L) - 2, LUA_MULTRET, 0, 0, deadline_k), 0);
}

/*
** The message handler of core.xpcall: the caller's handler (upvalue 1),
** except once the thread's deadline has ended. An error the count hook
** raises calls the handler with every hook off (ldo.c: the hook's
** allowhook stays 0 until a pcall unwinds), so a handler that loops there
** would never be stopped: after the deadline the error goes on as it is.
*/
static int
xpcall_handler(lua_State *L)
{
  if (sbx_deadline_state(L))
    return 1;
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

static int
xpcall_k(lua_State *L, int status, lua_KContext extra)
{
  if (status != LUA_OK && status != LUA_YIELD) {
    lua_pushboolean(L, 0);
    lua_pushvalue(L, -2);
    return 2;
  }
  return lua_gettop(L) - (int)extra;
}

/*
** core.xpcall(f, msgh, ...): xpcall, whose handler does not run once the
** thread's deadline has ended (above). What a task file's xpcall is.
*/
int
sbx_core_xpcall(lua_State *L)
{
  int n = lua_gettop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_pushcclosure(L, xpcall_handler, 1);
  lua_replace(L, 2); /* [f, handler, args...] */
  lua_pushboolean(L, 1);
  lua_pushvalue(L, 1);
  lua_rotate(L, 3, 2); /* [f, handler, true, f, args...] */
  return xpcall_k(L, lua_pcallk(L, n - 2, LUA_MULTRET, 2, 2, xpcall_k), 2);
}

/* A frame dropped with its thread (a task never resumed): off the list. */
static int
deadline_gc(lua_State *L)
{
  frame_unlink(luaL_checkudata(L, 1, DEADLINE_MT));
  return 0;
}

/* core.scheduler{ slice = seconds | false }: see the top of this file. */
int
sbx_core_scheduler(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "slice");
  if (lua_isnumber(L, -1)) {
    double s = lua_tonumber(L, -1);
    luaL_argcheck(L, s > 0, 1, "slice must be a positive number of seconds or false");
    h->slice = s;
  }
  else if (lua_isnil(L, -1) || (lua_isboolean(L, -1) && !lua_toboolean(L, -1)))
    h->slice = 0;
  else
    luaL_argerror(L, 1, "slice must be a positive number of seconds or false");
  lua_pop(L, 1);
  return 0;
}

void
sbx_deadline_open(lua_State *L)
{
  if (luaL_newmetatable(L, DEADLINE_MT)) {
    lua_pushcfunction(L, deadline_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushliteral(L, "sbx.deadline");
    lua_setfield(L, -2, "__name");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
  }
  lua_pop(L, 1);
}

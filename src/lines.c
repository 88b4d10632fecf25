/*
** Line-oriented reading of a file descriptor on the loop (stdin for the MCP
** server, a child's pipe): reader:read() yields until a whole line is there,
** so one task can read requests while others run tools. Lines are bounded.
*/
#include "host.h"
#include "modules.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINES_MT "sbx.lines"

struct lines {
  struct sbx_host *host;
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_pipe_t pipe;
    uv_tty_t tty;
  } u;
  int fd;
  int is_file; /* regular file: plain blocking reads */
  int handle_open;
  int reading;
  int eof;
  int err;
  int skipping; /* dropping the rest of a line reported too long */
  char *buf;
  size_t len, cap, max_line;
  struct sbx_waiter *reader;
  int refs;
};

struct lines_ud {
  struct lines *l;
};

static void
lines_unref(struct lines *l)
{
  if (--l->refs == 0) {
    free(l->buf);
    free(l);
  }
}

static void
closed_cb(uv_handle_t *h)
{
  lines_unref(h->data);
}

static void
wake(struct lines *l)
{
  if (l->reader)
    sbx_wake(l->reader);
}

static void
alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
  struct lines *l = h->data;
  (void)suggested;
  if (l->cap - l->len < 4096) {
    size_t c = l->cap ? l->cap * 2 : 65536;
    char *p = realloc(l->buf, c);
    if (!p) {
      b->base = NULL;
      b->len = 0;
      return;
    }
    l->buf = p;
    l->cap = c;
  }
  b->base = l->buf + l->len;
  b->len = l->cap - l->len;
}

static int
has_line(struct lines *l)
{
  return l->len && memchr(l->buf, '\n', l->len) != NULL;
}

/* While skipping, bytes up to the next newline are dropped as they come,
** so a line far beyond the limit never grows the buffer. */
static void
skip_rest(struct lines *l)
{
  char *nl;
  if (!l->skipping || !l->len)
    return;
  nl = memchr(l->buf, '\n', l->len);
  if (!nl) {
    l->len = 0;
    return;
  }
  l->skipping = 0;
  l->len -= (size_t)(nl - l->buf) + 1;
  memmove(l->buf, nl + 1, l->len);
}

static void
read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
  struct lines *l = s->data;
  (void)b;
  if (n > 0) {
    l->len += (size_t)n;
    skip_rest(l);
    /* Stop reading once a line is there or the buffer is at its limit:
    ** the writer then waits for us (back-pressure). */
    if (has_line(l) || l->len > l->max_line) {
      uv_read_stop(s);
      l->reading = 0;
    }
    if (has_line(l) || l->len > l->max_line)
      wake(l);
  }
  else if (n < 0) {
    if (n != UV_EOF)
      l->err = (int)n;
    l->eof = 1;
    uv_read_stop(s);
    l->reading = 0;
    wake(l);
  }
}

/*
** Pushes the next line (without its newline) or nil, reason. A line longer
** than max_line is reported once as "too_long" (as soon as max_line bytes
** are there without a newline) and the rest of it is dropped: the next
** read returns the line after it.
*/
static int
push_line(lua_State *L, struct lines *l)
{
  char *nl;
  size_t take;
  skip_rest(l);
  nl = l->len ? memchr(l->buf, '\n', l->len) : NULL;
  if (nl && (size_t)(nl - l->buf) <= l->max_line) {
    take = (size_t)(nl - l->buf);
    lua_pushlstring(L, l->buf, take > 0 && l->buf[take - 1] == '\r' ? take - 1 : take);
    memmove(l->buf, nl + 1, l->len - take - 1);
    l->len -= take + 1;
    return 1;
  }
  if (nl || l->len > l->max_line) {
    l->skipping = 1;
    skip_rest(l);
    return sbx_pushfail(L, "too_long", "a line longer than %d bytes", (int)l->max_line);
  }
  if (l->eof) {
    if (l->len) {
      lua_pushlstring(L, l->buf, l->len); /* a last line without newline */
      l->len = 0;
      return 1;
    }
    if (l->err)
      return sbx_pushfail(L, "closed", "%s", uv_strerror(l->err));
    return sbx_pushfail(L, "eof", "end of input");
  }
  return 0;
}

static int
read_k(lua_State *L, int status, lua_KContext ctx)
{
  struct lines_ud *ud = luaL_checkudata(L, 1, LINES_MT);
  int n;
  (void)status;
  (void)ctx;
  sbx_read_resumed(L);
  if (!ud->l)
    return sbx_pushfail(L, "closed", "reader closed");
  n = push_line(L, ud->l);
  if (n)
    return n;
  return sbx_pushfail(L, "timeout", "no line before the timeout");
}

static void
fill_from_file(struct lines *l)
{
  skip_rest(l);
  while (!has_line(l) && !l->eof && l->len <= l->max_line) {
    ssize_t n;
    if (l->cap - l->len < 4096) {
      size_t c = l->cap ? l->cap * 2 : 65536;
      char *p = realloc(l->buf, c);
      if (!p) {
        l->eof = 1;
        l->err = UV_ENOMEM;
        return;
      }
      l->buf = p;
      l->cap = c;
    }
    n = read(l->fd, l->buf + l->len, l->cap - l->len);
    if (n > 0) {
      l->len += (size_t)n;
      skip_rest(l);
    }
    else if (n == 0 || errno != EINTR) {
      l->eof = 1;
      if (n < 0)
        l->err = -errno;
    }
  }
}

/* reader:read([timeout]) -> line | nil, message, "eof"|"timeout"|"too_long"|"closed". May yield.
** After "too_long" the reader goes on with the next line. */
static int
lines_read(lua_State *L)
{
  struct lines_ud *ud = luaL_checkudata(L, 1, LINES_MT);
  struct lines *l = ud->l;
  double timeout = luaL_optnumber(L, 2, -1);
  int n;
  lua_settop(L, 1);
  if (!l)
    return luaL_error(L, "attempt to use a closed reader");
  if (l->is_file)
    fill_from_file(l);
  n = push_line(L, l);
  if (n)
    return n;
  if (l->reader)
    return luaL_error(L, "another task is already reading");
  if (!l->reading && l->handle_open) {
    l->reading = 1;
    uv_read_start(&l->u.stream, alloc_cb, read_cb);
  }
  return sbx_await_read(L, &l->reader, timeout, read_k, "another task is already reading");
}

static void
lines_close_l(struct lines_ud *ud)
{
  struct lines *l = ud->l;
  if (!l)
    return;
  ud->l = NULL;
  if (l->reader) {
    sbx_wake(l->reader);
    l->reader = NULL;
  }
  if (l->handle_open) {
    l->handle_open = 0;
    uv_close(&l->u.handle, closed_cb);
  }
  lines_unref(l);
}

/* reader:close(): a read in progress returns nil, "reader closed", "closed". */
static int
lines_gc(lua_State *L)
{
  lines_close_l(luaL_checkudata(L, 1, LINES_MT));
  return 0;
}

/* core.lines.open(fd [, max_line]) -> reader. The fd is not closed. */
static int
lines_open(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  int fd = (int)luaL_checkinteger(L, 1);
  lua_Integer max = luaL_optinteger(L, 2, 64 * 1024 * 1024);
  struct lines_ud *ud = lua_newuserdatauv(L, sizeof *ud, 0);
  struct lines *l;
  uv_handle_type t;
  ud->l = NULL;
  luaL_setmetatable(L, LINES_MT);
  l = calloc(1, sizeof *l);
  if (!l)
    return luaL_error(L, "out of memory");
  ud->l = l;
  l->host = h;
  l->fd = fd;
  l->refs = 1;
  l->max_line = (size_t)max;
  t = uv_guess_handle(fd);
  if (t == UV_TTY) {
    uv_tty_init(&h->loop, &l->u.tty, fd, 1);
  }
  else if (t == UV_NAMED_PIPE || t == UV_TCP) {
    uv_pipe_init(&h->loop, &l->u.pipe, 0);
    if (uv_pipe_open(&l->u.pipe, fd) != 0) {
      uv_close(&l->u.handle, NULL);
      l->is_file = 1;
      return 1;
    }
  }
  else {
    l->is_file = 1;
    return 1;
  }
  l->u.handle.data = l;
  l->handle_open = 1;
  l->refs++;
  return 1;
}

static const luaL_Reg lines_funcs[] = { { "open", lines_open }, { NULL, NULL } };

static const luaL_Reg lines_methods[] = { { "read", lines_read }, { "close", lines_gc }, { NULL, NULL } };

static const luaL_Reg lines_meta[] = { { "__gc", lines_gc },
                                       { "__close", lines_gc },
                                       { "__index", NULL },
                                       { NULL, NULL } };

int
sbx_open_lines(lua_State *L)
{
  luaL_newmetatable(L, LINES_MT);
  luaL_setfuncs(L, lines_meta, 0);
  lua_newtable(L);
  luaL_setfuncs(L, lines_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, lines_funcs);
  return 1;
}

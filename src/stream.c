/*
** A hijacked HTTP exchange on a raw socket, as Docker's attached exec uses:
** send a request (and optional stdin bytes followed by a write half-close),
** read the response head (hijack.c), then demultiplex the 8-byte-header
** frame stream (demux.c) into bounded captures of stdout, stderr and both
** interleaved. This file owns the socket and the Lua side; the byte formats
** live in those two codecs.
**
** libcurl cannot half-close a connection to signal stdin EOF, which is why
** this transport owns its socket (unix or TCP) on the loop.
**
** Memory is bounded: each capture holds head+tail bytes; bytes queued for a
** Lua on_output callback are capped, and past the cap reading stops (the
** daemon then blocks the writer: back-pressure, not loss).
**
** The same stream, with the same captures, chunk queue and channel
** writes, also carries bytes from other sources: a sink that Lua feeds
** (core.stream.sink: the SSM data channel) and a host process's pipes
** (sbx_stream_pipes: core.proc.spawn, whose stdin and stdout are a local
** box's agent channel, its stderr captured beside them).
*/
#include "host.h"
#include "modules.h"
#include "capture.h"
#include "demux.h"
#include "hijack.h"
#include "stream.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STREAM_MT "sbx.stream"

enum { CAP_STDOUT, CAP_STDERR, CAP_OUTPUT, CAP_N };

struct pendbuf {
  char *p;
  size_t len, cap;
  char carry[4];
  size_t carry_len;
};

struct stream {
  struct sbx_host *host;
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_pipe_t pipe;
    uv_tcp_t tcp;
  } u;
  int handle_open;
  int refs; /* the userdata and the open handle */
  uv_connect_t connect_req;
  uv_write_t write_req;
  uv_write_t stdin_req;
  uv_shutdown_t shutdown_req;
  char *request;
  size_t request_len;
  char *stdin_buf;
  size_t stdin_len;
  int has_stdin;
  int keep_open; /* a channel: stdin stays open for :write */
  int stdin_closed;
  int pipes;               /* a process's pipes: u.pipe is its stdout */
  uv_pipe_t *err_pipe;     /* its stderr (read), or NULL */
  uv_pipe_t *in_pipe;      /* its stdin (written by :write), or NULL */
  int reads_open;          /* read ends not at their end yet */
  int out_done;            /* its stdout is at its end */
  struct pendbuf early;    /* :write bytes before the daemon answered */
  struct sbx_hijack reply; /* head, then error body (socket streams) */
  struct sbx_demux demux;  /* the hijacked stream after a 200 or 101 */
  struct sbx_capture cap[CAP_N];
  int chunks;
  size_t chunk_limit;
  struct pendbuf pend[2];
  int reading, paused;
  int eof;
  char error[256];
  char error_code_buf[32];
  const char *error_code; /* NULL, or error_code_buf */
  struct sbx_waiter *reader;
  struct sbx_waiter *room; /* a producer waiting for the queue to drain */
  size_t room_limit;       /* ... to at most this many bytes */
  double started, ended;
};

struct stream_ud {
  struct stream *s;
};

static char read_buffer[65536];

/* Streams not yet freed, in this process (every host): core.stream.count(),
** for tests that hold a box's host memory to what it keeps. */
static size_t streams_alive;

static void write_cb(uv_write_t *req, int status);
static void shutdown_cb(uv_shutdown_t *req, int status);

static void
stream_free(struct stream *s)
{
  int i;
  for (i = 0; i < CAP_N; i++)
    sbx_capture_free(&s->cap[i]);
  free(s->pend[0].p);
  free(s->pend[1].p);
  free(s->early.p);
  free(s->request);
  free(s->stdin_buf);
  sbx_hijack_free(&s->reply);
  free(s);
  streams_alive--;
}

static void
stream_unref(struct stream *s)
{
  if (--s->refs == 0)
    stream_free(s);
}

static void
handle_closed(uv_handle_t *h)
{
  stream_unref(h->data);
}

static void
wake_reader(struct stream *s)
{
  if (s->reader)
    sbx_wake(s->reader); /* detach clears s->reader */
}

static size_t
queued(const struct stream *s)
{
  return s->pend[0].len + s->pend[1].len;
}

/* The producer in wait_room goes on once the reader took enough, or at
** the end. */
static void
wake_room(struct stream *s)
{
  if (s->room && (s->eof || queued(s) <= s->room_limit))
    sbx_wake(s->room); /* detach clears s->room */
}

static void
aux_closed(uv_handle_t *h)
{
  struct stream *s = h->data;
  free(h);
  stream_unref(s);
}

static void
close_aux(struct stream *s, uv_pipe_t **p)
{
  (void)s; /* the handle's data: the close callback's */
  if (*p) {
    uv_close((uv_handle_t *)*p, aux_closed);
    *p = NULL;
  }
}

static void
close_handle(struct stream *s)
{
  if (s->handle_open) {
    s->handle_open = 0;
    uv_close(&s->u.handle, handle_closed);
  }
  close_aux(s, &s->err_pipe);
  close_aux(s, &s->in_pipe);
}

/* Where :write goes: the socket, or a process's stdin pipe. */
static uv_stream_t *
write_end(struct stream *s)
{
  return s->pipes ? (uv_stream_t *)s->in_pipe : &s->u.stream;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* Reading stops (back-pressure) or starts again, on every read end. */
static void
reading(struct stream *s, int on)
{
  s->reading = on;
  if (on) {
    if (s->handle_open && !s->out_done)
      uv_read_start(&s->u.stream, alloc_cb, read_cb);
    if (s->err_pipe)
      uv_read_start((uv_stream_t *)s->err_pipe, alloc_cb, read_cb);
  }
  else {
    if (s->handle_open)
      uv_read_stop(&s->u.stream);
    if (s->err_pipe)
      uv_read_stop((uv_stream_t *)s->err_pipe);
  }
}

/* The end of a stream: no byte arrives after this, so captures shrink. */
static void
finish(struct stream *s, const char *code, const char *msg)
{
  int i;
  if (s->eof)
    return;
  if (code && !s->error_code) {
    /* A copy: code may be a Lua string that is collected later. */
    snprintf(s->error_code_buf, sizeof s->error_code_buf, "%s", code);
    s->error_code = s->error_code_buf;
    snprintf(s->error, sizeof s->error, "%s", msg ? msg : code);
  }
  s->eof = 1;
  s->ended = sbx_now();
  for (i = 0; i < CAP_N; i++)
    sbx_capture_compact(&s->cap[i]);
  close_handle(s);
  wake_reader(s);
  wake_room(s);
}

/* Room for n more bytes at the end; -1 when memory ran out. */
static int
pend_reserve(struct pendbuf *b, size_t n)
{
  if (b->len + n > b->cap) {
    /* The first chunk sets the size: a channel's 64 KiB reads are not
    ** copied through 4, 8, 16 and 32 KiB on their way in. */
    size_t c = b->cap ? b->cap : (n > 4096 ? n : 4096);
    char *q;
    while (c < b->len + n)
      c *= 2;
    q = realloc(b->p, c);
    if (!q)
      return -1;
    b->p = q;
    b->cap = c;
  }
  return 0;
}

static int
pend_add(struct pendbuf *b, const char *p, size_t n)
{
  if (pend_reserve(b, n) != 0)
    return -1;
  memcpy(b->p + b->len, p, n);
  b->len += n;
  return 0;
}

/* Bytes that are already at the end of the chunk queue (read there in
** place: reads_in_place) are captured and counted as queued. */
static void
deliver_queued(struct stream *s, int which, const char *p, size_t n)
{
  sbx_capture_add(&s->cap[which], p, n);
  sbx_capture_add(&s->cap[CAP_OUTPUT], p, n);
  s->pend[which].len += n;
  if (s->pend[0].len + s->pend[1].len > s->chunk_limit && s->reading) {
    reading(s, 0);
    s->paused = 1;
  }
  wake_reader(s);
}

static void
deliver(struct stream *s, int fd, const char *p, size_t n)
{
  int which = fd == 2 || fd == 3 ? CAP_STDERR : CAP_STDOUT;
  sbx_capture_add(&s->cap[which], p, n);
  sbx_capture_add(&s->cap[CAP_OUTPUT], p, n);
  if (s->chunks) {
    pend_add(&s->pend[which], p, n);
    if (s->pend[0].len + s->pend[1].len > s->chunk_limit && s->reading) {
      reading(s, 0);
      s->paused = 1;
    }
    wake_reader(s);
  }
}

/*
** Stdin goes out only once the daemon has answered: bytes that arrive with
** the request are read ahead by its HTTP server and lost at the hijack.
*/
/* One :write of a channel in flight: the bytes live with the request. */
struct chan_write {
  uv_write_t req;
  struct stream *s;
  char data[];
};

static void
chan_write_cb(uv_write_t *req, int status)
{
  struct chan_write *w = (struct chan_write *)req;
  struct stream *s = w->s;
  free(w);
  if (status < 0 && status != UV_ECANCELED && !s->eof)
    finish(s, "closed", uv_strerror(status));
}

static int
chan_write(struct stream *s, const char *p, size_t n)
{
  struct chan_write *w = malloc(sizeof *w + n);
  uv_buf_t b;
  if (!w)
    return -1;
  w->s = s;
  memcpy(w->data, p, n);
  b = uv_buf_init(w->data, (unsigned)n);
  if (uv_write(&w->req, write_end(s), &b, 1, chan_write_cb) != 0) {
    free(w);
    return -1;
  }
  return 0;
}

static void
send_stdin(struct stream *s)
{
  uv_buf_t b;
  if (!s->has_stdin || !s->handle_open)
    return;
  if (s->stdin_len) {
    b = uv_buf_init(s->stdin_buf, (unsigned)s->stdin_len);
    s->stdin_req.data = s;
    uv_write(&s->stdin_req, &s->u.stream, &b, 1, write_cb);
  }
  if (s->early.len) {
    chan_write(s, s->early.p, s->early.len);
    s->early.len = 0;
  }
  if (s->keep_open && !s->stdin_closed)
    return;
  s->shutdown_req.data = s;
  uv_shutdown(&s->shutdown_req, &s->u.stream, shutdown_cb);
}

static void
deliver_demuxed(void *ud, int fd, const char *p, size_t n)
{
  deliver(ud, fd, p, n);
}

/* Bytes from the socket: the head, then the hijacked stream or an error body. */
static void
feed(struct stream *s, const char *p, size_t n)
{
  while (n > 0 && !s->eof) {
    size_t used;
    if (s->reply.state == SBX_HIJACK_STREAM) {
      sbx_demux_feed(&s->demux, p, n, deliver_demuxed, s);
      return;
    }
    if (sbx_hijack_feed(&s->reply, p, n, &used) < 0) {
      finish(s, "protocol", "response head too large");
      return;
    }
    p += used;
    n -= used;
    if (s->reply.state == SBX_HIJACK_STREAM) {
      sbx_hijack_drop_head(&s->reply); /* a channel lives long: 16 KiB less */
      send_stdin(s);
    }
    else if (s->reply.state == SBX_HIJACK_DONE)
      finish(s, NULL, NULL);
  }
}

/* A process's stdout whose bytes go to a chunk queue (a local box's agent
** channel) is read straight into the queue's free end: one copy less. */
static int
reads_in_place(const struct stream *s, const uv_handle_t *h)
{
  return s->pipes && s->chunks && h == &s->u.handle;
}

static void
alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  struct stream *s = h->data;
  struct pendbuf *b = &s->pend[CAP_STDOUT];
  (void)suggested;
  if (reads_in_place(s, h) &&
      (b->cap - b->len >= sizeof read_buffer || pend_reserve(b, sizeof read_buffer) == 0)) {
    buf->base = b->p + b->len;
    buf->len = b->cap - b->len;
    return;
  }
  buf->base = read_buffer;
  buf->len = sizeof read_buffer;
}

/* A process's stdout or stderr: plain bytes; the end of both is the end. */
static void
pipe_read(struct stream *s, uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
  int fd = st == (uv_stream_t *)s->err_pipe ? 2 : 1;
  if (nread > 0) {
    if (buf->base != read_buffer)
      deliver_queued(s, CAP_STDOUT, buf->base, (size_t)nread);
    else
      deliver(s, fd, buf->base, (size_t)nread);
    return;
  }
  if (nread == 0)
    return;
  if (nread != UV_EOF) {
    finish(s, "closed", uv_strerror((int)nread));
    return;
  }
  uv_read_stop(st);
  if (fd == 2)
    close_aux(s, &s->err_pipe);
  else
    s->out_done = 1;
  if (--s->reads_open == 0)
    finish(s, NULL, NULL);
}

static void
read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
  struct stream *s = st->data;
  if (s->pipes)
    pipe_read(s, st, nread, buf);
  else if (nread > 0)
    feed(s, buf->base, (size_t)nread);
  else if (nread == UV_EOF) {
    if (s->reply.state == SBX_HIJACK_HEAD)
      finish(s, "closed", "the daemon closed the connection before answering");
    else
      finish(s, NULL, NULL);
  }
  else if (nread < 0)
    finish(s, "closed", uv_strerror((int)nread));
}

static void
write_cb(uv_write_t *req, int status)
{
  struct stream *s = req->data;
  if (status < 0 && status != UV_ECANCELED && !s->eof)
    finish(s, "closed", uv_strerror(status));
}

/* A process's stdin pipe cannot be half-closed: once every queued write
** went out (uv_shutdown waits for that; the pipe refuses the socket's
** shutdown itself), it is closed, which the reader sees as its end. */
static void
shutdown_cb(uv_shutdown_t *req, int status)
{
  struct stream *s = req->data;
  (void)status;
  if (s && s->pipes && req->handle == (uv_stream_t *)s->in_pipe)
    close_aux(s, &s->in_pipe);
}

static void
connect_cb(uv_connect_t *req, int status)
{
  struct stream *s = req->data;
  uv_buf_t b;
  if (status < 0) {
    char msg[200];
    snprintf(msg, sizeof msg, "cannot connect: %s", uv_strerror(status));
    finish(s, status == UV_ECONNREFUSED || status == UV_ENOENT ? "ECONNREFUSED" : "closed", msg);
    return;
  }
  if (s->eof)
    return;
  b = uv_buf_init(s->request, (unsigned)s->request_len);
  s->write_req.data = s;
  uv_write(&s->write_req, &s->u.stream, &b, 1, write_cb);
  s->reading = 1;
  uv_read_start(&s->u.stream, alloc_cb, read_cb);
}

static struct stream *
check_stream(lua_State *L)
{
  struct stream_ud *ud = luaL_checkudata(L, 1, STREAM_MT);
  if (!ud->s)
    luaL_error(L, "attempt to use a closed stream");
  return ud->s;
}

static void
opt_capture(lua_State *L, int t, const char *name, struct sbx_capture *c, size_t dh, size_t dt)
{
  size_t head = dh, tail = dt;
  lua_getfield(L, t, name);
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "head");
    head = (size_t)luaL_optinteger(L, -1, (lua_Integer)dh);
    lua_getfield(L, -2, "tail");
    tail = (size_t)luaL_optinteger(L, -1, (lua_Integer)dt);
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
  sbx_capture_init(c, head, tail);
}

static struct stream *
stream_new(lua_State *L, struct stream_ud *ud, struct sbx_host *h)
{
  struct stream *s = calloc(1, sizeof *s);
  if (!s) {
    luaL_error(L, "out of memory");
    return NULL;
  }
  streams_alive++;
  ud->s = s;
  s->host = h;
  s->refs = 1;
  s->started = sbx_now();
  sbx_hijack_init(&s->reply);
  return s;
}

/* The options every stream shares (the table at index opts): capture sizes
** and the chunk queue. */
static void
stream_options(lua_State *L, int opts, struct stream *s)
{
  lua_getfield(L, opts, "chunks");
  s->chunks = lua_toboolean(L, -1);
  lua_getfield(L, opts, "chunk_limit");
  s->chunk_limit = (size_t)luaL_optinteger(L, -1, 1 << 20);
  lua_getfield(L, opts, "capture");
  if (lua_istable(L, -1)) {
    int t = lua_gettop(L);
    opt_capture(L, t, "stdout", &s->cap[CAP_STDOUT], 65536, 65536);
    opt_capture(L, t, "stderr", &s->cap[CAP_STDERR], 65536, 65536);
    opt_capture(L, t, "output", &s->cap[CAP_OUTPUT], 65536, 65536);
  }
  else {
    int i;
    for (i = 0; i < CAP_N; i++)
      sbx_capture_init(&s->cap[i], 65536, 65536);
  }
  lua_pop(L, 3);
}

/*
** core.stream.sink{ capture=, chunks=, chunk_limit= } -> stream. A stream
** with no socket of its own: a transport written in Lua (the SSM data
** channel) feeds it with :push and ends it with :finish, and readers use
** the same methods as on a socket stream. The chunk queue is not capped
** here; :push returns its size so the feeder can hold back (stop acking)
** above chunk_limit.
*/
static int
stream_sink(lua_State *L)
{
  struct stream_ud *ud;
  struct stream *s;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  ud = lua_newuserdatauv(L, sizeof *ud, 0);
  ud->s = NULL;
  luaL_setmetatable(L, STREAM_MT);
  s = stream_new(L, ud, sbx_host_get(L));
  stream_options(L, 1, s);
  return 1;
}

/* A pipe of ours (fd) on the loop, or -1 with the fd closed. */
static int
open_pipe(struct stream *s, uv_pipe_t *p, int fd)
{
  if (uv_pipe_init(&s->host->loop, p, 0) != 0)
    return -1;
  p->data = s;
  s->refs++;
  if (uv_pipe_open(p, fd) != 0) {
    close(fd);
    return -1;
  }
  return 0;
}

/*
** sbx_stream_pipes(L, opts, in_fd, out_fd, err_fd): pushes a stream over a
** host process's pipes and takes ownership of the fds. out_fd (its stdout)
** and err_fd (its stderr, or -1) feed the captures and the chunk queue as
** "stdout" and "stderr"; in_fd (its stdin, or -1) makes the stream a
** channel (:write, :close_stdin, which closes the pipe once every write went
** out). The stream ends when both read ends are at their end (at once
** without either: give one to write). opts: the
** index of a table with capture, chunks, chunk_limit. Returns 0, or -1 when
** the loop refused a pipe (the stream is then ended with "closed"). May
** raise (out of memory).
*/
int
sbx_stream_pipes(lua_State *L, int opts, int in_fd, int out_fd, int err_fd)
{
  struct stream_ud *ud;
  struct stream *s;
  int rc = 0;
  opts = lua_absindex(L, opts);
  ud = lua_newuserdatauv(L, sizeof *ud, 0);
  ud->s = NULL;
  luaL_setmetatable(L, STREAM_MT);
  s = stream_new(L, ud, sbx_host_get(L));
  s->pipes = 1;
  s->reply.state = SBX_HIJACK_STREAM; /* no HTTP head: bytes from the start */
  stream_options(L, opts, s);
  if (out_fd >= 0) {
    s->handle_open = 1;
    s->u.handle.data = s;
    if (open_pipe(s, &s->u.pipe, out_fd) != 0)
      rc = -1;
    s->reads_open = 1;
  }
  if (err_fd >= 0) {
    s->err_pipe = malloc(sizeof *s->err_pipe);
    if (!s->err_pipe || open_pipe(s, s->err_pipe, err_fd) != 0) {
      if (!s->err_pipe)
        close(err_fd);
      else
        close_aux(s, &s->err_pipe);
      rc = -1;
    }
    else
      s->reads_open++;
  }
  if (in_fd >= 0) {
    s->in_pipe = malloc(sizeof *s->in_pipe);
    if (!s->in_pipe || open_pipe(s, s->in_pipe, in_fd) != 0) {
      if (!s->in_pipe)
        close(in_fd);
      else
        close_aux(s, &s->in_pipe);
      rc = -1;
    }
    s->keep_open = s->has_stdin = 1;
  }
  if (rc != 0) {
    finish(s, "closed", "the loop refused a pipe");
    return -1;
  }
  if (s->reads_open == 0)
    finish(s, NULL, NULL); /* nothing to read: it has ended */
  else
    reading(s, 1);
  return 0;
}

static struct stream *
test_stream(lua_State *L, int idx)
{
  struct stream_ud *ud = luaL_testudata(L, idx, STREAM_MT);
  return ud ? ud->s : NULL;
}

int
sbx_stream_push_out(lua_State *L, int idx, int fd, const char *p, size_t n, size_t *queued_out)
{
  struct stream *s = test_stream(L, idx);
  if (!s || s->request != NULL || s->pipes)
    return -1;
  if (s->eof)
    return 0;
  if (n)
    deliver(s, fd == 2 ? 2 : 1, p, n);
  *queued_out = queued(s);
  return 1;
}

/* stream:push("stdout"|"stderr", bytes) -> queued chunk bytes | nil when ended */
static int
stream_push(lua_State *L)
{
  struct stream *s = check_stream(L);
  static const char *const fds[] = { "stdout", "stderr", NULL };
  int which = luaL_checkoption(L, 2, NULL, fds);
  size_t n;
  const char *p = luaL_checklstring(L, 3, &n);
  luaL_argcheck(L, s->request == NULL && !s->pipes, 1, "push on a socket or pipe stream");
  if (s->eof) {
    lua_pushnil(L);
    return 1;
  }
  if (n)
    deliver(s, which == 0 ? 1 : 2, p, n);
  lua_pushinteger(L, (lua_Integer)queued(s));
  return 1;
}

static int
room_k(lua_State *L, int status, lua_KContext ctx)
{
  struct stream_ud *ud = luaL_checkudata(L, 1, STREAM_MT);
  struct stream *s = ud->s;
  (void)status;
  (void)ctx;
  sbx_read_resumed(L);
  if (!s || s->eof)
    lua_pushliteral(L, "eof");
  else if (queued(s) <= s->room_limit)
    lua_pushliteral(L, "room");
  else
    lua_pushliteral(L, "timeout");
  return 1;
}

/*
** sink:wait_room(limit[, timeout]) -> "room" | "eof" | "timeout": waits until
** the chunks queued for the reader are at most limit bytes (the reader took
** them) or the stream ended. A producer's back-pressure without polling (an
** SSM session's reader, a Kubernetes exec pump): it pushed past its limit,
** so it stops reading its source until the reader caught up. One producer
** waits at a time. May yield.
*/
static int
stream_wait_room(lua_State *L)
{
  struct stream *s = check_stream(L);
  lua_Integer limit = luaL_checkinteger(L, 2);
  double timeout = luaL_optnumber(L, 3, -1);
  luaL_argcheck(L, limit >= 0, 2, "limit must be at least 0");
  luaL_argcheck(L, lua_isnoneornil(L, 3) || timeout >= 0, 3, "negative timeout");
  lua_settop(L, 1);
  if (s->eof) {
    lua_pushliteral(L, "eof");
    return 1;
  }
  if (queued(s) <= (size_t)limit) {
    lua_pushliteral(L, "room");
    return 1;
  }
  s->room_limit = (size_t)limit;
  return sbx_await_read(L, &s->room, timeout, room_k,
                        "another task is already waiting for room on this stream");
}

/* stream:finish([code, message]): the end of a sink, with an error if given. */
static int
stream_finish(lua_State *L)
{
  struct stream *s = check_stream(L);
  const char *code = luaL_optstring(L, 2, NULL);
  const char *msg = luaL_optstring(L, 3, code);
  luaL_argcheck(L, s->request == NULL && !s->pipes, 1, "finish on a socket or pipe stream");
  finish(s, code, msg);
  return 0;
}

/*
** core.stream.open{ unix_socket= | host=, port=, request=, stdin=, tty=,
**   keep_open=bool, capture = { stdout={head=,tail=}, stderr=..., output=... },
**   chunks=bool, chunk_limit=bytes } -> stream. Never blocks. keep_open
**   makes a channel: stdin stays open after the request (and stdin=) for
**   stream:write, until stream:close_stdin.
*/
static int
stream_open(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  struct stream_ud *ud;
  struct stream *s;
  const char *sock, *host, *req, *in;
  size_t req_len, in_len = 0;
  int rc;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  ud = lua_newuserdatauv(L, sizeof *ud, 0); /* [opts, ud] */
  ud->s = NULL;
  luaL_setmetatable(L, STREAM_MT);
  lua_getfield(L, 1, "unix_socket");
  sock = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "host");
  host = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "request");
  req = luaL_checklstring(L, -1, &req_len);
  lua_getfield(L, 1, "stdin");
  in = luaL_optlstring(L, -1, NULL, &in_len);
  luaL_argcheck(L, sock || host, 1, "unix_socket or host expected");

  s = stream_new(L, ud, h);
  s->request = malloc(req_len);
  if (!s->request)
    return luaL_error(L, "out of memory");
  memcpy(s->request, req, req_len);
  s->request_len = req_len;
  if (in) {
    s->has_stdin = 1;
    s->stdin_buf = malloc(in_len ? in_len : 1);
    if (!s->stdin_buf)
      return luaL_error(L, "out of memory");
    memcpy(s->stdin_buf, in, in_len);
    s->stdin_len = in_len;
  }
  lua_getfield(L, 1, "tty");
  sbx_demux_init(&s->demux, lua_toboolean(L, -1));
  lua_getfield(L, 1, "keep_open");
  if (lua_toboolean(L, -1)) {
    s->keep_open = 1;
    s->has_stdin = 1;
  }
  lua_pop(L, 2);
  stream_options(L, 1, s);

  s->connect_req.data = s;
  if (sock) {
    uv_pipe_init(&h->loop, &s->u.pipe, 0);
    s->u.handle.data = s;
    s->handle_open = 1;
    s->refs++;
    uv_pipe_connect(&s->connect_req, &s->u.pipe, sock, connect_cb);
  }
  else {
    struct sockaddr_storage addr;
    int port;
    lua_getfield(L, 1, "port");
    port = (int)luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr) != 0) {
      uv_getaddrinfo_t gai;
      struct addrinfo hints;
      memset(&hints, 0, sizeof hints);
      hints.ai_socktype = SOCK_STREAM;
      /* A synchronous lookup: it happens once per daemon address. */
      rc = uv_getaddrinfo(NULL, &gai, NULL, host, NULL, &hints);
      if (rc != 0 || !gai.addrinfo) {
        finish(s, "ENOTFOUND", uv_strerror(rc));
        lua_settop(L, 2);
        return 1;
      }
      memcpy(&addr, gai.addrinfo->ai_addr, gai.addrinfo->ai_addrlen);
      ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)port);
      uv_freeaddrinfo(gai.addrinfo);
    }
    uv_tcp_init(&h->loop, &s->u.tcp);
    s->u.handle.data = s;
    s->handle_open = 1;
    s->refs++;
    rc = uv_tcp_connect(&s->connect_req, &s->u.tcp, (struct sockaddr *)&addr, connect_cb);
    if (rc != 0)
      finish(s, "ECONNREFUSED", uv_strerror(rc));
  }
  lua_settop(L, 2);
  return 1;
}

static int
has_data(struct stream *s)
{
  return s->chunks && (s->pend[0].len || s->pend[1].len);
}

static int
wait_k(lua_State *L, int status, lua_KContext ctx)
{
  struct stream_ud *ud = luaL_checkudata(L, 1, STREAM_MT);
  struct stream *s = ud->s;
  (void)status;
  (void)ctx;
  sbx_read_resumed(L);
  if (!s)
    lua_pushliteral(L, "eof");
  else if (has_data(s))
    lua_pushliteral(L, "data");
  else if (s->eof)
    lua_pushliteral(L, "eof");
  else
    lua_pushliteral(L, "timeout");
  return 1;
}

/*
** stream:wait([timeout]) -> "data" | "eof" | "timeout". With chunks on, it
** returns as soon as output is queued; otherwise only at the end. May yield.
*/
static int
stream_wait(lua_State *L)
{
  struct stream *s = check_stream(L);
  double timeout = luaL_optnumber(L, 2, -1);
  lua_settop(L, 1);
  if (has_data(s)) {
    lua_pushliteral(L, "data");
    return 1;
  }
  if (s->eof) {
    lua_pushliteral(L, "eof");
    return 1;
  }
  return sbx_await_read(L, &s->reader, timeout, wait_k, "another task is already waiting on this stream");
}

static void
push_take(lua_State *L, struct stream *s, int which, int raw)
{
  struct pendbuf *b = &s->pend[which];
  if (raw) {
    lua_pushlstring(L, b->p ? b->p : "", b->len);
  }
  else {
    size_t n = b->carry_len + b->len, rest = 0, o;
    char *in = malloc(n ? n : 1), *out = malloc(3 * n + 1);
    if (!in || !out) {
      free(in);
      free(out);
      luaL_error(L, "out of memory");
      return;
    }
    memcpy(in, b->carry, b->carry_len);
    if (b->len)
      memcpy(in + b->carry_len, b->p, b->len);
    o = sbx_utf8_sanitize(in, n, out, s->eof, &rest);
    memcpy(b->carry, in + n - rest, rest);
    b->carry_len = rest;
    lua_pushlstring(L, out, o);
    free(in);
    free(out);
  }
  b->len = 0;
  /* Nothing stays resident between bursts: an idle channel holds nothing. */
  free(b->p);
  b->p = NULL;
  b->cap = 0;
}

/* After a take: a paused reader reads again, a producer in wait_room goes on. */
static void
taken(struct stream *s)
{
  wake_room(s);
  if (s->paused && !s->eof) {
    s->paused = 0;
    reading(s, 1);
  }
}

int
sbx_stream_take_out(lua_State *L, int idx, char **p, size_t *len, size_t *cap)
{
  struct stream *s = test_stream(L, idx);
  if (!s)
    return -1;
  *p = s->pend[CAP_STDOUT].p;
  *len = s->pend[CAP_STDOUT].len;
  *cap = s->pend[CAP_STDOUT].cap;
  s->pend[CAP_STDOUT].p = NULL;
  s->pend[CAP_STDOUT].len = s->pend[CAP_STDOUT].cap = 0;
  free(s->pend[CAP_STDERR].p);
  s->pend[CAP_STDERR].p = NULL;
  s->pend[CAP_STDERR].len = s->pend[CAP_STDERR].cap = 0;
  taken(s);
  return 0;
}

/*
** stream:take([raw]) -> stdout_text, stderr_text: what was queued for the
** callback, as valid UTF-8 (a sequence split across chunks is held back to
** the next take) or raw bytes. Resumes reading if it was paused.
*/
static int
stream_take(lua_State *L)
{
  struct stream *s = check_stream(L);
  int raw = lua_toboolean(L, 2);
  push_take(L, s, CAP_STDOUT, raw);
  push_take(L, s, CAP_STDERR, raw);
  taken(s);
  return 2;
}

static int
cap_index(lua_State *L, int arg)
{
  static const char *const names[] = { "stdout", "stderr", "output", NULL };
  return luaL_checkoption(L, arg, NULL, names);
}

/* stream:captured(name) -> head, tail, total, omitted (raw bytes) */
static int
stream_captured(lua_State *L)
{
  struct stream *s = check_stream(L);
  struct sbx_capture *c = &s->cap[cap_index(L, 2)];
  luaL_Buffer b;
  lua_pushlstring(L, c->head ? c->head : "", c->head_len);
  sbx_capture_copy_tail(c, luaL_buffinitsize(L, &b, c->tail_len ? c->tail_len : 1));
  luaL_pushresultsize(&b, c->tail_len);
  lua_pushinteger(L, (lua_Integer)c->total);
  lua_pushinteger(L, (lua_Integer)sbx_capture_omitted(c));
  return 4;
}

/* stream:read(name, offset, max) -> bytes, next_offset, skipped */
static int
stream_read(lua_State *L)
{
  struct stream *s = check_stream(L);
  struct sbx_capture *c = &s->cap[cap_index(L, 2)];
  lua_Integer off = luaL_optinteger(L, 3, 0);
  lua_Integer max = luaL_optinteger(L, 4, 65536);
  uint64_t skipped = 0;
  size_t got;
  luaL_Buffer b;
  luaL_argcheck(L, off >= 0, 3, "negative offset");
  luaL_argcheck(L, max > 0, 4, "max must be positive");
  /* Never a buffer larger than what the capture keeps. */
  if ((uint64_t)max > c->head_len + c->tail_len)
    max = (lua_Integer)(c->head_len + c->tail_len) + 1;
  got = sbx_capture_read_at(c, (uint64_t)off, luaL_buffinitsize(L, &b, (size_t)max), (size_t)max, &skipped);
  luaL_pushresultsize(&b, got);
  lua_pushinteger(L, off + (lua_Integer)skipped + (lua_Integer)got);
  lua_pushinteger(L, (lua_Integer)skipped);
  return 3;
}

/* Bytes of memory the stream's captures and chunk queues hold. */
static size_t
held_bytes(const struct stream *s)
{
  size_t n = s->pend[0].cap + s->pend[1].cap;
  int i;
  for (i = 0; i < CAP_N; i++)
    n += sbx_capture_held(&s->cap[i]);
  return n;
}

/*
** stream:info() -> { status, eof, error, error_code, body, stdout_bytes,
** stderr_bytes, duration, held_bytes }
*/
static int
stream_info(lua_State *L)
{
  struct stream *s = check_stream(L);
  lua_createtable(L, 0, 8);
  lua_pushinteger(L, s->reply.status);
  lua_setfield(L, -2, "status");
  lua_pushboolean(L, s->eof);
  lua_setfield(L, -2, "eof");
  if (s->error_code) {
    lua_pushstring(L, s->error);
    lua_setfield(L, -2, "error");
    lua_pushstring(L, s->error_code);
    lua_setfield(L, -2, "error_code");
  }
  if (s->reply.body) {
    lua_pushlstring(L, s->reply.body, s->reply.body_len);
    lua_setfield(L, -2, "body");
  }
  lua_pushinteger(L, (lua_Integer)s->cap[CAP_STDOUT].total);
  lua_setfield(L, -2, "stdout_bytes");
  lua_pushinteger(L, (lua_Integer)s->cap[CAP_STDERR].total);
  lua_setfield(L, -2, "stderr_bytes");
  lua_pushnumber(L, (s->eof ? s->ended : sbx_now()) - s->started);
  lua_setfield(L, -2, "duration");
  lua_pushinteger(L, (lua_Integer)held_bytes(s));
  lua_setfield(L, -2, "held_bytes");

  return 1;
}

/*
** stream:write(bytes) -> bytes queued for the socket | nil, message, code.
** Only on a keep_open stream. Bytes written before the daemon answered are
** held until it did (its HTTP server would read them ahead and lose them).
*/
static int
stream_write(lua_State *L)
{
  struct stream *s = check_stream(L);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  luaL_argcheck(L, s->keep_open, 1, "write on a stream opened without keep_open");
  if (s->eof || s->stdin_closed)
    return sbx_pushfail(L, "closed", "the stream is closed");
  if (n) {
    if (!s->pipes && (s->reply.state != SBX_HIJACK_STREAM || !s->handle_open)) {
      if (pend_add(&s->early, p, n) != 0)
        return luaL_error(L, "out of memory");
    }
    else if (chan_write(s, p, n) != 0) {
      finish(s, "closed", "cannot write to the stream");
      return sbx_pushfail(L, "closed", "cannot write to the stream");
    }
  }
  lua_pushinteger(L, (lua_Integer)(s->early.len + (write_end(s) && (s->pipes || s->handle_open)
                                                     ? uv_stream_get_write_queue_size(write_end(s))
                                                     : 0)));
  return 1;
}

/* stream:close_stdin(): the end of a channel's input (a write half-close). */
static int
stream_close_stdin(lua_State *L)
{
  struct stream *s = check_stream(L);
  luaL_argcheck(L, s->keep_open, 1, "close_stdin on a stream opened without keep_open");
  if (s->stdin_closed || s->eof)
    return 0;
  s->stdin_closed = 1;
  if (s->reply.state == SBX_HIJACK_STREAM && (s->pipes || s->handle_open) && write_end(s)) {
    s->shutdown_req.data = s;
    if (uv_shutdown(&s->shutdown_req, write_end(s), shutdown_cb) != 0 && s->pipes)
      close_aux(s, &s->in_pipe);
  }
  return 0;
}

/*
** stream:close([code, message]): drops the connection; captured bytes stay
** readable. With a code, a stream that had not ended ends with that error
** (info().error_code), as when the box under it was frozen.
*/
static int
stream_close(lua_State *L)
{
  struct stream *s = check_stream(L);
  const char *code = luaL_optstring(L, 2, NULL);
  const char *msg = luaL_optstring(L, 3, code);
  finish(s, code, msg);
  return 0;
}

/*
** stream:release(): ends the stream and frees what it captured and queued
** now, not at the next collection; byte counts stay (info, captured), the
** bytes read as empty. For logs nobody may read again.
*/
static int
stream_release(lua_State *L)
{
  struct stream *s = check_stream(L);
  int i;
  finish(s, NULL, NULL);
  for (i = 0; i < CAP_N; i++)
    sbx_capture_free(&s->cap[i]);
  for (i = 0; i < 2; i++) {
    free(s->pend[i].p);
    s->pend[i].p = NULL;
    s->pend[i].len = s->pend[i].cap = 0;
  }
  return 0;
}

static int
stream_gc(lua_State *L)
{
  struct stream_ud *ud = luaL_checkudata(L, 1, STREAM_MT);
  struct stream *s = ud->s;
  if (s) {
    ud->s = NULL;
    s->reader = NULL;
    s->room = NULL;
    finish(s, NULL, NULL);
    stream_unref(s);
  }
  return 0;
}

static int
stream_tostring(lua_State *L)
{
  struct stream_ud *ud = luaL_checkudata(L, 1, STREAM_MT);
  lua_pushfstring(L, "sbx.stream (%s)", ud->s ? (ud->s->eof ? "ended" : "open") : "closed");
  return 1;
}

/* core.stream.count() -> streams of this process not yet freed */
static int
stream_count(lua_State *L)
{
  lua_pushinteger(L, (lua_Integer)streams_alive);
  return 1;
}

static const luaL_Reg stream_funcs[] = { { "open", stream_open },
                                         { "sink", stream_sink },
                                         { "count", stream_count },
                                         { NULL, NULL } };

static const luaL_Reg stream_methods[] = { { "wait", stream_wait },
                                           { "take", stream_take },
                                           { "captured", stream_captured },
                                           { "read", stream_read },
                                           { "info", stream_info },
                                           { "close", stream_close },
                                           { "release", stream_release },
                                           { "push", stream_push },
                                           { "wait_room", stream_wait_room },
                                           { "finish", stream_finish },
                                           { "write", stream_write },
                                           { "close_stdin", stream_close_stdin },
                                           { NULL, NULL } };

static const luaL_Reg stream_meta[] = { { "__gc", stream_gc },
                                        { "__close", stream_gc },
                                        { "__tostring", stream_tostring },
                                        { "__index", NULL },
                                        { NULL, NULL } };

int
sbx_open_stream(lua_State *L)
{
  luaL_newmetatable(L, STREAM_MT);
  luaL_setfuncs(L, stream_meta, 0);
  luaL_newlibtable(L, stream_methods);
  luaL_setfuncs(L, stream_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, stream_funcs);
  return 1;
}

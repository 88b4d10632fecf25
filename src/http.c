/*
** HTTP client on the shared loop: libcurl's multi interface driven by libuv
** socket polls and one timer (the pattern of curl's multi-uv example).
**
** core.http.request{...} -> response table | nil, message, code. May yield.
** A request marked detached has no waiter: it runs to completion on its own
** (used by finalizers that must not block), and the driver waits for it.
**
** A request marked stream returns when the response head arrives; its body
** is read from a body_stream userdata that owns the transfer. Queued unread
** bytes are capped: past the cap the write callback pauses the transfer, and
** the reader resumes it (curl_easy_pause, never from a curl callback).
*/
#include "host.h"
#include "modules.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#define BODY_MT "sbx.http.body"

struct http_req;

struct sbx_http {
  struct sbx_host *host;
  CURLM *multi;
  uv_timer_t timer;
  struct http_req *streams; /* live streamed transfers, for shutdown */
};

struct poll_ctx {
  uv_poll_t poll;
  curl_socket_t fd;
  struct sbx_http *http;
};

struct http_req {
  struct sbx_http *http;
  CURL *easy;
  struct curl_slist *headers;
  char *body_in; /* request body copy */
  char *body;
  size_t body_len, body_cap, body_max;
  char *hdrs;
  size_t hdrs_len, hdrs_cap;
  int truncated;
  long status;
  CURLcode result;
  char errbuf[CURL_ERROR_SIZE];
  struct http_wait *wait; /* NULL when detached or abandoned */
  int done;
  /* Streamed responses: owned by a body_stream userdata from the start. */
  int stream;
  int head_done;             /* the final response head arrived */
  int paused;                /* the write callback paused the transfer */
  size_t body_off;           /* read offset into body */
  struct sbx_waiter *reader; /* the one waiting :read(), or NULL */
  struct http_req *prev, *next;
  double idle, last_rx; /* idle_timeout (s) and the last byte's time */
  int idle_fired;
};

struct body_ud {
  struct http_req *r; /* NULL once closed */
};

struct http_wait {
  struct sbx_waiter w;
  struct http_req *req;
};

/* Detaches and frees the easy handle; the transfer stops. */
static void
req_stop(struct http_req *r)
{
  if (r->easy) {
    if (r->http)
      curl_multi_remove_handle(r->http->multi, r->easy);
    curl_easy_cleanup(r->easy);
    r->easy = NULL;
  }
}

static void
stream_unlink(struct http_req *r)
{
  if (!r->stream || !r->http)
    return;
  if (r->prev)
    r->prev->next = r->next;
  else if (r->http->streams == r)
    r->http->streams = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->prev = r->next = NULL;
}

static void
req_free(struct http_req *r)
{
  req_stop(r);
  stream_unlink(r);
  curl_slist_free_all(r->headers);
  free(r->body_in);
  free(r->body);
  free(r->hdrs);
  free(r);
}

static void
check_done(struct sbx_http *http)
{
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(http->multi, &left))) {
    struct http_req *r;
    if (msg->msg != CURLMSG_DONE)
      continue;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    r->result = msg->data.result;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &r->status);
    curl_multi_remove_handle(http->multi, r->easy);
    curl_easy_cleanup(r->easy);
    r->easy = NULL;
    r->done = 1;
    if (r->reader)
      sbx_wake(r->reader); /* detach clears r->reader */
    if (r->wait)
      sbx_wake(&r->wait->w);
    else if (!r->stream) {
      http->host->detached--;
      req_free(r);
    }
  }
}

static void
poll_close_cb(uv_handle_t *h)
{
  free(h->data);
}

static void
poll_cb(uv_poll_t *p, int status, int events)
{
  struct poll_ctx *ctx = p->data;
  int flags = 0, running;
  if (status < 0)
    flags = CURL_CSELECT_ERR;
  else {
    if (events & UV_READABLE)
      flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
      flags |= CURL_CSELECT_OUT;
  }
  curl_multi_socket_action(ctx->http->multi, ctx->fd, flags, &running);
  check_done(ctx->http);
}

static int
socket_cb(CURL *easy, curl_socket_t s, int action, void *userp, void *socketp)
{
  struct sbx_http *http = userp;
  struct poll_ctx *ctx = socketp;
  int events = 0;
  (void)easy;
  if (action == CURL_POLL_REMOVE) {
    if (ctx) {
      uv_poll_stop(&ctx->poll);
      uv_close((uv_handle_t *)&ctx->poll, poll_close_cb);
      curl_multi_assign(http->multi, s, NULL);
    }
    return 0;
  }
  if (!ctx) {
    ctx = calloc(1, sizeof *ctx);
    if (!ctx)
      return -1;
    ctx->fd = s;
    ctx->http = http;
    uv_poll_init_socket(&http->host->loop, &ctx->poll, s);
    ctx->poll.data = ctx;
    curl_multi_assign(http->multi, s, ctx);
  }
  if (action != CURL_POLL_OUT)
    events |= UV_READABLE;
  if (action != CURL_POLL_IN)
    events |= UV_WRITABLE;
  uv_poll_start(&ctx->poll, events, poll_cb);
  return 0;
}

static void
timer_cb(uv_timer_t *t)
{
  struct sbx_http *http = t->data;
  int running;
  curl_multi_socket_action(http->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done(http);
}

static int
timer_fn(CURLM *multi, long ms, void *userp)
{
  struct sbx_http *http = userp;
  (void)multi;
  if (ms < 0)
    uv_timer_stop(&http->timer);
  else
    uv_timer_start(&http->timer, timer_cb, (uint64_t)ms, 0);
  return 0;
}

/* The key of this module's state on the host (sbx_host_slot). */
static const char HTTP_KEY = 'h';
static void http_shutdown(struct sbx_host *h);

static struct sbx_http *
http_get(struct sbx_host *h)
{
  struct sbx_http *http;
  struct sbx_http **slot = (struct sbx_http **)sbx_host_slot(h, &HTTP_KEY);
  if (*slot)
    return *slot;
  http = calloc(1, sizeof *http);
  if (!http)
    return NULL;
  http->host = h;
  http->multi = curl_multi_init();
  curl_multi_setopt(http->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
  curl_multi_setopt(http->multi, CURLMOPT_SOCKETDATA, http);
  curl_multi_setopt(http->multi, CURLMOPT_TIMERFUNCTION, timer_fn);
  curl_multi_setopt(http->multi, CURLMOPT_TIMERDATA, http);
  /* Keep enough idle connections for hundreds of boxes in flight. */
  curl_multi_setopt(http->multi, CURLMOPT_MAXCONNECTS, 256L);
  uv_timer_init(&h->loop, &http->timer);
  http->timer.data = http;
  *slot = http;
  sbx_host_on_close(h, SBX_CLOSE_ABORT, http_shutdown);
  return http;
}

static void
http_free_cb(uv_handle_t *t)
{
  free(t->data);
}

/* The host is closing (SBX_CLOSE_ABORT): every transfer stops. */
static void
http_shutdown(struct sbx_host *h)
{
  struct sbx_http **slot = (struct sbx_http **)sbx_host_slot(h, &HTTP_KEY);
  struct sbx_http *http = *slot;
  struct http_req *r, *next;
  if (!http)
    return;
  *slot = NULL;
  /* Streamed bodies may outlive the host: stop them, keep their memory. */
  for (r = http->streams; r; r = next) {
    next = r->next;
    req_stop(r);
    r->prev = r->next = NULL;
    r->http = NULL;
    if (!r->done) {
      r->done = 1;
      r->result = CURLE_ABORTED_BY_CALLBACK;
      snprintf(r->errbuf, sizeof r->errbuf, "the HTTP client was shut down");
    }
    if (r->reader)
      sbx_wake(r->reader);
  }
  http->streams = NULL;
  curl_multi_cleanup(http->multi);
  uv_timer_stop(&http->timer);
  uv_close((uv_handle_t *)&http->timer, http_free_cb);
}

static int
grow(char **buf, size_t *cap, size_t need)
{
  size_t c = *cap ? *cap : 1024;
  char *p;
  if (need <= *cap)
    return 0;
  while (c < need)
    c *= 2;
  p = realloc(*buf, c);
  if (!p)
    return -1;
  *buf = p;
  *cap = c;
  return 0;
}

static size_t
write_cb(char *p, size_t size, size_t n, void *ud)
{
  struct http_req *r = ud;
  size_t len = size * n, take = len;
  r->last_rx = sbx_now();
  if (r->body_len + take > r->body_max) {
    take = r->body_max - r->body_len;
    r->truncated = 1;
  }
  if (take && grow(&r->body, &r->body_cap, r->body_len + take) == 0) {
    memcpy(r->body + r->body_len, p, take);
    r->body_len += take;
  }
  return len;
}

static size_t
header_cb(char *p, size_t size, size_t n, void *ud)
{
  struct http_req *r = ud;
  size_t len = size * n;
  r->last_rx = sbx_now();
  if (r->stream && r->head_done)
    return len; /* trailers */
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0)
    r->hdrs_len = 0; /* a new response (after 100-continue or a redirect) */
  if (r->stream && (len == 0 || p[0] == '\r' || p[0] == '\n')) {
    long code = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200 || code == 0) {
      /* The final head: the requester may go on (it runs after this pass). */
      r->head_done = 1;
      r->status = code;
      if (r->wait)
        sbx_wake(&r->wait->w);
    }
    return len;
  }
  if (r->hdrs_len + len < 65536 && grow(&r->hdrs, &r->hdrs_cap, r->hdrs_len + len) == 0) {
    memcpy(r->hdrs + r->hdrs_len, p, len);
    r->hdrs_len += len;
  }
  return len;
}

/*
** Streamed bodies: queue the bytes; past max (body_max) pause the transfer.
** curl keeps a paused chunk and delivers it again after CURLPAUSE_CONT.
*/
static size_t
stream_write_cb(char *p, size_t size, size_t n, void *ud)
{
  struct http_req *r = ud;
  size_t len = size * n, queued = r->body_len - r->body_off;
  if (queued > 0 && queued + len > r->body_max) {
    r->paused = 1;
    return CURL_WRITEFUNC_PAUSE;
  }
  if (r->body_off > 0 && r->body_off == r->body_len)
    r->body_off = r->body_len = 0;
  if (grow(&r->body, &r->body_cap, r->body_len + len) != 0) {
    snprintf(r->errbuf, sizeof r->errbuf, "out of memory queueing the body");
    return 0; /* curl fails the transfer with CURLE_WRITE_ERROR */
  }
  memcpy(r->body + r->body_len, p, len);
  r->body_len += len;
  r->last_rx = sbx_now();
  if (r->reader)
    sbx_wake(r->reader);
  return len;
}

/*
** The idle timeout: no byte for r->idle seconds while not paused by us.
** curl calls this at least once a second (the speed check's tick).
*/
static int
xferinfo_cb(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
  struct http_req *r = ud;
  (void)dltotal;
  (void)dlnow;
  (void)ultotal;
  (void)ulnow;
  if (r->paused) {
    r->last_rx = sbx_now(); /* our reader is slow, not the server */
    return 0;
  }
  if (r->idle > 0 && sbx_now() - r->last_rx > r->idle) {
    r->idle_fired = 1;
    return 1; /* CURLE_ABORTED_BY_CALLBACK */
  }
  return 0;
}

static void
http_cancel(struct sbx_waiter *w)
{
  struct http_wait *hw = (struct http_wait *)w;
  struct http_req *r = hw->req;
  if (r) {
    hw->req = NULL;
    r->wait = NULL;
    if (r->stream)
      req_stop(r); /* the body userdata still owns it */
    else
      req_free(r);
  }
}

static const char *
curl_code_name(CURLcode c)
{
  switch (c) {
  case CURLE_COULDNT_CONNECT:
    return "ECONNREFUSED";
  case CURLE_COULDNT_RESOLVE_HOST:
    return "ENOTFOUND";
  case CURLE_OPERATION_TIMEDOUT:
    return "timeout";
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_PARTIAL_FILE:
    return "closed";
  case CURLE_ABORTED_BY_CALLBACK:
    return "aborted";
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_PEER_FAILED_VERIFICATION:
    return "tls";
  default:
    return "http";
  }
}

/* Pushes a table of the response headers, names lowercased. */
static void
push_headers(lua_State *L, const char *p, size_t n)
{
  const char *end = p + n;
  lua_newtable(L);
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *colon, *v, *ve;
    if (!eol)
      eol = end;
    colon = memchr(p, ':', (size_t)(eol - p));
    if (colon && memcmp(p, "HTTP/", 5) != 0) {
      luaL_Buffer b;
      const char *k;
      luaL_buffinit(L, &b);
      for (k = p; k < colon; k++)
        luaL_addchar(&b, (char)((*k >= 'A' && *k <= 'Z') ? *k + 32 : *k));
      luaL_pushresult(&b);
      v = colon + 1;
      while (v < eol && (*v == ' ' || *v == '\t'))
        v++;
      ve = eol;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
        ve--;
      lua_pushlstring(L, v, (size_t)(ve - v));
      lua_settable(L, -3);
    }
    p = eol + 1;
  }
}

/* ---------------------------------------------------------------- body */

static struct http_req *
check_body(lua_State *L)
{
  struct body_ud *ud = luaL_checkudata(L, 1, BODY_MT);
  if (!ud->r)
    luaL_error(L, "attempt to use a closed body stream");
  return ud->r;
}

/* Stops the transfer and frees it; the userdata reads as closed after. */
static void
body_close(struct body_ud *ud)
{
  struct http_req *r = ud->r;
  if (!r)
    return;
  ud->r = NULL;
  if (r->wait) {
    r->wait->req = NULL;
    r->wait = NULL;
  }
  if (r->reader)
    sbx_wake(r->reader); /* another task's read ends with "closed" */
  req_free(r);
}

/* Pushes nil, message, code for a failed transfer; returns 3. */
static int
push_curl_fail(lua_State *L, struct http_req *r)
{
  if (r->idle_fired)
    return sbx_pushfail(L, "timeout", "no bytes received for %f s (idle_timeout)", r->idle);
  return sbx_pushfail(L, curl_code_name(r->result), "%s",
                      r->errbuf[0] ? r->errbuf : curl_easy_strerror(r->result));
}

/*
** The next queued bytes, or "eof", or the failure: pushes the results of
** :read() and returns their count, or returns 0 when nothing is ready yet.
** Taking the queue resumes a paused transfer (outside curl callbacks).
*/
static int
body_take(lua_State *L, struct http_req *r)
{
  if (r->body_len > r->body_off) {
    lua_pushlstring(L, r->body + r->body_off, r->body_len - r->body_off);
    r->body_off = r->body_len = 0;
    if (r->paused && r->easy) {
      r->paused = 0;
      r->last_rx = sbx_now();                   /* idle time restarts with the transfer */
      curl_easy_pause(r->easy, CURLPAUSE_CONT); /* may queue bytes at once */
    }
    return 1;
  }
  if (r->done) {
    if (r->result == CURLE_OK) {
      lua_pushnil(L);
      lua_pushliteral(L, "eof");
      return 2;
    }
    return push_curl_fail(L, r);
  }
  return 0;
}

static int
body_read_k(lua_State *L, int status, lua_KContext ctx)
{
  struct body_ud *ud = luaL_checkudata(L, 1, BODY_MT);
  int n;
  (void)status;
  (void)ctx;
  sbx_read_resumed(L);
  if (!ud->r)
    return sbx_pushfail(L, "closed", "the body stream was closed");
  if ((n = body_take(L, ud->r)) > 0)
    return n;
  return sbx_pushfail(L, "timeout", "no body bytes within the timeout");
}

/*
** body:read([timeout]) -> bytes | nil, "eof" | nil, message, code. Returns
** every queued byte (at most about max_buffer). One reader at a time.
** May yield; raises when closed or when another reader is waiting.
*/
static int
body_read(lua_State *L)
{
  struct http_req *r = check_body(L);
  double timeout = luaL_optnumber(L, 2, -1);
  int n;
  lua_settop(L, 1);
  if ((n = body_take(L, r)) > 0)
    return n;
  return sbx_await_read(L, &r->reader, timeout, body_read_k,
                        "another task is already reading this body stream");
}

/* body:close(): aborts the transfer. Idempotent; also __gc and __close. */
static int
body_gc(lua_State *L)
{
  body_close(luaL_checkudata(L, 1, BODY_MT));
  return 0;
}

static int
body_tostring(lua_State *L)
{
  struct body_ud *ud = luaL_checkudata(L, 1, BODY_MT);
  lua_pushfstring(L, "sbx.http.body (%s)",
                  !ud->r          ? "closed"
                  : ud->r->done   ? "ended"
                  : ud->r->paused ? "paused"
                                  : "open");
  return 1;
}

static const luaL_Reg body_methods[] = { { "read", body_read }, { "close", body_gc }, { NULL, NULL } };

static const luaL_Reg body_meta[] = { { "__gc", body_gc },
                                      { "__close", body_gc },
                                      { "__tostring", body_tostring },
                                      { "__index", NULL },
                                      { NULL, NULL } };

/*
** Resumes a streamed request: [opts, body_ud, op]. Before the head arrived
** the transfer can only have failed; after it, the body userdata goes out
** with the response and later failures surface from :read().
*/
static int
stream_k(lua_State *L, int status, lua_KContext ctx)
{
  struct http_wait *hw = lua_touserdata(L, -1);
  struct body_ud *ud = luaL_checkudata(L, 2, BODY_MT);
  struct http_req *r = ud->r;
  (void)status;
  (void)ctx;
  if (hw->w.cancelled)
    return sbx_raise_cancelled(L); /* the transfer was stopped; gc frees it */
  hw->req = NULL;
  r->wait = NULL;
  if (!r->head_done) {
    if (r->result == CURLE_OK) {
      r->head_done = 1; /* no head at all (not HTTP): body only */
      r->status = 0;
    }
    else {
      int n = push_curl_fail(L, r);
      body_close(ud);
      return n;
    }
  }
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, r->status);
  lua_setfield(L, -2, "status");
  push_headers(L, r->hdrs ? r->hdrs : "", r->hdrs_len);
  lua_setfield(L, -2, "headers");
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, "body_stream");
  return 1;
}

static int
request_k(lua_State *L, int status, lua_KContext ctx)
{
  struct http_wait *hw = lua_touserdata(L, -1);
  struct http_req *r = hw->req;
  (void)status;
  (void)ctx;
  if (hw->w.cancelled)
    return sbx_raise_cancelled(L);
  hw->req = NULL;
  if (r->result != CURLE_OK) {
    int n = push_curl_fail(L, r);
    req_free(r);
    return n;
  }
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, r->status);
  lua_setfield(L, -2, "status");
  lua_pushlstring(L, r->body ? r->body : "", r->body_len);
  lua_setfield(L, -2, "body");
  lua_pushboolean(L, r->truncated);
  lua_setfield(L, -2, "truncated");
  push_headers(L, r->hdrs ? r->hdrs : "", r->hdrs_len);
  lua_setfield(L, -2, "headers");
  req_free(r);
  return 1;
}

/*
** TLS options of a request (all optional): ca_file, cert_file, key_file
** (paths); ca_data, cert_data, key_data (PEM bytes, handed to libcurl as
** blobs it copies, so nothing secret is written to a file); insecure
** (true: no verification of the server's certificate or name). Checked
** before the request is made, so a wrong type raises with nothing to free.
*/
static const char *const tls_strings[] = { "ca_file",   "cert_file", "key_file", "ca_data",
                                           "cert_data", "key_data",  NULL };

static void
check_tls_opts(lua_State *L)
{
  int i;
  for (i = 0; tls_strings[i]; i++) {
    int t = lua_getfield(L, 1, tls_strings[i]);
    if (t != LUA_TNIL && t != LUA_TSTRING)
      luaL_error(L, "http.request: %s must be a string", tls_strings[i]);
    lua_pop(L, 1);
  }
}

static void
set_blob(CURL *easy, CURLoption opt, const char *p, size_t n)
{
  struct curl_blob blob;
  blob.data = (void *)p;
  blob.len = n;
  blob.flags = CURL_BLOB_COPY;
  curl_easy_setopt(easy, opt, &blob);
}

/* [opts] -> the TLS options of opts set on easy; the stack is unchanged. */
static void
set_tls_opts(lua_State *L, CURL *easy)
{
  static const CURLoption file_opts[] = { CURLOPT_CAINFO, CURLOPT_SSLCERT, CURLOPT_SSLKEY };
  static const CURLoption blob_opts[] = { CURLOPT_CAINFO_BLOB, CURLOPT_SSLCERT_BLOB, CURLOPT_SSLKEY_BLOB };
  int i;
  for (i = 0; i < 6; i++) {
    size_t n;
    const char *v;
    lua_getfield(L, 1, tls_strings[i]);
    v = lua_tolstring(L, -1, &n);
    if (v && i < 3)
      curl_easy_setopt(easy, file_opts[i], v); /* libcurl copies strings */
    else if (v)
      set_blob(easy, blob_opts[i - 3], v, n);
    lua_pop(L, 1);
  }
  lua_getfield(L, 1, "insecure");
  if (lua_toboolean(L, -1)) {
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  lua_pop(L, 1);
}

/*
** core.http.request{ url=, method=, headers={"K: V", ...} or {K=V}, body=,
**   unix_socket=, timeout= (s, whole transfer), connect_timeout= (s),
**   low_speed_time= (s), low_speed_limit= (bytes/s, default 1),
**   idle_timeout= (s without a byte, unless paused for the reader; checked
**   about once a second), max_body= (bytes),
**   detached=, stream=, max_buffer= (bytes, default 1 MiB),
**   ca_file=, ca_data=, cert_file=, cert_data=, key_file=, key_data=,
**   insecure= (TLS: see set_tls_opts) }
**   -> {status, body, headers, truncated} | nil, message, code
** With stream = true it returns at the response head with
**   {status, headers, body_stream = userdata (:read, :close)}.
** May yield. Contract errors raise.
*/
static int
http_request(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  struct sbx_http *http = http_get(h);
  struct http_req *r;
  const char *url, *method, *sock;
  size_t body_len = 0;
  const char *body;
  double timeout, ctimeout, low_time, low_limit, idle;
  int detached, stream;
  struct body_ud *ud = NULL;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  if (!http)
    return luaL_error(L, "out of memory");
  lua_getfield(L, 1, "stream");
  stream = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (stream) {
    /* Made first and closed: it owns the request from the allocation on. */
    ud = lua_newuserdatauv(L, sizeof *ud, 0); /* [opts, ud] */
    ud->r = NULL;
    luaL_setmetatable(L, BODY_MT);
  }
  if (lua_getfield(L, 1, "url") != LUA_TSTRING)
    return luaL_error(L, "http.request needs a url string");
  url = lua_tostring(L, -1);
  lua_getfield(L, 1, "method");
  method = luaL_optstring(L, -1, "GET");
  lua_getfield(L, 1, "unix_socket");
  sock = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "body");
  body = luaL_optlstring(L, -1, NULL, &body_len);
  lua_getfield(L, 1, "timeout");
  timeout = luaL_optnumber(L, -1, 0);
  lua_getfield(L, 1, "connect_timeout");
  ctimeout = luaL_optnumber(L, -1, 10);
  lua_getfield(L, 1, "low_speed_time");
  low_time = luaL_optnumber(L, -1, 0);
  lua_getfield(L, 1, "low_speed_limit");
  low_limit = luaL_optnumber(L, -1, 1);
  lua_getfield(L, 1, "idle_timeout");
  idle = luaL_optnumber(L, -1, 0);
  lua_getfield(L, 1, "detached");
  detached = lua_toboolean(L, -1);
  check_tls_opts(L);
  luaL_argcheck(L, !(stream && detached), 1, "a streamed request cannot be detached");
  lua_getfield(L, 1, stream ? "max_buffer" : "max_body");
  {
    lua_Integer max = luaL_optinteger(L, -1, stream ? 1024 * 1024 : 64 * 1024 * 1024);
    luaL_argcheck(L, max > 0, 1, "max_body and max_buffer must be positive");
    r = calloc(1, sizeof *r);
    if (!r)
      return luaL_error(L, "out of memory");
    r->body_max = (size_t)max;
  }
  r->http = http;
  r->stream = stream;
  r->idle = idle;
  r->last_rx = sbx_now();
  if (ud) {
    ud->r = r;
    r->next = http->streams;
    if (r->next)
      r->next->prev = r;
    http->streams = r;
  }
  r->easy = curl_easy_init();
  if (!r->easy) {
    if (!ud)
      free(r);
    return luaL_error(L, "out of memory");
  }
  curl_easy_setopt(r->easy, CURLOPT_URL, url);
  curl_easy_setopt(r->easy, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
  curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, stream ? stream_write_cb : write_cb);
  curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(r->easy, CURLOPT_HEADERFUNCTION, header_cb);
  curl_easy_setopt(r->easy, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, r->errbuf);
  curl_easy_setopt(r->easy, CURLOPT_ACCEPT_ENCODING, "");
  if (strcmp(method, "HEAD") == 0)
    curl_easy_setopt(r->easy, CURLOPT_NOBODY, 1L);
  if (sock)
    curl_easy_setopt(r->easy, CURLOPT_UNIX_SOCKET_PATH, sock);
  set_tls_opts(L, r->easy);
  if (timeout > 0)
    curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, (long)(timeout * 1000));
  curl_easy_setopt(r->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)(ctimeout * 1000));
  if (low_time > 0) {
    /* curl averages the speed over a few seconds; a paused transfer is exempt. */
    curl_easy_setopt(r->easy, CURLOPT_LOW_SPEED_TIME, (long)(low_time + 0.999));
    curl_easy_setopt(r->easy, CURLOPT_LOW_SPEED_LIMIT, (long)(low_limit > 1 ? low_limit : 1));
  }
  if (idle > 0) {
    curl_easy_setopt(r->easy, CURLOPT_XFERINFOFUNCTION, xferinfo_cb);
    curl_easy_setopt(r->easy, CURLOPT_XFERINFODATA, r);
    curl_easy_setopt(r->easy, CURLOPT_NOPROGRESS, 0L);
    if (low_time <= 0) {
      /* A speed limit makes curl tick every second, even when idle. */
      curl_easy_setopt(r->easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(r->easy, CURLOPT_LOW_SPEED_TIME, 86400L);
    }
  }
  if (body) {
    r->body_in = malloc(body_len ? body_len : 1);
    if (!r->body_in) {
      if (!ud)
        req_free(r);
      return luaL_error(L, "out of memory");
    }
    memcpy(r->body_in, body, body_len);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body_in);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  }
  r->headers = curl_slist_append(r->headers, "Expect:");
  lua_getfield(L, 1, "headers");
  if (lua_istable(L, -1)) {
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      int named = lua_type(L, -2) == LUA_TSTRING;
      const char *line = luaL_tolstring(L, -1, NULL); /* [k, v, s] */
      if (named)
        line = lua_pushfstring(L, "%s: %s", lua_tostring(L, -3), line);
      r->headers = curl_slist_append(r->headers, line);
      lua_pop(L, named ? 3 : 2); /* [k] */
    }
  }
  lua_pop(L, 1);
  curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->headers);
  lua_settop(L, ud ? 2 : 1);
  if (ud) {
    struct http_wait *hw = (struct http_wait *)sbx_op_new(L, sizeof *hw, http_cancel);
    hw->req = r; /* [opts, ud, op] */
    r->wait = hw;
    curl_multi_add_handle(http->multi, r->easy);
    return sbx_await(L, &hw->w, stream_k, 0);
  }
  if (detached) {
    h->detached++;
    curl_multi_add_handle(http->multi, r->easy);
    lua_pushboolean(L, 1);
    return 1;
  }
  {
    struct http_wait *hw = (struct http_wait *)sbx_op_new(L, sizeof *hw, http_cancel);
    hw->req = r;
    r->wait = hw;
    curl_multi_add_handle(http->multi, r->easy);
    return sbx_await(L, &hw->w, request_k, 0);
  }
}

/* core.http.escape(s) -> percent-encoded s */
static int
http_escape(lua_State *L)
{
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  char *e = curl_easy_escape(NULL, s, (int)n);
  if (!e)
    return luaL_error(L, "out of memory");
  lua_pushstring(L, e);
  curl_free(e);
  return 1;
}

static const luaL_Reg http_funcs[] = { { "request", http_request },
                                       { "escape", http_escape },
                                       { NULL, NULL } };

int
sbx_open_http(lua_State *L)
{
  static int inited;
  if (!inited) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    inited = 1;
  }
  luaL_newmetatable(L, BODY_MT);
  luaL_setfuncs(L, body_meta, 0);
  luaL_newlibtable(L, body_methods);
  luaL_setfuncs(L, body_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, http_funcs);
  return 1;
}

/*
** HTTP client on the shared loop: libcurl's multi interface driven by libuv
** socket polls and one timer (the pattern of curl's multi-uv example).
**
** core.http.request{...} -> response table | nil, message, code. May yield.
** A request marked detached has no waiter: it runs to completion on its own
** (used by finalizers that must not block), and the driver waits for it.
*/
#include "host.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

struct sbx_http {
  struct sbx_host *host;
  CURLM *multi;
  uv_timer_t timer;
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
  char *body_in;               /* request body copy */
  char *body; size_t body_len, body_cap, body_max;
  char *hdrs; size_t hdrs_len, hdrs_cap;
  int truncated;
  long status;
  CURLcode result;
  char errbuf[CURL_ERROR_SIZE];
  struct http_wait *wait;      /* NULL when detached or abandoned */
  int done;
};

struct http_wait {
  struct sbx_waiter w;
  struct http_req *req;
};

static void
req_free(struct http_req *r)
{
  if (r->easy) {
    curl_multi_remove_handle(r->http->multi, r->easy);
    curl_easy_cleanup(r->easy);
  }
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
    if (r->wait)
      sbx_wake(&r->wait->w);
    else {
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

static struct sbx_http *
http_get(struct sbx_host *h)
{
  struct sbx_http *http;
  if (h->http)
    return h->http;
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
  h->http = http;
  return http;
}

static void
http_free_cb(uv_handle_t *t)
{
  free(t->data);
}

void
sbx_http_shutdown(struct sbx_host *h)
{
  struct sbx_http *http = h->http;
  if (!http)
    return;
  h->http = NULL;
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
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0)
    r->hdrs_len = 0; /* a new response (after 100-continue or a redirect) */
  if (r->hdrs_len + len < 65536 && grow(&r->hdrs, &r->hdrs_cap, r->hdrs_len + len) == 0) {
    memcpy(r->hdrs + r->hdrs_len, p, len);
    r->hdrs_len += len;
  }
  return len;
}

static void
http_cancel(struct sbx_waiter *w)
{
  struct http_wait *hw = (struct http_wait *)w;
  if (hw->req) {
    req_free(hw->req);
    hw->req = NULL;
  }
}

static const char *
curl_code_name(CURLcode c)
{
  switch (c) {
  case CURLE_COULDNT_CONNECT: return "ECONNREFUSED";
  case CURLE_COULDNT_RESOLVE_HOST: return "ENOTFOUND";
  case CURLE_OPERATION_TIMEDOUT: return "timeout";
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING: return "closed";
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_PEER_FAILED_VERIFICATION: return "tls";
  default: return "http";
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
    const char *code = curl_code_name(r->result);
    lua_pushnil(L);
    lua_pushfstring(L, "%s", r->errbuf[0] ? r->errbuf : curl_easy_strerror(r->result));
    lua_pushstring(L, code);
    req_free(r);
    return 3;
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
** core.http.request{ url=, method=, headers={"K: V", ...} or {K=V}, body=,
**   unix_socket=, timeout= (s), connect_timeout= (s), max_body= (bytes),
**   detached= } -> {status, body, headers, truncated} | nil, message, code
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
  double timeout, ctimeout;
  int detached;
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!http)
    return luaL_error(L, "out of memory");
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
  lua_getfield(L, 1, "detached");
  detached = lua_toboolean(L, -1);

  r = calloc(1, sizeof *r);
  if (!r)
    return luaL_error(L, "out of memory");
  r->http = http;
  lua_getfield(L, 1, "max_body");
  r->body_max = (size_t)luaL_optinteger(L, -1, 64 * 1024 * 1024);
  r->easy = curl_easy_init();
  if (!r->easy) {
    free(r);
    return luaL_error(L, "out of memory");
  }
  curl_easy_setopt(r->easy, CURLOPT_URL, url);
  curl_easy_setopt(r->easy, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
  curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, write_cb);
  curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(r->easy, CURLOPT_HEADERFUNCTION, header_cb);
  curl_easy_setopt(r->easy, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, r->errbuf);
  curl_easy_setopt(r->easy, CURLOPT_ACCEPT_ENCODING, "");
  if (strcmp(method, "HEAD") == 0)
    curl_easy_setopt(r->easy, CURLOPT_NOBODY, 1L);
  if (sock)
    curl_easy_setopt(r->easy, CURLOPT_UNIX_SOCKET_PATH, sock);
  if (timeout > 0)
    curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, (long)(timeout * 1000));
  curl_easy_setopt(r->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)(ctimeout * 1000));
  if (body) {
    r->body_in = malloc(body_len ? body_len : 1);
    if (!r->body_in) {
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
      const char *line = luaL_tolstring(L, -1, NULL);          /* [k, v, s] */
      if (named)
        line = lua_pushfstring(L, "%s: %s", lua_tostring(L, -3), line);
      r->headers = curl_slist_append(r->headers, line);
      lua_pop(L, named ? 3 : 2);                               /* [k] */
    }
  }
  lua_pop(L, 1);
  curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->headers);
  lua_settop(L, 1);
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

static const luaL_Reg http_funcs[] = {
  { "request", http_request },
  { "escape", http_escape },
  { NULL, NULL }
};

int
sbx_open_http(lua_State *L)
{
  static int inited;
  if (!inited) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    inited = 1;
  }
  luaL_newlib(L, http_funcs);
  return 1;
}

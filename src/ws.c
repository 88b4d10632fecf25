/*
** core.ws: a websocket client on the host's loop. libwebsockets 4.1 runs on
** the host's own uv loop as a foreign loop: one lws context per host, made by
** the first connect and destroyed last at teardown (sbx_ws_shutdown before
** the final uv_run, sbx_ws_free after it). No threads, no polling.
**
** Ownership. A connection (struct ws_conn) is heap memory with up to three
** holders: the Lua userdata, every lws wsi made for it (each calls back until
** its LWS_CALLBACK_WSI_DESTROY) and a pending DNS lookup. It is freed when
** the last one lets go (conn_check_free). lws callbacks never run Lua: they
** queue messages and wake the one waiting coroutine.
**
** Flow control. Whole received messages wait for recv in a queue; above
** max_queue bytes the connection stops reading (the TCP window then stops
** the server) until recv has drained half of it. The message being
** reassembled is bounded by max_message instead.
**
** Sends are never fragmented: each message goes out as one frame (one
** lws_write; lws keeps what the socket does not take yet and calls back
** once it is written). Kubernetes' exec server (wsstream over
** golang.org/x/net/websocket) reads every frame as a message of its own and
** takes its first byte as the channel, so a continuation frame would be
** mangled. A message longer than max_send is refused (it raises): callers
** split their data into messages that each fit.
*/
#include "host.h" /* <uv.h> first: the lws header's libuv glue needs it */
#include "modules.h"

#include "sha256.h"

#include <libwebsockets.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WS_MT "sbx.ws"
#define WS_PROTOCOL "sbx-ws"
#define RX_CHUNK 16384        /* most payload bytes per receive callback */
#define SERV_BUF 32768        /* lws's per-loop buffer; holds the upgrade request */
#define LWS_OWN_TIMEOUT 86400 /* lws's handshake timeouts: ours (timeout=) decide */
#define CLOSE_FLUSH_SECS 10   /* queued sends get this long before a close */
#define MAX_ADDRS 8
#define ADDR_LEN 64

enum { ST_CONNECTING, ST_OPEN, ST_CLOSING, ST_CLOSED };
static const char *const state_names[] = { "connecting", "open", "closing", "closed" };

struct ws_msg {
  struct ws_msg *next;
  size_t len, off; /* off: bytes already written (outgoing) */
  int binary;
  char *p; /* the payload: data, or data + LWS_PRE (outgoing) */
  char data[];
};

/* bytes: what is not written yet (outgoing) or not taken yet (incoming). */
struct ws_queue {
  struct ws_msg *head, *tail;
  size_t bytes;
};

/*
** A vhost per TLS setting (trusted CAs, client certificate): its own
** OpenSSL context, made by us (lws uses it as given, and never frees it).
** Vhosts are found by a SHA-256 of the setting, so no certificate or key
** is kept here beyond what the OpenSSL context itself holds.
*/
struct ws_vhost {
  struct ws_vhost *next;
  struct lws_vhost *vh;
  SSL_CTX *ssl_ctx;
  char name[32]; /* lws keeps the pointer, not a copy */
  uint8_t id[32];
};

/* The TLS setting of a connection: files or PEM bytes, any may be NULL. */
struct ws_tls {
  const char *ca_file, *ca_data, *cert_data, *key_data;
  size_t ca_len, cert_len, key_len;
};

struct ws_conn;

struct sbx_ws {
  struct sbx_host *host;
  struct lws_context *ctx;
  struct lws_vhost *default_vh; /* system CAs */
  struct ws_vhost *vhosts;      /* one per TLS setting */
  struct ws_conn *conns;        /* every connection not yet freed */
  int dying;                    /* sbx_ws_shutdown ran: start nothing */
  int vhost_seq;
};

/* The wait of connect: embeds the waiter, points at the connection. */
struct ws_op {
  struct sbx_waiter w;
  struct ws_conn *c;
};

struct ws_conn {
  struct sbx_ws *ws; /* NULL once the host's lws context is gone */
  struct ws_conn *prev, *next;
  struct lws *wsi; /* the current attempt's, NULL when none */
  int wsi_live;    /* wsi that may still call back */
  int in_connect;  /* inside lws_client_connect_via_info */
  int owned;       /* a userdata points here */
  int resolving;
  int aborted;
  uv_getaddrinfo_t gai;
  int state;
  int opened; /* reached ST_OPEN (it may be closed again) */
  /* where to */
  char *url, *host, *hosthdr, *path, *headers;
  char *protocols;   /* offered subprotocols, "a, b", or NULL */
  char protocol[64]; /* the one the server chose, or "" */
  size_t headers_len;
  int port, tls_flags;
  struct lws_vhost *vh;
  char addrs[MAX_ADDRS][ADDR_LEN];
  int naddrs, addr_i;
  double timeout, deadline;
  /* how far the current attempt got, and why it failed */
  int tcp_up, request_sent, http_status;
  const char *err_code;
  char err[256];
  struct ws_op *op;
  /* receiving */
  struct ws_queue rx;
  struct ws_msg *asm_msg; /* the message being reassembled */
  size_t asm_cap;
  int asm_binary;
  size_t max_message, max_queue, max_send;
  int rx_paused;
  struct sbx_waiter *reader;
  /* sending */
  struct ws_queue tx, pings;
  struct sbx_waiter *drainer; /* a sender waiting for tx to drain ... */
  size_t drain_limit;         /* ... to at most this many bytes */
  int close_wanted, out_code;
  char out_reason[124];
  size_t out_reason_len;
  /* the end */
  int close_code; /* 0: none yet */
  char close_reason[124];
  char end[256]; /* recv's message once closed */
  lua_Integer messages_in, messages_out, bytes_in, bytes_out, pongs;
};

struct ws_ud {
  struct ws_conn *c; /* NULL once closed (__close, __gc) */
};

/* ---------------------------------------------------------------- queues */

static void
q_push(struct ws_queue *q, struct ws_msg *m)
{
  m->next = NULL;
  if (q->tail)
    q->tail->next = m;
  else
    q->head = m;
  q->tail = m;
  q->bytes += m->len - m->off;
}

static struct ws_msg *
q_pop(struct ws_queue *q)
{
  struct ws_msg *m = q->head;
  if (m) {
    q->head = m->next;
    if (!q->head)
      q->tail = NULL;
    q->bytes -= m->len - m->off;
  }
  return m;
}

static void
q_clear(struct ws_queue *q)
{
  struct ws_msg *m;
  while ((m = q_pop(q)))
    free(m);
}

/* An outgoing message: LWS_PRE bytes of room in front, as lws_write wants. */
static struct ws_msg *
msg_new(const char *p, size_t n, int binary)
{
  struct ws_msg *m = malloc(sizeof *m + LWS_PRE + (n ? n : 1));
  if (!m)
    return NULL;
  m->next = NULL;
  m->len = n;
  m->off = 0;
  m->binary = binary;
  m->p = m->data + LWS_PRE;
  if (n)
    memcpy(m->p, p, n);
  return m;
}

/* ---------------------------------------------------------------- connection state */

static void
conn_check_free(struct ws_conn *c)
{
  if (c->owned || c->wsi_live > 0 || c->resolving)
    return;
  if (c->ws) {
    if (c->prev)
      c->prev->next = c->next;
    else
      c->ws->conns = c->next;
    if (c->next)
      c->next->prev = c->prev;
  }
  q_clear(&c->rx);
  q_clear(&c->tx);
  q_clear(&c->pings);
  free(c->asm_msg);
  free(c->url);
  free(c->host);
  free(c->hosthdr);
  free(c->path);
  free(c->headers);
  free(c->protocols);
  free(c);
}

static void
wake_op(struct ws_conn *c)
{
  if (c->op)
    sbx_wake(&c->op->w); /* its detach clears c->op */
}

static void
wake_reader(struct ws_conn *c)
{
  if (c->reader)
    sbx_wake(c->reader); /* its detach clears c->reader */
}

/* The sender in wait_drained goes on once enough was written, or at the
** end (nothing queued is written after it). */
static void
wake_drainer(struct ws_conn *c)
{
  if (c->drainer && (c->state == ST_CLOSED || c->tx.bytes <= c->drain_limit))
    sbx_wake(c->drainer); /* its detach clears c->drainer */
}

/* The connect attempt failed: remembers why (the first reason wins). */
static void
connect_failed(struct ws_conn *c, const char *code, const char *fmt, ...)
{
  va_list ap;
  if (c->state != ST_CONNECTING)
    return;
  if (!c->err_code) {
    c->err_code = code;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
  }
  c->state = ST_CLOSED;
  snprintf(c->end, sizeof c->end, "%s", c->err);
  wake_op(c);
}

/*
** lws reports a failed attempt with one string; how far the attempt got
** tells which kind of failure it was.
*/
static void
attempt_failed(struct ws_conn *c, const char *why, size_t len)
{
  while (len > 0 && (why[len - 1] == '\0' || why[len - 1] == '\n'))
    len--;
  if (c->http_status && c->http_status != 101)
    connect_failed(c, "handshake", "the server answered the websocket upgrade with HTTP %d", c->http_status);
  else if (c->http_status == 101)
    connect_failed(c, "handshake", "bad websocket upgrade answer: %.*s", (int)len, why);
  else if (c->request_sent)
    connect_failed(c, "closed", "no answer to the websocket upgrade: %.*s", (int)len, why);
  else if (c->tcp_up && (c->tls_flags & LCCSCF_USE_SSL))
    connect_failed(c, "tls", "TLS handshake with %s failed: %.*s", c->host, (int)len, why);
  else if (c->tcp_up)
    connect_failed(c, "closed", "%.*s", (int)len, why);
  else
    connect_failed(c, "ECONNREFUSED", "cannot connect to %s port %d", c->addrs[c->addr_i], c->port);
}

/* The connection is gone (lws closed it, or it never opened). */
static void
conn_closed(struct ws_conn *c)
{
  if (c->state == ST_CONNECTING) {
    static const char why[] = "closed before the upgrade";
    attempt_failed(c, why, sizeof why - 1);
    return;
  }
  if (c->state == ST_CLOSED)
    return;
  c->state = ST_CLOSED;
  if (!c->end[0])
    snprintf(c->end, sizeof c->end, "connection lost");
  q_clear(&c->tx);
  q_clear(&c->pings);
  wake_reader(c);
  wake_drainer(c);
}

/*
** Stops a connection that is not open: the lookup is cancelled, the wsi is
** killed on lws's next pass (the nudge makes that pass happen now).
*/
static void
conn_abort(struct ws_conn *c)
{
  c->aborted = 1;
  if (c->resolving)
    uv_cancel((uv_req_t *)&c->gai);
  connect_failed(c, "closed", "the connection attempt was abandoned");
  if (c->wsi && c->ws) {
    lws_set_timeout(c->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
    lws_cancel_service(c->ws->ctx);
  }
}

static void
set_end(struct ws_conn *c, const char *how, int code, const char *reason, size_t len)
{
  snprintf(c->end, sizeof c->end, "%s (%d%s%.*s)", how, code, len ? " " : "", (int)len, reason);
}

/*
** Starts the closing handshake: queued sends go out first (for at most
** CLOSE_FLUSH_SECS), then the close frame from the writable callback.
*/
static void
conn_close(struct ws_conn *c, int code, const char *reason, size_t len)
{
  if (c->state != ST_OPEN || !c->wsi)
    return;
  c->state = ST_CLOSING;
  c->close_wanted = 1;
  c->out_code = code;
  memcpy(c->out_reason, reason, len);
  c->out_reason_len = len;
  c->close_code = code;
  memcpy(c->close_reason, reason, len);
  c->close_reason[len] = '\0';
  set_end(c, "closed locally", code, reason, len);
  if (c->tx.head)
    lws_set_timeout(c->wsi, PENDING_TIMEOUT_USER_OK, CLOSE_FLUSH_SECS);
  lws_callback_on_writable(c->wsi);
}

/* ---------------------------------------------------------------- lws callbacks */

static int
too_large(struct ws_conn *c, struct lws *wsi)
{
  static const char reason[] = "message too big";
  free(c->asm_msg);
  c->asm_msg = NULL;
  c->asm_cap = 0;
  c->close_code = LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE;
  snprintf(c->close_reason, sizeof c->close_reason, "%s", reason);
  snprintf(c->end, sizeof c->end,
           "an incoming message is larger than max_message (%zu bytes): closed with 1009", c->max_message);
  c->state = ST_CLOSING;
  lws_close_reason(wsi, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE, (unsigned char *)reason, sizeof reason - 1);
  return -1; /* from the receive callback this sends the close frame */
}

/* A piece of a message: reassemble; a whole one goes to the queue. */
static int
rx_data(struct ws_conn *c, struct lws *wsi, const char *p, size_t n)
{
  struct ws_msg *m = c->asm_msg;
  size_t have, rest = lws_remaining_packet_payload(wsi);
  if (!c->owned)
    return 0; /* nobody will read it; the close handshake goes on */
  if (lws_is_first_fragment(wsi)) {
    if (m)
      m->len = 0;
    c->asm_binary = lws_frame_is_binary(wsi);
  }
  have = m ? m->len : 0;
  if (rest > c->max_message || have + n + rest > c->max_message)
    return too_large(c, wsi); /* often known from a frame header, before any copy */
  if (have + n + rest > c->asm_cap || !m) {
    /* Exact for a message in one frame; fragments double the room. */
    size_t cap = have + n + rest;
    if (m && cap < 2 * c->asm_cap)
      cap = 2 * c->asm_cap < c->max_message ? 2 * c->asm_cap : c->max_message;
    m = realloc(m, sizeof *m + (cap ? cap : 1));
    if (!m) {
      lws_close_reason(wsi, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, NULL, 0);
      snprintf(c->end, sizeof c->end, "out of memory reassembling a message");
      return -1;
    }
    if (!c->asm_msg)
      m->len = 0;
    m->p = m->data;
    c->asm_msg = m;
    c->asm_cap = cap;
  }
  if (n)
    memcpy(m->data + m->len, p, n);
  m->len += n;
  c->bytes_in += (lua_Integer)n;
  if (lws_is_final_fragment(wsi)) {
    c->asm_msg = NULL;
    c->asm_cap = 0;
    m->off = 0;
    m->binary = c->asm_binary;
    q_push(&c->rx, m);
    c->messages_in++;
    if (c->rx.bytes > c->max_queue && !c->rx_paused) {
      c->rx_paused = 1;
      lws_rx_flow_control(wsi, 0);
    }
    wake_reader(c);
  }
  return 0;
}

static void
peer_close(struct ws_conn *c, const unsigned char *p, size_t len)
{
  size_t rlen = len > 2 ? len - 2 : 0;
  if (rlen > sizeof c->close_reason - 1)
    rlen = sizeof c->close_reason - 1;
  c->close_code = len >= 2 ? (p[0] << 8) | p[1] : LWS_CLOSE_STATUS_NO_STATUS;
  memcpy(c->close_reason, p + 2, rlen);
  c->close_reason[rlen] = '\0';
  set_end(c, "closed by peer", c->close_code, c->close_reason, rlen);
  c->close_wanted = 0; /* lws answers the peer's close frame itself */
  if (c->state == ST_OPEN)
    c->state = ST_CLOSING;
}

/*
** One write per callback, as lws wants: a ping, else the first queued
** message as one frame, else (once all is written) the close frame. lws
** holds what the socket did not take and calls back only once it is out.
*/
static int
writable(struct ws_conn *c, struct lws *wsi)
{
  struct ws_msg *m;
  if ((m = c->pings.head)) {
    int rc;
    q_pop(&c->pings);
    rc = lws_write(wsi, (unsigned char *)m->p, m->len, LWS_WRITE_PING);
    free(m);
    if (rc < 0)
      return -1;
  }
  else if ((m = c->tx.head)) {
    /* The whole message as one frame (FIN set): never a continuation. */
    int flags = m->binary ? LWS_WRITE_BINARY : LWS_WRITE_TEXT;
    if (lws_write(wsi, (unsigned char *)m->p, m->len, (enum lws_write_protocol)flags) < 0)
      return -1;
    c->bytes_out += (lua_Integer)m->len;
    free(q_pop(&c->tx));
    c->messages_out++;
    wake_drainer(c);
  }
  else if (c->close_wanted) {
    /* lws 4.1 drops the close frame when this callback returns -1; a
    ** kill through the timeout path after lws_close_reason sends it. */
    c->close_wanted = 0;
    lws_close_reason(wsi, (enum lws_close_status)c->out_code, (unsigned char *)c->out_reason,
                     c->out_reason_len);
    if (c->rx_paused) {
      c->rx_paused = 0; /* the peer's close answer must get through */
      lws_rx_flow_control(wsi, 1);
    }
    lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC);
    return 0;
  }
  if (c->pings.head || c->tx.head || c->close_wanted)
    lws_callback_on_writable(wsi);
  return 0;
}

/*
** lws's connection error text; for a certificate OpenSSL refused, lws says
** only "SSL err 1", so the verify result is asked for instead.
*/
static void
conn_error(struct ws_conn *c, struct lws *wsi, const char *in, size_t len)
{
  char detail[200];
  SSL *ssl = (c->tls_flags & LCCSCF_USE_SSL) ? lws_get_ssl(wsi) : NULL;
  long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
  if (v != X509_V_OK) {
    snprintf(detail, sizeof detail, "certificate verify failed (%s)", X509_verify_cert_error_string(v));
    attempt_failed(c, detail, strlen(detail));
  }
  else if (in)
    attempt_failed(c, in, len ? len : strlen(in));
  else
    attempt_failed(c, "", 0);
}

static int
ws_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
  struct ws_conn *c;
  switch (reason) {
  case LWS_CALLBACK_WSI_CREATE:
  case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER:
  case LWS_CALLBACK_ESTABLISHED_CLIENT_HTTP:
  case LWS_CALLBACK_CLIENT_FILTER_PRE_ESTABLISH:
  case LWS_CALLBACK_CLIENT_ESTABLISHED:
  case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
  case LWS_CALLBACK_CLIENT_RECEIVE:
  case LWS_CALLBACK_CLIENT_RECEIVE_PONG:
  case LWS_CALLBACK_CLIENT_WRITEABLE:
  case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
  case LWS_CALLBACK_CLIENT_CLOSED:
  case LWS_CALLBACK_WSI_DESTROY:
    break;
  default:
    return lws_callback_http_dummy(wsi, reason, user, in, len);
  }
  c = wsi ? lws_get_opaque_user_data(wsi) : NULL;
  if (!c)
    return 0;
  if (reason == LWS_CALLBACK_WSI_DESTROY) {
    c->wsi_live--;
    if (wsi == c->wsi) {
      c->wsi = NULL;
      conn_closed(c);
    }
    conn_check_free(c);
    return 0;
  }
  if (!c->wsi && c->in_connect)
    c->wsi = wsi; /* calling back before lws_client_connect_via_info returned */
  if (wsi != c->wsi)
    return 0; /* an earlier attempt on its way out */

  switch (reason) {
  case LWS_CALLBACK_WSI_CREATE:
    c->tcp_up = 1;
    break;
  case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER:
    c->request_sent = 1;
    if (c->headers_len) {
      char **p = in;
      if (len < c->headers_len + 1) {
        connect_failed(c, "handshake", "the extra headers (%zu bytes) do not fit the request",
                       c->headers_len);
        return -1;
      }
      memcpy(*p, c->headers, c->headers_len);
      *p += c->headers_len;
    }
    break;
  case LWS_CALLBACK_ESTABLISHED_CLIENT_HTTP:
    c->http_status = (int)lws_http_client_http_response(wsi);
    break;
  case LWS_CALLBACK_CLIENT_FILTER_PRE_ESTABLISH:
    /* lws has checked that the choice is one we offered; keep it. */
    if (lws_hdr_copy(wsi, c->protocol, sizeof c->protocol, WSI_TOKEN_PROTOCOL) < 0)
      c->protocol[0] = '\0';
    break;
  case LWS_CALLBACK_CLIENT_ESTABLISHED:
    if (c->state != ST_CONNECTING || !c->owned)
      return -1;
    c->state = ST_OPEN;
    c->opened = 1;
    wake_op(c);
    break;
  case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
    conn_error(c, wsi, in, len);
    c->wsi = NULL; /* only its WSI_DESTROY matters now */
    break;
  case LWS_CALLBACK_CLIENT_RECEIVE:
    return rx_data(c, wsi, in, len);
  case LWS_CALLBACK_CLIENT_RECEIVE_PONG:
    c->pongs++;
    break;
  case LWS_CALLBACK_CLIENT_WRITEABLE:
    /* After the peer's close or a refused message lws answers alone. */
    if (c->state == ST_OPEN || (c->state == ST_CLOSING && c->close_wanted))
      return writable(c, wsi);
    break;
  case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
    peer_close(c, in, len);
    break;
  case LWS_CALLBACK_CLIENT_CLOSED:
    conn_closed(c);
    break;
  default:
    break;
  }
  return 0;
}

static const struct lws_protocols ws_protocols[] = { { WS_PROTOCOL, ws_callback, 0, RX_CHUNK, 0, NULL, 0 },
                                                     { NULL, NULL, 0, 0, 0, NULL, 0 } };

/* ---------------------------------------------------------------- the lws context */

/* lws logs only through this; SBX_WS_LOG=1 shows it (debugging TLS, say). */
static void
ws_log(int level, const char *line)
{
  (void)level;
  (void)line;
}

struct handle_set {
  uv_handle_t **v;
  size_t n, cap;
  int failed;
};

static void
collect_handle(uv_handle_t *hd, void *arg)
{
  struct handle_set *s = arg;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    uv_handle_t **v = realloc(s->v, cap * sizeof *v);
    if (!v) {
      s->failed = 1;
      return;
    }
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = hd;
}

static void
unref_new_handle(uv_handle_t *hd, void *arg)
{
  struct handle_set *s = arg;
  size_t i;
  for (i = 0; i < s->n; i++)
    if (s->v[i] == hd)
      return;
  uv_unref(hd);
}

/*
** The host's context, made on first use. lws's own handles (its timer, idle
** and wake-up pipe) are unreferenced: they are housekeeping, and a loop kept
** alive by them alone would hide a deadlock from sbx_drive. Connections'
** handles come later and stay referenced.
*/
/* The key of this module's state on the host (sbx_host_slot). */
static const char WS_KEY = 'w';
static void ws_shutdown(struct sbx_host *h);
static void ws_free(struct sbx_host *h);

static struct sbx_ws *
ws_get(struct sbx_host *h)
{
  struct lws_context_creation_info info;
  struct handle_set before = { NULL, 0, 0, 0 };
  void *loops[1];
  struct sbx_ws *ws;
  struct sigaction pipe_before;
  const char *log = getenv("SBX_WS_LOG");
  struct sbx_ws **slot = (struct sbx_ws **)sbx_host_slot(h, &WS_KEY);
  if (*slot)
    return *slot;
  ws = calloc(1, sizeof *ws);
  if (!ws)
    return NULL;
  ws->host = h;
  if (log && *log && strcmp(log, "0") != 0)
    lws_set_log_level(LLL_ERR | LLL_WARN | LLL_NOTICE | LLL_INFO, lwsl_emit_stderr);
  else
    lws_set_log_level(LLL_ERR, ws_log);
  memset(&info, 0, sizeof info);
  loops[0] = &h->loop;
  info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
  info.port = CONTEXT_PORT_NO_LISTEN;
  info.protocols = ws_protocols;
  info.foreign_loops = loops;
  info.pcontext = &ws->ctx;
  info.timeout_secs = LWS_OWN_TIMEOUT;
  info.connect_timeout_secs = LWS_OWN_TIMEOUT;
  info.pt_serv_buf_size = SERV_BUF;
  uv_walk(&h->loop, collect_handle, &before);
  /* lws sets SIGPIPE to SIG_IGN process-wide so a peer that goes away
  ** cannot kill it. A handler the program installed (the sbx command's)
  ** protects lws as well and, unlike SIG_IGN, is not inherited by the
  ** commands it starts: put it back. */
  sigaction(SIGPIPE, NULL, &pipe_before);
  ws->ctx = lws_create_context(&info);
  if (pipe_before.sa_handler != SIG_DFL && pipe_before.sa_handler != SIG_IGN)
    sigaction(SIGPIPE, &pipe_before, NULL);
  if (ws->ctx && !before.failed)
    uv_walk(&h->loop, unref_new_handle, &before);
  free(before.v);
  if (!ws->ctx) {
    free(ws);
    return NULL;
  }
  ws->default_vh = lws_get_vhost_by_name(ws->ctx, "default");
  *slot = ws;
  /* lws goes last, in two halves: before the final uv_run and after it. */
  sbx_host_on_close(h, SBX_CLOSE_DRAIN, ws_shutdown);
  sbx_host_on_close(h, SBX_CLOSE_FREE, ws_free);
  return ws;
}

static void
tls_id(const struct ws_tls *t, uint8_t out[32])
{
  struct sbx_sha256 h;
  static const char sep[1] = { 0 };
  sbx_sha256_init(&h);
  sbx_sha256_update(&h, t->ca_file ? "f" : "-", 1);
  if (t->ca_file)
    sbx_sha256_update(&h, t->ca_file, strlen(t->ca_file) + 1);
  sbx_sha256_update(&h, t->ca_data ? "c" : "-", 1);
  sbx_sha256_update(&h, t->ca_data ? t->ca_data : sep, t->ca_data ? t->ca_len : 1);
  sbx_sha256_update(&h, t->cert_data ? "x" : "-", 1);
  sbx_sha256_update(&h, t->cert_data ? t->cert_data : sep, t->cert_data ? t->cert_len : 1);
  sbx_sha256_update(&h, t->key_data ? "k" : "-", 1);
  sbx_sha256_update(&h, t->key_data ? t->key_data : sep, t->key_data ? t->key_len : 1);
  sbx_sha256_final(&h, out);
}

/*
** A client OpenSSL context for t: the CAs of ca_file or ca_data (else the
** system's), and the certificate chain and key of cert_data and key_data.
** NULL with *why set when one of them does not load; why names the part,
** never its contents.
*/
static SSL_CTX *
tls_ctx(const struct ws_tls *t, const char **why)
{
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  BIO *bio = NULL;
  X509 *x = NULL;
  EVP_PKEY *key = NULL;
  if (!ctx) {
    *why = "cannot make a TLS context";
    return NULL;
  }
  if (t->ca_file) {
    if (SSL_CTX_load_verify_locations(ctx, t->ca_file, NULL) != 1) {
      *why = "cannot load the CA file";
      goto fail;
    }
  }
  else if (t->ca_data) {
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    int n = 0;
    bio = BIO_new_mem_buf(t->ca_data, (int)t->ca_len);
    while (bio && (x = PEM_read_bio_X509(bio, NULL, NULL, NULL))) {
      if (X509_STORE_add_cert(store, x) == 1)
        n++;
      X509_free(x);
    }
    x = NULL;
    BIO_free(bio);
    bio = NULL;
    ERR_clear_error(); /* the end of the PEM data reads as an error */
    if (n == 0) {
      *why = "no CA certificate in ca_data";
      goto fail;
    }
  }
  else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    *why = "cannot load the system's CA certificates";
    goto fail;
  }
  if (t->cert_data) {
    bio = BIO_new_mem_buf(t->cert_data, (int)t->cert_len);
    x = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    if (!x || SSL_CTX_use_certificate(ctx, x) != 1) {
      *why = "cannot load the client certificate";
      goto fail;
    }
    X509_free(x);
    while ((x = PEM_read_bio_X509(bio, NULL, NULL, NULL)))
      if (SSL_CTX_add0_chain_cert(ctx, x) != 1) {
        *why = "cannot load the client certificate's chain";
        goto fail;
      }
    ERR_clear_error();
    BIO_free(bio);
    bio = NULL;
  }
  if (t->key_data) {
    bio = BIO_new_mem_buf(t->key_data, (int)t->key_len);
    key = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    if (!key || SSL_CTX_use_PrivateKey(ctx, key) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
      *why = "cannot load the client key (or it does not match the certificate)";
      goto fail;
    }
    EVP_PKEY_free(key);
    BIO_free(bio);
  }
  return ctx;
fail:
  X509_free(x);
  EVP_PKEY_free(key);
  BIO_free(bio);
  SSL_CTX_free(ctx);
  ERR_clear_error();
  return NULL;
}

/* The vhost for TLS setting t, made once per setting; NULL, *why. */
static struct lws_vhost *
vhost_for(struct sbx_ws *ws, const struct ws_tls *t, const char **why)
{
  struct lws_context_creation_info info;
  struct ws_vhost *v;
  uint8_t id[32];
  tls_id(t, id);
  for (v = ws->vhosts; v; v = v->next)
    if (memcmp(v->id, id, sizeof id) == 0)
      return v->vh;
  v = calloc(1, sizeof *v);
  if (!v) {
    *why = "out of memory";
    return NULL;
  }
  memcpy(v->id, id, sizeof id);
  v->ssl_ctx = tls_ctx(t, why);
  if (!v->ssl_ctx) {
    free(v);
    return NULL;
  }
  snprintf(v->name, sizeof v->name, "sbx-tls-%d", ++ws->vhost_seq);
  memset(&info, 0, sizeof info);
  info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT | LWS_SERVER_OPTION_DISABLE_OS_CA_CERTS;
  info.port = CONTEXT_PORT_NO_LISTEN;
  info.protocols = ws_protocols;
  info.vhost_name = v->name;
  info.provided_client_ssl_ctx = v->ssl_ctx;
  info.connect_timeout_secs = LWS_OWN_TIMEOUT;
  v->vh = lws_create_vhost(ws->ctx, &info);
  if (!v->vh) {
    SSL_CTX_free(v->ssl_ctx);
    free(v);
    *why = "libwebsockets cannot make a TLS vhost";
    return NULL;
  }
  v->next = ws->vhosts;
  ws->vhosts = v;
  return v->vh;
}

/* Teardown, first half: lws closes everything while the loop still runs. */
static void
ws_shutdown(struct sbx_host *h)
{
  struct sbx_ws *ws = *(struct sbx_ws **)sbx_host_slot(h, &WS_KEY);
  struct ws_conn *c;
  if (!ws || ws->dying)
    return;
  ws->dying = 1;
  for (c = ws->conns; c; c = c->next)
    if (c->resolving)
      uv_cancel((uv_req_t *)&c->gai);
  lws_context_destroy(ws->ctx);
}

/*
** Teardown, second half, after the loop has run dry: only this second
** destroy frees the context. Connections a userdata still holds outlive it,
** closed and detached.
*/
static void
ws_free(struct sbx_host *h)
{
  struct sbx_ws **slot = (struct sbx_ws **)sbx_host_slot(h, &WS_KEY);
  struct sbx_ws *ws = *slot;
  struct ws_conn *c, *next;
  struct ws_vhost *v, *vnext;
  if (!ws)
    return;
  lws_context_destroy(ws->ctx);
  for (c = ws->conns; c; c = next) {
    next = c->next;
    c->ws = NULL;
    c->prev = c->next = NULL;
    c->wsi = NULL;
    c->wsi_live = 0; /* no wsi outlives the context */
    if (c->op) {
      c->op->c = NULL;
      c->op = NULL;
    }
    if (c->reader) {
      c->reader->source = NULL;
      c->reader = NULL;
    }
    if (c->drainer) {
      c->drainer->source = NULL;
      c->drainer = NULL;
    }
    if (c->state != ST_CLOSED) {
      c->state = ST_CLOSED;
      snprintf(c->end, sizeof c->end, "the host shut down");
    }
    conn_check_free(c);
  }
  for (v = ws->vhosts; v; v = vnext) {
    vnext = v->next;
    SSL_CTX_free(v->ssl_ctx); /* lws never frees a context it was given */
    free(v);
  }
  free(ws);
  *slot = NULL;
}

/* ---------------------------------------------------------------- connecting */

/*
** One attempt at c->addrs[c->addr_i]. Outside lws callbacks only (a uv
** callback or Lua), never from inside lws's service.
*/
static void
attempt_start(struct ws_conn *c)
{
  struct lws_client_connect_info i;
  struct lws *wsi;
  memset(&i, 0, sizeof i);
  i.context = c->ws->ctx;
  i.vhost = c->vh;
  i.address = c->addrs[c->addr_i];
  i.port = c->port;
  i.path = c->path;
  i.host = c->hosthdr;
  i.ssl_connection = c->tls_flags;
  i.protocol = c->protocols;
  i.local_protocol_name = WS_PROTOCOL;
  i.opaque_user_data = c;
  c->state = ST_CONNECTING;
  c->tcp_up = c->request_sent = c->http_status = 0;
  c->protocol[0] = '\0';
  c->err_code = NULL;
  c->err[0] = c->end[0] = '\0';
  c->wsi = NULL;
  c->wsi_live++;
  c->in_connect = 1;
  wsi = lws_client_connect_via_info(&i);
  c->in_connect = 0;
  if (wsi) {
    c->wsi = wsi;
    return;
  }
  /*
  ** lws gave up inside the call, where it reports nothing. If the wsi got
  ** as far as the loop, its WSI_DESTROY still comes and drops the count;
  ** otherwise the count stays until the context goes, which only delays
  ** freeing this struct.
  */
  c->wsi = NULL;
  {
    static const char why[] = "lws could not start the connection";
    attempt_failed(c, why, sizeof why - 1);
  }
}

static void
gai_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
  struct ws_conn *c = req->data;
  struct addrinfo *ai;
  c->resolving = 0;
  if (status != 0)
    connect_failed(c, "ENOTFOUND", "cannot resolve %s: %s", c->host, uv_strerror(status));
  else if (c->state == ST_CONNECTING && !c->aborted && c->ws && !c->ws->dying) {
    for (ai = res; ai && c->naddrs < MAX_ADDRS; ai = ai->ai_next) {
      char *a = c->addrs[c->naddrs];
      if (ai->ai_family == AF_INET && uv_ip4_name((struct sockaddr_in *)ai->ai_addr, a, ADDR_LEN) == 0)
        c->naddrs++;
      else if (ai->ai_family == AF_INET6 && uv_ip6_name((struct sockaddr_in6 *)ai->ai_addr, a, ADDR_LEN) == 0)
        c->naddrs++;
    }
    if (c->naddrs == 0)
      connect_failed(c, "ENOTFOUND", "no address for %s", c->host);
    else
      attempt_start(c);
  }
  uv_freeaddrinfo(res);
  conn_check_free(c);
}

static void
op_detach(struct sbx_waiter *w)
{
  struct ws_op *op = (struct ws_op *)w;
  if (op->c && op->c->op == op)
    op->c->op = NULL;
  op->c = NULL;
}

/* The connecting coroutine was cancelled or collected: stop the attempt. */
static void
op_cancel(struct sbx_waiter *w)
{
  struct ws_op *op = (struct ws_op *)w;
  if (op->c)
    conn_abort(op->c);
}

static struct ws_op *
op_new(lua_State *L, struct ws_conn *c, double seconds)
{
  struct ws_op *op = (struct ws_op *)sbx_op_new(L, sizeof *op, op_cancel);
  op->c = c;
  op->w.detach = op_detach;
  c->op = op;
  sbx_waiter_deadline(&op->w, seconds);
  return op;
}

/*
** Lets go of the connection: a connect in progress is abandoned, an open
** connection starts its closing handshake, unread messages are freed now.
** Never blocks; the rest goes when lws is done with the connection.
*/
static void
ws_release(struct ws_ud *ud)
{
  struct ws_conn *c = ud->c;
  if (!c)
    return;
  ud->c = NULL;
  c->owned = 0;
  if (c->op) {
    c->op->c = NULL;
    c->op = NULL;
  }
  wake_reader(c);
  if (c->drainer)
    sbx_wake(c->drainer); /* its userdata let go: the wait ends */
  q_clear(&c->rx);
  free(c->asm_msg);
  c->asm_msg = NULL;
  c->asm_cap = 0;
  if (c->state == ST_CONNECTING)
    conn_abort(c);
  else if (c->state == ST_OPEN)
    conn_close(c, LWS_CLOSE_STATUS_NORMAL, "", 0);
  conn_check_free(c);
}

static int connect_k(lua_State *L, int status, lua_KContext ctx);

/*
** The next address, if the last one refused the connection and time is
** left: [opts, ud, ...] -> yields again. Returns -1 when there is none.
*/
static int
connect_next(lua_State *L, struct ws_conn *c)
{
  double left = c->deadline - sbx_now();
  struct ws_op *op;
  if (c->err_code == NULL || strcmp(c->err_code, "ECONNREFUSED") != 0 || c->addr_i + 1 >= c->naddrs ||
      left <= 0 || c->aborted || !c->ws || c->ws->dying)
    return -1;
  c->addr_i++;
  op = op_new(L, c, left);
  attempt_start(c);
  return sbx_await(L, &op->w, connect_k, 0);
}

/* Resumes connect: [opts, ud, ..., op]. */
static int
connect_k(lua_State *L, int status, lua_KContext ctx)
{
  struct ws_op *op = lua_touserdata(L, -1);
  struct ws_ud *ud = luaL_checkudata(L, 2, WS_MT);
  struct ws_conn *c = ud->c;
  int n;
  (void)status;
  (void)ctx;
  if (op->w.cancelled) {
    ws_release(ud);
    return sbx_raise_cancelled(L);
  }
  if (!c)
    return sbx_pushfail(L, "closed", "the websocket was closed");
  if (c->opened) {
    /* Open, or already closed by the peer: recv tells that, after any
    ** messages that came first. */
    lua_settop(L, 2);
    return 1;
  }
  if (op->w.timed_out)
    n = sbx_pushfail(L, "timeout", "no websocket connection to %s within %f s", c->url, c->timeout);
  else if ((n = connect_next(L, c)) >= 0)
    return n;
  else
    n = sbx_pushfail(L, c->err_code ? c->err_code : "closed", "%s",
                     c->err[0] ? c->err : "the connection failed");
  ws_release(ud);
  return n;
}

static char *
dup_n(lua_State *L, const char *s, size_t n)
{
  char *p = malloc(n + 1);
  if (!p)
    luaL_error(L, "out of memory");
  else {
    memcpy(p, s, n);
    p[n] = '\0';
  }
  return p;
}

struct parsed_url {
  int tls, port;
  const char *host, *path;
  size_t host_len, path_len;
  int bracketed;
};

/* ws://host[:port][/path][?query] or wss://...; raises on anything else. */
static void
parse_url(lua_State *L, const char *url, struct parsed_url *u)
{
  const char *p, *end;
  memset(u, 0, sizeof *u);
  if (strncmp(url, "ws://", 5) == 0)
    p = url + 5;
  else if (strncmp(url, "wss://", 6) == 0) {
    u->tls = 1;
    p = url + 6;
  }
  else {
    luaL_error(L, "bad url '%s' (ws:// or wss:// expected)", url);
    return;
  }
  u->port = u->tls ? 443 : 80;
  end = p + strcspn(p, "/?#");
  if (*p == '[') {
    const char *close = memchr(p, ']', (size_t)(end - p));
    if (!close)
      luaL_error(L, "bad url '%s' (unclosed [)", url);
    u->host = p + 1;
    u->host_len = (size_t)(close - p - 1);
    u->bracketed = 1;
    p = close + 1;
  }
  else {
    const char *colon = memchr(p, ':', (size_t)(end - p));
    u->host = p;
    u->host_len = (size_t)((colon ? colon : end) - p);
    p = colon ? colon : end;
  }
  if (p < end) {
    char *stop;
    long port;
    if (*p != ':')
      luaL_error(L, "bad url '%s' (junk after the host)", url);
    port = strtol(p + 1, &stop, 10);
    if (stop != end || stop == p + 1 || port < 1 || port > 65535)
      luaL_error(L, "bad url '%s' (bad port)", url);
    u->port = (int)port;
  }
  if (u->host_len == 0 || memchr(u->host, '@', u->host_len))
    luaL_error(L, "bad url '%s' (bad host)", url);
  u->path = end;
  u->path_len = strcspn(end, "#");
  if (u->path_len && memchr(u->path, ' ', u->path_len))
    luaL_error(L, "bad url '%s' (spaces in the path)", url);
}

/*
** protocols = { "a", "b" } -> "a, b" pushed on the stack ("" when absent).
** Names are tokens (RFC 6455 4.1): no separators, no spaces.
*/
static void
push_protocols(lua_State *L, int opts)
{
  lua_Integer i, n;
  int list, parts = 0;
  lua_getfield(L, opts, "protocols");
  luaL_argcheck(L, lua_isnil(L, -1) || lua_istable(L, -1), 1, "protocols must be a list of names");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_pushliteral(L, "");
    return;
  }
  list = lua_gettop(L);
  n = luaL_len(L, list);
  luaL_checkstack(L, (int)(2 * n + 2), "too many protocols");
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *p;
    lua_geti(L, list, i); /* [list, ..., name] */
    p = lua_tolstring(L, -1, &len);
    if (!p || len == 0 || len > 60 || strcspn(p, "()<>@,;:\\\"/[]?={} \t\r\n") != len)
      luaL_error(L, "protocols: bad name #%d", (int)i);
    if (i > 1) {
      lua_pushliteral(L, ", ");
      lua_insert(L, -2);
      parts++;
    }
    parts++;
  }
  lua_concat(L, parts); /* [list, "a, b"] */
  lua_remove(L, list);
}

/*
** headers = { Name = "value", ... } -> "Name: value\r\n..." pushed on the
** stack. The string grows by concatenation: a handful of headers at most.
*/
static void
push_headers(lua_State *L, int opts)
{
  lua_getfield(L, opts, "headers");
  luaL_argcheck(L, lua_isnil(L, -1) || lua_istable(L, -1), 1, "headers must be a table");
  lua_pushliteral(L, ""); /* [hdrs, acc] */
  if (lua_isnil(L, -2)) {
    lua_remove(L, -2);
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, -3)) { /* [hdrs, acc, k, v] */
    size_t kn, vn;
    const char *k, *v;
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "headers: names and values must be strings");
    k = lua_tolstring(L, -2, &kn);
    v = lua_tolstring(L, -1, &vn);
    if (kn == 0 || strcspn(k, ":\r\n \t") != kn || strcspn(v, "\r\n") != vn)
      luaL_error(L, "headers: bad header '%s'", k);
    lua_pushvalue(L, -3);
    lua_pushfstring(L, "%s: %s\r\n", k, v);
    lua_concat(L, 2); /* [hdrs, acc, k, v, acc'] */
    lua_replace(L, -4);
    lua_pop(L, 1); /* [hdrs, acc', k] */
  }
  lua_remove(L, -2); /* [acc] */
}

static double
opt_number(lua_State *L, int opts, const char *name, double def)
{
  double v = def;
  lua_getfield(L, opts, name);
  if (!lua_isnil(L, -1)) {
    if (!lua_isnumber(L, -1))
      luaL_error(L, "bad option '%s' (number expected, got %s)", name, luaL_typename(L, -1));
    v = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

/*
** core.ws.connect{ url=, headers=, timeout=, max_message=, max_queue=, max_send=,
**   ca_file=, ca_data=, cert_data=, key_data= (PEM), insecure=,
**   protocols= { "name", ... } } -> ws | nil, message, code. The server's
**   choice among protocols is ws:info().protocol. Yields until the
** connection is open or failed (codes ECONNREFUSED, ENOTFOUND, timeout,
** handshake, tls, closed). Raises on bad arguments.
*/
static int
ws_connect(lua_State *L)
{
  struct sbx_host *h = sbx_host_get(L);
  struct parsed_url u;
  struct sbx_ws *ws;
  struct lws_vhost *vh;
  struct ws_ud *ud;
  struct ws_conn *c;
  struct ws_op *op;
  struct addrinfo hints;
  const char *url, *headers, *protos, *why = NULL;
  struct ws_tls tls;
  size_t headers_len, protos_len;
  double timeout, max_message, max_queue, max_send;
  int insecure, rc;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_getfield(L, 1, "url");
  luaL_argcheck(L, lua_type(L, -1) == LUA_TSTRING, 1, "url string expected");
  url = lua_tostring(L, -1); /* [opts, url] */
  parse_url(L, url, &u);
  timeout = opt_number(L, 1, "timeout", 30);
  luaL_argcheck(L, timeout > 0, 1, "timeout must be positive");
  max_message = opt_number(L, 1, "max_message", 16 << 20);
  luaL_argcheck(L, max_message >= 1 && max_message < 1e15, 1, "max_message must be positive");
  max_queue = opt_number(L, 1, "max_queue", 4 << 20);
  luaL_argcheck(L, max_queue >= 1 && max_queue < 1e15, 1, "max_queue must be positive");
  max_send = opt_number(L, 1, "max_send", 16 << 20);
  luaL_argcheck(L, max_send >= 1 && max_send < 1e15, 1, "max_send must be positive");
  memset(&tls, 0, sizeof tls);
  lua_getfield(L, 1, "ca_file");
  tls.ca_file = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "ca_data");
  tls.ca_data = luaL_optlstring(L, -1, NULL, &tls.ca_len);
  lua_getfield(L, 1, "cert_data");
  tls.cert_data = luaL_optlstring(L, -1, NULL, &tls.cert_len);
  lua_getfield(L, 1, "key_data");
  tls.key_data = luaL_optlstring(L, -1, NULL, &tls.key_len);
  luaL_argcheck(L, !tls.cert_data == !tls.key_data, 1, "cert_data and key_data go together");
  lua_getfield(L, 1, "insecure");
  insecure = lua_toboolean(L, -1);
  lua_pop(L, 1);        /* [opts, url, ca, cad, cert, key] */
  push_protocols(L, 1); /* [..., protos] */
  push_headers(L, 1);   /* [..., protos, hdrs] */
  headers = lua_tolstring(L, -1, &headers_len);
  protos = lua_tolstring(L, -2, &protos_len); /* both stay on the stack */

  if (tls.ca_file) {
    FILE *f = fopen(tls.ca_file, "r");
    if (!f)
      return sbx_pushfail(L, "tls", "cannot read ca_file %s", tls.ca_file);
    fclose(f);
  }
  ws = ws_get(h);
  if (!ws)
    return sbx_pushfail(L, "closed",
                        "cannot start libwebsockets on the loop "
                        "(is libwebsockets-evlib-uv installed?)");
  if (ws->dying)
    return sbx_pushfail(L, "closed", "the host is shutting down");
  if (tls.ca_file || tls.ca_data || tls.cert_data)
    vh = vhost_for(ws, &tls, &why);
  else
    vh = ws->default_vh;
  if (!vh)
    return sbx_pushfail(L, "tls", "cannot set up TLS: %s", why ? why : "no vhost");

  /* Made closed first: from here on the userdata owns the connection. */
  ud = lua_newuserdatauv(L, sizeof *ud, 0); /* [..., ud] */
  ud->c = NULL;
  luaL_setmetatable(L, WS_MT);
  lua_replace(L, 2); /* [opts, ud, ..., protos, hdrs] */
  c = calloc(1, sizeof *c);
  if (!c)
    return luaL_error(L, "out of memory");
  c->ws = ws;
  c->next = ws->conns;
  if (c->next)
    c->next->prev = c;
  ws->conns = c;
  c->owned = 1;
  ud->c = c;
  c->state = ST_CONNECTING;
  c->port = u.port;
  c->vh = vh;
  c->timeout = timeout;
  c->deadline = sbx_now() + timeout;
  c->max_message = (size_t)max_message;
  c->max_queue = (size_t)max_queue;
  c->max_send = (size_t)max_send;
  c->tls_flags = LCCSCF_HTTP_NO_FOLLOW_REDIRECT;
  if (u.tls)
    c->tls_flags |= LCCSCF_USE_SSL;
  if (u.tls && insecure)
    c->tls_flags |= LCCSCF_ALLOW_SELFSIGNED | LCCSCF_SKIP_SERVER_CERT_HOSTNAME_CHECK | LCCSCF_ALLOW_EXPIRED |
                    LCCSCF_ALLOW_INSECURE;
  c->url = dup_n(L, url, strlen(url));
  c->host = dup_n(L, u.host, u.host_len);
  /* "ws://h?q" has an empty path; the request line needs "/?q". */
  if (u.path_len && u.path[0] == '/')
    lua_pushlstring(L, u.path, u.path_len);
  else
    lua_pushfstring(L, "/%s", lua_pushlstring(L, u.path, u.path_len));
  c->path = dup_n(L, lua_tostring(L, -1), lua_rawlen(L, -1));
  if (headers_len)
    c->headers = dup_n(L, headers, headers_len);
  c->headers_len = headers_len;
  if (protos_len)
    c->protocols = dup_n(L, protos, protos_len);
  {
    /* Host carries the port when it is not the scheme's default. */
    const char *fmt = u.bracketed ? (u.port == (u.tls ? 443 : 80) ? "[%s]" : "[%s]:%d")
                                  : (u.port == (u.tls ? 443 : 80) ? "%s" : "%s:%d");
    lua_pushfstring(L, fmt, c->host, u.port);
    c->hosthdr = dup_n(L, lua_tostring(L, -1), lua_rawlen(L, -1));
    lua_pop(L, 1);
  }
  lua_settop(L, 2); /* [opts, ud] */

  op = op_new(L, c, timeout); /* [opts, ud, op] */
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  c->gai.data = c;
  rc = uv_getaddrinfo(&h->loop, &c->gai, gai_cb, c->host, NULL, &hints);
  if (rc != 0)
    connect_failed(c, "ENOTFOUND", "cannot resolve %s: %s", c->host, uv_strerror(rc));
  else
    c->resolving = 1;
  return sbx_await(L, &op->w, connect_k, 0);
}

/* ---------------------------------------------------------------- methods */

static struct ws_conn *
check_ws(lua_State *L)
{
  struct ws_ud *ud = luaL_checkudata(L, 1, WS_MT);
  if (!ud->c)
    luaL_error(L, "attempt to use a closed websocket");
  return ud->c;
}

static int
push_closed(lua_State *L, struct ws_conn *c)
{
  return sbx_pushfail(L, "closed", "%s", c->end[0] ? c->end : "the websocket is closing");
}

/*
** ws:send(data [, "binary"|"text"]) -> true | nil, message, "closed". The
** message goes out as one frame; one longer than max_send raises (the
** caller splits its data).
*/
static int
ws_send(lua_State *L)
{
  static const char *const types[] = { "text", "binary", NULL };
  struct ws_conn *c = check_ws(L);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  int binary = luaL_checkoption(L, 3, "binary", types);
  struct ws_msg *m;
  if (n > c->max_send)
    return luaL_error(L,
                      "a websocket message of %I bytes is longer than max_send (%I): "
                      "it would need fragments; split it",
                      (lua_Integer)n, (lua_Integer)c->max_send);
  if (c->state != ST_OPEN)
    return push_closed(L, c);
  m = msg_new(p, n, binary);
  if (!m)
    return luaL_error(L, "out of memory");
  q_push(&c->tx, m);
  lws_callback_on_writable(c->wsi);
  lua_pushboolean(L, 1);
  return 1;
}

/* ws:buffered() -> bytes queued by send and not yet written */
static int
ws_buffered(lua_State *L)
{
  struct ws_conn *c = check_ws(L);
  lua_pushinteger(L, (lua_Integer)c->tx.bytes);
  return 1;
}

static int
drained_k(lua_State *L, int status, lua_KContext ctx)
{
  struct ws_ud *ud = luaL_checkudata(L, 1, WS_MT);
  (void)status;
  (void)ctx;
  sbx_read_resumed(L);
  if (!ud->c || ud->c->state == ST_CLOSED)
    return sbx_pushfail(L, "closed", "the websocket was closed");
  if (ud->c->tx.bytes <= ud->c->drain_limit) {
    lua_pushboolean(L, 1);
    return 1;
  }
  return sbx_pushfail(L, "timeout", "timeout");
}

/*
** ws:wait_drained(limit[, timeout]) -> true | nil, "timeout", "timeout" |
** nil, message, "closed": waits until at most limit bytes that send queued
** are still unwritten. A sender's back-pressure without polling (stdin of a
** Kubernetes exec). One sender waits at a time. May yield.
*/
static int
ws_wait_drained(lua_State *L)
{
  struct ws_conn *c = check_ws(L);
  lua_Integer limit = luaL_checkinteger(L, 2);
  double timeout = luaL_optnumber(L, 3, -1);
  luaL_argcheck(L, limit >= 0, 2, "limit must be at least 0");
  luaL_argcheck(L, lua_isnoneornil(L, 3) || timeout >= 0, 3, "negative timeout");
  lua_settop(L, 1);
  if (c->state == ST_CLOSED)
    return sbx_pushfail(L, "closed", "the websocket was closed");
  if (c->tx.bytes <= (size_t)limit) {
    lua_pushboolean(L, 1);
    return 1;
  }
  c->drain_limit = (size_t)limit;
  return sbx_await_read(L, &c->drainer, timeout, drained_k,
                        "another coroutine is already waiting in wait_drained on this websocket");
}

/* ws:ping([payload]) -> true | nil, message, "closed" */
static int
ws_ping(lua_State *L)
{
  struct ws_conn *c = check_ws(L);
  size_t n;
  const char *p = luaL_optlstring(L, 2, "", &n);
  struct ws_msg *m;
  luaL_argcheck(L, n <= 125, 2, "a ping payload is at most 125 bytes");
  if (c->state != ST_OPEN)
    return push_closed(L, c);
  m = msg_new(p, n, 1);
  if (!m)
    return luaL_error(L, "out of memory");
  q_push(&c->pings, m);
  lws_callback_on_writable(c->wsi);
  lua_pushboolean(L, 1);
  return 1;
}

/*
** The next message, or the end: pushes recv's results and returns their
** count, or returns 0 when there is nothing yet. Taking a message can resume
** reading. The message leaves the queue only after its copy is pushed (a
** raise in between leaks nothing).
*/
static int
recv_take(lua_State *L, struct ws_conn *c)
{
  struct ws_msg *m = c->rx.head;
  if (m) {
    lua_pushlstring(L, m->data, m->len);
    lua_pushstring(L, m->binary ? "binary" : "text");
    free(q_pop(&c->rx));
    if (c->rx_paused && c->rx.bytes <= c->max_queue / 2 && c->wsi) {
      c->rx_paused = 0;
      lws_rx_flow_control(c->wsi, 1);
    }
    return 2;
  }
  if (c->state == ST_CLOSED)
    return push_closed(L, c);
  return 0;
}

static int
recv_k(lua_State *L, int status, lua_KContext ctx)
{
  struct ws_ud *ud = luaL_checkudata(L, 1, WS_MT);
  int n;
  (void)status;
  (void)ctx;
  sbx_read_resumed(L);
  if (!ud->c)
    return sbx_pushfail(L, "closed", "the websocket was closed");
  if ((n = recv_take(L, ud->c)) > 0)
    return n;
  return sbx_pushfail(L, "timeout", "timeout");
}

/*
** ws:recv([timeout]) -> data, "binary"|"text" | nil, "timeout", "timeout"
** | nil, message, "closed". One whole message; queued ones come before the
** end. May yield; raises when another coroutine already waits here.
*/
static int
ws_recv(lua_State *L)
{
  struct ws_conn *c = check_ws(L);
  double timeout = luaL_optnumber(L, 2, -1);
  int n;
  luaL_argcheck(L, lua_isnoneornil(L, 2) || timeout >= 0, 2, "negative timeout");
  lua_settop(L, 1);
  if ((n = recv_take(L, c)) > 0)
    return n;
  return sbx_await_read(L, &c->reader, timeout, recv_k,
                        "another coroutine is already waiting in recv on this websocket");
}

static int
valid_close_code(lua_Integer code)
{
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1011) || (code >= 3000 && code <= 4999);
}

/* ws:close([code [, reason]]) -> true. Idempotent; never yields. */
static int
ws_close(lua_State *L)
{
  struct ws_ud *ud = luaL_checkudata(L, 1, WS_MT);
  lua_Integer code = luaL_optinteger(L, 2, LWS_CLOSE_STATUS_NORMAL);
  size_t n;
  const char *reason = luaL_optlstring(L, 3, "", &n);
  luaL_argcheck(L, valid_close_code(code), 2, "not a close code an endpoint may send");
  luaL_argcheck(L, n <= 123, 3, "a close reason is at most 123 bytes");
  if (ud->c)
    conn_close(ud->c, (int)code, reason, n);
  lua_pushboolean(L, 1);
  return 1;
}

static void
set_int(lua_State *L, const char *k, lua_Integer v)
{
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

/* ws:info() -> { state, close_code, close_reason, messages_in, ... } */
static int
ws_info(lua_State *L)
{
  struct ws_conn *c = check_ws(L);
  lua_createtable(L, 0, 10);
  lua_pushstring(L, state_names[c->state]);
  lua_setfield(L, -2, "state");
  if (c->close_code) {
    set_int(L, "close_code", c->close_code);
    lua_pushstring(L, c->close_reason);
    lua_setfield(L, -2, "close_reason");
  }
  if (c->protocol[0]) {
    lua_pushstring(L, c->protocol);
    lua_setfield(L, -2, "protocol");
  }
  set_int(L, "messages_in", c->messages_in);
  set_int(L, "messages_out", c->messages_out);
  set_int(L, "bytes_in", c->bytes_in);
  set_int(L, "bytes_out", c->bytes_out);
  set_int(L, "pongs", c->pongs);
  set_int(L, "queued", (lua_Integer)c->rx.bytes);
  set_int(L, "max_send", (lua_Integer)c->max_send);
  return 1;
}

/* __gc and __close: idempotent, never block. */
static int
ws_gc(lua_State *L)
{
  ws_release(luaL_checkudata(L, 1, WS_MT));
  return 0;
}

static int
ws_tostring(lua_State *L)
{
  struct ws_ud *ud = luaL_checkudata(L, 1, WS_MT);
  if (ud->c)
    lua_pushfstring(L, "sbx.ws (%s %s)", state_names[ud->c->state], ud->c->url);
  else
    lua_pushliteral(L, "sbx.ws (closed)");
  return 1;
}

static const luaL_Reg ws_funcs[] = { { "connect", ws_connect }, { NULL, NULL } };

static const luaL_Reg ws_methods[] = { { "send", ws_send },
                                       { "buffered", ws_buffered },
                                       { "wait_drained", ws_wait_drained },
                                       { "recv", ws_recv },
                                       { "ping", ws_ping },
                                       { "close", ws_close },
                                       { "info", ws_info },
                                       { NULL, NULL } };

static const luaL_Reg ws_meta[] = { { "__gc", ws_gc },
                                    { "__close", ws_gc },
                                    { "__tostring", ws_tostring },
                                    { "__index", NULL },
                                    { NULL, NULL } };

int
sbx_open_ws(lua_State *L)
{
  luaL_newmetatable(L, WS_MT);
  luaL_setfuncs(L, ws_meta, 0);
  luaL_newlibtable(L, ws_methods);
  luaL_setfuncs(L, ws_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, ws_funcs);
  return 1;
}

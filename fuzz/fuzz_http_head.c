/* needs: nothing */
/*
** The answer to a hijacked request (src/hijack.c), driven the way stream.c
** drives it: head, then the stream through the demultiplexer or the error
** body. The payload goes in whole, one byte at a time, and in chunks the
** input chooses (fuzz.h); all three must end in the same state with the
** same status, Content-Length, head, body and stream output, and all must
** match a reference that reads the whole answer at once from the format's
** description.
*/
#include "fuzz.h"
#include "demux.h"
#include "hijack.h"

#include <string.h>

struct result {
  int rc; /* 0 or the first error */
  enum sbx_hijack_state state;
  int status;
  long content_length;
  size_t head_len;
  const char *head;
  struct fuzz_log body; /* the error body kept (tag 0) */
  size_t body_seen;
  struct fuzz_log out; /* stream output, tagged by stream */
};

static void
record(void *ud, int stream, const char *p, size_t n)
{
  CHECK(n > 0);
  fuzz_log_add(ud, stream, p, n);
}

/* Feeds p[0..n) as stream.c does; cuts NULL: byte by byte. */
static void
run(struct sbx_hijack *h, const uint8_t *data, size_t n, struct fuzz_cuts *cuts, struct result *r)
{
  struct sbx_demux d;
  size_t off = 0;
  sbx_hijack_init(h);
  sbx_demux_init(&d, 0);
  memset(r, 0, sizeof *r);
  fuzz_log_init(&r->body);
  fuzz_log_init(&r->out);
  while (off < n && r->rc == 0) {
    size_t m = cuts ? fuzz_cuts_next(cuts, n - off) : 1;
    const char *p = (const char *)data + off;
    off += m;
    while (m > 0) {
      size_t used;
      if (h->state == SBX_HIJACK_STREAM) {
        sbx_demux_feed(&d, p, m, record, &r->out);
        break;
      }
      if (h->state == SBX_HIJACK_DONE)
        break;
      r->rc = sbx_hijack_feed(h, p, m, &used);
      CHECK(used <= m);
      if (r->rc < 0) {
        CHECK(r->rc == SBX_HIJACK_E2BIG && h->state == SBX_HIJACK_DONE);
        break;
      }
      /* Progress: a feed takes bytes unless the state has moved on. */
      CHECK(used > 0 || h->state == SBX_HIJACK_STREAM || h->state == SBX_HIJACK_DONE);
      p += used;
      m -= used;
    }
  }
  CHECK(h->head_len < SBX_HIJACK_HEAD_MAX);
  CHECK(h->body_len <= SBX_HIJACK_BODY_MAX);
  CHECK(h->body_len <= h->body_seen);
  CHECK((h->body == NULL) == (h->body_len == 0));
  CHECK(h->body == NULL || h->body[h->body_len] == '\0');
  r->state = h->state;
  r->status = h->status;
  r->content_length = h->content_length;
  r->head_len = h->head_len;
  r->head = h->head;
  if (h->body_len)
    fuzz_log_add(&r->body, 0, h->body, h->body_len);
  r->body_seen = (size_t)h->body_seen;
}

static int
same(const struct result *a, const struct result *b)
{
  return a->rc == b->rc && a->state == b->state && a->status == b->status &&
         a->content_length == b->content_length && a->head_len == b->head_len &&
         (a->head_len == 0 || memcmp(a->head, b->head, a->head_len) == 0) &&
         fuzz_log_equal(&a->body, &b->body) && a->body_seen == b->body_seen &&
         fuzz_log_equal(&a->out, &b->out);
}

static void
result_free(struct result *r)
{
  fuzz_log_free(&r->body);
  fuzz_log_free(&r->out);
}

/* {====== the reference: the whole answer at once */

static int
ci_prefix(const char *s, size_t n, const char *lit)
{
  size_t i, k = strlen(lit);
  if (n < k)
    return 0;
  for (i = 0; i < k; i++) {
    char c = s[i];
    if (c >= 'A' && c <= 'Z')
      c = (char)(c - 'A' + 'a');
    if (c != lit[i])
      return 0;
  }
  return 1;
}

/* "HTTP/" 1*DIGIT "." 1*DIGIT 1*SP 3DIGIT (SP / CR / end), code >= 100. */
static int
ref_status(const char *s, size_t n)
{
  size_t i = 5, a;
  if (n < 5 || memcmp(s, "HTTP/", 5) != 0)
    return 0;
  a = i;
  while (i < n && s[i] >= '0' && s[i] <= '9')
    i++;
  if (i == a || i == n || s[i] != '.')
    return 0;
  a = ++i;
  while (i < n && s[i] >= '0' && s[i] <= '9')
    i++;
  if (i == a || i == n || s[i] != ' ')
    return 0;
  while (i < n && s[i] == ' ')
    i++;
  if (n - i < 3)
    return 0;
  for (a = i; a < i + 3; a++)
    if (s[a] < '0' || s[a] > '9')
      return 0;
  if (i + 3 < n && s[i + 3] != ' ' && s[i + 3] != '\r')
    return 0;
  a = (size_t)((s[i] - '0') * 100 + (s[i + 1] - '0') * 10 + (s[i + 2] - '0'));
  return a >= 100 ? (int)a : 0;
}

/* The first line after a CRLF naming Content-Length decides. */
static long
ref_length(const char *s, size_t n)
{
  size_t i;
  for (i = 0; i + 1 < n; i++) {
    size_t j, digits = 0;
    long v = 0;
    if (s[i] != '\r' || s[i + 1] != '\n' || !ci_prefix(s + i + 2, n - i - 2, "content-length:"))
      continue;
    j = i + 2 + strlen("content-length:");
    while (j < n && (s[j] == ' ' || s[j] == '\t'))
      j++;
    while (j < n && s[j] >= '0' && s[j] <= '9') {
      if (++digits > 18)
        return -1;
      v = v * 10 + (s[j++] - '0');
    }
    while (j < n && (s[j] == ' ' || s[j] == '\t'))
      j++;
    return digits && (j == n || s[j] == '\r') ? v : -1;
  }
  return -1;
}

static void
reference(const uint8_t *data, size_t n, struct result *r, char *head)
{
  const char *s = (const char *)data;
  size_t end = 0, i, rest, take;
  memset(r, 0, sizeof *r);
  fuzz_log_init(&r->body);
  fuzz_log_init(&r->out);
  r->content_length = -1;
  r->head = head;
  for (i = 3; i < n && i < SBX_HIJACK_HEAD_MAX - 1; i++)
    if (memcmp(s + i - 3, "\r\n\r\n", 4) == 0) {
      end = i + 1;
      break;
    }
  if (end == 0) {
    /* No blank line within the head's room: an error once it is full. */
    r->head_len = n < SBX_HIJACK_HEAD_MAX - 1 ? n : SBX_HIJACK_HEAD_MAX - 1;
    memcpy(head, s, r->head_len);
    r->state = n > SBX_HIJACK_HEAD_MAX - 1 ? SBX_HIJACK_DONE : SBX_HIJACK_HEAD;
    r->rc = n > SBX_HIJACK_HEAD_MAX - 1 ? SBX_HIJACK_E2BIG : 0;
    return;
  }
  r->head_len = end;
  memcpy(head, s, end);
  r->status = ref_status(s, end);
  r->content_length = ref_length(s, end);
  rest = n - end;
  if (r->status == 200 || r->status == 101) {
    struct sbx_demux d;
    r->state = SBX_HIJACK_STREAM;
    /* The demultiplexer has its own target (fuzz_demux); reuse it here. */
    sbx_demux_init(&d, 0);
    sbx_demux_feed(&d, s + end, rest, record, &r->out);
    return;
  }
  if (r->content_length == 0) {
    r->state = SBX_HIJACK_DONE;
    return;
  }
  take = rest;
  if (r->content_length > 0 && (unsigned long)r->content_length < take)
    take = (size_t)r->content_length;
  r->body_seen = take;
  if (take)
    fuzz_log_add(&r->body, 0, s + end, take < SBX_HIJACK_BODY_MAX ? take : SBX_HIJACK_BODY_MAX);
  r->state = r->content_length > 0 && (size_t)r->content_length <= rest ? SBX_HIJACK_DONE : SBX_HIJACK_BODY;
}

/* }====== */

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  static struct sbx_hijack h1, h2, h3; /* 16 KiB each: not on the stack */
  static char head[SBX_HIJACK_HEAD_MAX];
  struct fuzz_cuts cuts, whole = { NULL, 0, 0 };
  struct result ref, a, b, c;
  size_t n = fuzz_cuts_init(&cuts, data, size);

  reference(data, n, &ref, head);
  run(&h1, data, n, &whole, &a);
  run(&h2, data, n, NULL, &b);
  run(&h3, data, n, &cuts, &c);
  CHECK(same(&ref, &a));
  CHECK(same(&ref, &b));
  CHECK(same(&ref, &c));
  CHECK(a.status == 0 || (a.status >= 100 && a.status <= 999));
  if (a.state != SBX_HIJACK_HEAD && a.rc == 0)
    CHECK(a.head_len >= 4 && memcmp(a.head + a.head_len - 4, "\r\n\r\n", 4) == 0 &&
          a.head[a.head_len] == '\0');
  sbx_hijack_free(&h1);
  sbx_hijack_free(&h2);
  sbx_hijack_free(&h3);
  result_free(&ref);
  result_free(&a);
  result_free(&b);
  result_free(&c);
  return 0;
}

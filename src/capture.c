#include "capture.h"

#include <stdlib.h>
#include <string.h>

void
sbx_capture_init(struct sbx_capture *c, size_t head_cap, size_t tail_cap)
{
  memset(c, 0, sizeof *c);
  c->head_cap = head_cap;
  c->tail_cap = tail_cap;
}

void
sbx_capture_free(struct sbx_capture *c)
{
  free(c->head);
  free(c->tail);
  c->head = c->tail = NULL;
  c->head_len = c->head_alloc = c->tail_len = c->tail_pos = 0;
}

void
sbx_capture_compact(struct sbx_capture *c)
{
  char *p;
  if (c->head_alloc > c->head_len) {
    if (c->head_len == 0) {
      free(c->head);
      c->head = NULL;
      c->head_alloc = 0;
    }
    else if ((p = realloc(c->head, c->head_len)) != NULL) {
      c->head = p;
      c->head_alloc = c->head_len;
    }
  }
  /* A ring that is not full never wrapped: its bytes start at 0. */
  if (c->tail && c->tail_len < c->tail_cap) {
    if (c->tail_len == 0) {
      free(c->tail);
      c->tail = NULL;
      c->tail_cap = 0;
      c->tail_pos = 0;
    }
    else if ((p = realloc(c->tail, c->tail_len)) != NULL) {
      c->tail = p;
      c->tail_cap = c->tail_len;
      c->tail_pos = 0;
    }
  }
}

size_t
sbx_capture_held(const struct sbx_capture *c)
{
  return c->head_alloc + (c->tail ? c->tail_cap : 0);
}

static int
head_reserve(struct sbx_capture *c, size_t need)
{
  size_t want;
  char *p;
  if (need <= c->head_alloc)
    return 0;
  want = c->head_alloc ? c->head_alloc : 256;
  while (want < need)
    want *= 2;
  if (want > c->head_cap)
    want = c->head_cap;
  p = realloc(c->head, want);
  if (!p)
    return -1;
  c->head = p;
  c->head_alloc = want;
  return 0;
}

int
sbx_capture_add(struct sbx_capture *c, const char *p, size_t n)
{
  int rc = 0;
  c->total += n;
  if (c->head_len < c->head_cap) {
    size_t take = c->head_cap - c->head_len;
    if (take > n)
      take = n;
    if (head_reserve(c, c->head_len + take) == 0) {
      memcpy(c->head + c->head_len, p, take);
      c->head_len += take;
    }
    else
      rc = -1;
    p += take;
    n -= take;
  }
  if (n == 0 || c->tail_cap == 0)
    return rc;
  if (!c->tail) {
    c->tail = malloc(c->tail_cap);
    if (!c->tail)
      return -1;
  }
  if (n >= c->tail_cap) {
    /* Only the last tail_cap bytes of this chunk can survive. */
    memcpy(c->tail, p + n - c->tail_cap, c->tail_cap);
    c->tail_pos = 0;
    c->tail_len = c->tail_cap;
    return rc;
  }
  while (n > 0) {
    size_t room = c->tail_cap - c->tail_pos;
    size_t take = n < room ? n : room;
    memcpy(c->tail + c->tail_pos, p, take);
    c->tail_pos = (c->tail_pos + take) % c->tail_cap;
    c->tail_len = c->tail_len + take > c->tail_cap ? c->tail_cap : c->tail_len + take;
    p += take;
    n -= take;
  }
  return rc;
}

uint64_t
sbx_capture_omitted(const struct sbx_capture *c)
{
  return c->total - c->head_len - c->tail_len;
}

uint64_t
sbx_capture_tail_offset(const struct sbx_capture *c)
{
  return c->total - c->tail_len;
}

void
sbx_capture_copy_tail(const struct sbx_capture *c, char *out)
{
  size_t start;
  if (c->tail_len == 0)
    return;
  start = (c->tail_pos + c->tail_cap - c->tail_len) % c->tail_cap;
  if (start + c->tail_len <= c->tail_cap)
    memcpy(out, c->tail + start, c->tail_len);
  else {
    size_t first = c->tail_cap - start;
    memcpy(out, c->tail + start, first);
    memcpy(out + first, c->tail, c->tail_len - first);
  }
}

size_t
sbx_capture_read_at(const struct sbx_capture *c, uint64_t off, char *out, size_t max, uint64_t *skipped)
{
  size_t done = 0;
  uint64_t tail_off = sbx_capture_tail_offset(c);
  *skipped = 0;
  if (off < c->head_len) {
    size_t take = c->head_len - (size_t)off;
    if (take > max)
      take = max;
    memcpy(out, c->head + off, take);
    done = take;
    off += take;
    if (done == max || off < tail_off)
      return done; /* the caller asks again from off and learns about the gap */
  }
  if (off < tail_off) {
    *skipped = tail_off - off;
    off = tail_off;
  }
  if (off < c->total && done < max) {
    size_t start = (c->tail_pos + c->tail_cap - c->tail_len) % c->tail_cap;
    size_t rel = (size_t)(off - tail_off);
    size_t avail = c->tail_len - rel;
    size_t take = avail < max - done ? avail : max - done;
    size_t i;
    for (i = 0; i < take; i++)
      out[done + i] = c->tail[(start + rel + i) % c->tail_cap];
    done += take;
  }
  return done;
}

/* Length of the UTF-8 sequence at p (1..4) if it is valid and complete,
** -k if it is a valid but incomplete prefix of k bytes (p ends there), or 0
** if it is invalid: then *bad gets the length of its longest valid prefix
** (1..3), the maximal subpart that one U+FFFD stands for. */
static int
utf8_seq(const unsigned char *p, size_t n, size_t *bad)
{
  unsigned char b = p[0];
  int len, i;
  unsigned lo = 0x80, hi = 0xBF;
  *bad = 1;
  if (b < 0x80)
    return 1;
  if (b >= 0xC2 && b <= 0xDF)
    len = 2;
  else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0)
      lo = 0xA0; /* no overlongs */
    if (b == 0xED)
      hi = 0x9F; /* no surrogates */
  }
  else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0)
      lo = 0x90;
    if (b == 0xF4)
      hi = 0x8F;
  }
  else
    return 0;
  for (i = 1; i < len; i++) {
    if ((size_t)i >= n)
      return -i;
    if (p[i] < (i == 1 ? lo : 0x80) || p[i] > (i == 1 ? hi : 0xBF)) {
      *bad = (size_t)i;
      return 0;
    }
  }
  return len;
}

size_t
sbx_utf8_valid_prefix(const char *src, size_t n)
{
  const unsigned char *p = (const unsigned char *)src;
  size_t i = 0, bad;
  int k;
  while (i < n && (k = utf8_seq(p + i, n - i, &bad)) > 0)
    i += (size_t)k;
  return i;
}

size_t
sbx_utf8_sanitize(const char *src, size_t n, char *out, int final, size_t *rest)
{
  return sbx_utf8_repair(src, n, out, final, rest, NULL);
}

size_t
sbx_utf8_repair(const char *src, size_t n, char *out, int final, size_t *rest, size_t *replaced)
{
  const unsigned char *p = (const unsigned char *)src;
  size_t i = 0, o = 0, bad = 0;
  if (rest)
    *rest = 0;
  while (i < n) {
    size_t sub;
    int k = utf8_seq(p + i, n - i, &sub);
    if (k > 0) {
      memcpy(out + o, p + i, (size_t)k);
      o += (size_t)k;
      i += (size_t)k;
    }
    else if (k < 0 && !final) {
      if (rest)
        *rest = n - i;
      break;
    }
    else {
      /* One replacement per maximal invalid prefix, as Python's decoder:
      ** a truncated sequence ("\xE2\x82" then "b") is one. */
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i += k < 0 ? (size_t)(-k) : sub;
      bad++;
    }
  }
  if (replaced)
    *replaced = bad;
  return o;
}

size_t
sbx_utf8_lead_continuations(const char *src, size_t n)
{
  const unsigned char *p = (const unsigned char *)src;
  size_t i = 0;
  while (i < n && i < 3 && (p[i] & 0xC0) == 0x80)
    i++;
  return i;
}

size_t
sbx_utf8_incomplete_suffix(const char *src, size_t n)
{
  const unsigned char *p = (const unsigned char *)src;
  size_t back;
  for (back = 1; back <= 3 && back <= n; back++) {
    unsigned char b = p[n - back];
    if ((b & 0xC0) != 0x80) {
      size_t sub;
      int k = utf8_seq(p + n - back, back, &sub);
      return k < 0 ? back : 0;
    }
  }
  return 0;
}

/* The answer to a hijacked HTTP request: see hijack.h. No I/O, no loop. */
#include "hijack.h"

#include <stdlib.h>
#include <string.h>

/* More digits than this is not a length any daemon sends (and fits a long). */
#define LENGTH_DIGITS_MAX 18

void
sbx_hijack_init(struct sbx_hijack *h)
{
  h->state = SBX_HIJACK_HEAD;
  h->status = 0;
  h->content_length = -1;
  h->head_len = 0;
  h->head = NULL;
  h->body = NULL;
  h->body_len = 0;
  h->body_seen = 0;
}

void
sbx_hijack_free(struct sbx_hijack *h)
{
  free(h->body);
  h->body = NULL;
  h->body_len = 0;
  sbx_hijack_drop_head(h);
}

void
sbx_hijack_drop_head(struct sbx_hijack *h)
{
  free(h->head);
  h->head = NULL;
}

static int
is_digit(char c)
{
  return c >= '0' && c <= '9';
}

static int
is_blank(char c)
{
  return c == ' ' || c == '\t';
}

static int
lower(int c)
{
  return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

int
sbx_hijack_status(const char *s, size_t n)
{
  size_t i = 5, d;
  int code = 0;
  if (n < 5 || memcmp(s, "HTTP/", 5) != 0)
    return 0;
  for (d = i; i < n && is_digit(s[i]); i++)
    ;
  if (i == d || i >= n || s[i++] != '.')
    return 0;
  for (d = i; i < n && is_digit(s[i]); i++)
    ;
  if (i == d || i >= n || s[i] != ' ')
    return 0;
  while (i < n && s[i] == ' ')
    i++;
  for (d = i; i < n && i < d + 3 && is_digit(s[i]); i++)
    code = code * 10 + (s[i] - '0');
  if (i != d + 3 || code < 100 || (i < n && s[i] != ' ' && s[i] != '\r'))
    return 0;
  return code;
}

long
sbx_hijack_content_length(const char *s, size_t n)
{
  static const char name[] = "content-length:";
  const size_t nl = sizeof name - 1;
  size_t i, k;
  for (i = 2; i + nl <= n; i++) {
    long v = 0;
    if (s[i - 2] != '\r' || s[i - 1] != '\n')
      continue;
    for (k = 0; k < nl && lower((unsigned char)s[i + k]) == name[k]; k++)
      ;
    if (k < nl)
      continue;
    /* The first such line decides, as a reader that stops there would. */
    for (i += nl; i < n && is_blank(s[i]); i++)
      ;
    for (k = 0; i < n && is_digit(s[i]); i++, k++) {
      if (k == LENGTH_DIGITS_MAX)
        return -1;
      v = v * 10 + (s[i] - '0');
    }
    while (i < n && is_blank(s[i]))
      i++;
    if (k == 0 || (i < n && s[i] != '\r'))
      return -1;
    return v;
  }
  return -1;
}

/* The head is complete: read it and pick what the bytes after it are. */
static void
head_done(struct sbx_hijack *h)
{
  h->head[h->head_len] = '\0';
  h->status = sbx_hijack_status(h->head, h->head_len);
  h->content_length = sbx_hijack_content_length(h->head, h->head_len);
  if (h->status == 200 || h->status == 101)
    h->state = SBX_HIJACK_STREAM;
  else if (h->content_length == 0)
    h->state = SBX_HIJACK_DONE;
  else
    h->state = SBX_HIJACK_BODY;
}

/* Takes the body bytes of p[0..n), none past Content-Length; returns how
** many. What follows the body is not the body, however the reads fell. */
static size_t
body_add(struct sbx_hijack *h, const char *p, size_t n)
{
  size_t take;
  char *q;
  if (h->content_length >= 0 && (uint64_t)h->content_length - h->body_seen < n)
    n = (size_t)((uint64_t)h->content_length - h->body_seen);
  h->body_seen += n;
  take = n;
  if (take > SBX_HIJACK_BODY_MAX - h->body_len)
    take = SBX_HIJACK_BODY_MAX - h->body_len;
  if (take && (q = realloc(h->body, h->body_len + take + 1)) != NULL) {
    memcpy(q + h->body_len, p, take);
    h->body = q;
    h->body_len += take;
    q[h->body_len] = '\0';
  }
  if (h->content_length >= 0 && h->body_seen >= (uint64_t)h->content_length)
    h->state = SBX_HIJACK_DONE;
  return n;
}

int
sbx_hijack_feed(struct sbx_hijack *h, const char *p, size_t n, size_t *used)
{
  size_t i;
  *used = 0;
  switch (h->state) {
  case SBX_HIJACK_HEAD:
    /* Byte by byte until the blank line: heads are small. */
    if (!h->head && (h->head = malloc(SBX_HIJACK_HEAD_MAX)) == NULL) {
      h->state = SBX_HIJACK_DONE;
      return SBX_HIJACK_E2BIG;
    }
    for (i = 0; i < n; i++) {
      if (h->head_len >= SBX_HIJACK_HEAD_MAX - 1) {
        *used = i;
        h->state = SBX_HIJACK_DONE;
        return SBX_HIJACK_E2BIG;
      }
      h->head[h->head_len++] = p[i];
      if (h->head_len >= 4 && memcmp(h->head + h->head_len - 4, "\r\n\r\n", 4) == 0) {
        head_done(h);
        *used = i + 1;
        return 0;
      }
    }
    *used = n;
    return 0;
  case SBX_HIJACK_BODY:
    *used = body_add(h, p, n);
    return 0;
  default:
    return 0;
  }
}

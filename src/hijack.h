/*
** The daemon's answer to a hijacked HTTP/1.1 request (Docker's attached
** exec start): a response head up to its blank line, then either the
** hijacked byte stream, which belongs to the caller (status 200, or 101
** after an Upgrade), or an error body that ends after Content-Length bytes
** or at EOF.
**
** Pure and incremental: bytes go in as chunks of any size, and how they are
** cut never changes the result. No I/O, no loop, no Lua. Memory is bounded:
** the head lives in the struct, the error body keeps its first
** SBX_HIJACK_BODY_MAX bytes.
**
** Nothing here decodes a chunked body: dockerd writes no Transfer-Encoding
** on a hijack, and its short error answers carry a Content-Length. A
** chunked error body is kept as it came (framing included) and ends at EOF.
*/
#ifndef SBX_HIJACK_H
#define SBX_HIJACK_H

#include <stddef.h>
#include <stdint.h>

#define SBX_HIJACK_HEAD_MAX 16384 /* head bytes, its terminating NUL included */
#define SBX_HIJACK_BODY_MAX 65536 /* error body bytes kept */

enum sbx_hijack_state {
  SBX_HIJACK_HEAD,   /* reading the head */
  SBX_HIJACK_STREAM, /* the head said 200 or 101: the rest is the caller's */
  SBX_HIJACK_BODY,   /* any other status: reading the error body */
  SBX_HIJACK_DONE    /* the body is complete, or the head was too large */
};

enum { SBX_HIJACK_E2BIG = -1 }; /* the head does not fit */

struct sbx_hijack {
  enum sbx_hijack_state state;
  int status;          /* 100..999 once the head is in; 0 before, or when
                          the status line is not "HTTP/x.y NNN" */
  long content_length; /* -1 when absent or not a plain decimal number */
  size_t head_len;
  char *head;         /* NUL-terminated once complete; malloc'd at the
                         first byte, freed by sbx_hijack_free (a long-lived
                         stream frees it early with sbx_hijack_drop_head) */
  char *body;         /* error body (malloc'd, NUL-terminated) or NULL;
                         bytes that find no memory are dropped: the body
                         only explains a failure */
  size_t body_len;    /* bytes kept, <= SBX_HIJACK_BODY_MAX */
  uint64_t body_seen; /* bytes received, kept or not */
};

void sbx_hijack_init(struct sbx_hijack *h);
void sbx_hijack_free(struct sbx_hijack *h);
/* Frees the head once it was read (status and length stay). */
void sbx_hijack_drop_head(struct sbx_hijack *h);

/*
** Takes bytes from p[0..n) and stores in *used how many. In HEAD it stops
** right after the blank line, so the caller sees the state change (and can
** start writing stdin) before it hands the rest over; in BODY it takes all
** n up to the end of the body (Content-Length); in STREAM and DONE none. Returns 0, or SBX_HIJACK_E2BIG when
*the head
** reaches SBX_HIJACK_HEAD_MAX - 1 bytes without its blank line, or finds no
** memory (the state is then DONE).
*/
int sbx_hijack_feed(struct sbx_hijack *h, const char *p, size_t n, size_t *used);

/*
** The status code of a status line "HTTP/<digits>.<digits> SP+ NNN" ending
** with SP, CR or the end of s[0..n), or 0. Used on the head, exposed for
** tests.
*/
int sbx_hijack_status(const char *s, size_t n);

/*
** The value of the first header line "Content-Length:" (any case) of a head
** s[0..n): a decimal number with optional blanks around it, or -1.
*/
long sbx_hijack_content_length(const char *s, size_t n);

#endif

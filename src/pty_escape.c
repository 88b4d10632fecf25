/*
** The escaping of pty_escape.h: bytes through the SSM agent's PTY reader
** without ever forming EF BF BD.
*/
#include "pty_escape.h"

size_t
sbx_pty_escape(const void *in, size_t n, void *out)
{
  const unsigned char *p = in;
  unsigned char *o = out;
  size_t i, k = 0;
  for (i = 0; i < n; i++) {
    o[k++] = p[i];
    if (p[i] == SBX_PTY_ESC)
      o[k++] = SBX_PTY_ESC_SELF;
  }
  return k;
}

void
sbx_pty_unescape_init(struct sbx_pty_unescape *d)
{
  d->pending = 0;
}

int
sbx_pty_unescape(struct sbx_pty_unescape *d, const void *in, size_t n, void *out, size_t *outlen)
{
  const unsigned char *p = in;
  unsigned char *o = out;
  size_t i, k = 0;
  for (i = 0; i < n; i++) {
    if (d->pending) {
      if (p[i] != SBX_PTY_ESC_SELF) {
        *outlen = k;
        return -1;
      }
      o[k++] = SBX_PTY_ESC;
      d->pending = 0;
    }
    else if (p[i] == SBX_PTY_ESC) {
      d->pending = 1;
    }
    else {
      o[k++] = p[i];
    }
  }
  *outlen = k;
  return 0;
}

int
sbx_pty_unescape_done(const struct sbx_pty_unescape *d)
{
  return !d->pending;
}

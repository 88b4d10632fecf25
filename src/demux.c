/* Docker's multiplexed exec stream: see demux.h. No I/O, no loop, no Lua. */
#include "demux.h"

void
sbx_demux_init(struct sbx_demux *d, int raw)
{
  d->raw = raw != 0;
  d->stream = 0;
  d->left = 0;
  d->hdr_len = 0;
}

void
sbx_demux_feed(struct sbx_demux *d, const char *p, size_t n, sbx_demux_fn *out, void *ud)
{
  while (n > 0) {
    if (d->raw) {
      out(ud, 1, p, n);
      return;
    }
    if (d->left == 0) {
      if (d->hdr_len == 0 && (unsigned char)*p > 3) {
        /* Not a frame header: raw bytes, from this one on. Deciding on the
        ** first byte keeps a raw answer shorter than a header too. */
        d->raw = 1;
        continue;
      }
      while (n > 0 && d->hdr_len < SBX_DEMUX_HEADER) {
        d->hdr[d->hdr_len++] = (unsigned char)*p++;
        n--;
      }
      if (d->hdr_len < SBX_DEMUX_HEADER)
        return;
      d->hdr_len = 0;
      d->stream = d->hdr[0];
      d->left = (uint32_t)d->hdr[4] << 24 | (uint32_t)d->hdr[5] << 16 | (uint32_t)d->hdr[6] << 8 |
                (uint32_t)d->hdr[7];
    }
    else {
      size_t take = n < d->left ? n : d->left;
      out(ud, d->stream, p, take);
      d->left -= (uint32_t)take;
      p += take;
      n -= take;
    }
  }
}

int
sbx_demux_partial(const struct sbx_demux *d)
{
  return !d->raw && (d->left > 0 || d->hdr_len > 0);
}

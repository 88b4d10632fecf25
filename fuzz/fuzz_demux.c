/* needs: nothing */
/*
** Docker's frame demultiplexer (src/demux.c). The payload goes through it
** three times: whole, one byte at a time, and in chunks the input chooses
** (fuzz.h). Every run must emit the same bytes per stream in the same order
** as a reference that decodes the whole buffer at once, never an empty
** piece, never a stream above 3, and must agree on whether the input ends
** inside a frame. The first payload byte picks a tty (raw) stream when odd.
*/
#include "fuzz.h"
#include "demux.h"

#include <string.h>

struct sink {
  struct fuzz_log log;
  size_t bytes;
};

static void
record(void *ud, int stream, const char *p, size_t n)
{
  struct sink *k = ud;
  CHECK(n > 0);
  CHECK(stream >= 0 && stream <= 3);
  fuzz_log_add(&k->log, stream, p, n);
  k->bytes += n;
}

/* The format read straight from its description, over the whole input. */
static int
reference(const uint8_t *p, size_t n, int raw, struct fuzz_log *out)
{
  size_t i = 0;
  while (i < n) {
    uint32_t len;
    size_t take;
    if (raw || p[i] > 3) {
      fuzz_log_add(out, 1, p + i, n - i);
      return 0;
    }
    if (n - i < SBX_DEMUX_HEADER)
      return 1;
    len = (uint32_t)p[i + 4] << 24 | (uint32_t)p[i + 5] << 16 | (uint32_t)p[i + 6] << 8 | p[i + 7];
    take = n - i - SBX_DEMUX_HEADER < len ? n - i - SBX_DEMUX_HEADER : len;
    if (take)
      fuzz_log_add(out, p[i], p + i + SBX_DEMUX_HEADER, take);
    i += SBX_DEMUX_HEADER + take;
    if (take < len)
      return 1;
  }
  return 0;
}

/* Feeds p[0..n) in chunks from cuts (NULL: byte by byte). */
static int
run(const uint8_t *p, size_t n, int raw, struct fuzz_cuts *cuts, struct fuzz_log *out)
{
  struct sink k = { *out, 0 };
  struct sbx_demux d;
  size_t off = 0;
  int partial;
  sbx_demux_init(&d, raw);
  while (off < n) {
    size_t m = cuts ? fuzz_cuts_next(cuts, n - off) : 1;
    sbx_demux_feed(&d, (const char *)p + off, m, record, &k);
    off += m;
  }
  sbx_demux_feed(&d, "", 0, record, &k); /* nothing in, nothing out */
  CHECK(d.hdr_len < SBX_DEMUX_HEADER);
  /* Headers are dropped, never invented: output never exceeds input. */
  CHECK(k.bytes <= n);
  partial = sbx_demux_partial(&d);
  *out = k.log;
  return partial;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct fuzz_cuts cuts, whole = { NULL, 0, 0 };
  struct fuzz_log ref, a, b, c;
  size_t n = fuzz_cuts_init(&cuts, data, size);
  int raw = n > 0 && (data[0] & 1), partial;
  const uint8_t *p = n > 0 ? data + 1 : data;
  if (n > 0)
    n--;

  fuzz_log_init(&ref);
  fuzz_log_init(&a);
  fuzz_log_init(&b);
  fuzz_log_init(&c);
  partial = reference(p, n, raw, &ref);
  CHECK(run(p, n, raw, &whole, &a) == partial);
  CHECK(run(p, n, raw, NULL, &b) == partial);
  CHECK(run(p, n, raw, &cuts, &c) == partial);
  CHECK(fuzz_log_equal(&ref, &a));
  CHECK(fuzz_log_equal(&ref, &b));
  CHECK(fuzz_log_equal(&ref, &c));
  fuzz_log_free(&ref);
  fuzz_log_free(&a);
  fuzz_log_free(&b);
  fuzz_log_free(&c);
  return 0;
}

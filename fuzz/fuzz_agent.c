/* needs: nothing */
/*
** The agent protocol codec (src/agent_proto.c): every byte of it comes from
** a box, whose agent a hostile image may replace. The input is a stream of
** frames decoded twice, whole and in chunks the input chooses (fuzz.h), and
** both must give the same frames; every frame re-encodes to its own bytes;
** a decode never claims more than it was given; every payload's fields parse
** within bounds. The first byte picks authenticated frames (odd), checked
** under a fixed key, with a frame re-tagged by the encoder always accepted.
*/
#include "fuzz.h"
#include "agent_proto.h"

#include <string.h>

static const uint8_t KEY[SBX_AP_KEY] = "0123456789abcdef0123456789abcde";

static void
fields(const struct sbx_ap_frame *f)
{
  struct sbx_ap_fields it;
  uint8_t tag;
  const uint8_t *v;
  uint32_t len;
  int r;
  uint64_t n;
  sbx_ap_fields_init(&it, f->payload, f->len);
  while ((r = sbx_ap_next(&it, &tag, &v, &len)) == 1) {
    CHECK(v >= f->payload && v + len <= f->payload + f->len);
    (void)sbx_ap_uint(v, len, &n);
  }
  CHECK(r == 0 || r == -1);
}

/* Decodes everything in p[0..n); returns frames seen, a checksum of them. */
static size_t
decode_all(const uint8_t *p, size_t n, const uint8_t *key, uint32_t *sum, int *err)
{
  size_t off = 0, frames = 0;
  uint64_t seq = 0;
  *sum = 0;
  *err = 0;
  for (;;) {
    struct sbx_ap_frame f;
    int used = sbx_ap_decode(p + off, n - off, key, seq, &f);
    if (used == SBX_AP_NEED)
      break;
    if (used < 0) {
      *err = used;
      break;
    }
    CHECK((size_t)used <= n - off);
    if (f.type == SBX_AP_PAD) {
      /* Padding: zero bytes only, no frame, no sequence number. */
      size_t i;
      for (i = 0; i < (size_t)used; i++)
        CHECK(p[off + i] == 0);
      off += (size_t)used;
      continue;
    }
    CHECK(f.len <= SBX_AP_MAX_PAYLOAD);
    CHECK((size_t)used == SBX_AP_HEADER + f.len + (key ? SBX_AP_TAG : 0));
    /* The frame's bytes are what the encoder makes of it. */
    {
      uint8_t h[SBX_AP_HEADER], tag[SBX_AP_TAG];
      sbx_ap_header(h, f.type, f.id, f.len);
      h[1] = f.flags;
      CHECK(memcmp(h, p + off, SBX_AP_HEADER) == 0);
      if (key) {
        sbx_ap_tag(key, seq, p + off, f.payload, f.len, tag);
        CHECK(memcmp(tag, p + off + SBX_AP_HEADER + f.len, SBX_AP_TAG) == 0);
      }
    }
    fields(&f);
    *sum = *sum * 31 + f.type + f.id + f.len;
    off += (size_t)used;
    seq++;
    frames++;
  }
  return frames;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct fuzz_cuts cuts;
  size_t n, frames, off = 0, got = 0;
  uint32_t sum, sum2 = 0;
  int err, err2 = 0;
  const uint8_t *key;
  uint8_t *buf;
  if (size < 1)
    return 0;
  key = data[0] & 1 ? KEY : NULL;
  n = fuzz_cuts_init(&cuts, data + 1, size - 1);
  frames = decode_all(data + 1, n, key, &sum, &err);
  /* In chunks: a growing buffer fed piece by piece, decoded as it goes. */
  buf = fuzz_alloc(n);
  {
    size_t have = 0, pos = 0;
    uint64_t seq = 0;
    while (off < n) {
      size_t c = fuzz_cuts_next(&cuts, n - off);
      memcpy(buf + have, data + 1 + off, c);
      have += c;
      off += c;
      for (;;) {
        struct sbx_ap_frame f;
        int used = sbx_ap_decode(buf + pos, have - pos, key, seq, &f);
        if (used == SBX_AP_NEED)
          break;
        if (used < 0) {
          err2 = used;
          off = n;
          break;
        }
        pos += (size_t)used;
        if (f.type == SBX_AP_PAD)
          continue;
        sum2 = sum2 * 31 + f.type + f.id + f.len;
        seq++;
        got++;
      }
    }
  }
  CHECK(got == frames);
  CHECK(sum2 == sum);
  CHECK(err2 == err);
  /* A frame the encoder made (and tagged) always decodes to itself. */
  if (n >= SBX_AP_HEADER) {
    uint32_t len = (uint32_t)(n - SBX_AP_HEADER) % 512;
    uint8_t *fr = fuzz_alloc(SBX_AP_HEADER + len + SBX_AP_TAG);
    struct sbx_ap_frame f;
    int used;
    sbx_ap_header(fr, data[1] ? data[1] : 1, (uint32_t)n, len); /* type 0 is padding */
    memcpy(fr + SBX_AP_HEADER, data + 1, len < n ? len : n);
    if (len > n)
      memset(fr + SBX_AP_HEADER + n, 0, len - n);
    sbx_ap_tag(KEY, 7, fr, fr + SBX_AP_HEADER, len, fr + SBX_AP_HEADER + len);
    used = sbx_ap_decode(fr, SBX_AP_HEADER + len + SBX_AP_TAG, KEY, 7, &f);
    CHECK(used == (int)(SBX_AP_HEADER + len + SBX_AP_TAG));
    CHECK(f.len == len && f.id == (uint32_t)n);
    CHECK(sbx_ap_decode(fr, SBX_AP_HEADER + len + SBX_AP_TAG, KEY, 8, &f) == SBX_AP_BAD_TAG);
    free(fr);
  }
  free(buf);
  return 0;
}

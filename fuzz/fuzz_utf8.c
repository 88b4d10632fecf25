/* needs: nothing */
/*
** The bounded capture and the UTF-8 repair (src/capture.c), which turn
** whatever a box prints into text a model or a JSON document can read.
** Input: two bytes that size the capture's head and tail, then the payload
** (and the chunk control bytes of fuzz.h). Checked against a reference
** decoder written from the Unicode rules (code point ranges, not byte
** tables):
**   - sbx_utf8_repair writes exactly what the reference writes: valid
**     UTF-8, the input where it was valid, one U+FFFD per maximal invalid
**     subsequence, and says how many it wrote; sbx_utf8_valid_prefix agrees;
**   - repairing chunk by chunk with the held-back rest, as stream.c's take
**     does, gives the same text as repairing the whole;
**   - head_cut and tail_cut (incomplete_suffix, lead_continuations) cut at
**     most 3 bytes, and a cut of valid text leaves valid text;
**   - the capture keeps exactly the first head and the last tail bytes,
**     counts the rest, never holds more, and read_at returns kept bytes at
**     their offsets.
*/
#include "fuzz.h"
#include "capture.h"

#include <string.h>

/* {====== reference decoder */

static const uint32_t seq_min[5] = { 0, 0, 0x80, 0x800, 0x10000 };

/* Sequence length announced by a lead byte, 0 when it leads none. */
static int
lead_len(unsigned char b)
{
  if (b < 0x80)
    return 1;
  if (b >= 0xC0 && b < 0xE0)
    return 2;
  if (b >= 0xE0 && b < 0xF0)
    return 3;
  if (b >= 0xF0 && b < 0xF8)
    return 4;
  return 0;
}

/*
** Whether the first k of len bytes (lead at p, k-1 continuation bytes
** already checked) can still end as a scalar value that needs len bytes:
** the code points they allow must meet [seq_min, 0x10FFFF] outside the
** surrogates.
*/
static int
prefix_ok(const unsigned char *p, int k, int len)
{
  uint32_t v = p[0] & (0x7F >> len), lo, hi, a, b;
  int j, free_bits = 6 * (len - k);
  for (j = 1; j < k; j++)
    v = v << 6 | (p[j] & 0x3F);
  lo = v << free_bits;
  hi = lo | ((1u << free_bits) - 1);
  a = lo > seq_min[len] ? lo : seq_min[len];
  b = hi < 0x10FFFF ? hi : 0x10FFFF;
  if (a > b)
    return 0;
  return !(a >= 0xD800 && b <= 0xDFFF);
}

/*
** Decodes p[0..n) into out (may be NULL), one U+FFFD per maximal subpart
** of an ill-formed sequence; *rest gets the length of an incomplete
** sequence at the end when !final. Returns the output length.
*/
static size_t
ref_repair(const unsigned char *p, size_t n, unsigned char *out, int final, size_t *rest, size_t *replaced)
{
  size_t i = 0, o = 0;
  *rest = 0;
  *replaced = 0;
  while (i < n) {
    int len = lead_len(p[i]), k = 1;
    if (len == 1) {
      if (out)
        out[o] = p[i];
      o++;
      i++;
      continue;
    }
    if (len > 1 && prefix_ok(p + i, 1, len)) {
      while (k < len && i + (size_t)k < n && (p[i + k] & 0xC0) == 0x80 && prefix_ok(p + i, k + 1, len))
        k++;
      if (k == len) {
        if (out)
          memcpy(out + o, p + i, (size_t)len);
        o += (size_t)len;
        i += (size_t)len;
        continue;
      }
      if (i + (size_t)k == n && !final) {
        *rest = (size_t)k;
        return o;
      }
    }
    if (out)
      memcpy(out + o, "\xEF\xBF\xBD", 3);
    o += 3;
    i += (size_t)k;
    ++*replaced;
  }
  return o;
}

static int
ref_valid(const unsigned char *p, size_t n)
{
  size_t rest, bad;
  return ref_repair(p, n, NULL, 1, &rest, &bad) == n && bad == 0;
}

/* }====== */

static void
check_repair(const unsigned char *p, size_t n, struct fuzz_cuts *cuts)
{
  unsigned char *want = fuzz_alloc(3 * n + 1), *got = fuzz_alloc(3 * n + 1);
  unsigned char *acc = fuzz_alloc(3 * n + 1), *in = fuzz_alloc(n + 4);
  size_t wlen, glen, wrest, grest, wbad, gbad, alen = 0, carry = 0, off = 0;

  /* Whole, final. */
  wlen = ref_repair(p, n, want, 1, &wrest, &wbad);
  glen = sbx_utf8_repair((const char *)p, n, (char *)got, 1, &grest, &gbad);
  CHECK(glen == wlen && memcmp(got, want, wlen) == 0);
  CHECK(grest == 0 && gbad == wbad);
  CHECK(glen <= 3 * n);
  CHECK(ref_valid(got, glen));
  CHECK(sbx_utf8_valid_prefix((const char *)got, glen) == glen);
  CHECK((sbx_utf8_valid_prefix((const char *)p, n) == n) == (wbad == 0));
  if (wbad == 0)
    CHECK(glen == n && memcmp(got, p, n) == 0);
  CHECK(sbx_utf8_sanitize((const char *)p, n, (char *)got, 1, NULL) == glen);

  /* Whole, not final: what stays back is the incomplete end, which is
  ** exactly what head_cut drops. */
  wlen = ref_repair(p, n, want, 0, &wrest, &wbad);
  glen = sbx_utf8_repair((const char *)p, n, (char *)got, 0, &grest, &gbad);
  CHECK(glen == wlen && memcmp(got, want, wlen) == 0);
  CHECK(grest == wrest && gbad == wbad && grest <= 3);
  CHECK(sbx_utf8_incomplete_suffix((const char *)p, n) == grest);

  /* Chunk by chunk with the rest carried, then a final take: the text is
  ** the whole's, however the bytes arrived. */
  while (off < n) {
    size_t m = fuzz_cuts_next(cuts, n - off);
    memcpy(in + carry, p + off, m);
    glen = sbx_utf8_repair((const char *)in, carry + m, (char *)acc + alen, 0, &grest, &gbad);
    CHECK(grest <= 3 && grest <= carry + m);
    alen += glen;
    memmove(in, in + carry + m - grest, grest);
    carry = grest;
    off += m;
  }
  alen += sbx_utf8_repair((const char *)in, carry, (char *)acc + alen, 1, &grest, &gbad);
  wlen = ref_repair(p, n, want, 1, &wrest, &wbad);
  CHECK(alen == wlen && memcmp(acc, want, wlen) == 0);

  free(want);
  free(got);
  free(acc);
  free(in);
}

/* head_cut and tail_cut at a point of valid text leave valid text. */
static void
check_cuts(const unsigned char *p, size_t n, size_t at)
{
  unsigned char *v = fuzz_alloc(3 * n + 1);
  size_t vlen, k, i;
  vlen = sbx_utf8_sanitize((const char *)p, n, (char *)v, 1, NULL);
  at = vlen ? at % (vlen + 1) : 0;
  k = sbx_utf8_incomplete_suffix((const char *)v, at);
  CHECK(k <= 3 && k <= at);
  CHECK(ref_valid(v, at - k));
  k = sbx_utf8_lead_continuations((const char *)v + at, vlen - at);
  CHECK(k <= 3 && k <= vlen - at);
  for (i = 0; i < k; i++)
    CHECK((v[at + i] & 0xC0) == 0x80);
  CHECK(ref_valid(v + at + k, vlen - at - k));
  /* On any bytes: tail_cut drops continuation bytes only, and all of them
  ** up to three. */
  k = sbx_utf8_lead_continuations((const char *)p, n);
  for (i = 0; i < k; i++)
    CHECK((p[i] & 0xC0) == 0x80);
  CHECK(k == n || k == 3 || (p[k] & 0xC0) != 0x80);
  free(v);
}

static void
check_capture(const unsigned char *p, size_t n, size_t head_cap, size_t tail_cap, struct fuzz_cuts *cuts,
              size_t probe)
{
  struct sbx_capture c;
  size_t off = 0, head_len, tail_len, tail_off, i;
  char *tail = fuzz_alloc(tail_cap), *buf;
  sbx_capture_init(&c, head_cap, tail_cap);
  while (off < n) {
    size_t m = fuzz_cuts_next(cuts, n - off);
    CHECK(sbx_capture_add(&c, (const char *)p + off, m) == 0);
    off += m;
    CHECK(c.head_alloc <= head_cap && c.tail_len <= tail_cap);
  }
  head_len = n < head_cap ? n : head_cap;
  tail_len = n - head_len < tail_cap ? n - head_len : tail_cap;
  tail_off = n - tail_len;
  CHECK(c.total == n && c.head_len == head_len && c.tail_len == tail_len);
  CHECK(head_len == 0 || memcmp(c.head, p, head_len) == 0);
  CHECK(sbx_capture_omitted(&c) == n - head_len - tail_len);
  CHECK(sbx_capture_tail_offset(&c) == tail_off);
  sbx_capture_copy_tail(&c, tail);
  CHECK(tail_len == 0 || memcmp(tail, p + tail_off, tail_len) == 0);

  /* read_at from a few offsets, in and around both parts and the gap. */
  buf = fuzz_alloc(n + 8);
  for (i = 0; i < 8; i++) {
    const size_t offs[8] = {
      0, head_len, tail_off, n, n + 3, probe % (n + 1), head_len ? head_len - 1 : 0, (probe >> 8) % (n + 1)
    };
    uint64_t skipped = 99;
    size_t max = 1 + (probe >> (i + 4)) % (n + 4), start, run, got;
    got = sbx_capture_read_at(&c, offs[i], buf, max, &skipped);
    start = offs[i] + (size_t)skipped;
    /* The run of kept bytes from start: head (and the tail right after it
    ** when nothing was dropped between), or the tail. */
    if (start < head_len)
      run = head_len - start + (tail_off == head_len ? tail_len : 0);
    else if (start >= tail_off && start < n)
      run = n - start;
    else
      run = 0;
    CHECK(got == (run < max ? run : max));
    CHECK(got == 0 || memcmp(buf, p + start, got) == 0);
    if (offs[i] >= head_len && offs[i] < tail_off)
      CHECK(skipped == tail_off - offs[i]);
    else
      CHECK(skipped == 0);
  }
  free(buf);
  free(tail);
  sbx_capture_free(&c);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct fuzz_cuts cuts;
  size_t n = fuzz_cuts_init(&cuts, data, size), head_cap, tail_cap, probe;
  const unsigned char *p;
  if (n < 2)
    return 0;
  head_cap = data[0] % 64;
  tail_cap = data[1] % 64;
  probe = (size_t)data[0] << 8 | data[1];
  p = data + 2;
  n -= 2;
  check_repair(p, n, &cuts);
  cuts.next = 0;
  check_cuts(p, n, probe);
  cuts.next = 0;
  check_capture(p, n, head_cap, tail_cap, &cuts, probe);
  return 0;
}

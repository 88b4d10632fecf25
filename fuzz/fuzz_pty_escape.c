/* needs: nothing */
/*
** The escaping for the SSM agent's PTY reader (src/pty_escape.c).
** Input: the payload (and the chunk control bytes of fuzz.h). Checks:
**   - the encoding never contains EF BF BD, every EF in it is followed by
**     30, and its length is n plus the number of EFs;
**   - decoding it, whole or in input-chosen chunks, gives the input back
**     and ends with nothing pending;
**   - decoding the raw input as if it were an encoding either refuses at
**     an EF not followed by 30, or succeeds, and then encoding what it gave
**     reproduces the input (minus a pending last EF).
*/
#include "fuzz.h"
#include "pty_escape.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct fuzz_cuts cuts;
  struct sbx_pty_unescape d;
  size_t n = fuzz_cuts_init(&cuts, data, size), elen, olen, got, off = 0, efs = 0, i;
  unsigned char *enc = fuzz_alloc(2 * n + 1), *out = fuzz_alloc(2 * n + 1), *re = fuzz_alloc(2 * n + 1);
  int rc;

  for (i = 0; i < n; i++)
    efs += data[i] == 0xEF;
  elen = sbx_pty_escape(data, n, enc);
  CHECK(elen == n + efs);
  for (i = 0; i + 2 < elen; i++)
    CHECK(!(enc[i] == 0xEF && enc[i + 1] == 0xBF && enc[i + 2] == 0xBD));
  for (i = 0; i < elen; i++)
    if (enc[i] == 0xEF)
      CHECK(i + 1 < elen && enc[i + 1] == 0x30);

  sbx_pty_unescape_init(&d);
  CHECK(sbx_pty_unescape(&d, enc, elen, out, &olen) == 0);
  CHECK(olen == n && memcmp(out, data, n) == 0 && sbx_pty_unescape_done(&d));

  sbx_pty_unescape_init(&d);
  olen = 0;
  while (off < elen) {
    size_t m = fuzz_cuts_next(&cuts, elen - off);
    CHECK(sbx_pty_unescape(&d, enc + off, m, out + olen, &got) == 0);
    CHECK(got <= m);
    olen += got;
    off += m;
  }
  CHECK(olen == n && memcmp(out, data, n) == 0 && sbx_pty_unescape_done(&d));

  sbx_pty_unescape_init(&d);
  rc = sbx_pty_unescape(&d, data, n, out, &olen);
  CHECK(olen <= n);
  if (rc == 0) {
    size_t want = n - (sbx_pty_unescape_done(&d) ? 0 : 1);
    CHECK(sbx_pty_escape(out, olen, re) == want && memcmp(re, data, want) == 0);
  }
  else {
    int found = 0;
    for (i = 0; i + 1 < n; i++)
      found |= data[i] == 0xEF && data[i + 1] != 0x30;
    CHECK(rc == -1 && found);
  }
  free(enc);
  free(out);
  free(re);
  return 0;
}

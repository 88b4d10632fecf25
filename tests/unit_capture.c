/* needs: nothing */
/* Unit tests for the pure capture and UTF-8 code (TAP output). */
#include "capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n, failed;

static void
ok(int cond, const char *name)
{
  n++;
  if (!cond)
    failed++;
  printf("%sok %d - %s\n", cond ? "" : "not ", n, name);
}

int
main(void)
{
  struct sbx_capture c;
  char buf[4096];
  uint64_t skipped;
  size_t got, rest, i;

  sbx_capture_init(&c, 4, 6);
  sbx_capture_add(&c, "abcdefghij", 10);
  ok(c.head_len == 4 && memcmp(c.head, "abcd", 4) == 0, "head keeps the first bytes");
  sbx_capture_copy_tail(&c, buf);
  ok(c.tail_len == 6 && memcmp(buf, "efghij", 6) == 0, "tail keeps the last bytes");
  sbx_capture_add(&c, "klm", 3);
  sbx_capture_copy_tail(&c, buf);
  ok(memcmp(buf, "hijklm", 6) == 0, "ring wraps in order");
  ok(c.total == 13 && sbx_capture_omitted(&c) == 3, "counts what it dropped");
  got = sbx_capture_read_at(&c, 0, buf, 100, &skipped);
  ok(got == 4 && skipped == 0 && memcmp(buf, "abcd", 4) == 0, "read_at from 0 stops at the gap");
  got = sbx_capture_read_at(&c, 4, buf, 100, &skipped);
  ok(skipped == 3 && got == 6 && memcmp(buf, "hijklm", 6) == 0, "read_at reports the gap");
  got = sbx_capture_read_at(&c, 11, buf, 100, &skipped);
  ok(skipped == 0 && got == 2 && memcmp(buf, "lm", 2) == 0, "read_at inside the tail");
  sbx_capture_free(&c);

  /* A flood through a small capture: memory stays at head + tail. */
  sbx_capture_init(&c, 1024, 1024);
  memset(buf, 'x', sizeof buf);
  for (i = 0; i < 100000; i++)
    sbx_capture_add(&c, buf, sizeof buf);
  ok(c.total == 100000ull * sizeof buf && c.head_alloc <= 1024, "400 MB counted in 2 KiB");
  sbx_capture_free(&c);

  /* A finished capture shrinks to what it keeps; reads are unchanged. */
  sbx_capture_init(&c, 1024, 4096);
  sbx_capture_add(&c, "0123456789", 10);
  sbx_capture_compact(&c);
  ok(sbx_capture_held(&c) == 10 && c.tail == NULL, "a short capture keeps 10 bytes, not 1 KiB");
  got = sbx_capture_read_at(&c, 0, buf, 100, &skipped);
  ok(got == 10 && memcmp(buf, "0123456789", 10) == 0, "and reads the same");
  sbx_capture_free(&c);
  sbx_capture_init(&c, 4, 1000);
  sbx_capture_add(&c, "abcdefghij", 10);
  sbx_capture_compact(&c);
  ok(sbx_capture_held(&c) == 10 && c.tail_len == 6, "a tail that never filled its ring shrinks to its bytes");
  got = sbx_capture_read_at(&c, 0, buf, 100, &skipped);
  ok(got == 10 && memcmp(buf, "abcdefghij", 10) == 0, "head and tail read the same after compacting");
  got = sbx_capture_read_at(&c, 4, buf, 100, &skipped);
  ok(skipped == 0 && got == 6 && memcmp(buf, "efghij", 6) == 0, "tail reads the same after compacting");
  sbx_capture_free(&c);
  sbx_capture_init(&c, 2, 4);
  sbx_capture_add(&c, "abcdefghi", 9);
  sbx_capture_add(&c, "jk", 2);
  sbx_capture_compact(&c);
  sbx_capture_copy_tail(&c, buf);
  ok(sbx_capture_held(&c) == 6 && memcmp(buf, "hijk", 4) == 0, "a wrapped ring stays in order");
  sbx_capture_free(&c);
  ok(sbx_capture_held(&c) == 0 && c.total == 11, "freed: nothing held, the count stays");

  /* UTF-8 */
  {
    const char *s = "h\xC3\xA9llo \xE2\x82\xAC";
    char out[64];
    size_t o = sbx_utf8_sanitize(s, strlen(s), out, 1, &rest);
    ok(o == strlen(s) && memcmp(out, s, o) == 0, "valid UTF-8 passes unchanged");
    o = sbx_utf8_sanitize("a\xFF"
                          "b",
                          3, out, 1, &rest);
    ok(o == 5 && memcmp(out,
                        "a\xEF\xBF\xBD"
                        "b",
                        5) == 0,
       "an invalid byte becomes U+FFFD");
    o = sbx_utf8_sanitize("ab\xE2\x82", 4, out, 0, &rest);
    ok(o == 2 && rest == 2, "an incomplete sequence is held back when not final");
    o = sbx_utf8_sanitize("ab\xE2\x82", 4, out, 1, &rest);
    ok(o == 5 && memcmp(out + 2, "\xEF\xBF\xBD", 3) == 0, "and replaced once when final");
    o = sbx_utf8_sanitize("\xED\xA0\x80", 3, out, 1, &rest);
    ok(o == 9, "surrogates are invalid");
    o = sbx_utf8_sanitize("\xC0\xAF", 2, out, 1, &rest);
    ok(o == 6, "overlong encodings are invalid");
    ok(sbx_utf8_incomplete_suffix("ab\xE2\x82", 4) == 2, "incomplete suffix found");
    ok(sbx_utf8_incomplete_suffix("ab\xE2\x82\xAC", 5) == 0, "complete end has no suffix");
    ok(sbx_utf8_lead_continuations("\x82\xAC"
                                   "ab",
                                   4) == 2,
       "leading continuation bytes found");
  }
  printf("1..%d\n", n);
  return failed ? 1 : 0;
}

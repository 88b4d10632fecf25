/* needs: nothing */
/* Unit tests for the escaping through the SSM agent's PTY reader (TAP). */
#include "pty_escape.h"

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

/* The agent's rewrite (amazon-ssm-agent shell.go, processStdoutData): every
** valid EF BF BD leaves as a lone EF. */
static size_t
agent_rewrite(const unsigned char *p, size_t len, unsigned char *o)
{
  size_t i = 0, k = 0;
  while (i < len) {
    if (i + 2 < len && p[i] == 0xEF && p[i + 1] == 0xBF && p[i + 2] == 0xBD) {
      o[k++] = 0xEF;
      i += 3;
    }
    else {
      o[k++] = p[i++];
    }
  }
  return k;
}

int
main(void)
{
  unsigned char in[4096], enc[8192], out[8192], agent[8192];
  struct sbx_pty_unescape d;
  size_t elen, olen, alen, i;
  unsigned seed = 16;

  elen = sbx_pty_escape("a\xef\xbf\xbd"
                        "b",
                        5, enc);
  ok(elen == 6 && memcmp(enc,
                         "a\xef"
                         "0\xbf\xbd"
                         "b",
                         6) == 0,
     "EF becomes EF 30, other bytes stay");
  alen = agent_rewrite(enc, elen, agent);
  ok(alen == elen && memcmp(agent, enc, elen) == 0,
     "the agent's rewrite leaves the encoding of U+FFFD alone");
  sbx_pty_unescape_init(&d);
  ok(sbx_pty_unescape(&d, agent, alen, out, &olen) == 0 && olen == 5 &&
       memcmp(out,
              "a\xef\xbf\xbd"
              "b",
              5) == 0,
     "decoding after the agent gives U+FFFD back");

  /* Without the escaping the same bytes lose two. */
  alen = agent_rewrite((const unsigned char *)"a\xef\xbf\xbd"
                                              "b",
                       5, agent);
  ok(alen == 3, "unescaped, the agent turns EF BF BD into EF (what the escaping is for)");

  /* Every byte value, many times, through the agent's rewrite. */
  for (i = 0; i < sizeof in; i++) {
    seed = seed * 1103515245u + 12345u;
    in[i] = (i % 7 == 0) ? 0xEF : (i % 7 == 1) ? 0xBF : (i % 7 == 2) ? 0xBD : (unsigned char)(seed >> 16);
  }
  elen = sbx_pty_escape(in, sizeof in, enc);
  alen = agent_rewrite(enc, elen, agent);
  sbx_pty_unescape_init(&d);
  ok(alen == elen && sbx_pty_unescape(&d, agent, alen, out, &olen) == 0 && olen == sizeof in &&
       memcmp(out, in, sizeof in) == 0 && sbx_pty_unescape_done(&d),
     "4096 bytes dense in EF BF BD survive the agent");

  /* An EF split from its 30 across chunks. */
  sbx_pty_unescape_init(&d);
  ok(sbx_pty_unescape(&d, "x\xef", 2, out, &olen) == 0 && olen == 1 && !sbx_pty_unescape_done(&d),
     "an EF at a chunk's end waits");
  ok(sbx_pty_unescape(&d, "0y", 2, out, &olen) == 0 && olen == 2 && memcmp(out, "\xefy", 2) == 0 &&
       sbx_pty_unescape_done(&d),
     "its 30 in the next chunk completes it");

  /* What the agent does to raw U+FFFD is caught, not decoded wrongly. */
  sbx_pty_unescape_init(&d);
  ok(sbx_pty_unescape(&d,
                      "ab\xef"
                      "c",
                      4, out, &olen) == -1 &&
       olen == 2,
     "an EF followed by another byte is refused, after the bytes before it");

  printf("1..%d\n", n);
  return failed ? 1 : 0;
}

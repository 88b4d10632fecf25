/* needs: nothing */
/*
** The SigV4 canonicaliser (src/sigv4.c) on arbitrary requests. Input: a
** flags byte, then NUL-separated fields: method, path, query, header name
** and value pairs, and a body when one field is left over. Checked:
**   - canonical URI: starts with '/', only unreserved bytes, '/' and %XX
**     (upper-case hex) when encoded, no empty, "." or ".." segment when
**     normalised; normalising is idempotent, and encoding is a percent-
**     encoding of the unencoded form;
**   - canonical query: name=value pairs joined by '&', each byte unreserved
**     or %XX, sorted by name then value, one pair per non-empty parameter;
**     canonicalising it again changes nothing;
**   - canonical headers: accepted exactly when every name is a token and
**     every value a field value; lower-case names in strictly ascending
**     order, the signed-header list naming the same, values trimmed with no
**     runs of whitespace;
**   - signing: deterministic, its canonical request built from those
**     pieces, its signature 64 hex digits found in the Authorization (or
**     the presigned query), and no output ever holds the secret key.
*/
#define _GNU_SOURCE /* memmem */
#include "fuzz.h"
#include "sigv4.h"

#include <string.h>

#define SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define MAX_HEADERS 16

static int
unreserved(unsigned char c)
{
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '~';
}

static int
upper_hex(unsigned char c)
{
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
}

/* Every byte of s[0..n) unreserved, one of extra, or a %XX escape. */
static int
encoded_ok(const char *s, size_t n, const char *extra)
{
  size_t i;
  for (i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (unreserved(c) || (c && strchr(extra, c)))
      continue;
    if (c != '%' || i + 2 >= n || !upper_hex((unsigned char)s[i + 1]) || !upper_hex((unsigned char)s[i + 2]))
      return 0;
    i += 2;
  }
  return 1;
}

static int
hexval(char c)
{
  return c <= '9' ? c - '0' : c - 'A' + 10;
}

/* Percent-decodes an output of encoded_ok into a new string. */
static char *
decode(const char *s)
{
  size_t n = strlen(s), i, o = 0;
  char *out = fuzz_alloc(n + 1);
  for (i = 0; i < n; i++) {
    if (s[i] == '%') {
      out[o++] = (char)(hexval(s[i + 1]) << 4 | hexval(s[i + 2]));
      i += 2;
    }
    else
      out[o++] = s[i];
  }
  out[o] = '\0';
  return out;
}

/* flags: 0 or NO_NORMALIZE; each is tried with and without encoding. */
static void
check_uri(const char *path, unsigned flags)
{
  char *enc = NULL, *raw = NULL, *again = NULL, *dec;
  int rc = sbx_sigv4_canonical_uri(path, flags, &enc);
  int rc2 = sbx_sigv4_canonical_uri(path, flags | SBX_SIGV4_NO_ENCODE_PATH, &raw);
  CHECK((rc == 0) == (!*path || path[0] == '/'));
  CHECK(rc2 == rc);
  if (rc) {
    CHECK(rc == SBX_SIGV4_EINVAL && enc == NULL && raw == NULL);
    return;
  }
  CHECK(enc[0] == '/' && raw[0] == '/');
  CHECK(encoded_ok(enc, strlen(enc), "/"));
  /* Percent-decoding the encoded form gives the unencoded one. */
  dec = decode(enc);
  CHECK(strcmp(dec, raw) == 0);
  free(dec);
  if (!(flags & SBX_SIGV4_NO_NORMALIZE)) {
    CHECK(strstr(raw, "//") == NULL);
    CHECK(strstr(raw, "/./") == NULL && strstr(raw, "/../") == NULL);
    CHECK(strcmp(raw, "/.") != 0 && strcmp(raw, "/..") != 0);
    {
      size_t n = strlen(raw);
      CHECK(!(n >= 2 && strcmp(raw + n - 2, "/.") == 0));
      CHECK(!(n >= 3 && strcmp(raw + n - 3, "/..") == 0));
    }
    CHECK(sbx_sigv4_canonical_uri(raw, SBX_SIGV4_NO_ENCODE_PATH, &again) == 0);
    CHECK(strcmp(again, raw) == 0);
    free(again);
  }
  else
    CHECK(strcmp(raw, *path ? path : "/") == 0);
  free(enc);
  free(raw);
}

static int
pair_cmp(const char *a, size_t an, const char *b, size_t bn)
{
  /* By name, then by value: the name is what comes before '='. */
  const char *ae = memchr(a, '=', an), *be = memchr(b, '=', bn);
  size_t ak = (size_t)(ae - a), bk = (size_t)(be - b), m = ak < bk ? ak : bk;
  int c = memcmp(a, b, m);
  if (c || ak != bk)
    return c ? c : ak < bk ? -1 : 1;
  m = an - ak < bn - bk ? an - ak : bn - bk;
  c = memcmp(ae, be, m);
  return c ? c : an - ak == bn - bk ? 0 : an - ak < bn - bk ? -1 : 1;
}

static void
check_query(const char *query)
{
  char *q = NULL, *q2 = NULL, *again = NULL;
  const char *p, *prev = NULL;
  size_t prev_len = 0, pairs = 0, params = 0;
  CHECK(sbx_sigv4_canonical_query(query, &q) == 0);
  CHECK(sbx_sigv4_canonical_query(query, &q2) == 0);
  CHECK(strcmp(q, q2) == 0);
  for (p = query; *p;) {
    const char *amp = strchr(p, '&');
    size_t len = amp ? (size_t)(amp - p) : strlen(p);
    params += len > 0;
    p += len + (amp != NULL);
  }
  for (p = q; *p;) {
    const char *amp = strchr(p, '&'), *eq;
    size_t len = amp ? (size_t)(amp - p) : strlen(p);
    eq = memchr(p, '=', len);
    CHECK(eq != NULL && memchr(eq + 1, '=', len - (size_t)(eq - p) - 1) == NULL);
    CHECK(encoded_ok(p, (size_t)(eq - p), ""));
    CHECK(encoded_ok(eq + 1, len - (size_t)(eq - p) - 1, ""));
    if (prev)
      CHECK(pair_cmp(prev, prev_len, p, len) <= 0);
    prev = p;
    prev_len = len;
    pairs++;
    if (!amp)
      break;
    p = amp + 1;
    CHECK(*p != '\0');
  }
  CHECK(pairs == params);
  CHECK(sbx_sigv4_canonical_query(q, &again) == 0);
  CHECK(strcmp(again, q) == 0);
  free(q);
  free(q2);
  free(again);
}

static int
tchar(unsigned char c)
{
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int
field_value_ok(const char *v)
{
  for (; *v; v++) {
    unsigned char c = (unsigned char)*v;
    if (c == '\r' && v[1] == '\n')
      c = (unsigned char)*++v;
    if (c == '\n') {
      if (v[1] != ' ' && v[1] != '\t')
        return 0;
    }
    else if ((c < 0x20 && c != '\t') || c == 0x7f)
      return 0;
  }
  return 1;
}

static void
check_headers(const struct sbx_sigv4_header *h, size_t n)
{
  char *canon = NULL, *signed_h = NULL, *line, *s;
  size_t i;
  int ok = 1, rc;
  for (i = 0; i < n; i++) {
    const char *k;
    ok &= h[i].name[0] != '\0' && field_value_ok(h[i].value);
    for (k = h[i].name; *k; k++)
      ok &= tchar((unsigned char)*k);
  }
  rc = sbx_sigv4_canonical_headers(h, n, &canon, &signed_h);
  CHECK(ok ? rc == 0 : rc == SBX_SIGV4_EINVAL);
  if (rc)
    return;
  /* Walk the lines and the signed list side by side. */
  line = canon;
  s = signed_h;
  while (*line) {
    char *nl = strchr(line, '\n'), *colon = strchr(line, ':'), *k, *v;
    size_t nlen;
    CHECK(nl != NULL && colon != NULL && colon < nl && colon > line);
    nlen = (size_t)(colon - line);
    for (k = line; k < colon; k++)
      CHECK(tchar((unsigned char)*k) && !(*k >= 'A' && *k <= 'Z'));
    CHECK(strncmp(s, line, nlen) == 0 && (s[nlen] == ';' || s[nlen] == '\0'));
    for (v = colon + 1; v < nl; v++)
      CHECK(*v != '\r' && *v != '\t' && *v != '\n' &&
            !(*v == ' ' && (v == colon + 1 || v + 1 == nl || v[1] == ' ')));
    s += nlen + (s[nlen] == ';');
    if (nl[1]) {
      /* The next name sorts strictly after this one. */
      char *next = nl + 1, *nc = strchr(next, ':');
      size_t m = (size_t)(nc - next) < nlen ? (size_t)(nc - next) : nlen;
      int c = memcmp(line, next, m);
      CHECK(c < 0 || (c == 0 && nlen < (size_t)(nc - next)));
    }
    line = nl + 1;
  }
  CHECK(*s == '\0');
  free(canon);
  free(signed_h);
}

/* No field of r holds the secret key. */
static void
check_secret(const struct sbx_sigv4_result *r)
{
  const char *f[] = { r->canonical_request, r->string_to_sign, r->credential_scope, r->signed_headers,
                      r->payload_hash,      r->signature,      r->authorization,    r->query };
  size_t i;
  for (i = 0; i < sizeof f / sizeof f[0]; i++)
    CHECK(!f[i] || strstr(f[i], SECRET) == NULL);
}

/* Set when the input itself holds the secret (then outputs may too). */
static int secret_in_input;

static void
check_sign(const char *method, const char *path, const char *query, const struct sbx_sigv4_header *h,
           size_t n, unsigned flags, const char *body)
{
  struct sbx_sigv4_config cfg;
  struct sbx_sigv4_request req;
  struct sbx_sigv4_result r1, r2;
  char *uri = NULL, *q = NULL, hex[65];
  size_t i;
  int rc1, rc2;
  memset(&cfg, 0, sizeof cfg);
  memset(&req, 0, sizeof req);
  cfg.access_key = "AKIDEXAMPLE";
  cfg.secret_key = SECRET;
  cfg.session_token = flags & 0x40 ? "token/with+odd=bytes" : NULL;
  cfg.region = "us-east-1";
  cfg.service = "service";
  cfg.amz_date = "20150830T123600Z";
  cfg.flags = flags & 0x1f;
  cfg.expires = 3600;
  req.method = method;
  req.path = path;
  req.query = query;
  req.headers = h;
  req.nheaders = n;
  req.body = body;
  req.body_len = strlen(body);
  rc1 = sbx_sigv4_sign(&req, &cfg, &r1);
  rc2 = sbx_sigv4_sign(&req, &cfg, &r2);
  CHECK(rc1 == rc2);
  if (rc1) {
    CHECK(r1.canonical_request == NULL && r1.authorization == NULL);
    CHECK(strcmp(sbx_sigv4_strerror(rc1), "unknown error") != 0);
    return;
  }
  CHECK(strcmp(r1.canonical_request, r2.canonical_request) == 0);
  CHECK(strcmp(r1.signature, r2.signature) == 0);
  CHECK(strlen(r1.signature) == 64);
  for (i = 0; i < 64; i++)
    CHECK((r1.signature[i] >= '0' && r1.signature[i] <= '9') ||
          (r1.signature[i] >= 'a' && r1.signature[i] <= 'f'));
  /* method \n uri \n query \n ...: the pieces checked above. */
  CHECK(sbx_sigv4_canonical_uri(path, cfg.flags, &uri) == 0);
  {
    size_t ml = strlen(method), ul = strlen(uri);
    CHECK(strncmp(r1.canonical_request, method, ml) == 0 && r1.canonical_request[ml] == '\n');
    CHECK(strncmp(r1.canonical_request + ml + 1, uri, ul) == 0 && r1.canonical_request[ml + 1 + ul] == '\n');
    if (!(cfg.flags & SBX_SIGV4_PRESIGN)) {
      CHECK(sbx_sigv4_canonical_query(query, &q) == 0);
      CHECK(strncmp(r1.canonical_request + ml + ul + 2, q, strlen(q)) == 0);
      CHECK(r1.canonical_request[ml + ul + 2 + strlen(q)] == '\n');
    }
  }
  /* The string to sign ends with the hash of the canonical request. */
  CHECK(sbx_sigv4_sha256_hex(r1.canonical_request, strlen(r1.canonical_request), hex) == 0);
  CHECK(strlen(r1.string_to_sign) > 64 &&
        strcmp(r1.string_to_sign + strlen(r1.string_to_sign) - 64, hex) == 0);
  if (cfg.flags & SBX_SIGV4_PRESIGN) {
    CHECK(r1.authorization == NULL && r1.query != NULL);
    CHECK(strlen(r1.query) > 64 && strcmp(r1.query + strlen(r1.query) - 64, r1.signature) == 0);
  }
  else {
    CHECK(r1.query == NULL && r1.authorization != NULL);
    CHECK(strstr(r1.authorization, r1.signature) != NULL);
  }
  if (!secret_in_input)
    check_secret(&r1);
  free(uri);
  free(q);
  sbx_sigv4_result_free(&r1);
  sbx_sigv4_result_free(&r2);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct sbx_sigv4_header h[MAX_HEADERS + 1];
  const char *field[3 + 2 * MAX_HEADERS];
  char *copy;
  size_t nf = 0, i, nh, start = 1;
  unsigned flags;
  if (size < 1)
    return 0;
  flags = data[0];
  secret_in_input = memmem(data, size, SECRET, strlen(SECRET)) != NULL;
  /* NUL-separated fields in a NUL-terminated copy. */
  copy = fuzz_alloc(size + 1);
  memcpy(copy, data, size);
  copy[size] = '\0';
  for (i = 1; i <= size && nf < sizeof field / sizeof field[0]; i++)
    if (copy[i] == '\0') {
      field[nf++] = copy + start;
      start = i + 1;
    }
  while (nf < 3)
    field[nf++] = "";
  nh = (nf - 3) / 2;
  for (i = 0; i < nh; i++) {
    h[i].name = field[3 + 2 * i];
    h[i].value = field[4 + 2 * i];
  }

  check_uri(field[1], 0);
  check_uri(field[1], SBX_SIGV4_NO_NORMALIZE);
  check_query(field[2]);
  check_headers(h, nh);
  /* Signing needs a Host; add one unless the input has its own. */
  if (!(flags & 0x80)) {
    h[nh].name = "Host";
    h[nh].value = "example.amazonaws.com";
    nh++;
  }
  check_sign(*field[0] ? field[0] : "GET", field[1], field[2], h, nh, flags,
             (nf - 3) % 2 ? field[nf - 1] : "");
  free(copy);
  return 0;
}

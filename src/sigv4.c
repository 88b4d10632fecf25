/*
** AWS Signature Version 4. The C part is pure (no I/O, no clock); the Lua
** binding at the end (sbx_open_sigv4) adds the current time as a default.
** The rules follow the aws-c-auth suite and botocore: see sigv4.h.
*/
#include "sigv4.h"

#include <lua.h>
#include <lauxlib.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIGV4_MAX_TEXT ((size_t)16 << 20) /* cap on any string we build */

const char *
sbx_sigv4_strerror(int code)
{
  switch (code) {
#define SBX_SIGV4_TEXT(name, num, text)                                                                      \
  case (num):                                                                                                \
    return (text);
    SBX_SIGV4_ERRORS(SBX_SIGV4_TEXT)
#undef SBX_SIGV4_TEXT
  case 0:
    return "success";
  default:
    return "unknown error";
  }
}

/* {====== growable string with a sticky error (curl dynbuf style) */

struct buf {
  char *p;
  size_t len, cap;
  int err; /* first failure; later appends do nothing */
};

static void
buf_add(struct buf *b, const char *s, size_t n)
{
  if (b->err)
    return;
  if (n > SIGV4_MAX_TEXT - b->len) {
    b->err = SBX_SIGV4_E2BIG;
    return;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 128;
    char *p;
    while (cap < b->len + n + 1)
      cap *= 2;
    p = realloc(b->p, cap);
    if (!p) {
      b->err = SBX_SIGV4_ENOMEM;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  if (n)
    memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void
buf_str(struct buf *b, const char *s)
{
  buf_add(b, s, strlen(s));
}

static void
buf_free(struct buf *b)
{
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* Hands the string over in *out (an empty one if nothing was added), or
** frees it and returns the error. */
static int
buf_take(struct buf *b, char **out)
{
  int rc;
  buf_add(b, "", 0);
  rc = b->err;
  if (rc) {
    buf_free(b);
    return rc;
  }
  *out = b->p;
  memset(b, 0, sizeof *b);
  return 0;
}

/* }====== */

/* {====== character classes and encoding */

static int
is_unreserved(unsigned char c)
{
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '~';
}

/* RFC 9110 tchar: what a method or a header name may contain. */
static int
is_tchar(unsigned char c)
{
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int
is_token(const char *s)
{
  if (!s || !*s)
    return 0;
  for (; *s; s++)
    if (!is_tchar((unsigned char)*s))
      return 0;
  return 1;
}

/* Non-empty, printable ASCII, no space and none of the bytes in bad. */
static int
is_plain(const char *s, const char *bad)
{
  if (!s || !*s)
    return 0;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c <= 0x20 || c >= 0x7f || strchr(bad, c))
      return 0;
  }
  return 1;
}

static int
is_ws(unsigned char c)
{
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* A header value: no control bytes except HTAB, and line breaks only as
** obs-fold ("\n" or "\r\n" followed by SP or HTAB), so nothing can end
** the header early. */
static int
is_field_value(const char *s)
{
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '\r' && s[1] == '\n')
      c = (unsigned char)*++s;
    if (c == '\n') {
      if (s[1] != ' ' && s[1] != '\t')
        return 0;
    }
    else if ((c < 0x20 && c != '\t') || c == 0x7f)
      return 0;
  }
  return 1;
}

static int
lower(int c)
{
  return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
}

static int
ci_equal(const char *a, const char *b)
{
  for (; *a && *b; a++, b++)
    if (lower((unsigned char)*a) != lower((unsigned char)*b))
      return 0;
  return *a == *b;
}

/* Appends s[0..n) with every byte outside the unreserved set (and '/'
** when keep_slash) as %XX, upper-case hex. */
static void
buf_encode(struct buf *b, const char *s, size_t n, int keep_slash)
{
  static const char hex[] = "0123456789ABCDEF";
  size_t i, run = 0;
  char esc[3];
  for (i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (is_unreserved(c) || (keep_slash && c == '/'))
      continue;
    buf_add(b, s + run, i - run);
    esc[0] = '%';
    esc[1] = hex[c >> 4];
    esc[2] = hex[c & 15];
    buf_add(b, esc, 3);
    run = i + 1;
  }
  buf_add(b, s + run, n - run);
}

static int
hexval(unsigned char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  c = (unsigned char)lower(c);
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

/* Appends s[0..n) percent-decoded. A '%' not followed by two hex digits
** stays as it is; '+' stays a plus (SigV4 is not form decoding). */
static void
buf_decode(struct buf *b, const char *s, size_t n)
{
  size_t i, run = 0;
  for (i = 0; i < n; i++) {
    int hi, lo;
    char c;
    if (s[i] != '%' || i + 2 >= n)
      continue;
    hi = hexval((unsigned char)s[i + 1]);
    lo = hexval((unsigned char)s[i + 2]);
    if (hi < 0 || lo < 0)
      continue;
    buf_add(b, s + run, i - run);
    c = (char)(hi << 4 | lo);
    buf_add(b, &c, 1);
    i += 2;
    run = i + 1;
  }
  buf_add(b, s + run, n - run);
}

static void
hex_of(const unsigned char *p, size_t n, char *out)
{
  static const char hex[] = "0123456789abcdef";
  size_t i;
  for (i = 0; i < n; i++) {
    out[2 * i] = hex[p[i] >> 4];
    out[2 * i + 1] = hex[p[i] & 15];
  }
  out[2 * n] = '\0';
}

/* }====== */

/* {====== hashing */

int
sbx_sigv4_sha256_hex(const void *p, size_t n, char hex[65])
{
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (!p && n)
    return SBX_SIGV4_EINVAL;
  if (!EVP_Digest(p ? p : "", n, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
    return SBX_SIGV4_ECRYPTO;
  hex_of(md, 32, hex);
  return 0;
}

/* out = HMAC-SHA256(key, msg); 32 bytes. */
static int
hmac(const void *key, size_t keylen, const char *msg, size_t n, unsigned char out[32])
{
  unsigned int outlen = 0;
  if (keylen > INT_MAX)
    return SBX_SIGV4_EINVAL;
  if (!HMAC(EVP_sha256(), key, (int)keylen, (const unsigned char *)msg, n, out, &outlen) || outlen != 32)
    return SBX_SIGV4_ECRYPTO;
  return 0;
}

int
sbx_sigv4_signing_key(const char *secret_key, const char *amz_date, const char *region, const char *service,
                      unsigned char key[32])
{
  unsigned char k1[32], k2[32];
  size_t slen;
  char *ksecret;
  int rc;
  if (!secret_key || !amz_date || strlen(amz_date) < 8 || !region || !service)
    return SBX_SIGV4_EINVAL;
  slen = strlen(secret_key);
  if (slen > INT_MAX - 4)
    return SBX_SIGV4_EINVAL;
  ksecret = malloc(slen + 4);
  if (!ksecret)
    return SBX_SIGV4_ENOMEM;
  memcpy(ksecret, "AWS4", 4);
  memcpy(ksecret + 4, secret_key, slen);
  rc = hmac(ksecret, slen + 4, amz_date, 8, k1);
  if (!rc)
    rc = hmac(k1, 32, region, strlen(region), k2);
  if (!rc)
    rc = hmac(k2, 32, service, strlen(service), k1);
  if (!rc)
    rc = hmac(k1, 32, "aws4_request", 12, key);
  /* Every intermediate is as good as the secret for a day: wipe them. */
  OPENSSL_cleanse(ksecret, slen + 4);
  OPENSSL_cleanse(k1, sizeof k1);
  OPENSSL_cleanse(k2, sizeof k2);
  free(ksecret);
  if (rc)
    OPENSSL_cleanse(key, 32);
  return rc;
}

int
sbx_sigv4_signature(const unsigned char key[32], const char *msg, char hex[65])
{
  unsigned char md[32];
  int rc;
  if (!key || !msg)
    return SBX_SIGV4_EINVAL;
  rc = hmac(key, 32, msg, strlen(msg), md);
  if (!rc)
    hex_of(md, 32, hex);
  return rc;
}

/* }====== */

/* {====== canonical URI */

int
sbx_sigv4_canonical_uri(const char *path, unsigned flags, char **out)
{
  struct buf b = { 0 };
  if (!out)
    return SBX_SIGV4_EINVAL;
  if (!path || !*path)
    path = "/";
  if (path[0] != '/')
    return SBX_SIGV4_EINVAL;
  if (flags & SBX_SIGV4_NO_NORMALIZE) {
    if (flags & SBX_SIGV4_NO_ENCODE_PATH)
      buf_str(&b, path);
    else
      buf_encode(&b, path, strlen(path), 1);
    return buf_take(&b, out);
  }
  {
    /* RFC 3986 5.2.4 plus what AWS adds (botocore remove_dot_segments):
    ** empty segments go too, and a trailing '/' survives only when some
    ** segment is left. The kept segments are (offset, length) pairs. */
    size_t n = strlen(path), i = 0, nseg = 0, k;
    size_t *seg = malloc(sizeof *seg * (n + 1));
    if (!seg)
      return SBX_SIGV4_ENOMEM;
    while (i < n) {
      size_t start, len;
      while (i < n && path[i] == '/')
        i++;
      start = i;
      while (i < n && path[i] != '/')
        i++;
      len = i - start;
      if (len == 0 || (len == 1 && path[start] == '.'))
        continue;
      if (len == 2 && path[start] == '.' && path[start + 1] == '.') {
        if (nseg)
          nseg -= 2;
        continue;
      }
      seg[nseg++] = start;
      seg[nseg++] = len;
    }
    buf_add(&b, "/", 1);
    for (k = 0; k < nseg; k += 2) {
      if (k)
        buf_add(&b, "/", 1);
      if (flags & SBX_SIGV4_NO_ENCODE_PATH)
        buf_add(&b, path + seg[k], seg[k + 1]);
      else
        buf_encode(&b, path + seg[k], seg[k + 1], 0);
    }
    if (nseg && path[n - 1] == '/')
      buf_add(&b, "/", 1);
    free(seg);
  }
  return buf_take(&b, out);
}

/* }====== */

/* {====== canonical query */

struct param {
  char *s;     /* "encoded-name=encoded-value" */
  size_t klen; /* length of the name part */
};

struct params {
  struct param *v;
  size_t n, cap;
  int err;
};

/* Adds one parameter, encoding name and value; with decode they are first
** percent-decoded (they come from a raw query string). */
static void
params_add(struct params *ps, const char *k, size_t kn, const char *v, size_t vn, int decode)
{
  struct buf raw = { 0 }, enc = { 0 };
  size_t klen;
  if (ps->err)
    return;
  if (ps->n == ps->cap) {
    size_t cap = ps->cap ? 2 * ps->cap : 16;
    struct param *nv = realloc(ps->v, cap * sizeof *nv);
    if (!nv) {
      ps->err = SBX_SIGV4_ENOMEM;
      return;
    }
    ps->v = nv;
    ps->cap = cap;
  }
  if (decode) {
    buf_decode(&raw, k, kn);
    buf_add(&raw, "", 0);
    k = raw.p;
    kn = raw.len;
  }
  buf_encode(&enc, k ? k : "", kn, 0);
  klen = enc.len;
  buf_add(&enc, "=", 1);
  if (decode) {
    raw.len = 0;
    buf_decode(&raw, v, vn);
    buf_add(&raw, "", 0);
    v = raw.p;
    vn = raw.len;
  }
  buf_encode(&enc, v ? v : "", vn, 0);
  if (raw.err && !enc.err)
    enc.err = raw.err;
  buf_free(&raw);
  if (enc.err) {
    ps->err = enc.err;
    buf_free(&enc);
    return;
  }
  ps->v[ps->n].s = enc.p;
  ps->v[ps->n].klen = klen;
  ps->n++;
}

static void
params_add_raw(struct params *ps, const char *query)
{
  const char *p = query;
  while (p && *p) {
    const char *amp = strchr(p, '&'), *eq;
    size_t len = amp ? (size_t)(amp - p) : strlen(p);
    eq = memchr(p, '=', len);
    if (len) {
      if (eq)
        params_add(ps, p, (size_t)(eq - p), eq + 1, len - (size_t)(eq - p) - 1, 1);
      else
        params_add(ps, p, len, "", 0, 1);
    }
    p = amp ? amp + 1 : NULL;
  }
}

static void
params_free(struct params *ps)
{
  size_t i;
  for (i = 0; i < ps->n; i++)
    free(ps->v[i].s);
  free(ps->v);
  memset(ps, 0, sizeof *ps);
}

/* By encoded name, then by encoded value: "Param" sorts before "Param-3". */
static int
param_cmp(const void *a, const void *b)
{
  const struct param *x = a, *y = b;
  size_t m = x->klen < y->klen ? x->klen : y->klen;
  int c = memcmp(x->s, y->s, m);
  if (c)
    return c;
  if (x->klen != y->klen)
    return x->klen < y->klen ? -1 : 1;
  return strcmp(x->s + x->klen + 1, y->s + y->klen + 1);
}

static int
params_join(struct params *ps, char **out)
{
  struct buf b = { 0 };
  size_t i;
  if (ps->err)
    return ps->err;
  if (ps->n)
    qsort(ps->v, ps->n, sizeof *ps->v, param_cmp);
  for (i = 0; i < ps->n; i++) {
    if (i)
      buf_add(&b, "&", 1);
    buf_str(&b, ps->v[i].s);
  }
  return buf_take(&b, out);
}

int
sbx_sigv4_canonical_query(const char *query, char **out)
{
  struct params ps = { 0 };
  int rc;
  if (!out)
    return SBX_SIGV4_EINVAL;
  params_add_raw(&ps, query);
  rc = params_join(&ps, out);
  params_free(&ps);
  return rc;
}

/* }====== */

/* {====== canonical headers */

struct hdr {
  const char *name;
  const char *value;
  size_t idx; /* input order: keeps duplicates in order */
};

static int
hdr_cmp(const void *a, const void *b)
{
  const struct hdr *x = a, *y = b;
  const unsigned char *p = (const unsigned char *)x->name;
  const unsigned char *q = (const unsigned char *)y->name;
  for (; *p && lower(*p) == lower(*q); p++, q++)
    ;
  if (lower(*p) != lower(*q))
    return lower(*p) < lower(*q) ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Headers that hops and proxies add, drop or rewrite: never signed. */
static int
is_unsigned_header(const char *name)
{
  static const char *const skip[] = { "connection", "expect",     "keep-alive",
                                      "te",         "trailer",    "transfer-encoding",
                                      "upgrade",    "user-agent", "x-amzn-trace-id",
                                      NULL };
  size_t i;
  for (i = 0; skip[i]; i++)
    if (ci_equal(name, skip[i]))
      return 1;
  for (i = 0; i < 6; i++)
    if (lower((unsigned char)name[i]) != "proxy-"[i])
      return 0;
  return 1;
}

/* Appends a value trimmed, every run of whitespace (folds included) one
** space; quoted strings are not special. */
static void
buf_value(struct buf *b, const char *v)
{
  int space = 0, any = 0;
  for (; *v; v++) {
    if (is_ws((unsigned char)*v)) {
      space = 1;
      continue;
    }
    if (space && any)
      buf_add(b, " ", 1);
    buf_add(b, v, 1);
    space = 0;
    any = 1;
  }
}

static int
canonical_headers(const struct sbx_sigv4_header *h, size_t n, char **canon, char **signed_headers,
                  const char **why)
{
  struct buf c = { 0 }, s = { 0 };
  struct hdr *v;
  size_t i, m = 0;
  int rc;
  if ((!h && n) || !canon || !signed_headers)
    return SBX_SIGV4_EINVAL;
  if (n > SIGV4_MAX_TEXT / sizeof *v)
    return SBX_SIGV4_E2BIG;
  for (i = 0; i < n; i++) {
    if (!is_token(h[i].name)) {
      *why = "header name is empty or not an HTTP token";
      return SBX_SIGV4_EINVAL;
    }
    if (!h[i].value || !is_field_value(h[i].value)) {
      *why = "header value has control characters or a bare line break";
      return SBX_SIGV4_EINVAL;
    }
  }
  v = malloc(sizeof *v * (n ? n : 1));
  if (!v)
    return SBX_SIGV4_ENOMEM;
  for (i = 0; i < n; i++) {
    if (is_unsigned_header(h[i].name))
      continue;
    v[m].name = h[i].name;
    v[m].value = h[i].value;
    v[m].idx = i;
    m++;
  }
  if (m)
    qsort(v, m, sizeof *v, hdr_cmp);
  for (i = 0; i < m; i++) {
    const char *p;
    if (i && ci_equal(v[i - 1].name, v[i].name)) {
      /* A repeated name: its value joins the line already started. */
      buf_add(&c, ",", 1);
      buf_value(&c, v[i].value);
      continue;
    }
    if (i) {
      buf_add(&c, "\n", 1);
      buf_add(&s, ";", 1);
    }
    for (p = v[i].name; *p; p++) {
      char l = (char)lower((unsigned char)*p);
      buf_add(&c, &l, 1);
      buf_add(&s, &l, 1);
    }
    buf_add(&c, ":", 1);
    buf_value(&c, v[i].value);
  }
  if (m)
    buf_add(&c, "\n", 1);
  free(v);
  rc = buf_take(&c, canon);
  if (rc) {
    buf_free(&s);
    return rc;
  }
  rc = buf_take(&s, signed_headers);
  if (rc) {
    free(*canon);
    *canon = NULL;
  }
  return rc;
}

int
sbx_sigv4_canonical_headers(const struct sbx_sigv4_header *headers, size_t n, char **canonical,
                            char **signed_headers)
{
  const char *why = NULL;
  return canonical_headers(headers, n, canonical, signed_headers, &why);
}

int
sbx_sigv4_check_header(const char *name)
{
  if (!name)
    return SBX_SIGV4_EINVAL;
  if (ci_equal(name, "authorization") || ci_equal(name, "x-amz-date") ||
      ci_equal(name, "x-amz-security-token"))
    return SBX_SIGV4_ERESERVED;
  return 0;
}

/* }====== */

int
sbx_sigv4_string_to_sign(const char *amz_date, const char *scope, const char *canonical_request, char **out)
{
  struct buf b = { 0 };
  char hex[65];
  int rc;
  if (!amz_date || !scope || !canonical_request || !out)
    return SBX_SIGV4_EINVAL;
  rc = sbx_sigv4_sha256_hex(canonical_request, strlen(canonical_request), hex);
  if (rc)
    return rc;
  buf_str(&b, SBX_SIGV4_ALGORITHM "\n");
  buf_str(&b, amz_date);
  buf_add(&b, "\n", 1);
  buf_str(&b, scope);
  buf_add(&b, "\n", 1);
  buf_str(&b, hex);
  return buf_take(&b, out);
}

void
sbx_sigv4_result_free(struct sbx_sigv4_result *res)
{
  if (!res)
    return;
  free(res->canonical_request);
  free(res->string_to_sign);
  free(res->credential_scope);
  free(res->signed_headers);
  free(res->payload_hash);
  free(res->signature);
  free(res->authorization);
  free(res->query);
  memset(res, 0, sizeof *res);
}

/* {====== sbx_sigv4_sign */

static int
is_amz_date(const char *s)
{
  int i;
  if (!s || strlen(s) != 16 || s[8] != 'T' || s[15] != 'Z')
    return 0;
  for (i = 0; i < 15; i++)
    if (i != 8 && (s[i] < '0' || s[i] > '9'))
      return 0;
  return 1;
}

/* Stores the static reason and returns rc. */
static int
reject(const char **why, const char *text, int rc)
{
  *why = text;
  return rc;
}

/* Everything sbx_sigv4_sign can reject before doing any work. */
static int
check_input(const struct sbx_sigv4_request *req, const struct sbx_sigv4_config *cfg, const char **why)
{
  int presign = (cfg->flags & SBX_SIGV4_PRESIGN) != 0;
  int have_host = 0;
  size_t i;
  if (!is_token(req->method))
    return reject(why, "method is empty or not an HTTP token", SBX_SIGV4_EINVAL);
  if (req->path && req->path[0] && req->path[0] != '/')
    return reject(why, "path must start with '/'", SBX_SIGV4_EINVAL);
  if (req->body_len && !req->body)
    return reject(why, "body is NULL but body_len is not 0", SBX_SIGV4_EINVAL);
  if (req->payload_hash && !is_plain(req->payload_hash, ""))
    return reject(why, "payload_hash is empty or has whitespace", SBX_SIGV4_EINVAL);
  if (!is_plain(cfg->access_key, "/,"))
    return reject(why, "access_key is empty or has '/', ',' or whitespace", SBX_SIGV4_EINVAL);
  if (!cfg->secret_key || !*cfg->secret_key)
    return reject(why, "secret_key is empty", SBX_SIGV4_EINVAL);
  if (!is_plain(cfg->region, "/"))
    return reject(why, "region is empty or has '/' or whitespace", SBX_SIGV4_EINVAL);
  if (!is_plain(cfg->service, "/"))
    return reject(why, "service is empty or has '/' or whitespace", SBX_SIGV4_EINVAL);
  if (cfg->session_token && *cfg->session_token && !is_plain(cfg->session_token, ""))
    return reject(why, "session_token has whitespace or control characters", SBX_SIGV4_EINVAL);
  if (!is_amz_date(cfg->amz_date))
    return reject(why, "amz_date must look like YYYYMMDDTHHMMSSZ", SBX_SIGV4_EINVAL);
  if (presign && (cfg->expires < 1 || cfg->expires > SBX_SIGV4_MAX_EXPIRES))
    return reject(why, "expires must be 1..604800 seconds", SBX_SIGV4_EINVAL);
  if (req->nheaders && !req->headers)
    return reject(why, "headers is NULL but nheaders is not 0", SBX_SIGV4_EINVAL);
  if (req->nheaders > SIGV4_MAX_TEXT / sizeof *req->headers)
    return reject(why, "too many headers", SBX_SIGV4_E2BIG);
  for (i = 0; i < req->nheaders; i++) {
    const char *name = req->headers[i].name;
    if (!name)
      return reject(why, "header name is NULL", SBX_SIGV4_EINVAL);
    if (sbx_sigv4_check_header(name))
      return reject(why,
                    "Authorization, X-Amz-Date and X-Amz-Security-Token "
                    "are set by the signer",
                    SBX_SIGV4_ERESERVED);
    if (!presign && (cfg->flags & SBX_SIGV4_CONTENT_SHA256) && ci_equal(name, "x-amz-content-sha256"))
      return reject(why,
                    "X-Amz-Content-Sha256 is set by the signer "
                    "(CONTENT_SHA256)",
                    SBX_SIGV4_ERESERVED);
    if (ci_equal(name, "host") && req->headers[i].value && req->headers[i].value[0])
      have_host = 1;
  }
  if (!have_host)
    return reject(why, "the request has no Host header", SBX_SIGV4_ENOHOST);
  return 0;
}

/* The X-Amz-* query parameters a presigned request carries. */
static int
is_presign_param(const struct param *p)
{
  static const char *const names[] = { "X-Amz-Algorithm",      "X-Amz-Credential",
                                       "X-Amz-Date",           "X-Amz-Expires",
                                       "X-Amz-Security-Token", "X-Amz-Signature",
                                       "X-Amz-SignedHeaders",  NULL };
  size_t i;
  for (i = 0; names[i]; i++)
    if (strlen(names[i]) == p->klen && !strncmp(p->s, names[i], p->klen))
      return 1;
  return 0;
}

/* The canonical query: the request's own parameters, plus when presigning
** the X-Amz-* ones (which the request must not already have). */
static int
build_query(const struct sbx_sigv4_request *req, const struct sbx_sigv4_config *cfg, const char *scope,
            const char *signed_headers, char **out, const char **why)
{
  struct params ps = { 0 };
  struct buf cred = { 0 };
  char expires[24];
  const char *token = cfg->session_token;
  size_t i;
  int rc;
  params_add_raw(&ps, req->query);
  if (cfg->flags & SBX_SIGV4_PRESIGN) {
    for (i = 0; i < ps.n; i++) {
      if (is_presign_param(&ps.v[i])) {
        params_free(&ps);
        *why = "the query already has X-Amz-* signing parameters";
        return SBX_SIGV4_ERESERVED;
      }
    }
    buf_str(&cred, cfg->access_key);
    buf_add(&cred, "/", 1);
    buf_str(&cred, scope);
    buf_add(&cred, "", 0);
    if (cred.err) {
      params_free(&ps);
      rc = cred.err;
      buf_free(&cred);
      return rc;
    }
    snprintf(expires, sizeof expires, "%ld", cfg->expires);
#define ADD(k, v) params_add(&ps, (k), strlen(k), (v), strlen(v), 0)
    ADD("X-Amz-Algorithm", SBX_SIGV4_ALGORITHM);
    ADD("X-Amz-Credential", cred.p);
    ADD("X-Amz-Date", cfg->amz_date);
    ADD("X-Amz-Expires", expires);
    if (token && *token && !(cfg->flags & SBX_SIGV4_TOKEN_UNSIGNED))
      ADD("X-Amz-Security-Token", token);
    ADD("X-Amz-SignedHeaders", signed_headers);
#undef ADD
    buf_free(&cred);
  }
  rc = params_join(&ps, out);
  params_free(&ps);
  return rc;
}

int
sbx_sigv4_sign(const struct sbx_sigv4_request *req, const struct sbx_sigv4_config *cfg,
               struct sbx_sigv4_result *res)
{
  struct sbx_sigv4_header *all = NULL;
  struct buf b = { 0 };
  char *uri = NULL, *query = NULL, *canon = NULL;
  unsigned char key[32];
  char hex[65];
  const char *token;
  int presign, rc;
  size_t n;

  if (!res)
    return SBX_SIGV4_EINVAL;
  memset(res, 0, sizeof *res);
  if (!req || !cfg)
    return SBX_SIGV4_EINVAL;
  rc = check_input(req, cfg, &res->error);
  if (rc)
    return rc;
  presign = (cfg->flags & SBX_SIGV4_PRESIGN) != 0;
  token = cfg->session_token && *cfg->session_token ? cfg->session_token : NULL;

  /* Scope and payload hash. */
  buf_add(&b, cfg->amz_date, 8);
  buf_add(&b, "/", 1);
  buf_str(&b, cfg->region);
  buf_add(&b, "/", 1);
  buf_str(&b, cfg->service);
  buf_str(&b, "/aws4_request");
  rc = buf_take(&b, &res->credential_scope);
  if (rc)
    goto fail;
  if (req->payload_hash)
    buf_str(&b, req->payload_hash);
  else {
    rc = sbx_sigv4_sha256_hex(req->body, req->body_len, hex);
    if (rc)
      goto fail;
    buf_str(&b, hex);
  }
  rc = buf_take(&b, &res->payload_hash);
  if (rc)
    goto fail;

  /* The headers signed: the request's, plus the signer's own when the
  ** signature goes in a header. */
  all = malloc(sizeof *all * (req->nheaders + 3));
  if (!all) {
    rc = SBX_SIGV4_ENOMEM;
    goto fail;
  }
  if (req->nheaders)
    memcpy(all, req->headers, sizeof *all * req->nheaders);
  n = req->nheaders;
  if (!presign) {
    all[n].name = "x-amz-date";
    all[n++].value = cfg->amz_date;
    if (token && !(cfg->flags & SBX_SIGV4_TOKEN_UNSIGNED)) {
      all[n].name = "x-amz-security-token";
      all[n++].value = token;
    }
    if (cfg->flags & SBX_SIGV4_CONTENT_SHA256) {
      all[n].name = "x-amz-content-sha256";
      all[n++].value = res->payload_hash;
    }
  }
  rc = canonical_headers(all, n, &canon, &res->signed_headers, &res->error);
  if (rc)
    goto fail;
  rc = sbx_sigv4_canonical_uri(req->path, cfg->flags, &uri);
  if (rc)
    goto fail;
  rc = build_query(req, cfg, res->credential_scope, res->signed_headers, &query, &res->error);
  if (rc)
    goto fail;

  /* The canonical request; canon already ends with a newline. */
  buf_str(&b, req->method);
  buf_add(&b, "\n", 1);
  buf_str(&b, uri);
  buf_add(&b, "\n", 1);
  buf_str(&b, query);
  buf_add(&b, "\n", 1);
  buf_str(&b, canon);
  buf_add(&b, "\n", 1);
  buf_str(&b, res->signed_headers);
  buf_add(&b, "\n", 1);
  buf_str(&b, res->payload_hash);
  rc = buf_take(&b, &res->canonical_request);
  if (rc)
    goto fail;

  rc = sbx_sigv4_string_to_sign(cfg->amz_date, res->credential_scope, res->canonical_request,
                                &res->string_to_sign);
  if (rc)
    goto fail;
  rc = sbx_sigv4_signing_key(cfg->secret_key, cfg->amz_date, cfg->region, cfg->service, key);
  if (rc)
    goto fail;
  rc = sbx_sigv4_signature(key, res->string_to_sign, hex);
  OPENSSL_cleanse(key, sizeof key);
  if (rc)
    goto fail;
  buf_str(&b, hex);
  rc = buf_take(&b, &res->signature);
  if (rc)
    goto fail;

  if (presign) {
    /* A token left out of the signature still travels with the request. */
    buf_str(&b, query);
    if (token && (cfg->flags & SBX_SIGV4_TOKEN_UNSIGNED)) {
      buf_str(&b, "&X-Amz-Security-Token=");
      buf_encode(&b, token, strlen(token), 0);
    }
    buf_str(&b, "&X-Amz-Signature=");
    buf_str(&b, res->signature);
    rc = buf_take(&b, &res->query);
  }
  else {
    buf_str(&b, SBX_SIGV4_ALGORITHM " Credential=");
    buf_str(&b, cfg->access_key);
    buf_add(&b, "/", 1);
    buf_str(&b, res->credential_scope);
    buf_str(&b, ", SignedHeaders=");
    buf_str(&b, res->signed_headers);
    buf_str(&b, ", Signature=");
    buf_str(&b, res->signature);
    rc = buf_take(&b, &res->authorization);
  }
  if (rc)
    goto fail;
  free(all);
  free(uri);
  free(query);
  free(canon);
  return 0;

fail : {
  const char *why = res->error;
  buf_free(&b);
  free(all);
  free(uri);
  free(query);
  free(canon);
  sbx_sigv4_result_free(res);
  res->error = why;
}
  return rc;
}

/* }====== */

/* {====== Lua binding: sbx.sigv4 */

#define SIGV4_RESULT_MT "sbx.sigv4.result"

/* __gc and __close of the boxed result: frees the strings once. */
static int
result_gc(lua_State *L)
{
  sbx_sigv4_result_free(luaL_checkudata(L, 1, SIGV4_RESULT_MT));
  return 0;
}

/*
** Pushes t[name] (t at index 1) and returns it as a string, NULL when it is
** nil and optional. The value stays on the stack, so the pointer lives for
** the whole call. Raises on a wrong type or an embedded NUL.
*/
static const char *
field_string(lua_State *L, const char *name, int required)
{
  size_t len;
  const char *s;
  int t = lua_getfield(L, 1, name);
  if (t == LUA_TNIL && !required)
    return NULL;
  if (t == LUA_TNIL)
    luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' is required", name));
  if (t != LUA_TSTRING)
    luaL_argerror(L, 1,
                  lua_pushfstring(L,
                                  "field '%s' must be a string, "
                                  "not %s",
                                  name, lua_typename(L, t)));
  s = lua_tolstring(L, -1, &len);
  if (strlen(s) != len)
    luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' has a NUL byte", name));
  return s;
}

static int
field_bool(lua_State *L, const char *name, int dflt)
{
  int t = lua_getfield(L, 1, name);
  int v = dflt;
  if (t == LUA_TBOOLEAN)
    v = lua_toboolean(L, -1);
  else if (t != LUA_TNIL)
    luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be a boolean", name));
  lua_pop(L, 1);
  return v;
}

/* Returns the header value at index idx as a string (numbers are turned
** into strings anchored at t[anchor]); raises on anything else. */
static const char *
header_value(lua_State *L, int idx, int anchor, lua_Integer *nanchor, const char *name)
{
  size_t len;
  const char *s;
  int t = lua_type(L, idx);
  if (t != LUA_TSTRING && t != LUA_TNUMBER) {
    luaL_argerror(L, 1,
                  lua_pushfstring(L,
                                  "headers: value of '%s' must be "
                                  "a string",
                                  name));
    return NULL;
  }
  lua_pushvalue(L, idx);
  s = lua_tolstring(L, -1, &len);
  lua_rawseti(L, anchor, ++*nanchor);
  if (strlen(s) != len)
    luaL_argerror(L, 1,
                  lua_pushfstring(L,
                                  "headers: value of '%s' has a "
                                  "NUL byte",
                                  name));
  return s;
}

static int
header_name_cmp(const void *a, const void *b)
{
  return strcmp(((const struct sbx_sigv4_header *)a)->name, ((const struct sbx_sigv4_header *)b)->name);
}

/*
** Reads the headers field (a table at index ht) into a userdata array that
** it pushes: list entries {name, value} first, in order, then name = value
** entries sorted by name (so a table gives the same signature every time).
** Every string stays referenced by t[anchor]. May raise.
*/
static struct sbx_sigv4_header *
read_headers(lua_State *L, int ht, size_t *count)
{
  lua_Integer nlist = (lua_Integer)lua_rawlen(L, ht), i, nanchor = 0;
  struct sbx_sigv4_header *h;
  size_t total = 0, n = 0;
  int anchor;

  lua_pushnil(L);
  while (lua_next(L, ht)) {
    total++;
    lua_pop(L, 1);
  }
  lua_newtable(L);
  anchor = lua_gettop(L);
  h = lua_newuserdatauv(L, sizeof *h * (total ? total : 1), 0);
  for (i = 1; i <= nlist; i++) {
    const char *name;
    if (lua_rawgeti(L, ht, i) != LUA_TTABLE)
      luaL_argerror(L, 1,
                    lua_pushfstring(L,
                                    "headers[%I] must be "
                                    "{name, value}",
                                    i));
    if (lua_rawgeti(L, -1, 1) != LUA_TSTRING)
      luaL_argerror(L, 1,
                    lua_pushfstring(L,
                                    "headers[%I][1] must be a "
                                    "header name",
                                    i));
    name = lua_tostring(L, -1);
    lua_rawseti(L, anchor, ++nanchor);
    lua_rawgeti(L, -1, 2);
    h[n].name = name;
    h[n].value = header_value(L, lua_gettop(L), anchor, &nanchor, name);
    n++;
    lua_pop(L, 2);
  }
  lua_pushnil(L);
  while (lua_next(L, ht)) {
    if (lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1 && lua_tointeger(L, -2) <= nlist) {
      lua_pop(L, 1);
      continue;
    }
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_argerror(L, 1,
                    "headers must be {name = value} or a list of "
                    "{name, value}");
    h[n].name = lua_tostring(L, -2);
    h[n].value = header_value(L, lua_gettop(L), anchor, &nanchor, h[n].name);
    n++;
    lua_pop(L, 1);
  }
  if (n > (size_t)nlist)
    qsort(h + nlist, n - (size_t)nlist, sizeof *h, header_name_cmp);
  for (i = 0; i < (lua_Integer)n; i++) {
    if (strlen(h[i].name) == 0 || !is_token(h[i].name))
      luaL_argerror(L, 1,
                    lua_pushfstring(L,
                                    "headers: '%s' is not a valid "
                                    "header name",
                                    h[i].name));
    if (sbx_sigv4_check_header(h[i].name))
      luaL_argerror(L, 1,
                    lua_pushfstring(L,
                                    "headers: '%s' is set by the "
                                    "signer",
                                    h[i].name));
  }
  *count = n;
  return h;
}

static void
set_string(lua_State *L, const char *k, const char *v)
{
  if (v) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
  }
}

/*
** sigv4.sign{ method=, path=, query=, headers=, body=, service=, region=,
**   access_key=, secret_key=, session_token=, amz_date= }
**   -> { authorization=, amz_date=, payload_hash=, canonical_request=,
**        string_to_sign=, signature=, signed_headers=, credential_scope=,
**        headers = { [name] = value, ... }, query= (presign) }
**
** method defaults to "GET", path to "/", amz_date to now (UTC). headers
** must include Host. The result's headers are the ones to add to the
** request (X-Amz-Date, X-Amz-Security-Token, X-Amz-Content-Sha256,
** Authorization). Options: payload_hash= (e.g. "UNSIGNED-PAYLOAD", instead
** of body), content_sha256=true (sign x-amz-content-sha256), normalize=
** and double_encode= (default true; S3 wants both false), sign_token=false
** (send the token unsigned), presign=true with expires= (default 3600): the
** result then has query= (the whole query string to send) and no
** authorization. Misuse raises; no message and no field ever holds the
** secret key.
*/
static int
sigv4_sign(lua_State *L)
{
  struct sbx_sigv4_request req;
  struct sbx_sigv4_config cfg;
  struct sbx_sigv4_result *res;
  char now[32];
  size_t body_len = 0;
  int ht, rc;

  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstack(L, 40, "sigv4.sign");
  memset(&req, 0, sizeof req);
  memset(&cfg, 0, sizeof cfg);
  req.method = field_string(L, "method", 0);
  if (!req.method)
    req.method = "GET";
  req.path = field_string(L, "path", 0);
  req.query = field_string(L, "query", 0);
  req.payload_hash = field_string(L, "payload_hash", 0);
  if (lua_getfield(L, 1, "body") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_argerror(L, 1, "field 'body' must be a string");
    if (req.payload_hash)
      luaL_argerror(L, 1, "give body or payload_hash, not both");
    req.body = lua_tolstring(L, -1, &body_len);
    req.body_len = body_len;
  }
  cfg.service = field_string(L, "service", 1);
  cfg.region = field_string(L, "region", 1);
  cfg.access_key = field_string(L, "access_key", 1);
  cfg.secret_key = field_string(L, "secret_key", 1);
  cfg.session_token = field_string(L, "session_token", 0);
  cfg.amz_date = field_string(L, "amz_date", 0);
  if (!cfg.amz_date) {
    time_t t = time(NULL);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(now, sizeof now, "%Y%m%dT%H%M%SZ", &tm) != 16)
      return luaL_error(L, "sigv4.sign: cannot read the clock");
    cfg.amz_date = now;
  }
  if (!field_bool(L, "normalize", 1))
    cfg.flags |= SBX_SIGV4_NO_NORMALIZE;
  if (!field_bool(L, "double_encode", 1))
    cfg.flags |= SBX_SIGV4_NO_ENCODE_PATH;
  if (field_bool(L, "content_sha256", 0))
    cfg.flags |= SBX_SIGV4_CONTENT_SHA256;
  if (!field_bool(L, "sign_token", 1))
    cfg.flags |= SBX_SIGV4_TOKEN_UNSIGNED;
  if (field_bool(L, "presign", 0)) {
    int isnum;
    cfg.flags |= SBX_SIGV4_PRESIGN;
    cfg.expires = 3600;
    if (lua_getfield(L, 1, "expires") != LUA_TNIL) {
      lua_Integer e = lua_tointegerx(L, -1, &isnum);
      if (!isnum || e < 1 || e > SBX_SIGV4_MAX_EXPIRES)
        luaL_argerror(L, 1,
                      "field 'expires' must be an integer "
                      "1..604800");
      cfg.expires = (long)e;
    }
  }
  if (lua_getfield(L, 1, "headers") != LUA_TTABLE)
    luaL_argerror(L, 1, "field 'headers' must be a table (with Host)");
  ht = lua_gettop(L);
  req.headers = read_headers(L, ht, &req.nheaders); /* [.., anchor, h] */

  /* The strings sign allocates live in a box, so a raise frees them. */
  res = lua_newuserdatauv(L, sizeof *res, 0);
  memset(res, 0, sizeof *res);
  luaL_setmetatable(L, SIGV4_RESULT_MT);
  rc = sbx_sigv4_sign(&req, &cfg, res);
  if (rc == SBX_SIGV4_ENOMEM)
    return luaL_error(L, "sigv4.sign: out of memory");
  if (rc)
    return luaL_argerror(L, 1, res->error ? res->error : sbx_sigv4_strerror(rc));

  lua_createtable(L, 0, 11);
  set_string(L, "authorization", res->authorization);
  set_string(L, "query", res->query);
  set_string(L, "amz_date", cfg.amz_date);
  set_string(L, "payload_hash", res->payload_hash);
  set_string(L, "canonical_request", res->canonical_request);
  set_string(L, "string_to_sign", res->string_to_sign);
  set_string(L, "signature", res->signature);
  set_string(L, "signed_headers", res->signed_headers);
  set_string(L, "credential_scope", res->credential_scope);
  lua_createtable(L, 0, 4); /* [.., res, t, add] */
  if (!(cfg.flags & SBX_SIGV4_PRESIGN)) {
    set_string(L, "X-Amz-Date", cfg.amz_date);
    if (cfg.session_token && *cfg.session_token)
      set_string(L, "X-Amz-Security-Token", cfg.session_token);
    if (cfg.flags & SBX_SIGV4_CONTENT_SHA256)
      set_string(L, "X-Amz-Content-Sha256", res->payload_hash);
    set_string(L, "Authorization", res->authorization);
  }
  lua_setfield(L, -2, "headers");
  sbx_sigv4_result_free(res);
  return 1;
}

/* sigv4.sha256(bytes) -> 64 lowercase hex digits (content hashes, payload hashes) */
static int
sigv4_sha256(lua_State *L)
{
  size_t n;
  const char *p = luaL_checklstring(L, 1, &n);
  char hex[65];
  if (sbx_sigv4_sha256_hex(p, n, hex) != 0)
    return luaL_error(L, "sha256 failed");
  lua_pushlstring(L, hex, 64);
  return 1;
}

static const luaL_Reg sigv4_funcs[] = { { "sign", sigv4_sign }, { "sha256", sigv4_sha256 }, { NULL, NULL } };

static const luaL_Reg sigv4_result_meta[] = { { "__gc", result_gc },
                                              { "__close", result_gc },
                                              { NULL, NULL } };

/* The sigv4 module table: { sign = ..., sha256 = ... }. */
int
sbx_open_sigv4(lua_State *L)
{
  if (luaL_newmetatable(L, SIGV4_RESULT_MT))
    luaL_setfuncs(L, sigv4_result_meta, 0);
  lua_pop(L, 1);
  luaL_newlib(L, sigv4_funcs);
  return 1;
}

/* }====== */

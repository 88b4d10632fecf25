/* needs: nothing */
/*
** SigV4 against the aws-c-auth test suite, then cases of our own for what
** the suite leaves out. Every case directory is run four ways: header
** signing and presigning, each through the C API and through the Lua
** binding. TAP output; exit 1 when anything failed.
**
**   unit_sigv4 [SUITE_DIR]     (default tests/data/aws-sigv4, relative to
**                               the repository root)
*/
#include "sigv4.h"

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include <sys/stat.h>

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEFAULT_SUITE "tests/data/aws-sigv4"
#define SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"

static int n, failed;

static void ok(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
ok(int cond, const char *fmt, ...)
{
  va_list ap;
  n++;
  if (!cond)
    failed++;
  printf("%sok %d - ", cond ? "" : "not ", n);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
}

/* "# label: text" with line breaks and odd bytes escaped, so a diagnostic
** is always one TAP comment line. */
static void
diag(const char *label, const char *s)
{
  printf("#   %s: ", label);
  if (!s) {
    puts("(null)");
    return;
  }
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '\n')
      fputs("\\n", stdout);
    else if (c == '\r')
      fputs("\\r", stdout);
    else if (c == '\\')
      fputs("\\\\", stdout);
    else if (c < 0x20 || c >= 0x7f)
      printf("\\x%02X", c);
    else
      putchar(c);
  }
  putchar('\n');
}

static void
check_str(const char *want, const char *got, const char *name, const char *what)
{
  int good = want && got && strcmp(want, got) == 0;
  ok(good, "%s: %s", name, what);
  if (!good) {
    diag("want", want);
    diag("got ", got);
  }
}

/* {====== reading the suite */

/* The whole file, NUL-terminated, in malloc'd memory; NULL if unreadable. */
static char *
read_file(const char *dir, const char *name, size_t *len)
{
  char path[4096];
  char *buf = NULL;
  size_t cap = 0, used = 0, got;
  FILE *f;
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
    return NULL;
  f = fopen(path, "rb");
  if (!f)
    return NULL;
  do {
    if (cap - used < 4096) {
      char *p = realloc(buf, cap + 8192);
      if (!p) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = p;
      cap += 8192;
    }
    got = fread(buf + used, 1, cap - used - 1, f);
    used += got;
  } while (got);
  fclose(f);
  buf[used] = '\0';
  if (len)
    *len = used;
  return buf;
}

/* The expected files have no final newline; tolerate one anyway. */
static char *
chomp(char *s)
{
  size_t l = s ? strlen(s) : 0;
  while (l && (s[l - 1] == '\n' || s[l - 1] == '\r'))
    s[--l] = '\0';
  return s;
}

/*
** The value of "key" in context.json: a string (simple escapes) or a bare
** literal (true, false, a number), copied into out. The files are small
** and flat enough that a search for "key": finds the one field.
*/
static int
json_get(const char *json, const char *key, char *out, size_t size)
{
  char pat[128];
  const char *p;
  size_t o = 0;
  snprintf(pat, sizeof pat, "\"%s\"", key);
  p = strstr(json, pat);
  if (!p)
    return 0;
  p += strlen(pat);
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
    p++;
  if (*p++ != ':')
    return 0;
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
    p++;
  if (*p == '"') {
    for (p++; *p && *p != '"'; p++) {
      char c = *p;
      if (c == '\\') {
        c = *++p;
        if (c == 'n')
          c = '\n';
        else if (c == 't')
          c = '\t';
        else if (c != '"' && c != '\\' && c != '/')
          return 0;
      }
      if (o + 1 >= size)
        return 0;
      out[o++] = c;
    }
    if (*p != '"')
      return 0;
  }
  else {
    while (*p && !strchr(",}] \t\r\n", *p)) {
      if (o + 1 >= size)
        return 0;
      out[o++] = *p++;
    }
  }
  out[o] = '\0';
  return 1;
}

struct context {
  char access_key[256], secret_key[256], token[4096];
  char region[64], service[64], amz_date[32];
  int normalize, sign_body, omit_token;
  long expires;
};

static int
json_bool(const char *json, const char *key, int dflt)
{
  char v[16];
  if (!json_get(json, key, v, sizeof v))
    return dflt;
  return strcmp(v, "true") == 0;
}

static int
read_context(const char *json, struct context *c)
{
  char ts[64], num[32];
  size_t i, o = 0;
  memset(c, 0, sizeof *c);
  if (!json_get(json, "access_key_id", c->access_key, sizeof c->access_key) ||
      !json_get(json, "secret_access_key", c->secret_key, sizeof c->secret_key) ||
      !json_get(json, "region", c->region, sizeof c->region) ||
      !json_get(json, "service", c->service, sizeof c->service) ||
      !json_get(json, "timestamp", ts, sizeof ts))
    return -1;
  json_get(json, "token", c->token, sizeof c->token);
  /* "2015-08-30T12:36:00Z" -> "20150830T123600Z" */
  for (i = 0; ts[i] && o + 1 < sizeof c->amz_date; i++)
    if (ts[i] != '-' && ts[i] != ':')
      c->amz_date[o++] = ts[i];
  c->amz_date[o] = '\0';
  c->normalize = json_bool(json, "normalize", 1);
  c->sign_body = json_bool(json, "sign_body", 0);
  c->omit_token = json_bool(json, "omit_session_token", 0);
  c->expires = 3600;
  if (json_get(json, "expiration_in_seconds", num, sizeof num))
    c->expires = strtol(num, NULL, 10);
  return 0;
}

/*
** request.txt: "METHOD target HTTP/1.1", header lines "Name:value" (a line
** starting with whitespace continues the previous value, the line break
** kept), then optionally a blank line and the body. The target is split
** at '?'; it may hold spaces and raw UTF-8. Parsed in place.
*/
struct request {
  char *text;
  char *method, *path, *query;
  struct sbx_sigv4_header *h;
  size_t nh;
  const char *body;
  size_t body_len;
};

static int
parse_request(char *text, size_t len, struct request *r)
{
  char *end = text + len, *p, *e, *sp;
  size_t lines = 1;
  memset(r, 0, sizeof *r);
  r->text = text;
  for (p = text; p < end; p++)
    lines += *p == '\n';
  r->h = calloc(lines, sizeof *r->h);
  if (!r->h)
    return -1;
  e = memchr(text, '\n', len);
  if (!e)
    e = end;
  *e = '\0';
  sp = strchr(text, ' ');
  if (!sp)
    return -1;
  *sp = '\0';
  r->method = text;
  r->path = sp + 1;
  sp = strrchr(r->path, ' ');
  if (!sp)
    return -1;
  *sp = '\0';
  sp = strchr(r->path, '?');
  if (sp) {
    *sp = '\0';
    r->query = sp + 1;
  }
  for (p = e + 1; p < end; p = e + 1) {
    char *colon;
    if (*p == '\n') {
      r->body = p + 1;
      r->body_len = (size_t)(end - (p + 1));
      break;
    }
    e = memchr(p, '\n', (size_t)(end - p));
    if (!e)
      e = end;
    *e = '\0';
    if (*p == ' ' || *p == '\t') {
      if (!r->nh)
        return -1;
      p[-1] = '\n'; /* the previous value runs on over this line */
      continue;
    }
    colon = strchr(p, ':');
    if (!colon)
      return -1;
    *colon = '\0';
    r->h[r->nh].name = p;
    r->h[r->nh].value = colon + 1;
    r->nh++;
  }
  return 0;
}

static int
cmp_str(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The X-Amz-* parameters of a query string, sorted and joined with '&'
** (the suite lists them in its own order). malloc'd; NULL for none. */
static char *
amz_params(const char *query)
{
  char *copy, **v, *out, *p;
  size_t nv = 0, i, o = 0;
  if (!query)
    return NULL;
  copy = strdup(query);
  v = calloc(strlen(query) + 1, sizeof *v);
  out = malloc(strlen(query) + 1);
  if (!copy || !v || !out) {
    free(copy);
    free(v);
    free(out);
    return NULL;
  }
  for (p = copy; p;) {
    char *amp = strchr(p, '&');
    if (amp)
      *amp = '\0';
    if (strncmp(p, "X-Amz-", 6) == 0)
      v[nv++] = p;
    p = amp ? amp + 1 : NULL;
  }
  qsort(v, nv, sizeof *v, cmp_str);
  for (i = 0; i < nv; i++) {
    size_t l = strlen(v[i]);
    if (i)
      out[o++] = '&';
    memcpy(out + o, v[i], l);
    o += l;
  }
  out[o] = '\0';
  free(copy);
  free(v);
  return out;
}

/* }====== */

/* {====== one suite case */

/* Does text have a line equal to line[0..len)? */
static int
has_line(const char *text, const char *line, size_t len)
{
  const char *p = text;
  while (p && *p) {
    const char *e = strchr(p, '\n');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == len && memcmp(p, line, len) == 0)
      return 1;
    p = e ? e + 1 : NULL;
  }
  return 0;
}

/* The value of the "Authorization:" line of a signed request, malloc'd. */
static char *
authorization_of(const char *signed_req)
{
  const char *p = strstr(signed_req, "\nAuthorization:"), *e;
  char *v;
  if (!p)
    return NULL;
  p += strlen("\nAuthorization:");
  e = strchr(p, '\n');
  if (!e)
    e = p + strlen(p);
  v = malloc((size_t)(e - p) + 1);
  if (v) {
    memcpy(v, p, (size_t)(e - p));
    v[e - p] = '\0';
  }
  return v;
}

/* The query of the request line of a signed request, malloc'd. */
static char *
query_of(const char *signed_req)
{
  const char *e = strchr(signed_req, '\n'), *q, *sp;
  char *v;
  if (!e)
    e = signed_req + strlen(signed_req);
  q = memchr(signed_req, '?', (size_t)(e - signed_req));
  if (!q)
    return NULL;
  for (sp = e; sp > q && *sp != ' '; sp--)
    ;
  if (sp <= q)
    return NULL;
  v = malloc((size_t)(sp - q));
  if (v) {
    memcpy(v, q + 1, (size_t)(sp - q - 1));
    v[sp - q - 1] = '\0';
  }
  return v;
}

/*
** Checks that the headers the Lua result says to add (table at idx) are
** exactly the lines header-signed-request.txt has beyond request.txt and
** its Authorization line, names compared without case. 1 when they are.
*/
static int
added_headers_match(lua_State *L, int idx, const char *signed_req, const char *orig, const char **why)
{
  const char *p = strchr(signed_req, '\n');
  int want = 0, have = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    have++;
    lua_pop(L, 1);
  }
  for (p = p ? p + 1 : NULL; p && *p && *p != '\n';) {
    const char *e = strchr(p, '\n'), *colon;
    size_t len = e ? (size_t)(e - p) : strlen(p);
    int found = 0;
    colon = memchr(p, ':', len);
    if (*p != ' ' && *p != '\t' && colon && !has_line(orig, p, len)) {
      size_t nl = (size_t)(colon - p);
      want++;
      lua_pushnil(L);
      while (lua_next(L, idx)) {
        size_t kl, vl;
        const char *k = lua_tolstring(L, -2, &kl);
        const char *v = lua_tolstring(L, -1, &vl);
        if (kl == nl && strncasecmp(k, p, nl) == 0 && vl == len - nl - 1 && memcmp(v, colon + 1, vl) == 0)
          found = 1;
        lua_pop(L, 1);
      }
      if (!found) {
        *why = "a header of the signed request is missing or differs";
        return 0;
      }
    }
    p = e ? e + 1 : NULL;
  }
  if (want != have) {
    *why = "the result adds headers the signed request does not have";
    return 0;
  }
  return 1;
}

/* Pushes sigv4.sign's result for the case (or an error message) and
** returns the lua_pcall status. */
static int
lua_sign(lua_State *L, const struct request *r, const struct context *c, int presign)
{
  size_t i;
  lua_getglobal(L, "sigv4");
  lua_getfield(L, -1, "sign");
  lua_remove(L, -2);
  lua_createtable(L, 0, 16);
  lua_pushstring(L, r->method);
  lua_setfield(L, -2, "method");
  lua_pushstring(L, r->path);
  lua_setfield(L, -2, "path");
  if (r->query) {
    lua_pushstring(L, r->query);
    lua_setfield(L, -2, "query");
  }
  if (r->body) {
    lua_pushlstring(L, r->body, r->body_len);
    lua_setfield(L, -2, "body");
  }
  lua_createtable(L, (int)r->nh, 0);
  for (i = 0; i < r->nh; i++) {
    lua_createtable(L, 2, 0);
    lua_pushstring(L, r->h[i].name);
    lua_rawseti(L, -2, 1);
    lua_pushstring(L, r->h[i].value);
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, "headers");
  lua_pushstring(L, c->service);
  lua_setfield(L, -2, "service");
  lua_pushstring(L, c->region);
  lua_setfield(L, -2, "region");
  lua_pushstring(L, c->access_key);
  lua_setfield(L, -2, "access_key");
  lua_pushstring(L, c->secret_key);
  lua_setfield(L, -2, "secret_key");
  if (c->token[0]) {
    lua_pushstring(L, c->token);
    lua_setfield(L, -2, "session_token");
  }
  lua_pushstring(L, c->amz_date);
  lua_setfield(L, -2, "amz_date");
  lua_pushboolean(L, c->normalize);
  lua_setfield(L, -2, "normalize");
  lua_pushboolean(L, c->sign_body);
  lua_setfield(L, -2, "content_sha256");
  lua_pushboolean(L, !c->omit_token);
  lua_setfield(L, -2, "sign_token");
  if (presign) {
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "presign");
    lua_pushinteger(L, c->expires);
    lua_setfield(L, -2, "expires");
  }
  return lua_pcall(L, 1, 1, 0);
}

static const char *
field(lua_State *L, int idx, const char *k)
{
  const char *v;
  lua_getfield(L, idx, k);
  v = lua_tostring(L, -1);
  lua_pop(L, 1); /* the result table still holds the string */
  return v;
}

static void
run_case(const char *suite, const char *name, lua_State *L)
{
  static const char *const files[] = { "context.json",
                                       "request.txt",
                                       "header-canonical-request.txt",
                                       "header-string-to-sign.txt",
                                       "header-signature.txt",
                                       "header-signed-request.txt",
                                       "query-canonical-request.txt",
                                       "query-string-to-sign.txt",
                                       "query-signature.txt",
                                       "query-signed-request.txt" };
  enum { CTX, REQ, H_CREQ, H_STS, H_SIG, H_SREQ, Q_CREQ, Q_STS, Q_SIG, Q_SREQ, NFILES };
  char dir[4096], *f[NFILES] = { 0 }, *orig = NULL;
  size_t req_len = 0;
  struct context c;
  struct request r;
  struct sbx_sigv4_config cfg;
  struct sbx_sigv4_request sreq;
  struct sbx_sigv4_result res;
  int i, rc, mode;

  memset(&r, 0, sizeof r);
  snprintf(dir, sizeof dir, "%s/%s", suite, name);
  for (i = 0; i < NFILES; i++) {
    f[i] = chomp(read_file(dir, files[i], i == REQ ? &req_len : NULL));
    if (!f[i]) {
      ok(0, "%s: read %s", name, files[i]);
      goto done;
    }
  }
  /* request.txt keeps its bytes: the body is exact. */
  free(f[REQ]);
  f[REQ] = read_file(dir, "request.txt", &req_len);
  orig = f[REQ] ? strdup(f[REQ]) : NULL;
  if (!orig || read_context(f[CTX], &c) || parse_request(f[REQ], req_len, &r)) {
    ok(0, "%s: parse context.json and request.txt", name);
    goto done;
  }

  memset(&sreq, 0, sizeof sreq);
  sreq.method = r.method;
  sreq.path = r.path;
  sreq.query = r.query;
  sreq.headers = r.h;
  sreq.nheaders = r.nh;
  sreq.body = r.body;
  sreq.body_len = r.body_len;
  memset(&cfg, 0, sizeof cfg);
  cfg.access_key = c.access_key;
  cfg.secret_key = c.secret_key;
  cfg.session_token = c.token;
  cfg.region = c.region;
  cfg.service = c.service;
  cfg.amz_date = c.amz_date;
  cfg.expires = c.expires;
  cfg.flags = (c.normalize ? 0 : SBX_SIGV4_NO_NORMALIZE) | (c.sign_body ? SBX_SIGV4_CONTENT_SHA256 : 0) |
              (c.omit_token ? SBX_SIGV4_TOKEN_UNSIGNED : 0);

  for (mode = 0; mode < 2; mode++) {
    const char *m = mode ? "query" : "header";
    char *want_q = NULL, *got_q = NULL, *want_a = NULL;
    if (mode)
      cfg.flags |= SBX_SIGV4_PRESIGN;

    /* The C API. */
    rc = sbx_sigv4_sign(&sreq, &cfg, &res);
    if (rc) {
      ok(0, "%s: %s signing", name, m);
      diag("error", res.error ? res.error : sbx_sigv4_strerror(rc));
      continue;
    }
    check_str(f[mode ? Q_CREQ : H_CREQ], res.canonical_request, name,
              mode ? "query canonical request" : "header canonical request");
    check_str(f[mode ? Q_STS : H_STS], res.string_to_sign, name,
              mode ? "query string to sign" : "header string to sign");
    check_str(f[mode ? Q_SIG : H_SIG], res.signature, name, mode ? "query signature" : "header signature");
    if (mode) {
      /* The suite lists the parameters in its own order; compare the
      ** X-Amz-* ones as sets (the rest is the canonical query). */
      want_a = query_of(f[Q_SREQ]);
      want_q = amz_params(want_a);
      got_q = amz_params(res.query);
      check_str(want_q, got_q, name, "presigned X-Amz-* parameters");
    }
    else {
      want_a = authorization_of(f[H_SREQ]);
      check_str(want_a, res.authorization, name, "Authorization header");
    }
    free(want_q);
    free(got_q);
    free(want_a);
    sbx_sigv4_result_free(&res);

    /* The Lua binding, same inputs. */
    if (lua_sign(L, &r, &c, mode) != LUA_OK) {
      ok(0, "%s: lua %s", name, mode ? "presign" : "sign");
      diag("error", lua_tostring(L, -1));
    }
    else if (!mode) {
      const char *why = "the Authorization differs";
      char *auth = authorization_of(f[H_SREQ]);
      int good;
      lua_getfield(L, -1, "headers");
      good = auth && field(L, -2, "authorization") && !strcmp(auth, field(L, -2, "authorization")) &&
             !strcmp(f[H_CREQ], field(L, -2, "canonical_request")) &&
             added_headers_match(L, lua_gettop(L), f[H_SREQ], orig, &why);
      ok(good, "%s: lua sign: Authorization and the headers to add", name);
      if (!good)
        diag("why", why);
      lua_pop(L, 1);
      free(auth);
    }
    else {
      char *want = query_of(f[Q_SREQ]);
      char *wp = amz_params(want), *gp = amz_params(field(L, -1, "query"));
      int good = wp && gp && !strcmp(wp, gp) && !strcmp(f[Q_SIG], field(L, -1, "signature")) &&
                 !field(L, -1, "authorization");
      ok(good, "%s: lua presign: signature and query", name);
      if (!good) {
        diag("want", wp);
        diag("got ", gp);
      }
      free(want);
      free(wp);
      free(gp);
    }
    lua_pop(L, 1);
  }

done:
  for (i = 0; i < NFILES; i++)
    free(f[i]);
  free(orig);
  free(r.h);
}

/* }====== */

/* {====== cases of our own: what the suite does not cover */

static void
own_cases(void)
{
  static const struct {
    const char *in;
    unsigned flags;
    const char *want;
  } uri[] = {
    { "", 0, "/" },
    { "/foo/bar/..", 0, "/foo" },
    { "/foo/./bar/", 0, "/foo/bar/" },
    { "/../../", 0, "/" },
    { "/a%2Fb/c d", 0, "/a%252Fb/c%20d" },
    { "/caf\xC3\xA9/~x+y", 0, "/caf%C3%A9/~x%2By" },
    { "//a/../b//", SBX_SIGV4_NO_ENCODE_PATH, "/b/" },
    { "/a%2Fb/./c%20d", SBX_SIGV4_NO_NORMALIZE | SBX_SIGV4_NO_ENCODE_PATH, "/a%2Fb/./c%20d" },
  };
  static const struct {
    const char *in, *want;
  } query[] = {
    { NULL, "" },
    { "&&", "" },
    { "b=2&a=1&a=0&c&d=", "a=0&a=1&b=2&c=&d=" },
    { "e=x+y&f=%7e%2f%zz&g=%&h=%4", "e=x%2By&f=~%2F%25zz&g=%25&h=%254" },
    { "a=b=c&%41=%c3%a9", "A=%C3%A9&a=b%3Dc" },
    { "Param-3=1&Param=2&Param=1", "Param=1&Param=2&Param-3=1" },
  };
  static const struct sbx_sigv4_header hdrs[] = {
    { "X-B", "2" },         { "x-a", "\t a \t b \r\n  c " }, { "Host", "h" }, { "X-B", " 1 " },
    { "User-Agent", "ua" }, { "Proxy-Authorization", "p" },  { "Empty", "" },
  };
  static const struct sbx_sigv4_header host[] = { { "Host", "example.amazonaws.com" } };
  unsigned char key[32];
  char hex[65], *out = NULL, *sig = NULL;
  size_t i;
  int rc;

  for (i = 0; i < sizeof uri / sizeof uri[0]; i++) {
    rc = sbx_sigv4_canonical_uri(uri[i].in, uri[i].flags, &out);
    check_str(uri[i].want, rc ? NULL : out, "own", "canonical uri");
    if (!rc)
      free(out);
  }
  ok(sbx_sigv4_canonical_uri("relative", 0, &out) == SBX_SIGV4_EINVAL,
     "own: a path not starting with '/' is refused");

  for (i = 0; i < sizeof query / sizeof query[0]; i++) {
    rc = sbx_sigv4_canonical_query(query[i].in, &out);
    check_str(query[i].want, rc ? NULL : out, "own", "canonical query");
    if (!rc)
      free(out);
  }

  rc = sbx_sigv4_canonical_headers(hdrs, sizeof hdrs / sizeof hdrs[0], &out, &sig);
  check_str("empty:\nhost:h\nx-a:a b c\nx-b:2,1\n", rc ? NULL : out, "own",
            "canonical headers: folds, tabs, order of duplicates, unsigned "
            "hop-by-hop");
  check_str("empty;host;x-a;x-b", rc ? NULL : sig, "own", "signed headers");
  if (!rc) {
    free(out);
    free(sig);
  }

  /* AWS documentation's example: "Deriving the signing key". */
  rc = sbx_sigv4_signing_key(SECRET, "20120215T000000Z", "us-east-1", "iam", key);
  hex[0] = '\0';
  if (!rc) {
    static const char digits[] = "0123456789abcdef";
    for (i = 0; i < 32; i++) {
      hex[2 * i] = digits[key[i] >> 4];
      hex[2 * i + 1] = digits[key[i] & 15];
    }
    hex[64] = '\0';
  }
  check_str("f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d", hex, "own",
            "signing key (AWS documentation example)");
  rc = sbx_sigv4_sha256_hex("", 0, hex);
  check_str("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", rc ? NULL : hex, "own",
            "SHA-256 of the empty body");

  /* Refusals: each input the signer must not accept. */
  {
    static const struct sbx_sigv4_header bad_name[] = { { "Host", "h" }, { "Bad Name", "1" } };
    static const struct sbx_sigv4_header bare_lf[] = { { "Host", "h" }, { "X", "a\nEvil: 1" } };
    static const struct sbx_sigv4_header fold[] = { { "Host", "h" }, { "X", "a\r\n b" } };
    static const struct sbx_sigv4_header xdate[] = { { "Host", "h" }, { "X-AMZ-DATE", "1" } };
    static const struct sbx_sigv4_header auth[] = { { "Host", "h" }, { "authorization", "1" } };
    static const struct sbx_sigv4_header sha[] = { { "Host", "h" }, { "X-Amz-Content-Sha256", "1" } };
    static const struct sbx_sigv4_header nohost[] = { { "X", "1" } };
    struct {
      const char *what;
      const struct sbx_sigv4_header *h;
      size_t nh;
      const char *query, *date, *region, *secret;
      unsigned flags;
      long expires;
      int want;
    } bad[] = {
      { "no Host", nohost, 1, NULL, NULL, NULL, NULL, 0, 0, SBX_SIGV4_ENOHOST },
      { "X-Amz-Date header", xdate, 2, NULL, NULL, NULL, NULL, 0, 0, SBX_SIGV4_ERESERVED },
      { "Authorization header", auth, 2, NULL, NULL, NULL, NULL, 0, 0, SBX_SIGV4_ERESERVED },
      { "x-amz-content-sha256 header with CONTENT_SHA256", sha, 2, NULL, NULL, NULL, NULL,
        SBX_SIGV4_CONTENT_SHA256, 0, SBX_SIGV4_ERESERVED },
      { "header name with a space", bad_name, 2, NULL, NULL, NULL, NULL, 0, 0, SBX_SIGV4_EINVAL },
      { "bare line break in a value", bare_lf, 2, NULL, NULL, NULL, NULL, 0, 0, SBX_SIGV4_EINVAL },
      { "malformed amz_date", host, 1, NULL, "2015-08-30", NULL, NULL, 0, 0, SBX_SIGV4_EINVAL },
      { "region with '/'", host, 1, NULL, NULL, "us/east-1", NULL, 0, 0, SBX_SIGV4_EINVAL },
      { "empty secret", host, 1, NULL, NULL, NULL, "", 0, 0, SBX_SIGV4_EINVAL },
      { "presign with expires 0", host, 1, NULL, NULL, NULL, NULL, SBX_SIGV4_PRESIGN, 0, SBX_SIGV4_EINVAL },
      { "presign with expires over 7 days", host, 1, NULL, NULL, NULL, NULL, SBX_SIGV4_PRESIGN, 604801,
        SBX_SIGV4_EINVAL },
      { "presign over an X-Amz-Signature parameter", host, 1, "a=1&X-Amz-Signature=x", NULL, NULL, NULL,
        SBX_SIGV4_PRESIGN, 60, SBX_SIGV4_ERESERVED },
      { "obs-fold value is accepted", fold, 2, NULL, NULL, NULL, NULL, 0, 0, 0 },
    };
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      struct sbx_sigv4_request req = { 0 };
      struct sbx_sigv4_config cfg = { 0 };
      struct sbx_sigv4_result res;
      req.method = "GET";
      req.path = "/";
      req.query = bad[i].query;
      req.headers = bad[i].h;
      req.nheaders = bad[i].nh;
      cfg.access_key = "AKIDEXAMPLE";
      cfg.secret_key = bad[i].secret ? bad[i].secret : SECRET;
      cfg.region = bad[i].region ? bad[i].region : "us-east-1";
      cfg.service = "service";
      cfg.amz_date = bad[i].date ? bad[i].date : "20150830T123600Z";
      cfg.flags = bad[i].flags;
      cfg.expires = bad[i].expires;
      rc = sbx_sigv4_sign(&req, &cfg, &res);
      ok(rc == bad[i].want && (rc ? res.canonical_request == NULL && res.error != NULL : res.error == NULL),
         "own: %s: %s", bad[i].what, sbx_sigv4_strerror(bad[i].want));
      if (rc != bad[i].want)
        diag("got", sbx_sigv4_strerror(rc));
      sbx_sigv4_result_free(&res);
    }
  }

  /* UNSIGNED-PAYLOAD, also as the x-amz-content-sha256 value. */
  {
    struct sbx_sigv4_request req = { 0 };
    struct sbx_sigv4_config cfg = { 0 };
    struct sbx_sigv4_result res;
    const char *cr;
    req.method = "PUT";
    req.path = "/bucket/key";
    req.headers = host;
    req.nheaders = 1;
    req.body = "ignored";
    req.body_len = 7;
    req.payload_hash = SBX_SIGV4_UNSIGNED_PAYLOAD;
    cfg.access_key = "AKIDEXAMPLE";
    cfg.secret_key = SECRET;
    cfg.region = "us-east-1";
    cfg.service = "s3";
    cfg.amz_date = "20150830T123600Z";
    cfg.flags = SBX_SIGV4_CONTENT_SHA256 | SBX_SIGV4_NO_NORMALIZE | SBX_SIGV4_NO_ENCODE_PATH;
    rc = sbx_sigv4_sign(&req, &cfg, &res);
    cr = rc ? "" : res.canonical_request;
    ok(!rc && strstr(cr, "\nx-amz-content-sha256:UNSIGNED-PAYLOAD\n") && strlen(cr) > 17 &&
         !strcmp(cr + strlen(cr) - 17, "\nUNSIGNED-PAYLOAD"),
       "own: UNSIGNED-PAYLOAD is hashed nowhere and signed as is");
    if (rc)
      diag("error", sbx_sigv4_strerror(rc));
    sbx_sigv4_result_free(&res);
    sbx_sigv4_result_free(&res); /* twice is harmless */
  }

  ok(!strcmp(sbx_sigv4_strerror(SBX_SIGV4_ENOMEM), "out of memory") &&
       !strcmp(sbx_sigv4_strerror(-999), "unknown error") &&
       strcmp(sbx_sigv4_strerror(SBX_SIGV4_EINVAL), sbx_sigv4_strerror(SBX_SIGV4_ERESERVED)),
     "own: sbx_sigv4_strerror");
}

/* tap(cond, name [, detail]): an assertion from the Lua chunk below. */
static int
lua_tap(lua_State *L)
{
  int cond = lua_toboolean(L, 1);
  ok(cond, "lua: %s", luaL_checkstring(L, 2));
  if (!cond && !lua_isnoneornil(L, 3))
    diag("got", luaL_tolstring(L, 3, NULL));
  return 0;
}

/* The binding's contract: forms of headers, defaults, options, misuse. */
static const char lua_cases[] =
  "local sign, ok, SECRET = sigv4.sign, tap, SECRET\n"
  "local function base(extra)\n"
  "  local t = { method = 'GET', path = '/',\n"
  "    headers = { Host = 'example.amazonaws.com' }, service = 'service',\n"
  "    region = 'us-east-1', access_key = 'AKIDEXAMPLE',\n"
  "    secret_key = SECRET, amz_date = '20150830T123600Z' }\n"
  "  for k, v in pairs(extra or {}) do t[k] = v end\n"
  "  return t\n"
  "end\n"
  "local function clean(v)\n"
  "  if type(v) == 'string' then return not v:find(SECRET, 1, true) end\n"
  "  if type(v) == 'table' then\n"
  "    for k, x in pairs(v) do\n"
  "      if not clean(k) or not clean(x) then return false end\n"
  "    end\n"
  "  end\n"
  "  return true\n"
  "end\n"
  "\n"
  "local r = sign(base())\n"
  "ok(r.signature == '5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31',\n"
  "   'name = value headers sign get-vanilla', r.signature)\n"
  "ok(r.headers['X-Amz-Date'] == '20150830T123600Z' and\n"
  "   r.headers.Authorization == r.authorization and r.amz_date == '20150830T123600Z'\n"
  "   and r.credential_scope == '20150830/us-east-1/service/aws4_request',\n"
  "   'the headers to add and the scope')\n"
  "local t = base{ session_token = 'TOKEN', presign = false }\n"
  "ok(clean(sign(t)) and clean(sign(base{ presign = true })),\n"
  "   'no returned field holds the secret key')\n"
  "\n"
  "local a = sign(base{ method = 'POST', body = 'Param1=value1',\n"
  "  headers = { {'Host', 'example.amazonaws.com'}, {'Content-Length', 13} } })\n"
  "local b = sign(base{ method = 'POST', body = 'Param1=value1',\n"
  "  headers = { Host = 'example.amazonaws.com', ['Content-Length'] = '13' } })\n"
  "ok(a.signature == b.signature and a.signed_headers == 'content-length;host;x-amz-date',\n"
  "   'list form, map form and a number value agree', a.signed_headers)\n"
  "ok(a.payload_hash == '9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e',\n"
  "   'payload_hash is the SHA-256 of body', a.payload_hash)\n"
  "\n"
  "t = base(); t.amz_date = nil; t.method = nil; t.path = nil\n"
  "local before = os.date('!%Y%m%dT%H%M%SZ')\n"
  "local d = sign(t)\n"
  "local after = os.date('!%Y%m%dT%H%M%SZ')\n"
  "ok(d.amz_date:match('^%d%d%d%d%d%d%d%dT%d%d%d%d%d%dZ$') and before <= d.amz_date\n"
  "   and d.amz_date <= after and d.headers['X-Amz-Date'] == d.amz_date,\n"
  "   'amz_date defaults to now (UTC)', d.amz_date)\n"
  "ok(d.canonical_request:match('^GET\\n/\\n'), 'method and path default to GET /')\n"
  "\n"
  "local s = sign(base{ session_token = 'TOKEN' })\n"
  "ok(s.headers['X-Amz-Security-Token'] == 'TOKEN' and\n"
  "   s.signed_headers == 'host;x-amz-date;x-amz-security-token', 'a session token is signed')\n"
  "local u = sign(base{ session_token = 'TOKEN', sign_token = false })\n"
  "ok(u.headers['X-Amz-Security-Token'] == 'TOKEN' and u.signed_headers == 'host;x-amz-date',\n"
  "   'sign_token = false sends it unsigned')\n"
  "local p = sign(base{ payload_hash = 'UNSIGNED-PAYLOAD', content_sha256 = true })\n"
  "ok(p.canonical_request:sub(-17) == '\\nUNSIGNED-PAYLOAD' and\n"
  "   p.headers['X-Amz-Content-Sha256'] == 'UNSIGNED-PAYLOAD', 'payload_hash and content_sha256')\n"
  "local dbl = sign(base{ path = '/a%20b/./c' })\n"
  "ok(dbl.canonical_request:match('^GET\\n/a%%2520b/c\\n'), 'the path is normalised and encoded again',\n"
  "   dbl.canonical_request)\n"
  "local s3 = sign(base{ path = '/a%20b/./c', normalize = false, double_encode = false })\n"
  "ok(s3.canonical_request:match('^GET\\n/a%%20b/%./c\\n'), 'normalize = false, double_encode = false',\n"
  "   s3.canonical_request)\n"
  "local q = sign(base{ presign = true, expires = 60, query = 'b=2&a=1', session_token = 'T/K' })\n"
  "ok(q.authorization == nil and next(q.headers) == nil and\n"
  "   q.query:match('^X%-Amz%-Algorithm=AWS4%-HMAC%-SHA256&') and\n"
  "   q.query:find('&X-Amz-SignedHeaders=host&a=1&b=2&', 1, true) and\n"
  "   q.query:find('&X-Amz-Expires=60&', 1, true) and\n"
  "   q.query:find('&X-Amz-Security-Token=T%2FK&', 1, true) and\n"
  "   q.query:sub(-81) == '&X-Amz-Signature=' .. q.signature, 'presign gives the query to send', q.query)\n"
  "\n"
  "local nosecret = base(); nosecret.secret_key = nil\n"
  "local noheaders = base(); noheaders.headers = nil\n"
  "local bad = {\n"
  "  { 'not a table', 'x', 'table expected' },\n"
  "  { 'missing secret_key', nosecret, \"field 'secret_key' is required\" },\n"
  "  { 'secret_key not a string', base{ secret_key = 42 }, \"'secret_key' must be a string, not number\" },\n"
  "  { 'empty secret_key', base{ secret_key = '' }, 'secret_key is empty' },\n"
  "  { 'malformed amz_date', base{ amz_date = '2015-08-30' }, 'YYYYMMDDTHHMMSSZ' },\n"
  "  { 'X-Amz-Date header', base{ headers = { Host = 'h', ['X-Amz-Date'] = 'x' } },\n"
  "    \"'X-Amz-Date' is set by the signer\" },\n"
  "  { 'Authorization header', base{ headers = { {'Host', 'h'}, {'authorization', 'x'} } },\n"
  "    \"'authorization' is set by the signer\" },\n"
  "  { 'no Host', base{ headers = { Foo = 'bar' } }, 'Host' },\n"
  "  { 'no headers', noheaders, \"field 'headers'\" },\n"
  "  { 'header injection', base{ headers = { Host = 'h', X = 'a\\r\\nEvil: 1' } }, 'header value' },\n"
  "  { 'header name with a space', base{ headers = { Host = 'h', ['Bad Name'] = '1' } }, \"'Bad Name'\" },\n"
  "  { 'list entry not a pair', base{ headers = { 'Host' } }, 'headers[1]' },\n"
  "  { 'header value not a string', base{ headers = { Host = 'h', X = true } }, \"value of 'X'\" },\n"
  "  { 'region with a slash', base{ region = 'us/east-1' }, 'region' },\n"
  "  { 'body and payload_hash', base{ body = 'x', payload_hash = 'UNSIGNED-PAYLOAD' }, 'not both' },\n"
  "  { 'expires out of range', base{ presign = true, expires = 0 }, 'expires' },\n"
  "  { 'presign over X-Amz-Signature', base{ presign = true, query = 'X-Amz-Signature=1' }, 'X-Amz-*' },\n"
  "  { 'normalize not a boolean', base{ normalize = 'no' }, \"'normalize' must be a boolean\" },\n"
  "  { 'NUL in path', base{ path = '/a\\0b' }, 'NUL' },\n"
  "  { 'relative path', base{ path = 'a/b' }, \"path must start with '/'\" },\n"
  "}\n"
  "for _, c in ipairs(bad) do\n"
  "  local good, err = pcall(sign, c[2])\n"
  "  ok(not good and type(err) == 'string' and err:find(c[3], 1, true) ~= nil and\n"
  "     not err:find(SECRET, 1, true), 'misuse raises: ' .. c[1], err)\n"
  "end\n";

/* }====== */

int
main(int argc, char **argv)
{
  const char *suite = argc > 1 ? argv[1] : DEFAULT_SUITE;
  struct dirent **ents = NULL;
  lua_State *L = luaL_newstate();
  int i, k, cases = 0;

  if (!L) {
    puts("Bail out! cannot create a Lua state");
    return 1;
  }
  luaL_openlibs(L);
  sbx_open_sigv4(L);
  lua_setglobal(L, "sigv4");
  lua_pushcfunction(L, lua_tap);
  lua_setglobal(L, "tap");
  lua_pushstring(L, SECRET);
  lua_setglobal(L, "SECRET");

  k = scandir(suite, &ents, NULL, alphasort);
  if (k < 0) {
    ok(0, "suite: open %s", suite);
    diag("hint", "pass the suite directory as the first argument");
  }
  for (i = 0; i < k; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", suite, ents[i]->d_name);
    if (ents[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
      run_case(suite, ents[i]->d_name, L);
      cases++;
    }
    free(ents[i]);
  }
  free(ents);
  ok(cases > 0, "suite: %d case directories in %s", cases, suite);

  own_cases();
  if (luaL_loadbuffer(L, lua_cases, sizeof lua_cases - 1, "=lua_cases") || lua_pcall(L, 0, 0, 0)) {
    ok(0, "lua: the chunk runs to its end");
    diag("error", lua_tostring(L, -1));
  }
  lua_close(L);
  printf("1..%d\n", n);
  return failed ? 1 : 0;
}

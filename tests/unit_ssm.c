/* needs: nothing */
/*
** Unit tests for the SSM data-channel codec (TAP). Every vector of
** vectors.jsonl (frames made and parsed by the official session-manager-plugin)
** goes through the C API and then through the Lua binding: an accept vector
** must decode to its fields and encode back to the same bytes, a reject
** vector must be refused. Hand-made cases follow.
**   unit_ssm [path/to/vectors.jsonl]   (default tests/data/ssm/vectors.jsonl,
**                                       relative to the repository root)
*/
#include "ssm.h"

#include <cjson/cJSON.h>
#include <lauxlib.h>
#include <lualib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_VECTORS "tests/data/ssm/vectors.jsonl"

static int n, failed;
static char diag[4096];
static size_t diag_len;

/* Records one diagnostic line for the current test. */
static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
note(const char *fmt, ...)
{
  va_list ap;
  size_t room;
  int w;
  if (diag_len + 4 >= sizeof diag)
    return;
  memcpy(diag + diag_len, "# ", 2);
  diag_len += 2;
  room = sizeof diag - diag_len - 1; /* one byte kept for the newline */
  va_start(ap, fmt);
  w = vsnprintf(diag + diag_len, room, fmt, ap);
  va_end(ap);
  diag_len += w < 0 ? 0 : (size_t)w < room ? (size_t)w : room - 1;
  diag[diag_len++] = '\n';
  diag[diag_len] = '\0';
}

/* Ends the current test: ok unless a diagnostic was recorded or !cond. */
static void
check(int cond, const char *name)
{
  n++;
  if (!cond && diag_len == 0)
    note("check failed");
  if (diag_len) {
    failed++;
    printf("not ok %d - %s\n%s", n, name, diag);
  }
  else
    printf("ok %d - %s\n", n, name);
  diag_len = 0;
  diag[0] = '\0';
}

/* {====================================================== helpers */

static int
hexnib(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Decodes hex into a new buffer (at least 1 byte allocated). Returns 0/-1. */
static int
unhex(const char *s, unsigned char **out, size_t *len)
{
  size_t i, k = strlen(s);
  unsigned char *p;
  if (k % 2 || !(p = malloc(k / 2 + 1)))
    return -1;
  for (i = 0; i < k / 2; i++) {
    int hi = hexnib(s[2 * i]), lo = hexnib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      free(p);
      return -1;
    }
    p[i] = (unsigned char)(hi << 4 | lo);
  }
  *out = p;
  *len = k / 2;
  return 0;
}

static void
tohex(const unsigned char *p, size_t k, char *out)
{
  static const char H[] = "0123456789abcdef";
  size_t i;
  for (i = 0; i < k; i++) {
    out[2 * i] = H[p[i] >> 4];
    out[2 * i + 1] = H[p[i] & 15];
  }
  out[2 * k] = '\0';
}

static const char *
jstr(const cJSON *o, const char *key)
{
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* An integral JSON number that a double holds exactly (|v| <= 2^53). */
static int
jint(const cJSON *o, const char *key, long long *v)
{
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
  double d;
  if (!cJSON_IsNumber(j))
    return -1;
  d = j->valuedouble;
  if (!(d >= -9007199254740992.0 && d <= 9007199254740992.0) || (double)(long long)d != d)
    return -1;
  *v = (long long)d;
  return 0;
}

/* The expected fields of an accept vector. */
struct want {
  const char *type, *id, *payload_hex, *digest_hex;
  long long schema, date, seq, flags, ptype;
};

static int
load_want(const cJSON *v, struct want *w)
{
  int bad = 0;
  memset(w, 0, sizeof *w);
  if (!(w->type = jstr(v, "message_type")) || !(w->id = jstr(v, "message_id")) ||
      !(w->payload_hex = jstr(v, "payload_hex")) || !(w->digest_hex = jstr(v, "payload_digest_hex")))
    bad = 1;
  if (jint(v, "schema_version", &w->schema) < 0 || jint(v, "created_date_ms", &w->date) < 0 ||
      jint(v, "sequence_number", &w->seq) < 0 || jint(v, "flags", &w->flags) < 0 ||
      jint(v, "payload_type", &w->ptype) < 0)
    bad = 1;
  if (bad)
    note("vector is missing a field or has a non-integral number");
  return bad ? -1 : 0;
}

/* }====================================================== */

/* {====================================================== C API */

static void
c_accept(const char *name, const unsigned char *frame, size_t len, const struct want *w)
{
  struct sbx_ssm_msg m;
  char err[200], id[SBX_SSM_UUID_STRLEN + 1], dig[2 * SBX_SSM_DIGEST_SIZE + 1];
  char *phex;
  unsigned char wire[SBX_SSM_ID_SIZE], *enc = NULL;
  size_t elen = 0;
  int rc = sbx_ssm_decode(frame, len, &m, err, sizeof err);

  if (rc < 0) {
    note("decode failed (%s): %s", sbx_ssm_errname(rc), err);
    check(0, name);
    return;
  }
  if (strcmp(m.message_type, w->type) != 0)
    note("message_type '%s', want '%s'", m.message_type, w->type);
  if (m.header_length != SBX_SSM_HEADER_LENGTH)
    note("header_length %lu", (unsigned long)m.header_length);
  if ((long long)m.schema_version != w->schema)
    note("schema_version %lu, want %lld", (unsigned long)m.schema_version, w->schema);
  if ((long long)m.created_date != w->date)
    note("created_date %llu, want %lld", (unsigned long long)m.created_date, w->date);
  if (m.sequence_number != w->seq)
    note("sequence_number %lld, want %lld", (long long)m.sequence_number, w->seq);
  if ((long long)m.flags != w->flags)
    note("flags %llu, want %lld", (unsigned long long)m.flags, w->flags);
  if ((long long)m.payload_type != w->ptype)
    note("payload_type %lu, want %lld", (unsigned long)m.payload_type, w->ptype);
  sbx_ssm_uuid_format(m.message_id, id);
  if (strcmp(id, w->id) != 0)
    note("message_id %s, want %s", id, w->id);
  if (sbx_ssm_uuid_parse(w->id, strlen(w->id), wire) < 0 || memcmp(wire, m.message_id, sizeof wire) != 0)
    note("uuid_parse(%s) is not the wire MessageId", w->id);
  if (memcmp(wire, frame + 64, sizeof wire) != 0)
    note("uuid_parse(%s) differs from frame bytes 64..79", w->id);
  tohex(m.payload_digest, SBX_SSM_DIGEST_SIZE, dig);
  if (strcmp(dig, w->digest_hex) != 0)
    note("payload_digest %s, want %s", dig, w->digest_hex);
  if ((phex = malloc(2 * (size_t)m.payload_length + 1))) {
    tohex(m.payload, m.payload_length, phex);
    if (strcmp(phex, w->payload_hex) != 0)
      note("payload differs (%lu bytes)", (unsigned long)m.payload_length);
    free(phex);
  }
  if ((m.payload_length == 0) != (m.payload == NULL))
    note("payload pointer/length mismatch");

  if ((rc = sbx_ssm_encode(&m, &enc, &elen)) < 0)
    note("encode failed: %s", sbx_ssm_strerror(rc));
  else if (elen != len || memcmp(enc, frame, len) != 0)
    note("encode gave %zu bytes that differ from the %zu-byte frame", elen, len);
  free(enc);
  check(1, name);
}

static void
c_reject(const char *name, const unsigned char *frame, size_t len)
{
  struct sbx_ssm_msg m;
  char err[200] = "";
  int rc = sbx_ssm_decode(frame, len, &m, err, sizeof err);
  if (rc == 0)
    note("decode accepted a frame it must refuse");
  else if (err[0] == '\0')
    note("decode failed (%d) without a message", rc);
  else if (m.payload != NULL)
    note("payload set on failure");
  check(rc < 0, name);
  if (rc < 0)
    printf("#   refused (%s): %s\n", sbx_ssm_errname(rc), err);
}

/* }====================================================== */

/* {====================================================== Lua binding */

/* Calls ssm.<fn> with the value at idx; leaves nres results. */
static int
call_ssm(lua_State *L, const char *fn, int idx, int nres)
{
  idx = lua_absindex(L, idx);
  lua_getglobal(L, "ssm");
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_pushvalue(L, idx);
  if (lua_pcall(L, 1, nres, 0) != LUA_OK) {
    note("ssm.%s raised: %s", fn, lua_tostring(L, -1));
    lua_pop(L, 1);
    return -1;
  }
  return 0;
}

/* Checks that t[key] (t on top) is the integer want. */
static void
want_int(lua_State *L, const char *key, long long want)
{
  lua_getfield(L, -1, key);
  if (!lua_isinteger(L, -1) || (long long)lua_tointeger(L, -1) != want) {
    note("t.%s = %s, want %lld", key, luaL_tolstring(L, -1, NULL), want);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* Checks that t[key] (t on top) is the string of wlen bytes at want. */
static void
want_str(lua_State *L, const char *key, const void *want, size_t wlen)
{
  size_t k = 0;
  const char *s = NULL;
  lua_getfield(L, -1, key);
  if (lua_type(L, -1) == LUA_TSTRING)
    s = lua_tolstring(L, -1, &k);
  if (!s || k != wlen || memcmp(s, want, k) != 0)
    note("t.%s is wrong (%s, %zu bytes, want %zu)", key, luaL_typename(L, -1), k, wlen);
  lua_pop(L, 1);
}

static void
l_accept(lua_State *L, const char *name, const unsigned char *frame, size_t len, const struct want *w)
{
  unsigned char *payload = NULL;
  size_t plen = 0, k;
  const char *s;
  int top = lua_gettop(L);

  lua_pushlstring(L, (const char *)frame, len); /* [frame] */
  if (call_ssm(L, "decode", -1, 3) == 0) {      /* [frame, t, e, c] */
    lua_pop(L, 2);
    if (!lua_istable(L, -1)) {
      note("decode returned %s", luaL_typename(L, -1));
    }
    else {
      want_str(L, "message_type", w->type, strlen(w->type));
      want_int(L, "schema_version", w->schema);
      want_int(L, "created_date", w->date);
      want_int(L, "sequence_number", w->seq);
      want_int(L, "flags", w->flags);
      want_int(L, "payload_type", w->ptype);
      want_str(L, "message_id", w->id, strlen(w->id));
      want_str(L, "payload_digest", w->digest_hex, strlen(w->digest_hex));
      if (unhex(w->payload_hex, &payload, &plen) == 0) {
        want_str(L, "payload", payload, plen);
        free(payload);
      }
      if (call_ssm(L, "encode", -1, 1) == 0) { /* [frame, t, f2] */
        s = lua_tolstring(L, -1, &k);
        if (!s || k != len || memcmp(s, frame, len) != 0)
          note("encode(decode(frame)) differs from the frame");
      }
    }
  }
  lua_settop(L, top);
  check(1, name);
}

static void
l_reject(lua_State *L, const char *name, const unsigned char *frame, size_t len)
{
  int top = lua_gettop(L);
  lua_pushlstring(L, (const char *)frame, len);
  if (call_ssm(L, "decode", -1, 3) == 0) {
    if (!lua_isnil(L, -3))
      note("decode returned %s, want nil", luaL_typename(L, -3));
    if (lua_type(L, -2) != LUA_TSTRING)
      note("no error message");
    if (lua_type(L, -1) != LUA_TSTRING || strcmp(lua_tostring(L, -1), "ssm") != 0)
      note("third result is not \"ssm\"");
  }
  lua_settop(L, top);
  check(1, name);
}

/* }====================================================== */

/* Runs every vector of path; returns how many ran. */
static int
run_vectors(lua_State *L, const char *path)
{
  FILE *f = fopen(path, "r");
  char *line = NULL, tname[300];
  size_t cap = 0;
  int count = 0, lineno = 0;

  if (!f) {
    note("cannot open %s", path);
    check(0, "vectors file");
    return 0;
  }
  while (getline(&line, &cap, f) > 0) {
    cJSON *v;
    const char *name, *expect, *fhex;
    unsigned char *frame = NULL;
    size_t len = 0;
    struct want w;

    lineno++;
    if (line[strspn(line, " \t\r\n")] == '\0')
      continue;
    v = cJSON_Parse(line);
    name = v ? jstr(v, "name") : NULL;
    expect = v ? jstr(v, "expect") : NULL;
    fhex = v ? jstr(v, "frame_hex") : NULL;
    if (!name || !expect || !fhex || unhex(fhex, &frame, &len) < 0) {
      snprintf(tname, sizeof tname, "vector on line %d", lineno);
      note("unreadable vector (JSON, name, expect or frame_hex)");
      check(0, tname);
      check(0, tname);
      cJSON_Delete(v);
      continue;
    }
    count++;
    if (strcmp(expect, "accept") == 0) {
      if (load_want(v, &w) < 0) {
        check(0, name);
        note("see above");
        snprintf(tname, sizeof tname, "lua: %s", name);
        check(0, tname);
      }
      else {
        c_accept(name, frame, len, &w);
        snprintf(tname, sizeof tname, "lua: %s", name);
        l_accept(L, tname, frame, len, &w);
      }
    }
    else if (strcmp(expect, "reject") == 0) {
      c_reject(name, frame, len);
      snprintf(tname, sizeof tname, "lua: %s", name);
      l_reject(L, tname, frame, len);
    }
    else {
      note("expect is '%s'", expect);
      check(0, name);
      check(0, name);
    }
    free(frame);
    cJSON_Delete(v);
  }
  free(line);
  fclose(f);
  return count;
}

/* {====================================================== hand-made cases */

/* A valid frame to mutate: output_stream_data "hello\r\n", seq 0, SYN. */
static const char SAMPLE_ID[] = "6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c12";

static size_t
sample_frame(unsigned char *buf, size_t cap)
{
  struct sbx_ssm_msg m;
  memset(&m, 0, sizeof m);
  snprintf(m.message_type, sizeof m.message_type, "%s", "output_stream_data");
  m.schema_version = 1;
  m.created_date = 1728561600000ull;
  m.flags = SBX_SSM_FLAG_SYN;
  m.payload_type = SBX_SSM_PAYLOAD_OUTPUT;
  m.payload = (const unsigned char *)"hello\r\n";
  m.payload_length = 7;
  sbx_ssm_uuid_parse(SAMPLE_ID, strlen(SAMPLE_ID), m.message_id);
  return sbx_ssm_encode_to(&m, buf, cap) == 0 ? sbx_ssm_frame_size(&m) : 0;
}

/* Frames made by mutating the sample: the decoder's checks one by one. */
static void
handmade_decode(void)
{
  unsigned char f[256], g[256];
  char err[200];
  struct sbx_ssm_msg m;
  size_t len = sample_frame(f, sizeof f);

  check(len == 127 && sbx_ssm_decode(f, len, &m, err, sizeof err) == 0, "sample frame is valid");

  memcpy(g, f, len);
  g[3] = 0;
  check(sbx_ssm_decode(g, len, &m, err, sizeof err) == SBX_SSM_EHEADER,
        "HeaderLength 0 is refused (plugin: HeaderLength cannot be zero)");
  g[3] = 117;
  check(sbx_ssm_decode(g, len, &m, err, sizeof err) == SBX_SSM_EHEADER, "HeaderLength 117 is refused");

  memcpy(g, f, len);
  g[119] = 6; /* PayloadLength 6 with 7 bytes following */
  check(sbx_ssm_decode(g, len, &m, err, sizeof err) == SBX_SSM_ELENGTH,
        "PayloadLength one short of the frame is refused");
  g[119] = 0; /* the plugin skips the digest when PayloadLength is 0 */
  check(sbx_ssm_decode(g, len, &m, err, sizeof err) == SBX_SSM_ELENGTH,
        "PayloadLength 0 with a payload behind it is refused");
  /* PayloadLength 0, no payload, a digest that is not SHA-256(""). */
  check(sbx_ssm_decode(g, 120, &m, err, sizeof err) == SBX_SSM_EDIGEST,
        "empty payload with a wrong digest is refused");

  memcpy(g, f, len);
  memset(g + 4 + 18, 0, 14);
  check(sbx_ssm_decode(g, len, &m, err, sizeof err) == 0 &&
          strcmp(m.message_type, "output_stream_data") == 0 && sbx_ssm_encode_to(&m, g, sizeof g) == 0 &&
          memcmp(g, f, len) == 0,
        "NUL padding in MessageType is trimmed, re-encoded with spaces");
  memcpy(g, f, len);
  memset(g + 4, ' ', 32);
  memcpy(g + 6, "output_stream_data", 18);
  check(sbx_ssm_decode(g, len, &m, err, sizeof err) == 0 && strcmp(m.message_type, "output_stream_data") == 0,
        "leading spaces in MessageType are trimmed");
  memcpy(g, f, len);
  g[4 + 6] = 0x01;
  check(sbx_ssm_decode(g, len, &m, err, sizeof err) == SBX_SSM_ETYPE,
        "a control byte inside MessageType is refused");
  g[4 + 6] = 0xc3;
  check(sbx_ssm_decode(g, len, &m, err, sizeof err) == SBX_SSM_ETYPE,
        "a non-ASCII byte inside MessageType is refused");

  check(sbx_ssm_decode(f, len, NULL, err, sizeof err) == SBX_SSM_EINVAL &&
          sbx_ssm_decode(NULL, 0, &m, err, sizeof err) == SBX_SSM_ESHORT &&
          sbx_ssm_decode(NULL, 5, &m, NULL, 0) == SBX_SSM_EINVAL &&
          sbx_ssm_decode(f, 3, &m, NULL, 0) == SBX_SSM_ESHORT,
        "decode handles NULL arguments and a NULL err");
  sbx_ssm_decode(f, 60, &m, err, 8);
  check(strlen(err) == 7, "a short err buffer is truncated and NUL-terminated");
}

static void
handmade_uuid(void)
{
  /* README: this id is written as 8e210d5f7a9b3c12 6f1c2a4e9b7d4c3a. */
  static const unsigned char wire_want[16] = { 0x8e, 0x21, 0x0d, 0x5f, 0x7a, 0x9b, 0x3c, 0x12,
                                               0x6f, 0x1c, 0x2a, 0x4e, 0x9b, 0x7d, 0x4c, 0x3a };
#define BAD(s)                                                                                               \
  {                                                                                                          \
    s, sizeof s - 1                                                                                          \
  }
  static const struct {
    const char *s;
    size_t n;
  } bad[] = {
    BAD("6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c1"),     /* 35 characters */
    BAD("6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c123"),   /* 37 characters */
    BAD("6f1c2a4e09b7d-4c3a-8e21-0d5f7a9b3c12"),    /* a hyphen missing */
    BAD("6f1c2a4-e9b7d-4c3a-8e21-0d5f7a9b3c12"),    /* a hyphen moved */
    BAD("6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c1g"),    /* not hex */
    BAD("6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c 2"),    /* a space */
    BAD("6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c\0002"), /* NUL (\000, then 2) */
  };
#undef BAD
  unsigned char wire[16];
  char id[SBX_SSM_UUID_STRLEN + 1];
  size_t i;
  int refused = 1;

  sbx_ssm_uuid_format(wire_want, id);
  check(strcmp(id, SAMPLE_ID) == 0, "uuid_format un-swaps the wire halves");
  check(sbx_ssm_uuid_parse("6F1C2A4E-9B7D-4C3A-8E21-0D5F7A9B3C12", 36, wire) == 0 &&
          memcmp(wire, wire_want, 16) == 0,
        "uuid_parse swaps the halves and takes upper case");
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (sbx_ssm_uuid_parse(bad[i].s, bad[i].n, wire) == 0) {
      note("accepted '%s'", bad[i].s);
      refused = 0;
    }
  if (sbx_ssm_uuid_parse(NULL, 36, wire) == 0) {
    note("accepted NULL");
    refused = 0;
  }
  check(refused, "uuid_parse refuses malformed strings");
}

/* Checks that encode refuses e (it would not decode back to itself). */
static void
encode_refuses(const struct sbx_ssm_msg *e, const char *name)
{
  unsigned char g[256];
  check(sbx_ssm_encode_to(e, g, sizeof g) == SBX_SSM_EINVAL, name);
}

static void
handmade_encode(void)
{
  static const char EMPTY_SHA256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  unsigned char f[256], g[256], *p = NULL;
  char err[200], dig[2 * SBX_SSM_DIGEST_SIZE + 1] = "";
  struct sbx_ssm_msg m, e;
  size_t len = sample_frame(f, sizeof f), plen = 0;
  int rc;

  sbx_ssm_decode(f, len, &m, err, sizeof err);
  e = m;
  e.message_type[0] = '\0';
  encode_refuses(&e, "encode: empty type");
  e = m;
  memset(e.message_type, 'a', sizeof e.message_type);
  encode_refuses(&e, "encode: 33-byte type");
  e = m;
  snprintf(e.message_type, sizeof e.message_type, " ack");
  encode_refuses(&e, "encode: leading space");
  snprintf(e.message_type, sizeof e.message_type, "ack ");
  encode_refuses(&e, "encode: trailing space");
  snprintf(e.message_type, sizeof e.message_type, "a\tb");
  encode_refuses(&e, "encode: control byte");
  e = m;
  e.created_date = 0;
  encode_refuses(&e, "encode: created_date 0");
  e = m;
  memset(e.message_id, 0, sizeof e.message_id);
  encode_refuses(&e, "encode: nil UUID");
  e = m;
  e.header_length = 117;
  encode_refuses(&e, "encode: header_length 117");
  e = m;
  e.payload = NULL;
  encode_refuses(&e, "encode: NULL payload with a length");

  e = m;
  memset(e.message_type, 'a', 32);
  e.message_type[32] = '\0';
  check(sbx_ssm_encode_to(&e, g, sizeof g) == 0 && sbx_ssm_decode(g, len, &e, err, sizeof err) == 0 &&
          strlen(e.message_type) == 32,
        "encode: a 32-byte type fills the field");
  e = m;
  e.header_length = 0;
  check(sbx_ssm_encode_to(&e, g, sizeof g) == 0 && memcmp(g, f, len) == 0,
        "encode: header_length 0 means 116");
  check(sbx_ssm_encode_to(&m, g, len - 1) == SBX_SSM_EINVAL && sbx_ssm_encode_to(&m, g, len) == 0,
        "encode: cap must hold the frame");

  e = m;
  e.payload = NULL;
  e.payload_length = 0;
  rc = sbx_ssm_encode(&e, &p, &plen);
  if (rc == 0)
    tohex(p + 80, SBX_SSM_DIGEST_SIZE, dig);
  check(rc == 0 && plen == 120 && p[119] == 0 && strcmp(dig, EMPTY_SHA256) == 0,
        "encode: empty payload is 120 bytes with SHA-256 of nothing");
  free(p);
  check(sbx_ssm_encode(NULL, NULL, NULL) == SBX_SSM_EINVAL, "encode: NULL arguments");

  check(strstr(sbx_ssm_strerror(SBX_SSM_EDIGEST), "digest") != NULL &&
          strcmp(sbx_ssm_errname(SBX_SSM_ELENGTH), "length") == 0 &&
          strcmp(sbx_ssm_strerror(-99), "unknown error") == 0 && strcmp(sbx_ssm_errname(0), "unknown") == 0,
        "strerror and errname");
}

/* Each chunk returns true, or false plus a message. */
static const char *const LUA_CASES[][2] = {
  { "lua: encode fills in the defaults",
    "local f = ssm.encode{message_type = 'acknowledge', payload = '{}',\n"
    "  message_id = '6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c12'}\n"
    "local t = assert(ssm.decode(f))\n"
    "local now = os.time() * 1000\n"
    "return #f == 122 and t.schema_version == 1 and t.flags == 0 and\n"
    "  t.payload_type == 0 and t.sequence_number == 0 and\n"
    "  t.payload == '{}' and math.abs(t.created_date - now) < 5000 and\n"
    "  math.type(t.created_date) == 'integer'" },
  { "lua: u64 and negative fields round-trip",
    "local t = {message_type = 'x', payload = '', flags = -1,\n"
    "  message_id = 'ffffffff-ffff-4fff-bfff-ffffffffffff',\n"
    "  sequence_number = -5, created_date = -1,\n"
    "  payload_type = 4294967295, schema_version = 0}\n"
    "local d = assert(ssm.decode(ssm.encode(t)))\n"
    "for k, v in pairs(t) do if d[k] ~= v then return false, k end end\n"
    "return true" },
  { "lua: integral floats are accepted",
    "local d = assert(ssm.decode(ssm.encode{message_type = 'x',\n"
    "  message_id = '00000000-0000-4000-8000-000000000001', payload = 'p',\n"
    "  sequence_number = 2.0^40}))\n"
    "return d.sequence_number == 1 << 40 and\n"
    "  math.type(d.sequence_number) == 'integer'" },
  { "lua: decode of garbage returns nil, err, 'ssm'",
    "local a, b, c = ssm.decode('short')\n"
    "return a == nil and b:find('shorter') ~= nil and c == 'ssm', b" },
  { "lua: misuse raises", "local id = '6f1c2a4e-9b7d-4c3a-8e21-0d5f7a9b3c12'\n"
                          "local bad = {  -- changes to a valid table; false removes the field\n"
                          "  {message_type = false}, {message_id = false}, {payload = false},\n"
                          "  {message_type = ''}, {message_type = string.rep('a', 33)},\n"
                          "  {message_type = ' ack'}, {message_type = 'a\\0b'},\n"
                          "  {message_type = 1}, {message_id = 'xyz'},\n"
                          "  {message_id = '00000000-0000-0000-0000-000000000000'},\n"
                          "  {message_id = id .. ' '}, {payload = 5}, {created_date = 0},\n"
                          "  {payload_type = -1}, {payload_type = 1 << 32},\n"
                          "  {schema_version = '1'}, {sequence_number = 1.5}, {flags = 'x'},\n"
                          "  {created_date = 0.5},\n"
                          "}\n"
                          "for i, over in ipairs(bad) do\n"
                          "  local r = {message_type = 'acknowledge', message_id = id,\n"
                          "             payload = ''}\n"
                          "  for k, v in pairs(over) do r[k] = v or nil end\n"
                          "  local ok, e = pcall(ssm.encode, r)\n"
                          "  if ok or not e:find('ssm.encode') then\n"
                          "    return false, 'case ' .. i .. ': ' .. tostring(e)\n"
                          "  end\n"
                          "end\n"
                          "if pcall(ssm.encode, 'x') or pcall(ssm.encode) or pcall(ssm.decode) or\n"
                          "  pcall(ssm.decode, {}) then\n"
                          "  return false, 'a non-table or non-string was accepted'\n"
                          "end\n"
                          "return true" },
};

static void
handmade_lua(lua_State *L)
{
  size_t i;
  for (i = 0; i < sizeof LUA_CASES / sizeof LUA_CASES[0]; i++) {
    int top = lua_gettop(L);
    if (luaL_loadstring(L, LUA_CASES[i][1]) != LUA_OK || lua_pcall(L, 0, 2, 0) != LUA_OK)
      note("error: %s", lua_tostring(L, -1));
    else if (!lua_toboolean(L, -2))
      note("returned false: %s", luaL_tolstring(L, -1, NULL));
    lua_settop(L, top);
    check(1, LUA_CASES[i][0]);
  }
}

/* }====================================================== */

int
main(int argc, char **argv)
{
  const char *path = argc > 1 ? argv[1] : DEFAULT_VECTORS;
  lua_State *L = luaL_newstate();
  int vectors;

  if (!L) {
    fprintf(stderr, "unit_ssm: cannot create a Lua state\n");
    return 1;
  }
  luaL_openlibs(L);
  sbx_open_ssm(L);
  lua_setglobal(L, "ssm");

  vectors = run_vectors(L, path);
  printf("# %d vectors from %s\n", vectors, path);
  if (vectors == 0) {
    note("no vectors in %s", path);
    check(0, "vectors present");
  }
  handmade_decode();
  handmade_uuid();
  handmade_encode();
  handmade_lua(L);
  lua_close(L);

  printf("1..%d\n", n);
  if (failed)
    printf("# %d of %d failed\n", failed, n);
  return failed ? 1 : 0;
}

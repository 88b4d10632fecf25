/*
** SSM data-channel ClientMessage codec (see ssm.h for the layout) and its
** Lua binding sbx.ssm. The C part does no I/O and never raises; the Lua part
** raises on misuse and returns nil, err, "ssm" for a frame it cannot accept.
*/
#include "ssm.h"

#include <lauxlib.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Field offsets. */
enum {
  OFF_HL = 0,
  OFF_TYPE = 4,
  OFF_SCHEMA = 36,
  OFF_DATE = 40,
  OFF_SEQ = 48,
  OFF_FLAGS = 56,
  OFF_ID = 64,
  OFF_DIGEST = 80,
  OFF_PTYPE = 112,
  OFF_PLEN = 116
};

static const char HEX[] = "0123456789abcdef";

/* {====================================================== errors */

const char *
sbx_ssm_strerror(int code)
{
  switch (code) {
#define SBX_SSM_X(name, num, desc)                                                                           \
  case num:                                                                                                  \
    return desc;
    SBX_SSM_ERRORS(SBX_SSM_X)
#undef SBX_SSM_X
  }
  return "unknown error";
}

const char *
sbx_ssm_errname(int code)
{
  switch (code) {
  case SBX_SSM_ESHORT:
    return "short";
  case SBX_SSM_EHEADER:
    return "header";
  case SBX_SSM_ELENGTH:
    return "length";
  case SBX_SSM_EDIGEST:
    return "digest";
  case SBX_SSM_ETYPE:
    return "type";
  case SBX_SSM_EDATE:
    return "date";
  case SBX_SSM_EINVAL:
    return "inval";
  case SBX_SSM_ENOMEM:
    return "nomem";
  case SBX_SSM_ECRYPTO:
    return "crypto";
  }
  return "unknown";
}

/* Writes a sentence into err (if any) and returns code. */
static int fail(int code, char *err, size_t errlen, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));

static int
fail(int code, char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;
  if (err && errlen) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* }====================================================== */

/* {====================================================== big-endian */

static uint32_t
get32(const unsigned char *p)
{
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t
get64(const unsigned char *p)
{
  return (uint64_t)get32(p) << 32 | get32(p + 4);
}

static void
put32(unsigned char *p, uint32_t v)
{
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

static void
put64(unsigned char *p, uint64_t v)
{
  put32(p, (uint32_t)(v >> 32));
  put32(p + 4, (uint32_t)v);
}

/* }====================================================== */

int
sbx_ssm_sha256(const void *p, size_t n, unsigned char md[SBX_SSM_DIGEST_SIZE])
{
  unsigned int mdlen = 0;
  if (!p)
    p = "";
  if (!EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL) || mdlen != SBX_SSM_DIGEST_SIZE)
    return SBX_SSM_ECRYPTO;
  return 0;
}

/* {====================================================== UUID */

void
sbx_ssm_uuid_format(const unsigned char wire[SBX_SSM_ID_SIZE], char out[SBX_SSM_UUID_STRLEN + 1])
{
  size_t i, o = 0;
  for (i = 0; i < SBX_SSM_ID_SIZE; i++) {
    /* Text byte i lives at wire[(i + 8) % 16]: the halves are swapped. */
    unsigned char b = wire[(i + 8) % SBX_SSM_ID_SIZE];
    if (i == 4 || i == 6 || i == 8 || i == 10)
      out[o++] = '-';
    out[o++] = HEX[b >> 4];
    out[o++] = HEX[b & 15];
  }
  out[o] = '\0';
}

static int
hexval(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int
sbx_ssm_uuid_parse(const char *s, size_t n, unsigned char wire[SBX_SSM_ID_SIZE])
{
  unsigned char u[SBX_SSM_ID_SIZE];
  size_t i, k = 0;
  if (!s || !wire || n != SBX_SSM_UUID_STRLEN)
    return SBX_SSM_EINVAL;
  for (i = 0; i < n; i++) {
    int hi, lo;
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (s[i] != '-')
        return SBX_SSM_EINVAL;
      continue;
    }
    hi = hexval(s[i]);
    lo = i + 1 < n ? hexval(s[i + 1]) : -1;
    if (hi < 0 || lo < 0)
      return SBX_SSM_EINVAL;
    u[k++] = (unsigned char)(hi << 4 | lo);
    i++;
  }
  memcpy(wire, u + 8, 8);
  memcpy(wire + 8, u, 8);
  return 0;
}

/* }====================================================== */

/* {====================================================== decode */

static int
is_space(unsigned char c)
{
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/*
** Trims the MessageType field the way the Go readers do (NULs from both ends,
** then whitespace from both ends) into out. Returns the length, or -1 when a
** byte left over is not printable ASCII (*bad gets its offset in the field).
*/
static int
trim_type(const unsigned char *f, char out[SBX_SSM_TYPE_SIZE + 1], size_t *bad)
{
  size_t a = 0, b = SBX_SSM_TYPE_SIZE, i;
  while (a < b && f[a] == 0)
    a++;
  while (b > a && f[b - 1] == 0)
    b--;
  while (a < b && is_space(f[a]))
    a++;
  while (b > a && is_space(f[b - 1]))
    b--;
  for (i = a; i < b; i++)
    if (f[i] < 0x20 || f[i] > 0x7e) {
      *bad = i;
      return -1;
    }
  memcpy(out, f + a, b - a);
  out[b - a] = '\0';
  return (int)(b - a);
}

int
sbx_ssm_decode(const unsigned char *buf, size_t len, struct sbx_ssm_msg *out, char *err, size_t errlen)
{
  unsigned char md[SBX_SSM_DIGEST_SIZE];
  const unsigned char *payload;
  size_t bad = 0;
  int n, rc;

  if (!out || (!buf && len))
    return fail(SBX_SSM_EINVAL, err, errlen, "ssm decode: no frame or no output");
  memset(out, 0, sizeof *out);
  if (len < SBX_SSM_PREFIX)
    return fail(SBX_SSM_ESHORT, err, errlen, "ssm frame is %zu bytes, shorter than the %d-byte header", len,
                SBX_SSM_PREFIX);

  out->header_length = get32(buf + OFF_HL);
  n = trim_type(buf + OFF_TYPE, out->message_type, &bad);
  out->schema_version = get32(buf + OFF_SCHEMA);
  out->created_date = get64(buf + OFF_DATE);
  out->sequence_number = (int64_t)get64(buf + OFF_SEQ);
  out->flags = get64(buf + OFF_FLAGS);
  memcpy(out->message_id, buf + OFF_ID, SBX_SSM_ID_SIZE);
  memcpy(out->payload_digest, buf + OFF_DIGEST, SBX_SSM_DIGEST_SIZE);
  out->payload_type = get32(buf + OFF_PTYPE);
  out->payload_length = get32(buf + OFF_PLEN);

  if (out->header_length != SBX_SSM_HEADER_LENGTH)
    return fail(SBX_SSM_EHEADER, err, errlen, "ssm header length is %lu, expected %d",
                (unsigned long)out->header_length, SBX_SSM_HEADER_LENGTH);
  /* len >= 120 here, so len - 120 cannot wrap. */
  if (len - SBX_SSM_PREFIX < out->payload_length)
    return fail(SBX_SSM_ELENGTH, err, errlen, "ssm payload length %lu needs a %llu-byte frame, got %zu bytes",
                (unsigned long)out->payload_length, (unsigned long long)out->payload_length + SBX_SSM_PREFIX,
                len);
  if (len - SBX_SSM_PREFIX > out->payload_length)
    return fail(SBX_SSM_ELENGTH, err, errlen, "ssm frame has %zu trailing bytes after its %lu-byte payload",
                len - SBX_SSM_PREFIX - out->payload_length, (unsigned long)out->payload_length);
  if (n < 0)
    return fail(SBX_SSM_ETYPE, err, errlen, "ssm message type has byte 0x%02x at offset %zu",
                buf[OFF_TYPE + bad], bad);
  if (n == 0)
    return fail(SBX_SSM_ETYPE, err, errlen, "ssm message type is empty");
  if (out->created_date == 0)
    return fail(SBX_SSM_EDATE, err, errlen, "ssm %s message has created date 0", out->message_type);

  payload = buf + SBX_SSM_PREFIX;
  if ((rc = sbx_ssm_sha256(payload, out->payload_length, md)) < 0)
    return fail(rc, err, errlen, "ssm: SHA-256 failed in libcrypto");
  if (memcmp(md, out->payload_digest, SBX_SSM_DIGEST_SIZE) != 0)
    return fail(SBX_SSM_EDIGEST, err, errlen,
                "ssm %s message (seq %lld): payload digest does not match "
                "SHA-256 of its %lu-byte payload",
                out->message_type, (long long)out->sequence_number, (unsigned long)out->payload_length);
  out->payload = out->payload_length ? payload : NULL;
  return 0;
}

/* }====================================================== */

/* {====================================================== encode */

size_t
sbx_ssm_frame_size(const struct sbx_ssm_msg *m)
{
  return (size_t)SBX_SSM_PREFIX + m->payload_length;
}

/* 0 when t is a message type that decodes back to itself. */
static int
check_type(const char *t, size_t n)
{
  size_t i;
  if (n == 0 || n > SBX_SSM_TYPE_SIZE || t[0] == ' ' || t[n - 1] == ' ')
    return SBX_SSM_EINVAL;
  for (i = 0; i < n; i++)
    if ((unsigned char)t[i] < 0x20 || (unsigned char)t[i] > 0x7e)
      return SBX_SSM_EINVAL;
  return 0;
}

static int
is_nil_id(const unsigned char id[SBX_SSM_ID_SIZE])
{
  size_t i;
  for (i = 0; i < SBX_SSM_ID_SIZE; i++)
    if (id[i])
      return 0;
  return 1;
}

int
sbx_ssm_encode_to(const struct sbx_ssm_msg *m, unsigned char *out, size_t cap)
{
  size_t tlen;
  int rc;
  if (!m || !out)
    return SBX_SSM_EINVAL;
  tlen = strnlen(m->message_type, sizeof m->message_type);
  if (check_type(m->message_type, tlen) < 0 || m->created_date == 0 || is_nil_id(m->message_id) ||
      (!m->payload && m->payload_length) || (m->header_length && m->header_length != SBX_SSM_HEADER_LENGTH) ||
      cap < sbx_ssm_frame_size(m))
    return SBX_SSM_EINVAL;

  put32(out + OFF_HL, SBX_SSM_HEADER_LENGTH);
  memset(out + OFF_TYPE, ' ', SBX_SSM_TYPE_SIZE);
  memcpy(out + OFF_TYPE, m->message_type, tlen);
  put32(out + OFF_SCHEMA, m->schema_version);
  put64(out + OFF_DATE, m->created_date);
  put64(out + OFF_SEQ, (uint64_t)m->sequence_number);
  put64(out + OFF_FLAGS, m->flags);
  memcpy(out + OFF_ID, m->message_id, SBX_SSM_ID_SIZE);
  rc = sbx_ssm_sha256(m->payload, m->payload_length, out + OFF_DIGEST);
  if (rc < 0)
    return rc;
  put32(out + OFF_PTYPE, m->payload_type);
  put32(out + OFF_PLEN, m->payload_length);
  if (m->payload_length)
    memcpy(out + SBX_SSM_PREFIX, m->payload, m->payload_length);
  return 0;
}

int
sbx_ssm_encode(const struct sbx_ssm_msg *m, unsigned char **out, size_t *len)
{
  unsigned char *p;
  size_t n;
  int rc;
  if (!m || !out || !len)
    return SBX_SSM_EINVAL;
  n = sbx_ssm_frame_size(m);
  if (n < SBX_SSM_PREFIX) /* size_t overflow on a 32-bit target */
    return SBX_SSM_EINVAL;
  if (!(p = malloc(n)))
    return SBX_SSM_ENOMEM;
  if ((rc = sbx_ssm_encode_to(m, p, n)) < 0) {
    free(p);
    return rc;
  }
  *out = p;
  *len = n;
  return 0;
}

/* }====================================================== */

/* {====================================================== Lua binding */

/*
** ssm.decode(frame) -> table | nil, err, "ssm"
** The table: message_type, schema_version, created_date (ms), sequence_number,
** flags, message_id (UUID string, un-swapped), payload_type, payload (string)
** and payload_digest (64 lowercase hex digits). created_date and flags are
** u64 on the wire; values of 2^63 and above come out negative. Raises only
** when frame is not a string (or on memory errors).
*/
static int
ssm_decode(lua_State *L)
{
  struct sbx_ssm_msg m;
  char err[160], id[SBX_SSM_UUID_STRLEN + 1], hex[2 * SBX_SSM_DIGEST_SIZE];
  size_t len, i;
  const char *frame = luaL_checklstring(L, 1, &len);

  if (sbx_ssm_decode((const unsigned char *)frame, len, &m, err, sizeof err) < 0) {
    luaL_pushfail(L);
    lua_pushstring(L, err);
    lua_pushliteral(L, "ssm");
    return 3;
  }
  lua_createtable(L, 0, 9);
  lua_pushstring(L, m.message_type);
  lua_setfield(L, -2, "message_type");
  lua_pushinteger(L, (lua_Integer)m.schema_version);
  lua_setfield(L, -2, "schema_version");
  lua_pushinteger(L, (lua_Integer)m.created_date);
  lua_setfield(L, -2, "created_date");
  lua_pushinteger(L, (lua_Integer)m.sequence_number);
  lua_setfield(L, -2, "sequence_number");
  lua_pushinteger(L, (lua_Integer)m.flags);
  lua_setfield(L, -2, "flags");
  sbx_ssm_uuid_format(m.message_id, id);
  lua_pushstring(L, id);
  lua_setfield(L, -2, "message_id");
  lua_pushinteger(L, (lua_Integer)m.payload_type);
  lua_setfield(L, -2, "payload_type");
  /* The payload is the tail of frame (still on the stack at index 1). */
  lua_pushlstring(L, frame + SBX_SSM_PREFIX, m.payload_length);
  lua_setfield(L, -2, "payload");
  for (i = 0; i < SBX_SSM_DIGEST_SIZE; i++) {
    hex[2 * i] = HEX[m.payload_digest[i] >> 4];
    hex[2 * i + 1] = HEX[m.payload_digest[i] & 15];
  }
  lua_pushlstring(L, hex, sizeof hex);
  lua_setfield(L, -2, "payload_digest");
  return 1; /* [frame, t] */
}

/*
** Pushes t[name] and returns it as an integer, or def when it is nil (and
** required is 0). Raises unless it is an integer (or an integral float) in
** [lo, hi]. The value stays on the stack.
*/
static lua_Integer
opt_field_int(lua_State *L, const char *name, int required, lua_Integer def, lua_Integer lo, lua_Integer hi)
{
  lua_Integer v;
  int isnum = 0;
  int t = lua_getfield(L, 1, name);
  if (t == LUA_TNIL) {
    if (required)
      luaL_error(L, "ssm.encode: field '%s' is required", name);
    return def;
  }
  v = t == LUA_TNUMBER ? lua_tointegerx(L, -1, &isnum) : 0;
  if (!isnum || v < lo || v > hi)
    luaL_error(L,
               "ssm.encode: field '%s' must be an integer in [%I, %I], "
               "got %s",
               name, lo, hi, luaL_typename(L, -1));
  return v;
}

/* Pushes t[name], which must be a string, and returns it. */
static const char *
field_string(lua_State *L, const char *name, size_t *len)
{
  if (lua_getfield(L, 1, name) != LUA_TSTRING)
    luaL_error(L, "ssm.encode: field '%s' must be a string, got %s", name, luaL_typename(L, -1));
  return lua_tolstring(L, -1, len);
}

static uint64_t
now_ms(void)
{
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
    return 1; /* never 0: decoders reject it */
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/*
** ssm.encode(t) -> frame (string). May raise.
** Required: message_type (1-32 printable ASCII bytes, no space at either end),
** message_id (hyphenated UUID string, not the nil UUID), payload (string, may
** be empty). Optional: schema_version (u32, default 1), created_date (ms,
** non-zero, default now), sequence_number (default 0), flags (default 0),
** payload_type (u32, default 0). created_date and flags take any non-zero /
** any integer and are written as u64 (two's complement), so the output of
** decode always encodes back to the same frame. payload_digest and
** header_length are computed, never read.
*/
static int
ssm_encode(lua_State *L)
{
  struct sbx_ssm_msg m;
  const char *s;
  size_t n, size;
  luaL_Buffer b;
  unsigned char *p;
  int rc;

  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  memset(&m, 0, sizeof m);

  s = field_string(L, "message_type", &n);
  if (check_type(s, n) < 0)
    luaL_error(L,
               "ssm.encode: message_type must be 1 to %d printable ASCII "
               "bytes with no space at either end",
               SBX_SSM_TYPE_SIZE);
  memcpy(m.message_type, s, n);
  s = field_string(L, "message_id", &n);
  if (sbx_ssm_uuid_parse(s, n, m.message_id) < 0)
    luaL_error(L,
               "ssm.encode: message_id must be a UUID "
               "(xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), got '%s'",
               s);
  if (is_nil_id(m.message_id))
    luaL_error(L, "ssm.encode: message_id must not be the nil UUID");
  m.schema_version = (uint32_t)opt_field_int(L, "schema_version", 0, 1, 0, UINT32_MAX);
  m.created_date = (uint64_t)opt_field_int(L, "created_date", 0, 0, LUA_MININTEGER, LUA_MAXINTEGER);
  if (lua_isnil(L, -1))
    m.created_date = now_ms();
  else if (m.created_date == 0)
    luaL_error(L, "ssm.encode: field 'created_date' must not be 0");
  m.sequence_number = (int64_t)opt_field_int(L, "sequence_number", 0, 0, LUA_MININTEGER, LUA_MAXINTEGER);
  m.flags = (uint64_t)opt_field_int(L, "flags", 0, 0, LUA_MININTEGER, LUA_MAXINTEGER);
  m.payload_type = (uint32_t)opt_field_int(L, "payload_type", 0, 0, 0, UINT32_MAX);
  /* The payload string stays on the stack, so m.payload stays valid. */
  s = field_string(L, "payload", &n);
  if (n > UINT32_MAX || n > (size_t)-1 - SBX_SSM_PREFIX)
    luaL_error(L, "ssm.encode: payload of %I bytes is too long", (lua_Integer)n);
  m.payload = (const unsigned char *)s;
  m.payload_length = (uint32_t)n;

  size = sbx_ssm_frame_size(&m);
  p = (unsigned char *)luaL_buffinitsize(L, &b, size);
  if ((rc = sbx_ssm_encode_to(&m, p, size)) < 0)
    return luaL_error(L, "ssm.encode: %s", sbx_ssm_strerror(rc));
  luaL_pushresultsize(&b, size);
  return 1;
}

static const luaL_Reg ssm_funcs[] = { { "decode", ssm_decode }, { "encode", ssm_encode }, { NULL, NULL } };

int
sbx_open_ssm(lua_State *L)
{
  luaL_newlib(L, ssm_funcs);
  return 1;
}

/* }====================================================== */

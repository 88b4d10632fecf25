/*
** core.agent: the agent protocol's frames for the Lua transport
** (lua/sbx/transports/agent.lua). The codec is agent_proto.c; this file
** only carries bytes between it and Lua. Every byte from a box is
** untrusted: a frame that is too long or fails authentication is an error
** the decoder reports once and keeps reporting (the channel is done).
**
**   core.agent.encode(type, id, payload [, key, seq]) -> frame bytes
**   core.agent.decoder([key]) -> d
**     d:feed(bytes)         buffers (at most one frame beyond what next took)
**     d:feed_from(stream) -> n: as d:feed(stream:take(true)) without the
**       Lua string (the channel's queued bytes are handed over, most often
**       without a copy)
**     d:next([jobs]) -> type, id, payload | nil (need more) | false, code, message;
**       for an OUT frame: type, id, the output bytes, the stream (1 or 2);
**       with jobs (id -> a table whose sink is a core.stream sink), an OUT
**       frame for one of them goes into its sink as sink:push does, and
**       the bytes never become a Lua string: type, id, their count, the
**       stream, and what push returned (the queued bytes, or nil: ended)
**     d:buffered() -> bytes waiting
**     d:position() -> bytes of whole frames taken since the start
**     d:resume() -> position: drops a frame cut short by a dropped channel
**       (the agent sends it again whole from that position)
**   core.agent.attach_name(key) -> the agent's attach socket name
**   core.agent.attach_proof(key, role, nonce_a, nonce_h) -> 32 bytes
**   core.agent.HEADER, TAG, KEY, MAX_PAYLOAD, VERSION
*/
#include "host.h"
#include "modules.h"
#include "agent_proto.h"
#include "pty_escape.h"
#include "stream.h"

#include <stdlib.h>
#include <string.h>

#define DECODER_MT "sbx.agent.decoder"

struct decoder {
  uint8_t *p;
  size_t len, off, cap;
  uint8_t key[SBX_AP_KEY];
  int mac;
  uint64_t seq;
  uint64_t pos; /* bytes of whole frames taken */
  int failed;   /* 0, or the sbx_ap_decode error that ended it */
};

static struct decoder *
check_decoder(lua_State *L)
{
  return luaL_checkudata(L, 1, DECODER_MT);
}

static int
agent_encode(lua_State *L)
{
  lua_Integer type = luaL_checkinteger(L, 1);
  lua_Integer id = luaL_checkinteger(L, 2);
  size_t n, klen = 0;
  const char *payload = luaL_optlstring(L, 3, "", &n);
  const char *key = luaL_optlstring(L, 4, NULL, &klen);
  luaL_Buffer b;
  uint8_t *out;
  luaL_argcheck(L, type >= 1 && type <= 255, 1, "a frame type 1-255 (0 is padding)");
  luaL_argcheck(L, id >= 0 && id <= 0xffffffffLL, 2, "an id 0-2^32-1");
  luaL_argcheck(L, n <= SBX_AP_MAX_PAYLOAD, 3, "payload longer than the protocol allows");
  luaL_argcheck(L, !key || klen == SBX_AP_KEY, 4, "a 32-byte key");
  out = (uint8_t *)luaL_buffinitsize(L, &b, SBX_AP_HEADER + n + SBX_AP_TAG);
  sbx_ap_header(out, (uint8_t)type, (uint32_t)id, (uint32_t)n);
  memcpy(out + SBX_AP_HEADER, payload, n);
  if (key) {
    uint64_t seq = (uint64_t)luaL_checkinteger(L, 5);
    sbx_ap_tag((const uint8_t *)key, seq, out, out + SBX_AP_HEADER, (uint32_t)n, out + SBX_AP_HEADER + n);
    luaL_pushresultsize(&b, SBX_AP_HEADER + n + SBX_AP_TAG);
  }
  else {
    luaL_pushresultsize(&b, SBX_AP_HEADER + n);
  }
  return 1;
}

static int
agent_decoder(lua_State *L)
{
  size_t klen = 0;
  const char *key = luaL_optlstring(L, 1, NULL, &klen);
  struct decoder *d;
  luaL_argcheck(L, !key || klen == SBX_AP_KEY, 1, "a 32-byte key");
  d = lua_newuserdatauv(L, sizeof *d, 0);
  memset(d, 0, sizeof *d);
  luaL_setmetatable(L, DECODER_MT);
  if (key) {
    memcpy(d->key, key, SBX_AP_KEY);
    d->mac = 1;
  }
  return 1;
}

/* Appends n bytes; -1 when memory ran out. */
static int
decoder_append(struct decoder *d, const char *p, size_t n)
{
  if (d->off > 0 && (d->off == d->len || d->off > d->cap / 2)) {
    memmove(d->p, d->p + d->off, d->len - d->off);
    d->len -= d->off;
    d->off = 0;
  }
  if (d->len + n > d->cap) {
    size_t cap = d->cap ? d->cap : (n > 256 ? n : 256);
    uint8_t *q;
    while (cap < d->len + n)
      cap *= 2;
    q = realloc(d->p, cap);
    if (!q)
      return -1;
    d->p = q;
    d->cap = cap;
  }
  memcpy(d->p + d->len, p, n);
  d->len += n;
  return 0;
}

static int
decoder_feed(lua_State *L)
{
  struct decoder *d = check_decoder(L);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  if (decoder_append(d, p, n) != 0)
    return luaL_error(L, "out of memory");
  return 0;
}

static int
decoder_feed_from(lua_State *L)
{
  struct decoder *d = check_decoder(L);
  char *p;
  size_t n, cap;
  if (sbx_stream_take_out(L, 2, &p, &n, &cap) != 0)
    return luaL_argerror(L, 2, "an open core.stream");
  if (p && d->off == d->len) {
    /* Nothing of ours is waiting: the queue becomes our buffer. */
    free(d->p);
    d->p = (uint8_t *)p;
    d->off = 0;
    d->len = n;
    d->cap = cap;
  }
  else if (p) {
    int rc = decoder_append(d, p, n);
    free(p);
    if (rc != 0)
      return luaL_error(L, "out of memory");
  }
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* An OUT frame for a job of jobs (the table at index 2) goes into its
** sink: 5 results pushed, or 0 when it is not for one (the caller pushes
** the bytes as a string). */
static int
route_output(lua_State *L, const struct sbx_ap_frame *f)
{
  size_t queued = 0;
  int rc = -1;
  if (f->payload[0] != 1 && f->payload[0] != 2)
    return 0;
  if (lua_geti(L, 2, (lua_Integer)f->id) == LUA_TTABLE) {
    lua_getfield(L, -1, "sink");
    rc = sbx_stream_push_out(L, -1, f->payload[0], (const char *)f->payload + 1, f->len - 1, &queued);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (rc < 0)
    return 0;
  lua_pushinteger(L, (lua_Integer)(f->len - 1));
  lua_pushinteger(L, f->payload[0]);
  if (rc > 0)
    lua_pushinteger(L, (lua_Integer)queued);
  else
    lua_pushnil(L);
  return 5;
}

static int
decoder_next(lua_State *L)
{
  struct decoder *d = check_decoder(L);
  struct sbx_ap_frame f;
  int used;
  if (!d->failed) {
    used = sbx_ap_decode(d->p + d->off, d->len - d->off, d->mac ? d->key : NULL, d->seq, &f);
    if (used == SBX_AP_NEED) {
      lua_pushnil(L);
      return 1;
    }
    while (used > 0 && f.type == SBX_AP_PAD) {
      d->off += (size_t)used;
      d->pos += (uint64_t)used;
      used = sbx_ap_decode(d->p + d->off, d->len - d->off, d->mac ? d->key : NULL, d->seq, &f);
    }
    if (used == SBX_AP_NEED) {
      lua_pushnil(L);
      return 1;
    }
    if (used > 0) {
      int nres = 3;
      int routed = lua_istable(L, 2);
      d->seq++;
      lua_pushinteger(L, f.type);
      lua_pushinteger(L, (lua_Integer)f.id);
      if (f.type == SBX_AP_OUT && f.len >= 1 && routed && (nres = route_output(L, &f)) > 0) {
        /* pushed into the job's sink */
      }
      else if (f.type == SBX_AP_OUT && f.len >= 1) {
        /* Output: the bytes, then the stream, so no copy is cut again. */
        lua_pushlstring(L, (const char *)f.payload + 1, f.len - 1);
        lua_pushinteger(L, f.payload[0]);
        nres = 4;
      }
      else {
        lua_pushlstring(L, (const char *)f.payload, f.len);
      }
      d->off += (size_t)used;
      d->pos += (uint64_t)used;
      /* An idle channel holds no buffer: a box waiting for its next
      ** command costs its host almost nothing. */
      if (d->off == d->len && d->cap > 4096) {
        free(d->p);
        d->p = NULL;
        d->len = d->off = d->cap = 0;
      }
      return nres;
    }
    d->failed = used;
  }
  lua_pushboolean(L, 0);
  if (d->failed == SBX_AP_BAD_TAG) {
    lua_pushliteral(L, "bad_tag");
    lua_pushliteral(L, "a frame from the agent failed authentication");
  }
  else {
    lua_pushliteral(L, "bad_frame");
    lua_pushliteral(L, "a frame from the agent is longer than the protocol allows");
  }
  return 3;
}

static int
decoder_buffered(lua_State *L)
{
  struct decoder *d = check_decoder(L);
  lua_pushinteger(L, (lua_Integer)(d->len - d->off));
  return 1;
}

static int
decoder_position(lua_State *L)
{
  struct decoder *d = check_decoder(L);
  lua_pushinteger(L, (lua_Integer)d->pos);
  return 1;
}

static int
decoder_resume(lua_State *L)
{
  struct decoder *d = check_decoder(L);
  d->off = d->len = 0;
  lua_pushinteger(L, (lua_Integer)d->pos);
  return 1;
}

static int
agent_attach_name(lua_State *L)
{
  size_t klen;
  const char *key = luaL_checklstring(L, 1, &klen);
  char name[SBX_AP_ATTACH_NAME];
  luaL_argcheck(L, klen == SBX_AP_KEY, 1, "a 32-byte key");
  sbx_ap_attach_name((const uint8_t *)key, name);
  lua_pushstring(L, name);
  return 1;
}

static int
agent_attach_proof(lua_State *L)
{
  size_t klen, alen, hlen;
  const char *key = luaL_checklstring(L, 1, &klen);
  const char *role = luaL_checkstring(L, 2);
  const char *na = luaL_checklstring(L, 3, &alen);
  const char *nh = luaL_checklstring(L, 4, &hlen);
  uint8_t proof[SBX_AP_PROOF];
  luaL_argcheck(L, klen == SBX_AP_KEY, 1, "a 32-byte key");
  luaL_argcheck(L, alen == SBX_AP_NONCE, 3, "a 16-byte nonce");
  luaL_argcheck(L, hlen == SBX_AP_NONCE, 4, "a 16-byte nonce");
  sbx_ap_attach_proof((const uint8_t *)key, role, (const uint8_t *)na, (const uint8_t *)nh, proof);
  lua_pushlstring(L, (const char *)proof, sizeof proof);
  return 1;
}

static int
decoder_gc(lua_State *L)
{
  struct decoder *d = check_decoder(L);
  free(d->p);
  d->p = NULL;
  d->len = d->off = d->cap = 0;
  memset(d->key, 0, sizeof d->key);
  return 0;
}

/* The agents built into this library (Makefile: agent_blob.S). */
#ifdef SBX_AGENT_x86_64
extern const char sbx_agent_x86_64[], sbx_agent_x86_64_end[];
#endif
#ifdef SBX_AGENT_aarch64
extern const char sbx_agent_aarch64[], sbx_agent_aarch64_end[];
#endif

/* core.agent.binary(arch) -> the static agent for arch ("x86_64",
** "aarch64"; uname -m's names) | nil when this build has none. */
static int
agent_binary(lua_State *L)
{
  const char *arch = luaL_checkstring(L, 1);
  (void)arch;
#ifdef SBX_AGENT_x86_64
  if (strcmp(arch, "x86_64") == 0) {
    lua_pushlstring(L, sbx_agent_x86_64, (size_t)(sbx_agent_x86_64_end - sbx_agent_x86_64));
    return 1;
  }
#endif
#ifdef SBX_AGENT_aarch64
  if (strcmp(arch, "aarch64") == 0 || strcmp(arch, "arm64") == 0) {
    lua_pushlstring(L, sbx_agent_aarch64, (size_t)(sbx_agent_aarch64_end - sbx_agent_aarch64));
    return 1;
  }
#endif
  lua_pushnil(L);
  return 1;
}

/* core.agent.pty_decoder() -> d: undoes the relay's --escape (pty_escape.h)
** on a channel through the SSM agent. d:decode(bytes) -> bytes | nil,
** message (the escaping was broken: the channel was rewritten or cut);
** d:done() -> whether no escape waits for its second byte. */
#define PTY_DECODER_MT "sbx.agent.pty_decoder"

static int
pty_decoder_new(lua_State *L)
{
  struct sbx_pty_unescape *d = lua_newuserdatauv(L, sizeof *d, 0);
  sbx_pty_unescape_init(d);
  luaL_setmetatable(L, PTY_DECODER_MT);
  return 1;
}

static int
pty_decoder_decode(lua_State *L)
{
  struct sbx_pty_unescape *d = luaL_checkudata(L, 1, PTY_DECODER_MT);
  size_t n, got;
  const char *in = luaL_checklstring(L, 2, &n);
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, n ? n : 1);
  if (sbx_pty_unescape(d, in, n, out, &got) != 0) {
    luaL_pushresultsize(&b, 0);
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_pushliteral(L, "the channel's escaping is broken (an EF not followed by 30: "
                       "bytes were rewritten or lost on the way)");
    return 2;
  }
  luaL_pushresultsize(&b, got);
  return 1;
}

static int
pty_decoder_done(lua_State *L)
{
  struct sbx_pty_unescape *d = luaL_checkudata(L, 1, PTY_DECODER_MT);
  lua_pushboolean(L, sbx_pty_unescape_done(d));
  return 1;
}

static const luaL_Reg pty_decoder_methods[] = { { "decode", pty_decoder_decode },
                                                { "done", pty_decoder_done },
                                                { NULL, NULL } };

static const luaL_Reg agent_funcs[] = { { "pty_decoder", pty_decoder_new },
                                        { "encode", agent_encode },
                                        { "decoder", agent_decoder },
                                        { "binary", agent_binary },
                                        { "attach_name", agent_attach_name },
                                        { "attach_proof", agent_attach_proof },
                                        { NULL, NULL } };

static const luaL_Reg decoder_methods[] = { { "feed", decoder_feed },
                                            { "feed_from", decoder_feed_from },
                                            { "next", decoder_next },
                                            { "buffered", decoder_buffered },
                                            { "position", decoder_position },
                                            { "resume", decoder_resume },
                                            { NULL, NULL } };

static const luaL_Reg decoder_meta[] = { { "__gc", decoder_gc },
                                         { "__close", decoder_gc },
                                         { "__index", NULL },
                                         { NULL, NULL } };

int
sbx_open_agent(lua_State *L)
{
  luaL_newmetatable(L, DECODER_MT);
  luaL_setfuncs(L, decoder_meta, 0);
  luaL_newlibtable(L, decoder_methods);
  luaL_setfuncs(L, decoder_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newmetatable(L, PTY_DECODER_MT);
  luaL_newlibtable(L, pty_decoder_methods);
  luaL_setfuncs(L, pty_decoder_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, agent_funcs);
  lua_pushliteral(L, SBX_AP_ESCAPE);
  lua_setfield(L, -2, "escape_arg");
  lua_pushinteger(L, SBX_AP_HEADER);
  lua_setfield(L, -2, "HEADER");
  lua_pushinteger(L, SBX_AP_TAG);
  lua_setfield(L, -2, "TAG");
  lua_pushinteger(L, SBX_AP_KEY);
  lua_setfield(L, -2, "KEY");
  lua_pushinteger(L, SBX_AP_MAX_PAYLOAD);
  lua_setfield(L, -2, "MAX_PAYLOAD");
  lua_pushinteger(L, SBX_AP_VERSION);
  lua_setfield(L, -2, "VERSION");
  lua_pushliteral(L, SBX_AP_SAY_RAW);
  lua_setfield(L, -2, "say_raw");
  lua_pushliteral(L, SBX_AP_RAW_LINE);
  lua_setfield(L, -2, "raw_line");
  return 1;
}

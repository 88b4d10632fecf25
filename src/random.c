/*
** core.random: bytes from OpenSSL's CSPRNG (seeded by the kernel), the one
** source of every secret and name sbx makes: job markers, box and session
** names, the agent's key and nonces, exit-marker secrets, SSM message ids.
** (Lua's math.random is xoshiro256**: a command that sees a few of its
** outputs in markers could work out the rest.)
**
**   random.bytes(n) -> n bytes | nil, message, "random"
**   random.hex(n)   -> 2n lowercase hex digits of n random bytes | nil, message, "random"
** n is 0 to 65536; other values raise.
*/
#include <openssl/err.h>
#include <openssl/rand.h>

#include "fail.h"
#include "modules.h"

#define RANDOM_MAX 65536

static int
fill(lua_State *L, unsigned char *buf, int n)
{
  if (n > 0 && RAND_bytes(buf, n) != 1) {
    unsigned long e = ERR_get_error();
    char why[256];
    ERR_error_string_n(e, why, sizeof why);
    return sbx_pushfail(L, "random", "no random bytes from OpenSSL: %s", e ? why : "unknown error");
  }
  return 0;
}

static int
checked_size(lua_State *L)
{
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0 && n <= RANDOM_MAX, 1, "0 to 65536 bytes");
  return (int)n;
}

static int
random_bytes(lua_State *L)
{
  int n = checked_size(L);
  luaL_Buffer b;
  unsigned char *buf = (unsigned char *)luaL_buffinitsize(L, &b, (size_t)n);
  int failed = fill(L, buf, n);
  if (failed)
    return failed;
  luaL_pushresultsize(&b, (size_t)n);
  return 1;
}

static int
random_hex(lua_State *L)
{
  static const char digits[] = "0123456789abcdef";
  int n = checked_size(L), i;
  luaL_Buffer b;
  unsigned char *raw = lua_newuserdatauv(L, (size_t)n + 1, 0);
  char *out;
  int failed = fill(L, raw, n);
  if (failed)
    return failed;
  out = luaL_buffinitsize(L, &b, 2 * (size_t)n);
  for (i = 0; i < n; i++) {
    out[2 * i] = digits[raw[i] >> 4];
    out[2 * i + 1] = digits[raw[i] & 15];
  }
  luaL_pushresultsize(&b, 2 * (size_t)n);
  return 1;
}

static const luaL_Reg random_funcs[] = {
  { "bytes", random_bytes },
  { "hex", random_hex },
  { NULL, NULL },
};

int
sbx_open_random(lua_State *L)
{
  luaL_newlib(L, random_funcs);
  return 1;
}

/*
** AWS Signature Version 4 (AWS4-HMAC-SHA256): the canonical request, the
** string to sign, the signing key, the signature and either the
** Authorization header value or a presigned query string.
**
** Pure code: no I/O and no clock (the caller passes the time as amz_date).
** SHA-256 and HMAC come from OpenSSL libcrypto. Every function returns 0 or
** a negative SBX_SIGV4_E* code. Strings handed back are malloc'd and belong
** to the caller, who releases them with free() (or sbx_sigv4_result_free).
** No output and no error text ever contains the secret key.
**
** Checked against the aws-c-auth SigV4 test suite (tests/unit_sigv4.c).
*/
#ifndef SBX_SIGV4_H
#define SBX_SIGV4_H

#include <stddef.h>

#define SBX_SIGV4_ALGORITHM "AWS4-HMAC-SHA256"
#define SBX_SIGV4_UNSIGNED_PAYLOAD "UNSIGNED-PAYLOAD"
#define SBX_SIGV4_MAX_EXPIRES 604800L /* presigned URLs: 7 days at most */

#define SBX_SIGV4_ERRORS(X)                                                                                  \
  X(ENOMEM, -1, "out of memory")                                                                             \
  X(EINVAL, -2, "invalid argument")                                                                          \
  X(ERESERVED, -3, "header or query parameter is set by the signer")                                         \
  X(ENOHOST, -4, "the request has no Host header")                                                           \
  X(ECRYPTO, -5, "libcrypto failed")                                                                         \
  X(E2BIG, -6, "request too large to sign")

enum sbx_sigv4_error {
#define SBX_SIGV4_ENUM(name, code, text) SBX_SIGV4_##name = (code),
  SBX_SIGV4_ERRORS(SBX_SIGV4_ENUM)
#undef SBX_SIGV4_ENUM
};

/* A static description of code ("unknown error" for anything else). */
const char *sbx_sigv4_strerror(int code);

/* Flags for struct sbx_sigv4_config. The zero value is what every service
** but S3 expects, with the signature carried in an Authorization header. */
#define SBX_SIGV4_NO_NORMALIZE                                                                               \
  0x01u                                /* keep ".", "..", "//" in the path                                   \
                                          (S3) */
#define SBX_SIGV4_NO_ENCODE_PATH 0x02u /* path is not encoded again (S3) */
#define SBX_SIGV4_CONTENT_SHA256                                                                             \
  0x04u /* add and sign x-amz-content-sha256                                                                 \
           (header signing only) */
#define SBX_SIGV4_TOKEN_UNSIGNED                                                                             \
  0x08u /* session token is sent but left out                                                                \
           of the signature */
#define SBX_SIGV4_PRESIGN                                                                                    \
  0x10u /* sign the query string (presigned                                                                  \
           URL) instead of adding headers */

struct sbx_sigv4_header {
  const char *name;  /* any case; trimmed and lower-cased */
  const char *value; /* may fold lines: "\n" or "\r\n" + SP/HT */
};

/*
** The request as it goes on the wire. path and query are the exact bytes of
** the request target (already percent-encoded, or raw as in the test
** suite); for services other than S3 the path is encoded once more for the
** canonical request (AWS's "double encoding"). headers must include Host
** and must not include Authorization, X-Amz-Date or X-Amz-Security-Token,
** which the signer owns. Duplicate names are joined with "," in order.
*/
struct sbx_sigv4_request {
  const char *method; /* "GET", "POST", ... */
  const char *path;   /* NULL or "" means "/" */
  const char *query;  /* without '?'; NULL for none */
  const struct sbx_sigv4_header *headers;
  size_t nheaders;
  const void *body; /* NULL when body_len is 0 */
  size_t body_len;
  const char *payload_hash; /* NULL: hex SHA-256 of body; or a
                               precomputed hash, or
                               SBX_SIGV4_UNSIGNED_PAYLOAD */
};

struct sbx_sigv4_config {
  const char *access_key;
  const char *secret_key;
  const char *session_token; /* NULL or "" for none */
  const char *region;        /* "us-east-1" */
  const char *service;       /* "ecs", "iam", ... */
  const char *amz_date;      /* "YYYYMMDDTHHMMSSZ", UTC */
  unsigned flags;            /* SBX_SIGV4_* */
  long expires;              /* PRESIGN: 1..MAX_EXPIRES s */
};

/*
** What sbx_sigv4_sign produces. Header signing: send the request with
** "X-Amz-Date: <amz_date>", "X-Amz-Security-Token: <token>" when there is
** a token, "X-Amz-Content-Sha256: <payload_hash>" with CONTENT_SHA256, and
** "Authorization: <authorization>". Presigning: send the request with
** "?<query>" as its query string instead of the one given (same parameters,
** canonical order and encoding, plus the X-Amz-* ones).
*/
struct sbx_sigv4_result {
  char *canonical_request;
  char *string_to_sign;
  char *credential_scope; /* YYYYMMDD/region/service/aws4_request */
  char *signed_headers;   /* "host;x-amz-date" */
  char *payload_hash;
  char *signature;     /* 64 lower-case hex digits */
  char *authorization; /* header signing; NULL when presigning */
  char *query;         /* presigning; NULL otherwise */
  const char *error;   /* static text saying what was invalid, or
                          NULL; never holds caller data */
};

/*
** Signs req. On success res holds malloc'd strings (release them with
** sbx_sigv4_result_free); on failure res holds none, and res->error may
** name the offending input. res may be uninitialised on entry.
*/
int sbx_sigv4_sign(const struct sbx_sigv4_request *req, const struct sbx_sigv4_config *cfg,
                   struct sbx_sigv4_result *res);
/* Frees every string of res and clears it; safe to call twice. */
void sbx_sigv4_result_free(struct sbx_sigv4_result *res);

/* The building blocks. Each *out is malloc'd and set only on success. */

/* The canonical URI of a wire path: dot segments and empty segments
** removed unless NO_NORMALIZE, then every byte outside A-Z a-z 0-9 - _ . ~ /
** written as %XX unless NO_ENCODE_PATH. */
int sbx_sigv4_canonical_uri(const char *path, unsigned flags, char **out);

/* The canonical query string of a raw one: each name and value percent-
** decoded (only valid %XX; '+' stays a plus) and re-encoded, a name
** without '=' given an empty value, sorted by name and then by value. */
int sbx_sigv4_canonical_query(const char *query, char **out);

/* Canonical header lines ("name:value\n" each, sorted, duplicates joined
** with ",", values trimmed with runs of whitespace collapsed to one space)
** and the signed header list ("a;b;c"). Hop-by-hop headers and the ones
** proxies rewrite (connection, expect, keep-alive, proxy-*, te, trailer,
** transfer-encoding, upgrade, user-agent, x-amzn-trace-id) are not signed. */
int sbx_sigv4_canonical_headers(const struct sbx_sigv4_header *headers, size_t n, char **canonical,
                                char **signed_headers);

/* "AWS4-HMAC-SHA256\n<amz_date>\n<scope>\n<hex SHA-256 of creq>". */
int sbx_sigv4_string_to_sign(const char *amz_date, const char *scope, const char *canonical_request,
                             char **out);

/* kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service),
** "aws4_request"), date being the first 8 characters of amz_date. */
int sbx_sigv4_signing_key(const char *secret_key, const char *amz_date, const char *region,
                          const char *service, unsigned char key[32]);

/* hex = lower-case hex of HMAC-SHA256(key, msg): the signature. */
int sbx_sigv4_signature(const unsigned char key[32], const char *msg, char hex[65]);

/* hex = lower-case hex of SHA-256(p, n). */
int sbx_sigv4_sha256_hex(const void *p, size_t n, char hex[65]);

/* 0 when a caller may set this header, else SBX_SIGV4_ERESERVED. */
int sbx_sigv4_check_header(const char *name);

/* The Lua module: a table with sign{...}. See sigv4.c. */
struct lua_State;
int sbx_open_sigv4(struct lua_State *L);

#endif

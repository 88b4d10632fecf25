/*
** SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), dependency-free, for the
** agent protocol's frame tags: the agent is a static program without
** OpenSSL, and the host checks the same tags with the same code.
*/
#ifndef SBX_SHA256_H
#define SBX_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sbx_sha256 {
  uint32_t h[8];
  uint64_t bytes;
  uint8_t buf[64];
  size_t used;
};

void sbx_sha256_init(struct sbx_sha256 *c);
void sbx_sha256_update(struct sbx_sha256 *c, const void *data, size_t n);
void sbx_sha256_final(struct sbx_sha256 *c, uint8_t out[32]);

/* HMAC over the concatenation of up to three parts (NULL parts skipped). */
void sbx_hmac_sha256(const uint8_t *key, size_t keylen, const void *a, size_t an, const void *b, size_t bn,
                     const void *c, size_t cn, uint8_t out[32]);

#endif

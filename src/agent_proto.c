/* The agent protocol codec; the contract is in agent_proto.h. Pure: no
** I/O, no allocation. */
#include "agent_proto.h"
#include "sha256.h"

#include <string.h>

uint32_t
sbx_ap_be32(const uint8_t *p)
{
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

uint64_t
sbx_ap_be64(const uint8_t *p)
{
  return (uint64_t)sbx_ap_be32(p) << 32 | sbx_ap_be32(p + 4);
}

void
sbx_ap_put_be32(uint8_t *p, uint32_t v)
{
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

void
sbx_ap_put_be64(uint8_t *p, uint64_t v)
{
  sbx_ap_put_be32(p, (uint32_t)(v >> 32));
  sbx_ap_put_be32(p + 4, (uint32_t)v);
}

void
sbx_ap_header(uint8_t *out, uint8_t type, uint32_t id, uint32_t len)
{
  out[0] = type;
  out[1] = 0;
  sbx_ap_put_be32(out + 2, id);
  sbx_ap_put_be32(out + 6, len);
}

void
sbx_ap_tag(const uint8_t *key, uint64_t seq, const uint8_t *header, const uint8_t *payload, uint32_t len,
           uint8_t *tag)
{
  uint8_t s[8], mac[32];
  sbx_ap_put_be64(s, seq);
  sbx_hmac_sha256(key, SBX_AP_KEY, s, 8, header, SBX_AP_HEADER, payload, len, mac);
  memcpy(tag, mac, SBX_AP_TAG);
}

/* Constant time: how much of a tag matched must not leak through timing. */
int
sbx_ap_same(const uint8_t *a, const uint8_t *b, size_t n)
{
  unsigned diff = 0;
  size_t i;
  for (i = 0; i < n; i++)
    diff |= (unsigned)(a[i] ^ b[i]);
  return diff == 0;
}

void
sbx_ap_attach_name(const uint8_t *key, char out[SBX_AP_ATTACH_NAME])
{
  static const char hex[] = "0123456789abcdef";
  uint8_t mac[32];
  int i;
  sbx_hmac_sha256(key, SBX_AP_KEY, "attach name", 11, NULL, 0, NULL, 0, mac);
  memcpy(out, "sbx-agent-", 10);
  for (i = 0; i < 16; i++) {
    out[10 + 2 * i] = hex[mac[i] >> 4];
    out[11 + 2 * i] = hex[mac[i] & 15];
  }
  out[42] = 0;
}

void
sbx_ap_attach_proof(const uint8_t *key, const char *role, const uint8_t *nonce_a, const uint8_t *nonce_h,
                    uint8_t proof[SBX_AP_PROOF])
{
  sbx_hmac_sha256(key, SBX_AP_KEY, role, strlen(role), nonce_a, SBX_AP_NONCE, nonce_h, SBX_AP_NONCE, proof);
}

int
sbx_ap_decode(const uint8_t *buf, size_t n, const uint8_t *key, uint64_t seq, struct sbx_ap_frame *f)
{
  uint32_t len;
  size_t total;
  if (n > 0 && buf[0] == 0) {
    /* Padding: every zero byte here, as one PAD "frame". */
    size_t k = 1;
    while (k < n && k < SBX_AP_MAX_PAYLOAD && buf[k] == 0)
      k++;
    memset(f, 0, sizeof *f);
    f->type = SBX_AP_PAD;
    f->payload = buf;
    return (int)k;
  }
  if (n < SBX_AP_HEADER)
    return SBX_AP_NEED;
  len = sbx_ap_be32(buf + 6);
  if (len > SBX_AP_MAX_PAYLOAD)
    return SBX_AP_BAD_LENGTH;
  total = SBX_AP_HEADER + (size_t)len + (key ? SBX_AP_TAG : 0);
  if (n < total)
    return SBX_AP_NEED;
  if (key) {
    uint8_t tag[SBX_AP_TAG];
    sbx_ap_tag(key, seq, buf, buf + SBX_AP_HEADER, len, tag);
    if (!sbx_ap_same(tag, buf + SBX_AP_HEADER + len, SBX_AP_TAG))
      return SBX_AP_BAD_TAG;
  }
  f->type = buf[0];
  f->flags = buf[1];
  f->id = sbx_ap_be32(buf + 2);
  f->len = len;
  f->payload = buf + SBX_AP_HEADER;
  return (int)total;
}

void
sbx_ap_fields_init(struct sbx_ap_fields *it, const uint8_t *payload, uint32_t len)
{
  it->p = payload;
  it->end = payload + len;
}

int
sbx_ap_next(struct sbx_ap_fields *it, uint8_t *tag, const uint8_t **value, uint32_t *len)
{
  uint32_t l;
  if (it->p == it->end)
    return 0;
  if (it->end - it->p < 5)
    return -1;
  l = sbx_ap_be32(it->p + 1);
  if ((size_t)(it->end - it->p - 5) < l)
    return -1;
  *tag = it->p[0];
  *value = it->p + 5;
  *len = l;
  it->p += 5 + (size_t)l;
  return 1;
}

int
sbx_ap_put(uint8_t *out, size_t cap, size_t *n, uint8_t tag, const void *value, uint32_t len)
{
  if (cap < *n || cap - *n < 5 + (size_t)len)
    return -1;
  out[*n] = tag;
  sbx_ap_put_be32(out + *n + 1, len);
  if (len)
    memcpy(out + *n + 5, value, len);
  *n += 5 + (size_t)len;
  return 0;
}

int
sbx_ap_put_u32(uint8_t *out, size_t cap, size_t *n, uint8_t tag, uint32_t v)
{
  uint8_t b[4];
  sbx_ap_put_be32(b, v);
  return sbx_ap_put(out, cap, n, tag, b, 4);
}

int
sbx_ap_put_u64(uint8_t *out, size_t cap, size_t *n, uint8_t tag, uint64_t v)
{
  uint8_t b[8];
  sbx_ap_put_be64(b, v);
  return sbx_ap_put(out, cap, n, tag, b, 8);
}

int
sbx_ap_uint(const uint8_t *v, uint32_t len, uint64_t *out)
{
  switch (len) {
  case 1:
    *out = v[0];
    return 0;
  case 2:
    *out = (uint64_t)v[0] << 8 | v[1];
    return 0;
  case 4:
    *out = sbx_ap_be32(v);
    return 0;
  case 8:
    *out = sbx_ap_be64(v);
    return 0;
  }
  return -1;
}

/* needs: nothing */
/*
** The SSM data-channel frame codec (src/ssm.c). The input is decoded as it
** is, and again with its length and digest fields made right (a fuzzer
** cannot forge SHA-256, and every check but the digest comes before it).
** On every frame the decoder accepts:
**   - the frame is exactly 120 + PayloadLength bytes, HeaderLength 116, a
**     type of 1..32 printable bytes without blanks at either end, a date,
**     a digest equal to SHA-256 of the payload, and the payload borrowed
**     from the frame;
**   - encoding the fields gives a frame that decodes to the same fields,
**     and gives back the very input when its type was space padded (a nil
**     MessageId is the one field the encoder refuses, by design);
** On every message the encoder accepts (fields taken from the input), the
** decoder gives the same fields back. MessageId text and wire order convert
** both ways without loss.
*/
#include "fuzz.h"
#include "ssm.h"

#include <string.h>

static int
fields_equal(const struct sbx_ssm_msg *a, const struct sbx_ssm_msg *b)
{
  return a->header_length == b->header_length && strcmp(a->message_type, b->message_type) == 0 &&
         a->schema_version == b->schema_version && a->created_date == b->created_date &&
         a->sequence_number == b->sequence_number && a->flags == b->flags &&
         memcmp(a->message_id, b->message_id, SBX_SSM_ID_SIZE) == 0 &&
         memcmp(a->payload_digest, b->payload_digest, SBX_SSM_DIGEST_SIZE) == 0 &&
         a->payload_type == b->payload_type && a->payload_length == b->payload_length &&
         (a->payload_length == 0 || memcmp(a->payload, b->payload, a->payload_length) == 0);
}

static int
is_nil(const unsigned char *id)
{
  size_t i;
  for (i = 0; i < SBX_SSM_ID_SIZE; i++)
    if (id[i])
      return 0;
  return 1;
}

static uint32_t
be32(const unsigned char *p)
{
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Decodes buf and checks everything an accepted frame promises. */
static void
check_decode(const unsigned char *buf, size_t len)
{
  struct sbx_ssm_msg m, m2;
  unsigned char md[SBX_SSM_DIGEST_SIZE], *enc;
  char err[200];
  size_t tlen, i, elen;
  int rc;

  err[0] = '\0';
  rc = sbx_ssm_decode(buf, len, &m, err, sizeof err);
  CHECK(rc <= 0);
  CHECK(strcmp(sbx_ssm_errname(rc), "unknown") != 0 || rc == 0);
  if (rc < 0) {
    CHECK(err[0] != '\0' && strlen(err) < sizeof err);
    CHECK(m.payload == NULL);
    return;
  }
  CHECK(len >= SBX_SSM_PREFIX && len - SBX_SSM_PREFIX == m.payload_length);
  CHECK(m.header_length == SBX_SSM_HEADER_LENGTH);
  CHECK(be32(buf + 116) == m.payload_length);
  tlen = strlen(m.message_type);
  CHECK(tlen >= 1 && tlen <= SBX_SSM_TYPE_SIZE);
  for (i = 0; i < tlen; i++)
    CHECK(m.message_type[i] >= 0x20 && m.message_type[i] <= 0x7e);
  CHECK(m.message_type[0] != ' ' && m.message_type[tlen - 1] != ' ');
  CHECK(m.created_date != 0);
  CHECK(m.payload_length ? m.payload == buf + SBX_SSM_PREFIX : m.payload == NULL);
  CHECK(sbx_ssm_sha256(m.payload, m.payload_length, md) == 0);
  CHECK(memcmp(md, m.payload_digest, sizeof md) == 0);
  CHECK(sbx_ssm_frame_size(&m) == len);

  rc = sbx_ssm_encode(&m, &enc, &elen);
  if (is_nil(m.message_id)) {
    CHECK(rc == SBX_SSM_EINVAL);
    return;
  }
  CHECK(rc == 0 && elen == len);
  CHECK(sbx_ssm_decode(enc, elen, &m2, NULL, 0) == 0);
  CHECK(fields_equal(&m, &m2));
  /* Byte for byte, unless the type field had other padding than spaces. */
  {
    unsigned char field[SBX_SSM_TYPE_SIZE];
    memset(field, ' ', sizeof field);
    memcpy(field, m.message_type, tlen);
    if (memcmp(buf + 4, field, sizeof field) == 0)
      CHECK(memcmp(enc, buf, len) == 0);
    else
      CHECK(memcmp(enc + 36, buf + 36, len - 36) == 0);
  }
  free(enc);
}

/* Builds a message from the input's bytes; what encodes must decode back. */
static void
check_encode(const unsigned char *d, size_t n)
{
  struct sbx_ssm_msg m, back;
  unsigned char *enc;
  size_t elen, tlen;
  uint64_t v = 0;
  size_t i;
  int rc;
  if (n < 1 + 16 + 8)
    return;
  memset(&m, 0, sizeof m);
  tlen = d[0] % (SBX_SSM_TYPE_SIZE + 2); /* 33: too long */
  if (n < 1 + 16 + 8 + tlen)
    return;
  memcpy(m.message_id, d + 1, 16);
  for (i = 0; i < 8; i++)
    v = v << 8 | d[17 + i];
  m.created_date = v;
  m.sequence_number = (int64_t)(v * 0x9E3779B97F4A7C15ull);
  m.flags = v >> 3;
  m.schema_version = (uint32_t)v;
  m.payload_type = (uint32_t)(v >> 32);
  memcpy(m.message_type, d + 25, tlen < SBX_SSM_TYPE_SIZE ? tlen : SBX_SSM_TYPE_SIZE);
  m.payload = d + 25 + tlen;
  m.payload_length = (uint32_t)(n - 25 - tlen);
  rc = sbx_ssm_encode(&m, &enc, &elen);
  CHECK(rc == 0 || rc == SBX_SSM_EINVAL);
  if (rc != 0)
    return;
  CHECK(elen == SBX_SSM_PREFIX + m.payload_length);
  CHECK(sbx_ssm_decode(enc, elen, &back, NULL, 0) == 0);
  /* The encoder computes HeaderLength and the digest: compare the rest. */
  m.header_length = back.header_length;
  memcpy(m.payload_digest, back.payload_digest, SBX_SSM_DIGEST_SIZE);
  CHECK(fields_equal(&m, &back));
  free(enc);
}

static void
check_uuid(const unsigned char *d, size_t n)
{
  unsigned char wire[SBX_SSM_ID_SIZE], again[SBX_SSM_ID_SIZE];
  char text[SBX_SSM_UUID_STRLEN + 1];
  size_t i;
  if (n >= SBX_SSM_ID_SIZE) {
    sbx_ssm_uuid_format(d, text);
    CHECK(strlen(text) == SBX_SSM_UUID_STRLEN);
    CHECK(sbx_ssm_uuid_parse(text, SBX_SSM_UUID_STRLEN, again) == 0);
    CHECK(memcmp(again, d, SBX_SSM_ID_SIZE) == 0);
  }
  if (n >= SBX_SSM_UUID_STRLEN && sbx_ssm_uuid_parse((const char *)d, SBX_SSM_UUID_STRLEN, wire) == 0) {
    sbx_ssm_uuid_format(wire, text);
    for (i = 0; i < SBX_SSM_UUID_STRLEN; i++) {
      char c = (char)d[i];
      if (c >= 'A' && c <= 'F')
        c = (char)(c - 'A' + 'a');
      CHECK(text[i] == c);
    }
  }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  check_decode(data, size);
  if (size >= SBX_SSM_PREFIX) {
    /* The same frame with HeaderLength, PayloadLength and the digest right. */
    unsigned char *f = fuzz_alloc(size);
    uint32_t plen = (uint32_t)(size - SBX_SSM_PREFIX);
    memcpy(f, data, size);
    f[0] = 0, f[1] = 0, f[2] = 0, f[3] = SBX_SSM_HEADER_LENGTH;
    f[116] = (unsigned char)(plen >> 24);
    f[117] = (unsigned char)(plen >> 16);
    f[118] = (unsigned char)(plen >> 8);
    f[119] = (unsigned char)plen;
    CHECK(sbx_ssm_sha256(f + SBX_SSM_PREFIX, plen, f + 80) == 0);
    check_decode(f, size);
    free(f);
  }
  check_encode(data, size);
  check_uuid(data, size);
  return 0;
}

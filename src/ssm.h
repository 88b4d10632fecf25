/*
** The SSM session-manager data channel (ECS Exec): one ClientMessage per
** websocket binary message. Pure code, no I/O; SHA-256 comes from libcrypto.
** Layout (big-endian, fixed offsets), from docs/aws-protocol.md 1.2:
**
**   0 HeaderLength u32 (116)    4 MessageType 32 bytes, space padded
**  36 SchemaVersion u32        40 CreatedDate u64 (ms since the epoch)
**  48 SequenceNumber i64       56 Flags u64 (bit 0 SYN, bit 1 FIN)
**  64 MessageId 16 bytes       80 PayloadDigest 32 bytes = SHA-256(payload)
** 112 PayloadType u32         116 PayloadLength u32   120 payload
**
** A valid frame is exactly 120 + PayloadLength bytes. The decoder is stricter
** than the official plugin: it always checks the digest (the plugin skips it
** for empty payloads and for start/pause_publication) and the frame length
** (the plugin takes the payload to the end of the frame).
*/
#ifndef SBX_SSM_H
#define SBX_SSM_H

#include <stddef.h>
#include <stdint.h>
#include <lua.h>

enum {
  SBX_SSM_HEADER_LENGTH = 116, /* the HeaderLength every writer puts */
  SBX_SSM_PREFIX = 120,        /* header + PayloadLength: payload offset */
  SBX_SSM_TYPE_SIZE = 32,      /* MessageType field */
  SBX_SSM_ID_SIZE = 16,        /* MessageId field */
  SBX_SSM_DIGEST_SIZE = 32,    /* PayloadDigest field */
  SBX_SSM_UUID_STRLEN = 36     /* "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
};

/* Flags bits. Readers decode them and never act on them. */
enum { SBX_SSM_FLAG_SYN = 1, SBX_SSM_FLAG_FIN = 2 };

/* PayloadType values (docs/aws-protocol.md 1.4); control messages use 0. */
enum {
  SBX_SSM_PAYLOAD_NONE = 0,
  SBX_SSM_PAYLOAD_OUTPUT = 1,
  SBX_SSM_PAYLOAD_ERROR = 2,
  SBX_SSM_PAYLOAD_SIZE = 3,
  SBX_SSM_PAYLOAD_PARAMETER = 4,
  SBX_SSM_PAYLOAD_HANDSHAKE_REQUEST = 5,
  SBX_SSM_PAYLOAD_HANDSHAKE_RESPONSE = 6,
  SBX_SSM_PAYLOAD_HANDSHAKE_COMPLETE = 7,
  SBX_SSM_PAYLOAD_ENC_CHALLENGE_REQUEST = 8,
  SBX_SSM_PAYLOAD_ENC_CHALLENGE_RESPONSE = 9,
  SBX_SSM_PAYLOAD_FLAG = 10,
  SBX_SSM_PAYLOAD_STDERR = 11,
  SBX_SSM_PAYLOAD_EXIT_CODE = 12
};

/* Error codes: X(name, code, description). Every function returns 0 or one
** of these (negative). */
#define SBX_SSM_ERRORS(X)                                                                                    \
  X(SHORT, -1, "frame shorter than the 120-byte header")                                                     \
  X(HEADER, -2, "header length is not 116")                                                                  \
  X(LENGTH, -3, "frame length does not match the payload length")                                            \
  X(DIGEST, -4, "payload digest does not match SHA-256 of the payload")                                      \
  X(TYPE, -5, "message type is empty or not printable ASCII")                                                \
  X(DATE, -6, "created date is zero")                                                                        \
  X(INVAL, -7, "invalid argument")                                                                           \
  X(NOMEM, -8, "out of memory")                                                                              \
  X(CRYPTO, -9, "libcrypto failed")

enum {
#define SBX_SSM_X(name, code, desc) SBX_SSM_E##name = code,
  SBX_SSM_ERRORS(SBX_SSM_X)
#undef SBX_SSM_X
};

/* A static description of an error code ("unknown error" for others). */
const char *sbx_ssm_strerror(int code);
/* A static short name: "short", "header", "length", "digest", ... */
const char *sbx_ssm_errname(int code);

/*
** One decoded ClientMessage. message_id holds the 16 MessageId bytes exactly
** as they are on the wire, i.e. with the UUID's halves swapped (wire[0..7] =
** uuid[8..15], wire[8..15] = uuid[0..7]); sbx_ssm_uuid_format/parse convert
** between that and the UUID text. payload points into the decoded frame
** (borrowed, not NUL-terminated, NULL when the payload is empty).
*/
struct sbx_ssm_msg {
  uint32_t header_length;                   /* always 116 */
  char message_type[SBX_SSM_TYPE_SIZE + 1]; /* without padding, NUL-ended */
  uint32_t schema_version;                  /* 1 in practice */
  uint64_t created_date;                    /* ms since the epoch, not 0 */
  int64_t sequence_number;
  uint64_t flags;
  unsigned char message_id[SBX_SSM_ID_SIZE]; /* wire order (swapped) */
  unsigned char payload_digest[SBX_SSM_DIGEST_SIZE];
  uint32_t payload_type;
  uint32_t payload_length;
  const unsigned char *payload;
};

/*
** Decodes and validates one frame: at least 120 bytes, HeaderLength 116,
** exactly 120 + PayloadLength bytes, a MessageType that is not empty once
** NULs and then whitespace are trimmed from both ends and is printable ASCII,
** CreatedDate not 0, PayloadDigest = SHA-256(payload). Returns 0, or a
** negative SBX_SSM_E* code with a sentence in err (when err is not NULL). On
** failure the header fields read so far are left in *out for logging, and
** out->payload is NULL. Schema version, flags and payload type are not
** checked. *out borrows buf.
*/
int sbx_ssm_decode(const unsigned char *buf, size_t len, struct sbx_ssm_msg *out, char *err, size_t errlen);

/* The frame size of m: 120 + m->payload_length. */
size_t sbx_ssm_frame_size(const struct sbx_ssm_msg *m);

/*
** Writes the frame of m into out (cap >= sbx_ssm_frame_size(m)). HeaderLength
** and PayloadDigest are computed (m->header_length may be 0 or 116;
** m->payload_digest is ignored). Returns 0, or SBX_SSM_EINVAL when m would
** not decode back to the same fields: message_type empty, longer than 32
** bytes, not printable ASCII (0x20..0x7e) or with a space at either end;
** created_date 0; message_id all zero (the official serializer refuses the
** nil UUID); payload NULL with a non-zero length; cap too small.
*/
int sbx_ssm_encode_to(const struct sbx_ssm_msg *m, unsigned char *out, size_t cap);

/* Like sbx_ssm_encode_to into a new malloc'd buffer that the caller frees;
** *out and *len are set only on success. */
int sbx_ssm_encode(const struct sbx_ssm_msg *m, unsigned char **out, size_t *len);

/* SHA-256 of n bytes at p (p may be NULL when n is 0). Returns 0 or
** SBX_SSM_ECRYPTO. */
int sbx_ssm_sha256(const void *p, size_t n, unsigned char md[SBX_SSM_DIGEST_SIZE]);

/* Formats wire-order MessageId bytes as the lowercase hyphenated UUID (the
** un-swapped form that acks quote) into out: 36 characters plus a NUL. */
void sbx_ssm_uuid_format(const unsigned char wire[SBX_SSM_ID_SIZE], char out[SBX_SSM_UUID_STRLEN + 1]);

/* Parses the n characters at s, a hyphenated UUID (either case), into
** wire-order MessageId bytes. Returns 0 or SBX_SSM_EINVAL. */
int sbx_ssm_uuid_parse(const char *s, size_t n, unsigned char wire[SBX_SSM_ID_SIZE]);

/*
** The Lua module: pushes a table with
**   decode(frame) -> { message_type, schema_version, created_date,
**                      sequence_number, flags, message_id, payload_type,
**                      payload, payload_digest (hex) } | nil, err, "ssm"
**   encode(t) -> frame bytes
** Returns 1. See ssm.c for the field rules of encode.
*/
int sbx_open_ssm(lua_State *L);

#endif

/*
** Bounded capture of one output stream: the first head_cap bytes, the last
** tail_cap bytes in a ring, and a count of everything. Host memory stays at
** head_cap + tail_cap whatever the command prints. Pure code: no I/O, no Lua.
*/
#ifndef SBX_CAPTURE_H
#define SBX_CAPTURE_H

#include <stddef.h>
#include <stdint.h>

struct sbx_capture {
  size_t head_cap, tail_cap;
  char *head; /* grows on demand up to head_cap */
  size_t head_len, head_alloc;
  char *tail;      /* ring of tail_cap bytes, allocated once the head is full */
  size_t tail_pos; /* next write position in the ring */
  size_t tail_len; /* valid bytes in the ring (<= tail_cap) */
  uint64_t total;  /* every byte ever added */
};

void sbx_capture_init(struct sbx_capture *c, size_t head_cap, size_t tail_cap);
void sbx_capture_free(struct sbx_capture *c);
/*
** Shrinks a capture that takes no more bytes to what it keeps (the head to
** head_len, the tail to tail_len); reads give the same bytes afterwards.
*/
void sbx_capture_compact(struct sbx_capture *c);
/* Bytes of memory the capture's buffers hold. */
size_t sbx_capture_held(const struct sbx_capture *c);
/* Returns 0, or -1 when memory ran out (the bytes are then only counted). */
int sbx_capture_add(struct sbx_capture *c, const char *p, size_t n);
/* Bytes between head and tail that were counted but not kept. */
uint64_t sbx_capture_omitted(const struct sbx_capture *c);
/* Copies the tail in order into out (tail_len bytes). */
void sbx_capture_copy_tail(const struct sbx_capture *c, char *out);
/* Absolute offset of the first byte of the tail. */
uint64_t sbx_capture_tail_offset(const struct sbx_capture *c);
/*
** Copies at most max bytes stored at absolute offset off into out and returns
** how many; *skipped gets the bytes from off that are no longer kept (the
** copy then starts at off + *skipped).
*/
size_t sbx_capture_read_at(const struct sbx_capture *c, uint64_t off, char *out, size_t max,
                           uint64_t *skipped);

/*
** UTF-8 hygiene. sbx_utf8_valid_prefix returns how many leading bytes of p
** form complete valid sequences (it stops before the first invalid or
** incomplete one; p is valid UTF-8 when that is n).
** sbx_utf8_sanitize writes p with every invalid byte replaced by U+FFFD into
** out (room for 3*n bytes) and returns the length written; when final is 0 an
** incomplete sequence at the end is left out and its length stored in *rest.
** sbx_utf8_repair does the same and stores in *replaced how many U+FFFD it
** wrote: one per maximal invalid subsequence, as Python's decoder.
*/
size_t sbx_utf8_valid_prefix(const char *p, size_t n);
size_t sbx_utf8_sanitize(const char *p, size_t n, char *out, int final, size_t *rest);
size_t sbx_utf8_repair(const char *p, size_t n, char *out, int final, size_t *rest, size_t *replaced);
/* Length of the shortest prefix of p that is only continuation bytes (<= 3). */
size_t sbx_utf8_lead_continuations(const char *p, size_t n);
/* Length of an incomplete sequence at the end of p, 0 when it ends cleanly. */
size_t sbx_utf8_incomplete_suffix(const char *p, size_t n);

#endif

/*
** What the fuzz targets share. A target is one LLVMFuzzerTestOneInput in
** fuzz/fuzz_<name>.c: libFuzzer drives it in `make fuzz`, and fuzz/replay.c
** runs it over its checked-in corpus in `make test`, built with the normal
** compiler and flags. A target checks invariants, not only the absence of a
** crash: CHECK names the one that broke and aborts.
*/
#ifndef SBX_FUZZ_H
#define SBX_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond))                                                                                             \
      fuzz_fail(#cond, __FILE__, __LINE__);                                                                  \
  } while (0)

static inline void
fuzz_fail(const char *what, const char *file, int line)
{
  fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
  abort();
}

/* malloc that never returns NULL (a fuzz run has no use for the error). */
static inline void *
fuzz_alloc(size_t n)
{
  void *p = malloc(n ? n : 1);
  CHECK(p != NULL);
  return p;
}

/*
** Chunk sizes chosen by the input itself, so the fuzzer explores where a
** codec's input is cut. The last byte k of an input names k % 16 control
** bytes just before it; the bytes in front of those are the payload. Each
** control byte c is one chunk size (c & 0x7f, times 64 when c & 0x80, at
** least 1), used in turn and then again from the first. No control bytes:
** the payload goes in whole.
*/
struct fuzz_cuts {
  const uint8_t *ctl;
  size_t nctl, next;
};

/* Splits data into payload and control bytes; returns the payload length. */
static inline size_t
fuzz_cuts_init(struct fuzz_cuts *c, const uint8_t *data, size_t size)
{
  size_t k;
  c->ctl = NULL;
  c->nctl = c->next = 0;
  if (size == 0)
    return 0;
  k = data[size - 1] % 16;
  if (k > size - 1)
    k = size - 1;
  c->ctl = data + size - 1 - k;
  c->nctl = k;
  return size - 1 - k;
}

/* The size of the next chunk when left > 0 bytes remain: 1..left. */
static inline size_t
fuzz_cuts_next(struct fuzz_cuts *c, size_t left)
{
  size_t n;
  uint8_t b;
  if (c->nctl == 0)
    return left;
  b = c->ctl[c->next++ % c->nctl];
  n = (size_t)(b & 0x7f) * (b & 0x80 ? 64 : 1);
  if (n == 0)
    n = 1;
  return n < left ? n : left;
}

/*
** A growable byte log of what a decoder emitted: (tag, bytes) records, a
** record merged into the previous one when the tag is the same, so that two
** runs over differently cut input compare equal exactly when they emitted
** the same bytes under the same tags in the same order.
*/
struct fuzz_log {
  unsigned char *p;
  size_t len, cap;
  size_t last;  /* offset of the last record's header */
  int last_tag; /* -1 before the first record */
};

static inline void
fuzz_log_init(struct fuzz_log *l)
{
  l->p = NULL;
  l->len = l->cap = l->last = 0;
  l->last_tag = -1;
}

static inline void
fuzz_log_grow(struct fuzz_log *l, size_t n)
{
  if (l->len + n > l->cap) {
    size_t cap = l->cap ? l->cap : 256;
    while (cap < l->len + n)
      cap *= 2;
    l->p = realloc(l->p, cap);
    CHECK(l->p != NULL);
    l->cap = cap;
  }
}

static inline void
fuzz_log_add(struct fuzz_log *l, int tag, const void *p, size_t n)
{
  size_t k;
  if (tag != l->last_tag) {
    fuzz_log_grow(l, 1 + sizeof(size_t));
    l->last = l->len;
    l->p[l->len] = (unsigned char)tag;
    k = 0;
    memcpy(l->p + l->len + 1, &k, sizeof k);
    l->len += 1 + sizeof k;
    l->last_tag = tag;
  }
  fuzz_log_grow(l, n);
  if (n)
    memcpy(l->p + l->len, p, n);
  l->len += n;
  memcpy(&k, l->p + l->last + 1, sizeof k);
  k += n;
  memcpy(l->p + l->last + 1, &k, sizeof k);
}

static inline int
fuzz_log_equal(const struct fuzz_log *a, const struct fuzz_log *b)
{
  return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static inline void
fuzz_log_free(struct fuzz_log *l)
{
  free(l->p);
  fuzz_log_init(l);
}

#endif

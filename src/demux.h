/*
** Docker's multiplexed exec stream (an attached exec without a tty): frames
** of an 8-byte header [stream, 0, 0, 0, length u32 big-endian] followed by
** length bytes. Stream 1 is stdout and 2 stderr; 0 (stdin) and 3 (system
** error) exist in the format.
**
** Pure and incremental: bytes go in as chunks of any size and every payload
** piece comes out through the callback as soon as it is in, so nothing is
** held but a partial header, and a 4 GiB frame costs no memory. How the
** input is cut into chunks never changes the bytes that come out of each
** stream, nor their order.
**
** Where a header should start, a byte above 3 starts none: the daemon (or
** what sits in front of it) sent raw bytes. From that byte on everything
** comes out as stream 1, exactly as a tty stream does.
*/
#ifndef SBX_DEMUX_H
#define SBX_DEMUX_H

#include <stddef.h>
#include <stdint.h>

enum { SBX_DEMUX_HEADER = 8 };

struct sbx_demux {
  int raw;        /* no frames (tty, or given up) */
  int stream;     /* stream of the current frame */
  uint32_t left;  /* payload bytes still to come */
  size_t hdr_len; /* header bytes held */
  unsigned char hdr[SBX_DEMUX_HEADER];
};

/* Receives n > 0 bytes of stream (0..3; always 1 once raw). */
typedef void sbx_demux_fn(void *ud, int stream, const char *p, size_t n);

/* A demultiplexer at the start of a stream; raw for a tty exec. */
void sbx_demux_init(struct sbx_demux *d, int raw);

/* Passes every payload byte of p[0..n) to out, in order. */
void sbx_demux_feed(struct sbx_demux *d, const char *p, size_t n, sbx_demux_fn *out, void *ud);

/* 1 when the bytes so far end inside a frame (a cut stream at EOF). */
int sbx_demux_partial(const struct sbx_demux *d);

#endif

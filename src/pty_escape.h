/*
** An escaping of bytes that never contains EF BF BD, for a channel that
** passes through the SSM agent (ECS Exec). The agent's processStdoutData
** (amazon-ssm-agent, agent/session/shell/shell.go) reads box output with
** bufio.Reader.ReadRune, which reports the valid rune U+FFFD as an error;
** the error branch copies one byte and skips three, so every EF BF BD the
** box writes arrives as a lone EF (docs/aws-protocol.md, 1.9).
**
** The encoding: every byte stands for itself except EF, which becomes
** EF 30. An EF in the encoding is therefore always followed by 30, never
** by BF, so no EF BF BD can appear in it, nor in any concatenation of
** encodings (an EF and its 30 are written together). Decoding refuses an
** EF followed by anything but 30: the stream was cut or rewritten. Cost:
** one byte per EF (1/256 on random data).
*/
#ifndef SBX_PTY_ESCAPE_H
#define SBX_PTY_ESCAPE_H

#include <stddef.h>

#define SBX_PTY_ESC 0xEF
#define SBX_PTY_ESC_SELF 0x30

/* Writes the encoding of in[0..n) to out (room for 2*n bytes); returns its
** length. */
size_t sbx_pty_escape(const void *in, size_t n, void *out);

/* Streaming decoder: an EF at the end of one chunk waits for the next. */
struct sbx_pty_unescape {
  int pending; /* an EF was the last byte seen */
};

void sbx_pty_unescape_init(struct sbx_pty_unescape *d);

/* Decodes in[0..n) into out (room for n bytes); *outlen gets the length.
** Returns 0, or -1 at an EF followed by a byte other than 30 (*outlen then
** counts the bytes decoded before it). */
int sbx_pty_unescape(struct sbx_pty_unescape *d, const void *in, size_t n, void *out, size_t *outlen);

/* Whether the stream may end here (no EF waits for its 30). */
int sbx_pty_unescape_done(const struct sbx_pty_unescape *d);

#endif

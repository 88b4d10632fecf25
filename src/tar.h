/*
** A task's outputs as a tar archive (src/tar.c): read with libarchive, every
** entry checked against the output directories a task declared, and written
** again as a clean archive (plain tar, regular files, directories and
** symbolic links only, owner 0, no extended attributes) that a check box
** unpacks. Knows neither Lua nor the loop; the limits are the caller's
** (policy.grade).
*/
#ifndef SBX_TAR_H
#define SBX_TAR_H

#include <stddef.h>
#include <stdint.h>

struct sbx_tar_limits {
  uint64_t max_bytes; /* sum of the entries' declared sizes */
  uint64_t max_entries;
  size_t max_path; /* bytes of one entry's path or link target */
};

/* What sbx_tar_filter refused, for the message and the caller's code. */
enum sbx_tar_error {
  SBX_TAR_OK = 0,
  SBX_TAR_MALFORMED = -1, /* not a tar archive libarchive can read */
  SBX_TAR_OUTSIDE = -2,   /* a path outside every output, absolute or with .. */
  SBX_TAR_LINK = -3,      /* a link that leaves the outputs, or a hard link */
  SBX_TAR_TYPE = -4,      /* a device, FIFO, socket or sparse file */
  SBX_TAR_TOO_LARGE = -5, /* over max_bytes, max_entries or max_path */
  SBX_TAR_NOMEM = -6,
};

/* Reads the tar archive in in[0..inlen) and writes the entries it keeps to a
** new archive in *out (malloc'd, *outlen bytes; the caller frees it). roots
** are the output paths, relative to / and already clean ("work/out"); an
** entry is kept when it is one of them or lies under one. An empty input is
** an empty archive. Returns SBX_TAR_OK, or an error with a sentence naming
** the entry in err (also on success, err is left as ""). *entries counts the
** entries kept. */
int sbx_tar_filter(const void *in, size_t inlen, const char *const *roots, size_t nroots,
                   const struct sbx_tar_limits *lim, void **out, size_t *outlen, uint64_t *entries, char *err,
                   size_t errsz);

/* Cleans a relative path in place: drops a leading "./", empty and "."
** components; 0, or -1 for an absolute path, a ".." component or an empty
** result. */
int sbx_tar_clean(char *path);

#endif

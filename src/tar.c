/*
** A task's outputs, checked and written again (tar.h). The archive comes
** from the box the graded code controlled, so every byte of it is a
** stranger's: libarchive reads plain tar only (no compression, so its size
** is what the caller read), and an entry is kept only when
**   - its path is relative, has no ".." and lies under a declared output;
**   - it is a regular file, a directory or a symbolic link (no device,
**     FIFO, socket, hard link or sparse file);
**   - a link's target, taken from the link's directory, has no ".." and,
**     absolute or not, lies under a declared output, so no chain of links
**     leaves the outputs;
**   - the declared sizes, the entry count and each path stay within the
**     caller's limits.
** The first entry that fails refuses the whole archive. The kept entries go
** to a new pax archive with mode bits 0777 at most, owner 0 and nothing
** else (no xattrs, ACLs or file flags), which the check box unpacks.
*/
#include "tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
sbx_tar_clean(char *path)
{
  char *r = path, *w = path;
  if (*path == '/')
    return -1;
  while (*r) {
    char *start;
    size_t len;
    while (*r == '/')
      r++;
    start = r;
    while (*r && *r != '/')
      r++;
    len = (size_t)(r - start);
    if (len == 0 || (len == 1 && start[0] == '.'))
      continue;
    if (len == 2 && start[0] == '.' && start[1] == '.')
      return -1;
    if (w != path)
      *w++ = '/';
    memmove(w, start, len);
    w += len;
  }
  *w = '\0';
  return w == path ? -1 : 0;
}

/* 1 when path is root or lies under it (both clean). */
static int
under(const char *path, const char *root)
{
  size_t n = strlen(root);
  return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static int
under_any(const char *path, const char *const *roots, size_t nroots)
{
  size_t i;
  for (i = 0; i < nroots; i++)
    if (under(path, roots[i]))
      return 1;
  return 0;
}

struct outbuf {
  unsigned char *data;
  size_t len, cap;
  int nomem;
};

static la_ssize_t
out_write(struct archive *a, void *ud, const void *buf, size_t n)
{
  struct outbuf *o = ud;
  (void)a;
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 16384;
    unsigned char *p;
    while (cap < o->len + n)
      cap *= 2;
    p = realloc(o->data, cap);
    if (!p) {
      o->nomem = 1;
      return -1;
    }
    o->data = p;
    o->cap = cap;
  }
  memcpy(o->data + o->len, buf, n);
  o->len += n;
  return (la_ssize_t)n;
}

static int fail(char *err, size_t errsz, int code, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));

static int
fail(char *err, size_t errsz, int code, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errsz, fmt, ap);
  va_end(ap);
  return code;
}

/* Checks one link: target taken from the directory of the clean path
** "name", into buf (lim->max_path * 2 + 2 bytes). 0 or an error. */
static int
check_link(const char *name, const char *target, const char *const *roots, size_t nroots, char *buf,
           size_t bufsz, char *err, size_t errsz)
{
  if (!target || !*target)
    return fail(err, errsz, SBX_TAR_LINK, "%s: a link without a target", name);
  if (target[0] == '/') {
    snprintf(buf, bufsz, "%s", target + 1);
  }
  else {
    const char *slash = strrchr(name, '/');
    if (slash)
      snprintf(buf, bufsz, "%.*s/%s", (int)(slash - name), name, target);
    else
      snprintf(buf, bufsz, "%s", target);
  }
  if (sbx_tar_clean(buf) != 0 || !under_any(buf, roots, nroots))
    return fail(err, errsz, SBX_TAR_LINK, "%s: its link to '%s' leaves the declared outputs", name, target);
  return 0;
}

int
sbx_tar_filter(const void *in, size_t inlen, const char *const *roots, size_t nroots,
               const struct sbx_tar_limits *lim, void **out, size_t *outlen, uint64_t *entries, char *err,
               size_t errsz)
{
  struct archive *r = NULL, *w = NULL;
  struct archive_entry *e, *ne = NULL;
  struct outbuf o = { NULL, 0, 0, 0 };
  char *name = NULL, *link = NULL;
  uint64_t total = 0, count = 0;
  int rc = SBX_TAR_OK, ar;
  err[0] = '\0';
  *out = NULL;
  *outlen = 0;
  *entries = 0;
  name = malloc(lim->max_path + 1);
  link = malloc(lim->max_path * 2 + 2);
  r = archive_read_new();
  w = archive_write_new();
  ne = archive_entry_new();
  if (!name || !link || !r || !w || !ne) {
    rc = SBX_TAR_NOMEM;
    goto done;
  }
  if (archive_write_set_format_pax_restricted(w) != ARCHIVE_OK ||
      archive_write_set_bytes_in_last_block(w, 1) != ARCHIVE_OK ||
      archive_write_open(w, &o, NULL, out_write, NULL) != ARCHIVE_OK) {
    rc = fail(err, errsz, SBX_TAR_NOMEM, "cannot start an archive: %s", archive_error_string(w));
    goto done;
  }
  if (inlen == 0)
    goto finish;
  archive_read_support_format_tar(r);
  if (archive_read_open_memory(r, in, inlen) != ARCHIVE_OK) {
    rc = fail(err, errsz, SBX_TAR_MALFORMED, "not a tar archive: %s", archive_error_string(r));
    goto done;
  }
  while ((ar = archive_read_next_header(r, &e)) == ARCHIVE_OK || ar == ARCHIVE_WARN) {
    const char *path = archive_entry_pathname(e);
    mode_t type = archive_entry_filetype(e);
    int64_t size = archive_entry_size(e);
    if (!path || strlen(path) > lim->max_path) {
      rc = fail(err, errsz, SBX_TAR_TOO_LARGE, "entry %llu: no path, or one longer than %zu bytes",
                (unsigned long long)count + 1, lim->max_path);
      goto done;
    }
    snprintf(name, lim->max_path + 1, "%s", path);
    if (sbx_tar_clean(name) != 0 || !under_any(name, roots, nroots)) {
      rc = fail(err, errsz, SBX_TAR_OUTSIDE, "%s: outside the declared outputs", path);
      goto done;
    }
    if (++count > lim->max_entries) {
      rc =
        fail(err, errsz, SBX_TAR_TOO_LARGE, "more than %llu entries", (unsigned long long)lim->max_entries);
      goto done;
    }
    if (archive_entry_hardlink(e)) {
      rc = fail(err, errsz, SBX_TAR_LINK,
                "%s: a hard link (outputs hold files, directories and symbolic links)", name);
      goto done;
    }
    if (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
      rc = fail(err, errsz, SBX_TAR_TYPE, "%s: not a file, directory or symbolic link", name);
      goto done;
    }
    if (archive_entry_sparse_count(e) > 0) {
      rc = fail(err, errsz, SBX_TAR_TYPE, "%s: a sparse file", name);
      goto done;
    }
    if (type != AE_IFREG)
      size = 0;
    if (size < 0 || (uint64_t)size > lim->max_bytes - total) {
      rc = fail(err, errsz, SBX_TAR_TOO_LARGE, "%s: the outputs pass %llu bytes", name,
                (unsigned long long)lim->max_bytes);
      goto done;
    }
    total += (uint64_t)size;
    archive_entry_clear(ne);
    archive_entry_set_pathname(ne, name);
    archive_entry_set_filetype(ne, type);
    archive_entry_set_perm(ne, archive_entry_perm(e) & 0777);
    archive_entry_set_mtime(ne, archive_entry_mtime(e), 0);
    if (type == AE_IFLNK) {
      const char *target = archive_entry_symlink(e);
      if (target && strlen(target) > lim->max_path) {
        rc =
          fail(err, errsz, SBX_TAR_TOO_LARGE, "%s: a link target longer than %zu bytes", name, lim->max_path);
        goto done;
      }
      rc = check_link(name, target, roots, nroots, link, lim->max_path * 2 + 2, err, errsz);
      if (rc)
        goto done;
      archive_entry_set_symlink(ne, target);
    }
    archive_entry_set_size(ne, size);
    if (archive_write_header(w, ne) != ARCHIVE_OK) {
      rc = fail(err, errsz, o.nomem ? SBX_TAR_NOMEM : SBX_TAR_MALFORMED, "%s: %s", name,
                archive_error_string(w));
      goto done;
    }
    if (type == AE_IFREG) {
      char block[16384];
      int64_t left = size;
      la_ssize_t n;
      while ((n = archive_read_data(r, block, sizeof block)) > 0) {
        if (n > left) {
          rc = fail(err, errsz, SBX_TAR_MALFORMED, "%s: more data than its size", name);
          goto done;
        }
        left -= n;
        if (archive_write_data(w, block, (size_t)n) != n) {
          rc = fail(err, errsz, o.nomem ? SBX_TAR_NOMEM : SBX_TAR_MALFORMED, "%s: %s", name,
                    archive_error_string(w));
          goto done;
        }
      }
      if (n < 0 || left != 0) {
        rc = fail(err, errsz, SBX_TAR_MALFORMED, "%s: cut short: %s", name,
                  n < 0 ? archive_error_string(r) : "less data than its size");
        goto done;
      }
    }
  }
  if (ar != ARCHIVE_EOF) {
    rc = fail(err, errsz, SBX_TAR_MALFORMED, "not a tar archive: %s",
              archive_error_string(r) ? archive_error_string(r) : "unreadable");
    goto done;
  }
finish:
  if (archive_write_close(w) != ARCHIVE_OK) {
    rc = fail(err, errsz, o.nomem ? SBX_TAR_NOMEM : SBX_TAR_MALFORMED, "cannot finish the archive: %s",
              archive_error_string(w));
    goto done;
  }
  *out = o.data;
  *outlen = o.len;
  *entries = count;
  o.data = NULL;
done:
  if (rc == SBX_TAR_NOMEM && !err[0])
    fail(err, errsz, rc, "out of memory");
  if (r)
    archive_read_free(r);
  if (w)
    archive_write_free(w);
  if (ne)
    archive_entry_free(ne);
  free(o.data);
  free(name);
  free(link);
  return rc;
}

/* needs: nothing */
/*
** The outputs filter (src/tar.c). Each input is used as a whole archive,
** filtered under the roots "out" and "o2/deep", and the invariants are
** checked:
**   - on success, the clean archive reads back (libarchive, tar only) and
**     every entry in it is a file, a directory or a symbolic link whose
**     path is clean and under a root, with mode bits 0777 at most, owner
**     0, and a link target that stays under a root; filtering the clean
**     archive again gives the same bytes (the filter is idempotent);
**   - the declared sizes stay within max_bytes and the count within
**     max_entries;
**   - on failure, the message is not empty.
** The input is also a path for sbx_tar_clean, checked against the rules.
*/
#include "fuzz.h"
#include "tar.h"

#include <archive.h>
#include <archive_entry.h>

static const char *const ROOTS[] = { "out", "o2/deep" };
static const struct sbx_tar_limits LIM = { 1 << 20, 64, 256 };

static int
under_a_root(const char *p)
{
  size_t i;
  for (i = 0; i < 2; i++) {
    size_t n = strlen(ROOTS[i]);
    if (strncmp(p, ROOTS[i], n) == 0 && (p[n] == '\0' || p[n] == '/'))
      return 1;
  }
  return 0;
}

static void
check_clean_archive(const void *buf, size_t len, uint64_t entries)
{
  struct archive *a = archive_read_new();
  struct archive_entry *e;
  uint64_t n = 0, bytes = 0;
  char tmp[1024];
  CHECK(a != NULL);
  archive_read_support_format_tar(a);
  if (len == 0) {
    CHECK(entries == 0);
    archive_read_free(a);
    return;
  }
  CHECK(archive_read_open_memory(a, buf, len) == ARCHIVE_OK);
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    const char *p = archive_entry_pathname(e);
    mode_t t = archive_entry_filetype(e);
    n++;
    CHECK(p != NULL && strlen(p) < sizeof tmp);
    snprintf(tmp, sizeof tmp, "%s", p);
    /* libarchive's pax writer ends a directory's name with one "/". */
    if (t == AE_IFDIR && tmp[0] && tmp[strlen(tmp) - 1] == '/')
      tmp[strlen(tmp) - 1] = '\0';
    CHECK(strcmp(tmp, p) == 0 || t == AE_IFDIR);
    CHECK(sbx_tar_clean(tmp) == 0);
    CHECK(under_a_root(tmp));
    CHECK(t == AE_IFREG || t == AE_IFDIR || t == AE_IFLNK);
    CHECK((archive_entry_perm(e) & ~0777) == 0);
    CHECK(archive_entry_uid(e) == 0 && archive_entry_gid(e) == 0);
    CHECK(archive_entry_hardlink(e) == NULL);
    if (t == AE_IFREG)
      bytes += (uint64_t)archive_entry_size(e);
    if (t == AE_IFLNK) {
      const char *l = archive_entry_symlink(e);
      CHECK(l != NULL);
      if (l[0] == '/') {
        snprintf(tmp, sizeof tmp, "%s", l + 1);
      }
      else {
        const char *s = strrchr(p, '/');
        if (s)
          snprintf(tmp, sizeof tmp, "%.*s/%s", (int)(s - p), p, l);
        else
          snprintf(tmp, sizeof tmp, "%s", l);
      }
      CHECK(sbx_tar_clean(tmp) == 0 && under_a_root(tmp));
    }
  }
  CHECK(n == entries && n <= LIM.max_entries && bytes <= LIM.max_bytes);
  archive_read_free(a);
}

static void
check_path(const uint8_t *data, size_t size)
{
  char in[512], out[512];
  size_t n = size < sizeof in - 1 ? size : sizeof in - 1, i;
  int dotdot = 0, rc;
  memcpy(in, data, n);
  in[n] = '\0';
  memcpy(out, in, n + 1);
  rc = sbx_tar_clean(out);
  for (i = 0; in[i]; i++)
    if (in[i] == '.' && in[i + 1] == '.' && (i == 0 || in[i - 1] == '/') &&
        (in[i + 2] == '/' || in[i + 2] == '\0'))
      dotdot = 1;
  if (in[0] == '/' || dotdot) {
    CHECK(rc == -1);
    return;
  }
  if (rc == 0) {
    char again[512];
    CHECK(out[0] != '\0' && out[0] != '/');
    CHECK(strstr(out, "//") == NULL);
    memcpy(again, out, strlen(out) + 1);
    CHECK(sbx_tar_clean(again) == 0 && strcmp(again, out) == 0);
  }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  void *out = NULL, *out2 = NULL;
  size_t outlen = 0, outlen2 = 0;
  uint64_t entries = 0, entries2 = 0;
  char err[512];
  int rc;
  check_path(data, size);
  rc = sbx_tar_filter(data, size, ROOTS, 2, &LIM, &out, &outlen, &entries, err, sizeof err);
  if (rc != SBX_TAR_OK) {
    CHECK(err[0] != '\0' && out == NULL);
    return 0;
  }
  check_clean_archive(out, outlen, entries);
  rc = sbx_tar_filter(out, outlen, ROOTS, 2, &LIM, &out2, &outlen2, &entries2, err, sizeof err);
  CHECK(rc == SBX_TAR_OK && entries2 == entries);
  CHECK(outlen2 == outlen && memcmp(out, out2, outlen) == 0);
  free(out);
  free(out2);
  return 0;
}

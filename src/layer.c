/*
** Image layers unpacked safely (the contract is in layer.h).
**
** Three libarchive readers can be stacked: an optional outer tar whose
** member is the blob (docker save and OCI archives), a "raw" reader whose
** filters (gzip, zstd, ...) turn the blob into the uncompressed tar, and the
** tar reader itself. Each hands its bytes up through a callback that hashes
** them, so the blob's digest and the diff id come out of the one pass.
** Every byte of the blob is read and hashed, the tail after the tar's end
** included, before either digest is compared.
*/
#define _GNU_SOURCE
#include "layer.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#define BUFSZ (128 * 1024)
#define MAX_DEPTH 256 /* directories an entry may nest in */

/* A directory whose mode and time are set once everything in it is written. */
struct dirmeta {
  char *path;
  mode_t mode;
  struct timespec mtime;
};

struct unpack {
  const struct sbx_layer_opts *o;
  struct sbx_layer_result *r;
  struct archive *outer, *raw, *tar;
  EVP_MD_CTX *raw_md, *tar_md;
  unsigned char *rbuf, *tbuf;
  struct dirmeta *dirs;
  size_t ndirs, capdirs;
  /* The parent directory of the last entry, kept open: entries come
  ** grouped by directory. Dropped whenever anything is removed. */
  char *cached;
  int cached_fd;
  int privileged;
};

static int fail(struct unpack *u, const char *code, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));

static int
fail(struct unpack *u, const char *code, const char *fmt, ...)
{
  va_list ap;
  if (u->r->code[0])
    return -1; /* the first failure is the one reported */
  snprintf(u->r->code, sizeof u->r->code, "%s", code);
  va_start(ap, fmt);
  vsnprintf(u->r->message, sizeof u->r->message, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---------------------------------------------------------------- budgets */

struct sbx_layer_budget {
  _Atomic uint64_t used;
  _Atomic int refs;
  _Atomic int over;
  uint64_t limit;
  char message[SBX_LAYER_MSG / 2];
};

struct sbx_layer_budget *
sbx_layer_budget_new(uint64_t limit, const char *message)
{
  struct sbx_layer_budget *b = calloc(1, sizeof *b);
  if (!b)
    return NULL;
  atomic_init(&b->used, 0);
  atomic_init(&b->refs, 1);
  atomic_init(&b->over, 0);
  b->limit = limit;
  snprintf(b->message, sizeof b->message, "%s", message ? message : "over its budget");
  return b;
}

void
sbx_layer_budget_ref(struct sbx_layer_budget *b)
{
  atomic_fetch_add(&b->refs, 1);
}

void
sbx_layer_budget_unref(struct sbx_layer_budget *b)
{
  if (b && atomic_fetch_sub(&b->refs, 1) == 1)
    free(b);
}

uint64_t
sbx_layer_budget_used(const struct sbx_layer_budget *b)
{
  return atomic_load(&b->used);
}

uint64_t
sbx_layer_budget_limit(const struct sbx_layer_budget *b)
{
  return b->limit;
}

int
sbx_layer_budget_over(const struct sbx_layer_budget *b)
{
  return atomic_load(&b->over);
}

/* Takes n bytes from one budget, or none when they do not fit. */
static int
take(struct sbx_layer_budget *b, uint64_t n)
{
  uint64_t cur = atomic_load(&b->used);
  do {
    if (n > b->limit || cur > b->limit - n) {
      atomic_store(&b->over, 1);
      return -1;
    }
  } while (!atomic_compare_exchange_weak(&b->used, &cur, cur + n));
  return 0;
}

/* Charges n bytes for the entry path to every budget, or to none. */
static int
charge(struct unpack *u, uint64_t n, const char *path)
{
  int i, j;
  for (i = 0; i < SBX_LAYER_BUDGETS; i++) {
    struct sbx_layer_budget *b = u->o->budgets[i];
    if (!b)
      continue;
    if (take(b, n) != 0) {
      for (j = 0; j < i; j++)
        if (u->o->budgets[j])
          atomic_fetch_sub(&u->o->budgets[j]->used, n);
      return fail(u, "too_large", "%.300s: %s", path, b->message);
    }
  }
  return 0;
}

/* What a file of size bytes may take on disk. */
static uint64_t
blocks_of(uint64_t size)
{
  return size > UINT64_MAX - 4095 ? UINT64_MAX : (size + 4095) & ~(uint64_t)4095;
}

/* ---------------------------------------------------------------- paths */

int
sbx_layer_clean_path(const char *in, char *out, size_t outsz)
{
  size_t n = 0;
  const char *p = in;
  if (outsz == 0)
    return -1;
  if (outsz > 4096)
    outsz = 4096;
  out[0] = '\0';
  while (*p) {
    const char *start;
    size_t len;
    while (*p == '/')
      p++;
    start = p;
    while (*p && *p != '/')
      p++;
    len = (size_t)(p - start);
    if (len == 0 || (len == 1 && start[0] == '.'))
      continue;
    if (len == 2 && start[0] == '.' && start[1] == '.')
      return -1;
    if (len > 255)
      return -1;
    if (n + (n ? 1 : 0) + len + 1 > outsz)
      return -1;
    if (n)
      out[n++] = '/';
    memcpy(out + n, start, len);
    n += len;
    out[n] = '\0';
  }
  return (int)n;
}

/* The last component of a clean path, and its directory ("" for the root). */
static const char *
split_leaf(char *path, const char **dir)
{
  char *slash = strrchr(path, '/');
  if (!slash) {
    *dir = "";
    return path;
  }
  *slash = '\0';
  *dir = path;
  return slash + 1;
}

static int
depth_of(const char *path)
{
  int d = *path ? 1 : 0;
  for (; *path; path++)
    d += *path == '/';
  return d;
}

/*
** Opens directory dir (a clean path, "" for the root) below the root, one
** component at a time with O_NOFOLLOW; missing ones are made (0755) when
** create is set. Returns an fd the caller closes, or -1 with errno.
*/
static int
open_dir(int root, const char *dir, int create)
{
  char comp[256];
  const char *p = dir;
  int fd = openat(root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  while (fd >= 0 && *p) {
    const char *start = p;
    size_t len;
    int next;
    while (*p && *p != '/')
      p++;
    len = (size_t)(p - start);
    if (*p == '/')
      p++;
    memcpy(comp, start, len);
    comp[len] = '\0';
    next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT && create) {
      if (mkdirat(fd, comp, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
      }
      next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (next >= 0)
        fchmod(next, 0755); /* whatever the umask says */
    }
    {
      int e = errno;
      close(fd);
      errno = e;
    }
    fd = next;
  }
  return fd;
}

/* The parent directory of an entry, through the one-entry cache. */
static int
parent_fd(struct unpack *u, const char *dir)
{
  int fd;
  if (u->cached && strcmp(u->cached, dir) == 0)
    return u->cached_fd;
  fd = open_dir(u->o->root_fd, dir, 1);
  if (fd < 0)
    return -1;
  if (u->cached) {
    close(u->cached_fd);
    free(u->cached);
  }
  u->cached = strdup(dir);
  if (!u->cached) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  u->cached_fd = fd;
  return fd;
}

static void
drop_cache(struct unpack *u)
{
  if (u->cached) {
    close(u->cached_fd);
    free(u->cached);
    u->cached = NULL;
  }
}

/* ---------------------------------------------------------------- removal */

static int
remove_at(int dfd, const char *name, int depth)
{
  struct stat st;
  int fd, rc = 0;
  DIR *d;
  struct dirent *de;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? 0 : -1;
  if (!S_ISDIR(st.st_mode))
    return unlinkat(dfd, name, 0) == 0 || errno == ENOENT ? 0 : -1;
  if (depth > MAX_DEPTH + 8) {
    errno = ELOOP;
    return -1;
  }
  if ((st.st_mode & 0700) != 0700)
    fchmodat(dfd, name, (st.st_mode & 07777) | 0700, 0); /* a directory: no link to follow */
  fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -1;
  d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  while ((de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (remove_at(fd, de->d_name, depth + 1) != 0)
      rc = -1;
  }
  closedir(d);
  if (rc == 0 && unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
    rc = -1;
  return rc;
}

int
sbx_layer_remove(int dirfd, const char *path, char *msg, size_t msgsz)
{
  if (remove_at(dirfd, path, 0) == 0)
    return 0;
  if (msg)
    snprintf(msg, msgsz, "cannot remove %s: %s", path, strerror(errno));
  return -1;
}

/* Clears the way for a new entry named leaf: a directory stays when the
** entry is one too (*kept = 1), anything else is removed. */
static int
make_room(struct unpack *u, int dfd, const char *leaf, int want_dir, int *kept, const char *path)
{
  struct stat st;
  *kept = 0;
  if (fstatat(dfd, leaf, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT)
      return 0;
    return fail(u, "io", "%s: %s", path, strerror(errno));
  }
  if (S_ISDIR(st.st_mode) && want_dir) {
    *kept = 1;
    return 0;
  }
  if (S_ISDIR(st.st_mode)) {
    char msg[SBX_LAYER_MSG];
    /* The cached parent may be inside what goes: drop it, keep dfd valid. */
    int keep = dup(dfd);
    int rc;
    if (keep < 0)
      return fail(u, "io", "%s: %s", path, strerror(errno));
    drop_cache(u);
    rc = sbx_layer_remove(keep, leaf, msg, sizeof msg);
    close(keep);
    if (rc != 0)
      return fail(u, "io", "%s", msg);
    return 1; /* dfd was the cache's: the caller opens it again */
  }
  if (unlinkat(dfd, leaf, 0) != 0)
    return fail(u, "io", "cannot replace %s: %s", path, strerror(errno));
  return 0;
}

/* ---------------------------------------------------------------- entries */

static void
set_owner(struct unpack *u, int dfd, const char *leaf, struct archive_entry *e)
{
  if (!u->o->chown)
    return;
  /* Ignored when refused: a user namespace may not map the tar's ids. */
  if (fchownat(dfd, leaf, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e), AT_SYMLINK_NOFOLLOW) !=
      0) {
  }
}

static struct timespec
mtime_of(struct archive_entry *e)
{
  struct timespec t;
  t.tv_sec = archive_entry_mtime(e);
  t.tv_nsec = archive_entry_mtime_nsec(e);
  if (t.tv_nsec < 0 || t.tv_nsec > 999999999)
    t.tv_nsec = 0;
  return t;
}

static int
remember_dir(struct unpack *u, const char *path, struct archive_entry *e)
{
  if (u->ndirs == u->capdirs) {
    size_t cap = u->capdirs ? u->capdirs * 2 : 64;
    struct dirmeta *d = realloc(u->dirs, cap * sizeof *d);
    if (!d)
      return fail(u, "io", "out of memory");
    u->dirs = d;
    u->capdirs = cap;
  }
  u->dirs[u->ndirs].path = strdup(path);
  if (!u->dirs[u->ndirs].path)
    return fail(u, "io", "out of memory");
  u->dirs[u->ndirs].mode = archive_entry_perm(e) & 07777;
  u->dirs[u->ndirs].mtime = mtime_of(e);
  u->ndirs++;
  return 0;
}

static int
write_file(struct unpack *u, int dfd, const char *leaf, const char *path, struct archive_entry *e)
{
  const void *buf;
  size_t size;
  la_int64_t offset, declared = archive_entry_size(e), end = 0;
  struct timespec times[2];
  struct stat st;
  int fd, rc;
  if (declared < 0)
    declared = 0;
  if ((uint64_t)declared > u->o->max_bytes - u->r->bytes)
    return fail(
      u, "too_large",
      "%s declares %lld bytes: more than the layer may hold (%llu bytes, policy.images.max_layer_bytes)",
      path, (long long)declared, (unsigned long long)u->o->max_bytes);
  if (charge(u, blocks_of((uint64_t)declared), path) != 0)
    return -1;
  fd = openat(dfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return fail(u, "io", "cannot create %s: %s", path, strerror(errno));
  while ((rc = archive_read_data_block(u->tar, &buf, &size, &offset)) == ARCHIVE_OK) {
    const char *p = buf;
    if (offset < 0 || (uint64_t)offset + size > (uint64_t)declared) {
      close(fd);
      return fail(u, "bad_layer", "%s: data past its declared size", path);
    }
    while (size > 0) {
      ssize_t n = pwrite(fd, p, size, offset);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        int err = errno;
        close(fd);
        return fail(u, "io", "cannot write %s: %s", path, strerror(err));
      }
      p += n;
      size -= (size_t)n;
      offset += n;
    }
    if (offset > end)
      end = offset;
  }
  if (rc != ARCHIVE_EOF) {
    close(fd);
    return fail(u, "bad_layer", "%s: %s", path, archive_error_string(u->tar));
  }
  if (end < declared && ftruncate(fd, declared) != 0) {
    int err = errno;
    close(fd);
    return fail(u, "io", "cannot size %s: %s", path, strerror(err));
  }
  u->r->bytes += (uint64_t)declared;
  if (u->o->chown && fchown(fd, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e)) != 0) {
  }
  fchmod(fd, archive_entry_perm(e) & 07777);
  times[0] = times[1] = mtime_of(e);
  futimens(fd, times);
  if (fstat(fd, &st) == 0)
    u->r->disk += (uint64_t)st.st_blocks * 512;
  close(fd);
  return 0;
}

static int
whiteout(struct unpack *u, int dfd, const char *leaf, const char *path)
{
  const char *name = leaf + 4;
  struct stat st;
  if (strcmp(leaf, ".wh..wh..opq") == 0) {
    if (fsetxattr(dfd, "user.overlay.opaque", "y", 1, 0) != 0)
      return fail(u, "io", "cannot mark the directory of %s opaque (user.overlay.opaque): %s", path,
                  strerror(errno));
    /* For a mount without userxattr; only a privileged process may set it. */
    if (u->privileged && fsetxattr(dfd, "trusted.overlay.opaque", "y", 1, 0) != 0) {
    }
    u->r->whiteouts++;
    return 0;
  }
  if (strncmp(leaf, ".wh..wh.", 8) == 0) {
    u->r->skipped++; /* aufs bookkeeping (.wh..wh.plnk, ...): nothing for overlayfs */
    return 0;
  }
  if (name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
    return fail(u, "unsafe_entry", "%s: a whiteout that names no entry", path);
  /* An entry of this very layer is not hidden by its whiteout. */
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
    return 0;
  if (mknodat(dfd, name, S_IFCHR | 0, makedev(0, 0)) != 0)
    return fail(u, "io", "cannot make the whiteout for %s (a 0/0 character device): %s", path,
                strerror(errno));
  u->r->whiteouts++;
  return 0;
}

/* Puts the hard link path -> target off until the lower layers are there. */
static int
defer_link(struct unpack *u, const char *path, const char *target)
{
  size_t a = strlen(path) + 1, b = strlen(target) + 1;
  char *p = realloc(u->r->deferred, u->r->deferred_len + a + b);
  if (!p)
    return fail(u, "io", "out of memory");
  memcpy(p + u->r->deferred_len, path, a);
  memcpy(p + u->r->deferred_len + a, target, b);
  u->r->deferred = p;
  u->r->deferred_len += a + b;
  u->r->ndeferred++;
  return 0;
}

void
sbx_layer_result_free(struct sbx_layer_result *r)
{
  free(r->deferred);
  r->deferred = NULL;
  r->deferred_len = r->ndeferred = 0;
}

static int
apply_entry(struct unpack *u, struct archive_entry *e)
{
  char path[4096], tpath[4096];
  const char *name = archive_entry_pathname(e);
  const char *dir, *leaf, *hl;
  mode_t type = archive_entry_filetype(e);
  int dfd, kept, n;
  if (!name)
    name = archive_entry_pathname_utf8(e);
  if (!name)
    return fail(u, "bad_layer", "an entry without a readable name");
  n = sbx_layer_clean_path(name, path, sizeof path);
  if (n < 0)
    return fail(u, "unsafe_entry",
                "the entry %.300s leaves the layer's root (a \"..\" component) or its name is too long",
                name);
  if (n == 0)
    return 0; /* the root itself: its mode belongs to the box */
  if (depth_of(path) > MAX_DEPTH)
    return fail(u, "unsafe_entry", "the entry %.300s nests deeper than %d directories", path, MAX_DEPTH);
  leaf = split_leaf(path, &dir);
  if (u->o->whiteouts && strncmp(leaf, ".wh.", 4) == 0) {
    dfd = parent_fd(u, dir);
    if (dfd < 0)
      goto no_parent;
    return whiteout(u, dfd, leaf, name);
  }
  hl = archive_entry_hardlink(e);
  if (!hl)
    hl = archive_entry_hardlink_utf8(e);
  if (!hl && (type == AE_IFCHR || type == AE_IFBLK)) {
    if (u->o->skip_devices) {
      u->r->skipped++;
      return 0;
    }
    return fail(u, "device",
                "the entry %.300s is a %s device node (%u:%u): images may not carry device nodes (a box gets "
                "its /dev from the backend; policy.images.device_nodes = \"skip\" drops them)",
                name, type == AE_IFCHR ? "character" : "block", (unsigned)archive_entry_rdevmajor(e),
                (unsigned)archive_entry_rdevminor(e));
  }
  if (!hl && type == AE_IFSOCK) {
    u->r->skipped++;
    return 0;
  }
  dfd = parent_fd(u, dir);
  if (dfd < 0)
    goto no_parent;
  if (hl) {
    const char *tdir, *tleaf;
    struct stat st;
    int tfd, rc;
    if (sbx_layer_clean_path(hl, tpath, sizeof tpath) <= 0)
      return fail(u, "unsafe_entry", "the hard link %.300s points outside the layer (%.300s)", name, hl);
    tleaf = split_leaf(tpath, &tdir);
    tfd = open_dir(u->o->root_fd, tdir, 0);
    if (tfd < 0 || fstatat(tfd, tleaf, &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(st.st_mode)) {
      int missing = tfd < 0 ? errno == ENOENT : errno == ENOENT && !S_ISDIR(st.st_mode);
      if (tfd >= 0)
        close(tfd);
      if (missing && u->o->defer_links) {
        /* A file of a lower layer: linked once those are there. */
        if (*tdir)
          tpath[strlen(tpath)] = '/';
        if (*dir)
          path[strlen(path)] = '/';
        return defer_link(u, path, tpath);
      }
      return fail(u, "unsafe_entry",
                  "the hard link %.300s points to %.300s, which is not a file this layer holds (links may "
                  "not leave the tree)",
                  name, hl);
    }
    rc = make_room(u, dfd, leaf, 0, &kept, name);
    if (rc < 0 || (rc == 1 && (dfd = parent_fd(u, dir)) < 0)) {
      close(tfd);
      return rc < 0 ? -1 : fail(u, "io", "%s: %s", name, strerror(errno));
    }
    rc = linkat(tfd, tleaf, dfd, leaf, 0);
    close(tfd);
    if (rc != 0)
      return fail(u, "io", "cannot link %s to %s: %s", name, hl, strerror(errno));
    return 0;
  }
  n = make_room(u, dfd, leaf, type == AE_IFDIR, &kept, name);
  if (n < 0)
    return -1;
  if (n == 1 && (dfd = parent_fd(u, dir)) < 0)
    goto no_parent;
  switch (type) {
  case AE_IFDIR:
    if (!kept && charge(u, 4096, name) != 0)
      return -1;
    if (!kept && mkdirat(dfd, leaf, 0700) != 0)
      return fail(u, "io", "cannot make the directory %s: %s", name, strerror(errno));
    set_owner(u, dfd, leaf, e);
    u->r->disk += 4096;
    /* split_leaf cut path in two: join it again for the record. */
    if (*dir)
      path[strlen(path)] = '/';
    return remember_dir(u, path, e);
  case AE_IFREG:
    return write_file(u, dfd, leaf, name, e);
  case AE_IFLNK: {
    const char *target = archive_entry_symlink(e);
    struct timespec times[2];
    if (!target)
      target = archive_entry_symlink_utf8(e);
    if (!target)
      return fail(u, "bad_layer", "the symlink %.300s has no readable target", name);
    if (symlinkat(target, dfd, leaf) != 0)
      return fail(u, "io", "cannot make the symlink %s: %s", name, strerror(errno));
    set_owner(u, dfd, leaf, e);
    times[0] = times[1] = mtime_of(e);
    utimensat(dfd, leaf, times, AT_SYMLINK_NOFOLLOW);
    return 0;
  }
  case AE_IFIFO:
    if (mkfifoat(dfd, leaf, 0600) != 0)
      return fail(u, "io", "cannot make the FIFO %s: %s", name, strerror(errno));
    set_owner(u, dfd, leaf, e);
    fchmodat(dfd, leaf, archive_entry_perm(e) & 07777, 0); /* a FIFO: no link to follow */
    return 0;
  default:
    return fail(u, "bad_layer", "the entry %.300s has an unknown type (0%o)", name, (unsigned)type);
  }

no_parent:
  if (errno == ELOOP || errno == ENOTDIR)
    return fail(
      u, "unsafe_entry",
      "the entry %.300s goes through a symlink or a file (%.300s): nothing is written through links", name,
      *dir ? dir : ".");
  return fail(u, "io", "cannot open the directory of %.300s: %s", name, strerror(errno));
}

/* Applies the remembered directory modes and times, deepest last made first. */
static void
finish_dirs(struct unpack *u)
{
  size_t i = u->ndirs;
  while (i-- > 0) {
    struct dirmeta *d = &u->dirs[i];
    struct timespec times[2];
    int fd = open_dir(u->o->root_fd, d->path, 0);
    if (fd < 0)
      continue; /* replaced by a later entry */
    fchmod(fd, d->mode);
    times[0] = times[1] = d->mtime;
    futimens(fd, times);
    close(fd);
  }
}

/* ---------------------------------------------------------------- sources */

static int
cancelled(struct unpack *u)
{
  return u->o->cancel && *u->o->cancel;
}

/* The blob's bytes: from the file, or from the outer archive's member. */
static la_ssize_t
blob_read(struct archive *a, void *ctx, const void **buf)
{
  struct unpack *u = ctx;
  la_ssize_t n;
  if (cancelled(u)) {
    archive_set_error(a, ECANCELED, "cancelled");
    return -1;
  }
  if (u->outer) {
    n = archive_read_data(u->outer, u->rbuf, BUFSZ);
    if (n < 0) {
      archive_set_error(a, EIO, "%s", archive_error_string(u->outer));
      return -1;
    }
  }
  else {
    do
      n = read(u->o->in_fd, u->rbuf, BUFSZ);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      archive_set_error(a, errno, "cannot read the blob: %s", strerror(errno));
      return -1;
    }
  }
  EVP_DigestUpdate(u->raw_md, u->rbuf, (size_t)n);
  u->r->raw_bytes += (uint64_t)n;
  *buf = u->rbuf;
  return n;
}

/* The uncompressed tar's bytes, from the raw reader. */
static la_ssize_t
tar_read(struct archive *a, void *ctx, const void **buf)
{
  struct unpack *u = ctx;
  la_ssize_t n = archive_read_data(u->raw, u->tbuf, BUFSZ);
  if (n < 0) {
    archive_set_error(a, EIO, "%s", archive_error_string(u->raw));
    return -1;
  }
  EVP_DigestUpdate(u->tar_md, u->tbuf, (size_t)n);
  *buf = u->tbuf;
  return n;
}

/* Reads whatever is left of the blob into the digests. */
static void
drain(struct unpack *u, int tar_ok)
{
  const void *p;
  if (tar_ok && u->raw) {
    /* The tar's tail (end blocks, padding) belongs to the diff id. */
    while (tar_read(u->tar, u, &p) > 0)
      ;
  }
  while (blob_read(u->raw ? u->raw : u->tar, u, &p) > 0)
    ;
}

static void
hex_digest(EVP_MD_CTX *md, char *out, size_t outsz)
{
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int n = 0, i;
  size_t k;
  EVP_DigestFinal_ex(md, d, &n);
  k = (size_t)snprintf(out, outsz, "sha256:");
  for (i = 0; i < n && k + 2 < outsz; i++)
    k += (size_t)snprintf(out + k, outsz - k, "%02x", d[i]);
}

static int
find_member(struct unpack *u)
{
  struct archive_entry *e;
  char want[4096], got[4096];
  int rc;
  if (sbx_layer_clean_path(u->o->member, want, sizeof want) <= 0)
    return fail(u, "not_found", "no such member: %s", u->o->member);
  u->outer = archive_read_new();
  if (!u->outer)
    return fail(u, "io", "out of memory");
  archive_read_support_filter_all(u->outer);
  archive_read_support_format_tar(u->outer);
  if (archive_read_open_fd(u->outer, u->o->in_fd, BUFSZ) != ARCHIVE_OK)
    return fail(u, "bad_image", "cannot read the archive: %s", archive_error_string(u->outer));
  while ((rc = archive_read_next_header(u->outer, &e)) == ARCHIVE_OK || rc == ARCHIVE_WARN) {
    const char *name = archive_entry_pathname(e);
    if (name && sbx_layer_clean_path(name, got, sizeof got) > 0 && strcmp(got, want) == 0) {
      if (archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e))
        return fail(u, "bad_image", "the archive member %s is not a regular file", u->o->member);
      return 0;
    }
  }
  if (rc == ARCHIVE_EOF)
    return fail(u, "not_found", "the archive has no member %s", u->o->member);
  return fail(u, "bad_image", "cannot read the archive: %s", archive_error_string(u->outer));
}

int
sbx_layer_unpack(const struct sbx_layer_opts *o, struct sbx_layer_result *r)
{
  struct unpack u;
  struct archive_entry *e;
  int rc = 0, tar_ok = 0;
  size_t i;
  memset(r, 0, sizeof *r);
  memset(&u, 0, sizeof u);
  u.o = o;
  u.r = r;
  u.privileged = geteuid() == 0;
  u.rbuf = malloc(BUFSZ);
  u.tbuf = malloc(BUFSZ);
  u.raw_md = EVP_MD_CTX_new();
  u.tar_md = EVP_MD_CTX_new();
  if (!u.rbuf || !u.tbuf || !u.raw_md || !u.tar_md) {
    fail(&u, "io", "out of memory");
    goto out;
  }
  EVP_DigestInit_ex(u.raw_md, EVP_sha256(), NULL);
  EVP_DigestInit_ex(u.tar_md, EVP_sha256(), NULL);
  if (o->member && find_member(&u) != 0)
    goto out;
  u.raw = archive_read_new();
  u.tar = archive_read_new();
  if (!u.raw || !u.tar) {
    fail(&u, "io", "out of memory");
    goto out;
  }
  archive_read_support_filter_all(u.raw);
  archive_read_support_format_raw(u.raw);
  archive_read_support_format_tar(u.tar);
  if (archive_read_open(u.raw, &u, NULL, blob_read, NULL) != ARCHIVE_OK ||
      archive_read_next_header(u.raw, &e) != ARCHIVE_OK) {
    fail(&u, "bad_layer", "the layer is corrupt or truncated: %s",
         archive_error_string(u.raw) ? archive_error_string(u.raw) : "empty");
    goto check;
  }
  if (archive_read_open(u.tar, &u, NULL, tar_read, NULL) != ARCHIVE_OK) {
    fail(&u, "bad_layer", "the layer is not a tar: %s", archive_error_string(u.tar));
    goto check;
  }
  for (;;) {
    rc = archive_read_next_header(u.tar, &e);
    if (rc == ARCHIVE_EOF) {
      tar_ok = 1;
      break;
    }
    if (rc < ARCHIVE_WARN) {
      fail(&u, cancelled(&u) ? "cancelled" : "bad_layer", "the layer is corrupt or truncated: %s",
           archive_error_string(u.tar));
      break;
    }
    if (++r->entries > o->max_entries) {
      fail(&u, "too_large", "the layer has more than %llu entries (policy.images.max_layer_entries)",
           (unsigned long long)o->max_entries);
      break;
    }
    if (apply_entry(&u, e) != 0)
      break;
  }
check:
  /* Whatever went wrong, a blob that is not the one asked for says so. */
  if (!cancelled(&u))
    drain(&u, tar_ok);
  hex_digest(u.raw_md, r->digest, sizeof r->digest);
  hex_digest(u.tar_md, r->diff_id, sizeof r->diff_id);
  if (!cancelled(&u) && o->digest && strcmp(o->digest, r->digest) != 0) {
    r->code[0] = '\0';
    fail(&u, "digest_mismatch", "the blob's digest is %s, not %s: it was corrupted or replaced on the way",
         r->digest, o->digest);
  }
  else if (tar_ok && !r->code[0] && o->diff_id && strcmp(o->diff_id, r->diff_id) != 0) {
    fail(&u, "digest_mismatch", "the uncompressed layer's digest is %s, not %s (the image config's diff id)",
         r->diff_id, o->diff_id);
  }
  if (!r->code[0])
    finish_dirs(&u);
out:
  drop_cache(&u);
  for (i = 0; i < u.ndirs; i++)
    free(u.dirs[i].path);
  free(u.dirs);
  if (u.tar)
    archive_read_free(u.tar);
  if (u.raw)
    archive_read_free(u.raw);
  if (u.outer)
    archive_read_free(u.outer);
  EVP_MD_CTX_free(u.raw_md);
  EVP_MD_CTX_free(u.tar_md);
  free(u.rbuf);
  free(u.tbuf);
  return r->code[0] ? -1 : 0;
}

/* ---------------------------------------------------------------- links to lower layers */

enum { FOUND, ABSENT, HIDDEN };

/*
** Looks for the clean path target in the layer at fd: FOUND (its parent
** directory in *pfd, the caller closes it), ABSENT (not in this layer;
** *opaque set when a directory on the way is opaque, so no lower layer
** counts either) or HIDDEN (a whiteout or a non-directory on the way).
*/
static int
lookup(int fd, char *target, int *pfd, int *opaque)
{
  const char *dir, *leaf;
  char buf[4096], *comp, *save = NULL;
  struct stat st;
  int cur = dup(fd), next;
  char v[2];
  snprintf(buf, sizeof buf, "%s", target);
  leaf = split_leaf(buf, &dir);
  *opaque = 0;
  if (cur < 0)
    return HIDDEN;
  for (comp = strtok_r((char *)dir, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
    if (fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (fgetxattr(cur, "user.overlay.opaque", v, 1) == 1 && v[0] == 'y')
        *opaque = 1;
      close(cur);
      return ABSENT;
    }
    if (!S_ISDIR(st.st_mode)) {
      close(cur);
      return HIDDEN;
    }
    next = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(cur);
    if (next < 0)
      return HIDDEN;
    cur = next;
    if (fgetxattr(cur, "user.overlay.opaque", v, 1) == 1 && v[0] == 'y')
      *opaque = 1;
  }
  if (fstatat(cur, leaf, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    close(cur);
    return ABSENT;
  }
  if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {
    close(cur);
    return HIDDEN;
  }
  if (S_ISDIR(st.st_mode)) {
    close(cur);
    return HIDDEN;
  }
  *pfd = cur;
  return FOUND;
}

int
sbx_layer_link_lower(int root_fd, const int *lowers, size_t n, const char *path, const char *target,
                     char *code, size_t codesz, char *msg, size_t msgsz)
{
  char p[4096], tg[4096];
  const char *dir, *leaf, *tdir, *tleaf;
  struct stat st;
  size_t i;
  int dfd, src = -1, opaque = 0, rc, where = ABSENT;
  if (sbx_layer_clean_path(path, p, sizeof p) <= 0 || sbx_layer_clean_path(target, tg, sizeof tg) <= 0) {
    snprintf(code, codesz, "unsafe_entry");
    snprintf(msg, msgsz, "the hard link %.300s -> %.300s is not a clean path", path, target);
    return -1;
  }
  /* This layer first (a link made before), then the ones below. */
  where = lookup(root_fd, tg, &src, &opaque);
  for (i = 0; where == ABSENT && !opaque && i < n; i++)
    where = lookup(lowers[i], tg, &src, &opaque);
  if (where != FOUND) {
    snprintf(code, codesz, "unsafe_entry");
    snprintf(msg, msgsz,
             "the hard link %.300s points to %.300s, which neither this layer nor one below holds as a file",
             path, target);
    return -1;
  }
  leaf = split_leaf(p, &dir);
  dfd = open_dir(root_fd, dir, 1);
  if (dfd < 0) {
    int e = errno;
    close(src);
    snprintf(code, codesz, e == ELOOP || e == ENOTDIR ? "unsafe_entry" : "io");
    snprintf(msg, msgsz, "cannot open the directory of %.300s: %s", path, strerror(e));
    return -1;
  }
  if (fstatat(dfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    close(src);
    close(dfd);
    return 0; /* a later entry of the layer took the name */
  }
  tleaf = split_leaf(tg, &tdir);
  rc = linkat(src, tleaf, dfd, leaf, 0);
  {
    int e = errno;
    close(src);
    close(dfd);
    if (rc != 0) {
      snprintf(code, codesz, "io");
      snprintf(msg, msgsz, "cannot link %.300s to %.300s of a lower layer: %s", path, target, strerror(e));
      return -1;
    }
  }
  return 0;
}

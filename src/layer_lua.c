/*
** core.layer: the image cache's mechanism. Unpacking a layer (layer.c),
** reading an archive's index and removing a tree run on libuv's worker
** threads, so the loop keeps serving other tasks; the rest are small
** file-system calls the Lua cache code needs and plain Lua lacks (mkdir,
** readdir, lstat, flock, utimens, a read that cannot leave a directory).
** Policy (where the cache is, what is kept, limits) is Lua's: see
** lua/sbx/images/.
*/
#define _GNU_SOURCE
#include "host.h"
#include "fail.h"
#include "modules.h"
#include "layer.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#define LOCK_MT "sbx.layer.lock"
#define BUDGET_MT "sbx.layer.budget"

/* ---------------------------------------------------------------- helpers */

static const char *
errno_code(int e)
{
  switch (e) {
  case ENOENT:
    return "ENOENT";
  case EACCES:
    return "EACCES";
  case EPERM:
    return "EPERM";
  case ENOSPC:
    return "ENOSPC";
  case EEXIST:
    return "EEXIST";
  case ENOTDIR:
    return "ENOTDIR";
  case ELOOP:
    return "ELOOP";
  case EXDEV:
    return "EXDEV";
  default:
    return "io";
  }
}

static int
push_errno(lua_State *L, const char *what, const char *path)
{
  int e = errno;
  return sbx_pushfail(L, errno_code(e), "%s %s: %s", what, path, strerror(e));
}

/* Opens path for reading; with root, path is resolved as if root were "/"
** (symlinks included), so nothing outside root is ever read. */
static int
open_in(const char *root, const char *path)
{
  struct open_how how;
  int rfd, fd;
  if (!root)
    return open(path, O_RDONLY | O_CLOEXEC);
  rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0)
    return -1;
  memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  fd = (int)syscall(SYS_openat2, rfd, path, &how, sizeof how);
  {
    int e = errno;
    close(rfd);
    errno = e;
  }
  return fd;
}

static char *
opt_strdup(lua_State *L, int t, const char *key)
{
  char *s = NULL;
  if (lua_getfield(L, t, key) == LUA_TSTRING) {
    s = strdup(lua_tostring(L, -1));
    if (!s)
      luaL_error(L, "out of memory");
  }
  else if (!lua_isnil(L, -1))
    luaL_error(L, "layer option %s must be a string", key);
  lua_pop(L, 1);
  return s;
}

/* ---------------------------------------------------------------- jobs */

enum { JOB_UNPACK, JOB_REMOVE, JOB_SCAN };

struct scan_entry {
  char *name, *link, *data;
  char type; /* f d l h (hard link) o (other) */
  int64_t size;
  size_t data_len;
};

struct layer_op;

/*
** Work for a thread. Allocated apart from the Lua op: a cancelled or
** collected op lets go of it, and the loop frees it once the thread is done.
*/
struct job {
  uv_work_t work;
  struct layer_op *op; /* NULL once nobody waits */
  volatile int cancel;
  int kind;
  char *file, *root, *member, *dest, *digest, *diff_id;
  struct sbx_layer_opts o;
  struct sbx_layer_result r;
  int rc;
  char msg[SBX_LAYER_MSG];
  const char *code;
  struct scan_entry *entries;
  size_t n, cap;
  size_t small, total, kept;
};

struct layer_op {
  struct sbx_waiter w;
  struct job *job;
};

static void
job_free(struct job *j)
{
  size_t i;
  for (i = 0; i < j->n; i++) {
    free(j->entries[i].name);
    free(j->entries[i].link);
    free(j->entries[i].data);
  }
  free(j->entries);
  free(j->file);
  free(j->root);
  free(j->member);
  free(j->dest);
  free(j->digest);
  free(j->diff_id);
  for (i = 0; i < SBX_LAYER_BUDGETS; i++)
    sbx_layer_budget_unref(j->o.budgets[i]);
  sbx_layer_result_free(&j->r);
  free(j);
}

static void
run_unpack(struct job *j)
{
  int in = open_in(j->root, j->file);
  int dest;
  if (in < 0) {
    snprintf(j->r.code, sizeof j->r.code, "%s", errno == ENOENT ? "not_found" : "io");
    snprintf(j->r.message, sizeof j->r.message, "cannot open %s: %s", j->file, strerror(errno));
    j->rc = -1;
    return;
  }
  dest = open(j->dest, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dest < 0) {
    snprintf(j->r.code, sizeof j->r.code, "io");
    snprintf(j->r.message, sizeof j->r.message, "cannot open %s: %s", j->dest, strerror(errno));
    close(in);
    j->rc = -1;
    return;
  }
  j->o.in_fd = in;
  j->o.root_fd = dest;
  j->o.member = j->member;
  j->o.digest = j->digest;
  j->o.diff_id = j->diff_id;
  j->o.cancel = &j->cancel;
  j->rc = sbx_layer_unpack(&j->o, &j->r);
  close(in);
  close(dest);
}

static int
scan_add(struct job *j, struct archive *a, struct archive_entry *e)
{
  struct scan_entry *s;
  const char *name = archive_entry_pathname(e);
  const char *hl = archive_entry_hardlink(e), *sl = archive_entry_symlink(e);
  mode_t t = archive_entry_filetype(e);
  if (!name)
    return 0;
  if (j->n == j->cap) {
    size_t cap = j->cap ? j->cap * 2 : 64;
    struct scan_entry *p = realloc(j->entries, cap * sizeof *p);
    if (!p)
      return -1;
    j->entries = p;
    j->cap = cap;
  }
  s = &j->entries[j->n++];
  memset(s, 0, sizeof *s);
  s->name = strdup(name);
  s->type = hl ? 'h' : t == AE_IFREG ? 'f' : t == AE_IFDIR ? 'd' : t == AE_IFLNK ? 'l' : 'o';
  s->size = archive_entry_size(e);
  if (hl || sl)
    s->link = strdup(hl ? hl : sl);
  if (!s->name || ((hl || sl) && !s->link))
    return -1;
  if (s->type == 'f' && s->size >= 0 && (size_t)s->size <= j->small &&
      j->kept + (size_t)s->size <= j->total) {
    la_ssize_t n;
    s->data = malloc((size_t)s->size + 1);
    if (!s->data)
      return -1;
    n = archive_read_data(a, s->data, (size_t)s->size);
    if (n < 0)
      return -2;
    s->data_len = (size_t)n;
    j->kept += (size_t)n;
  }
  return 0;
}

static void
run_scan(struct job *j)
{
  struct archive *a = archive_read_new();
  struct archive_entry *e;
  int fd = open_in(j->root, j->file), rc;
  j->rc = -1;
  if (fd < 0) {
    j->code = errno == ENOENT ? "not_found" : "io";
    snprintf(j->msg, sizeof j->msg, "cannot open %s: %s", j->file, strerror(errno));
    if (a)
      archive_read_free(a);
    return;
  }
  if (!a) {
    j->code = "io";
    snprintf(j->msg, sizeof j->msg, "out of memory");
    close(fd);
    return;
  }
  archive_read_support_filter_all(a);
  archive_read_support_format_tar(a);
  if (archive_read_open_fd(a, fd, 128 * 1024) != ARCHIVE_OK) {
    j->code = "bad_image";
    snprintf(j->msg, sizeof j->msg, "%s is not a tar archive: %s", j->file, archive_error_string(a));
    goto out;
  }
  while ((rc = archive_read_next_header(a, &e)) == ARCHIVE_OK || rc == ARCHIVE_WARN) {
    int k;
    if (j->cancel) {
      j->code = "cancelled";
      snprintf(j->msg, sizeof j->msg, "cancelled");
      goto out;
    }
    k = scan_add(j, a, e);
    if (k == -1) {
      j->code = "io";
      snprintf(j->msg, sizeof j->msg, "out of memory");
      goto out;
    }
    if (k == -2)
      break;
  }
  if (rc != ARCHIVE_EOF) {
    j->code = "bad_image";
    snprintf(j->msg, sizeof j->msg, "%s is truncated or corrupt: %s", j->file, archive_error_string(a));
    goto out;
  }
  j->rc = 0;
out:
  archive_read_free(a);
  close(fd);
}

static void
work_cb(uv_work_t *req)
{
  struct job *j = req->data;
  switch (j->kind) {
  case JOB_UNPACK:
    run_unpack(j);
    break;
  case JOB_REMOVE:
    j->rc = sbx_layer_remove(AT_FDCWD, j->file, j->msg, sizeof j->msg);
    j->code = j->rc ? errno_code(errno) : NULL;
    break;
  case JOB_SCAN:
    run_scan(j);
    break;
  }
}

static void
after_cb(uv_work_t *req, int status)
{
  struct job *j = req->data;
  (void)status;
  if (j->op)
    sbx_wake(&j->op->w);
  else
    job_free(j);
}

/* The waiting side is gone (interrupt, task cancelled, collected): the
** thread is told to stop, and after_cb frees the job. */
static void
op_cancel(struct sbx_waiter *w)
{
  struct layer_op *op = (struct layer_op *)w;
  if (op->job) {
    op->job->cancel = 1;
    op->job->op = NULL;
    op->job = NULL;
  }
}

static int
job_start(lua_State *L, struct job *j, lua_KFunction k)
{
  struct sbx_host *h = sbx_host_get(L);
  struct layer_op *op = (struct layer_op *)sbx_op_new(L, sizeof *op, op_cancel); /* [..., op] */
  op->job = j;
  j->op = op;
  j->work.data = j;
  if (uv_queue_work(&h->loop, &j->work, work_cb, after_cb) != 0) {
    op->job = NULL;
    job_free(j);
    return luaL_error(L, "cannot start a worker thread");
  }
  return sbx_await(L, &op->w, k, 0);
}

/* Takes the finished job from the op on top of the stack; raises when the
** wait was cancelled. */
static struct job *
job_take(lua_State *L)
{
  struct layer_op *op = lua_touserdata(L, -1);
  struct job *j;
  if (op->w.cancelled)
    sbx_raise_cancelled(L);
  j = op->job;
  op->job = NULL;
  lua_pop(L, 1);
  return j;
}

/* ---------------------------------------------------------------- unpack */

static int
unpack_k(lua_State *L, int status, lua_KContext ctx)
{
  struct job *j = job_take(L);
  (void)status;
  (void)ctx;
  if (j->rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, j->r.message);
    lua_pushstring(L, j->r.code);
    job_free(j);
    return 3;
  }
  lua_createtable(L, 0, 8);
  lua_pushinteger(L, (lua_Integer)j->r.bytes);
  lua_setfield(L, -2, "bytes");
  lua_pushinteger(L, (lua_Integer)j->r.disk);
  lua_setfield(L, -2, "disk");
  lua_pushinteger(L, (lua_Integer)j->r.entries);
  lua_setfield(L, -2, "entries");
  lua_pushinteger(L, (lua_Integer)j->r.whiteouts);
  lua_setfield(L, -2, "whiteouts");
  lua_pushinteger(L, (lua_Integer)j->r.skipped);
  lua_setfield(L, -2, "skipped");
  lua_pushinteger(L, (lua_Integer)j->r.raw_bytes);
  lua_setfield(L, -2, "raw_bytes");
  lua_pushstring(L, j->r.digest);
  lua_setfield(L, -2, "digest");
  lua_pushstring(L, j->r.diff_id);
  lua_setfield(L, -2, "diff_id");
  if (j->r.ndeferred > 0) {
    const char *p = j->r.deferred, *end = j->r.deferred + j->r.deferred_len;
    lua_Integer i = 0;
    lua_createtable(L, (int)j->r.ndeferred, 0);
    while (p < end) {
      const char *target = p + strlen(p) + 1;
      lua_createtable(L, 2, 0);
      lua_pushstring(L, p);
      lua_rawseti(L, -2, 1);
      lua_pushstring(L, target);
      lua_rawseti(L, -2, 2);
      lua_rawseti(L, -2, ++i);
      p = target + strlen(target) + 1;
    }
    lua_setfield(L, -2, "deferred");
  }
  job_free(j);
  return 1;
}

static uint64_t
opt_size(lua_State *L, int t, const char *key, uint64_t dflt)
{
  lua_Integer v;
  if (lua_getfield(L, t, key) == LUA_TNIL) {
    lua_pop(L, 1);
    return dflt;
  }
  v = luaL_checkinteger(L, -1);
  if (v < 0)
    luaL_error(L, "layer option %s must be >= 0", key);
  lua_pop(L, 1);
  return (uint64_t)v;
}

static int
is_digest(const char *s)
{
  size_t i;
  if (!s)
    return 1;
  if (strncmp(s, "sha256:", 7) != 0 || strlen(s) != 7 + 64)
    return 0;
  for (i = 7; s[i]; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return 0;
  return 1;
}

/*
** layer.unpack{ file =, root =, member =, dest =, digest =, diff_id =,
**   max_bytes =, max_entries =, devices = "refuse"|"skip", whiteouts =,
**   chown =, budgets = { layer.budget, ... }, defer_links = } -> ...,
**   deferred = { { path, target }, ... } (defer_links: hard links to files
**   this layer lacks, for layer.link_lower once the layers below are there) -> { bytes, disk, entries,
*whiteouts, skipped, raw_bytes,
**   digest, diff_id } | nil, message, code
** Unpacks the blob at file (inside root when given: resolved as if root
** were "/"; or the tar member named member of that file) into the
** existing directory dest. digest and diff_id ("sha256:<hex>") are checked
** when given. whiteouts defaults to true, chown to "running as root".
** Codes: see layer.h. Runs on a worker thread; may yield; raises on bad
** options.
*/
static int
layer_unpack(lua_State *L)
{
  struct job *j;
  const char *devices;
  luaL_checktype(L, 1, LUA_TTABLE);
  j = calloc(1, sizeof *j);
  if (!j)
    return luaL_error(L, "out of memory");
  j->kind = JOB_UNPACK;
  /* Strings are copied one by one; a raise in between leaks what was
  ** copied, which only a misuse can cause. */
  j->file = opt_strdup(L, 1, "file");
  j->root = opt_strdup(L, 1, "root");
  j->member = opt_strdup(L, 1, "member");
  j->dest = opt_strdup(L, 1, "dest");
  j->digest = opt_strdup(L, 1, "digest");
  j->diff_id = opt_strdup(L, 1, "diff_id");
  if (!j->file || !j->dest || !is_digest(j->digest) || !is_digest(j->diff_id)) {
    job_free(j);
    return luaL_error(L, "layer.unpack needs file and dest, and digests as sha256:<64 hex digits>");
  }
  j->o.max_bytes = opt_size(L, 1, "max_bytes", UINT64_MAX);
  j->o.max_entries = opt_size(L, 1, "max_entries", UINT64_MAX);
  if (lua_getfield(L, 1, "budgets") == LUA_TTABLE) {
    int i, n = (int)luaL_len(L, -1);
    if (n > SBX_LAYER_BUDGETS) {
      job_free(j);
      return luaL_error(L, "layer.unpack: at most %d budgets", SBX_LAYER_BUDGETS);
    }
    for (i = 0; i < n; i++) {
      struct sbx_layer_budget **b;
      lua_rawgeti(L, -1, i + 1);
      b = luaL_testudata(L, -1, BUDGET_MT);
      if (!b || !*b) {
        job_free(j);
        return luaL_error(L, "layer.unpack: budgets must hold layer.budget values");
      }
      sbx_layer_budget_ref(*b);
      j->o.budgets[i] = *b;
      lua_pop(L, 1);
    }
  }
  else if (!lua_isnil(L, -1)) {
    job_free(j);
    return luaL_error(L, "layer.unpack: budgets must be a list");
  }
  lua_pop(L, 1);
  lua_getfield(L, 1, "devices");
  devices = luaL_optstring(L, -1, "refuse");
  if (strcmp(devices, "refuse") != 0 && strcmp(devices, "skip") != 0) {
    job_free(j);
    return luaL_error(L, "layer.unpack: devices must be \"refuse\" or \"skip\"");
  }
  j->o.skip_devices = strcmp(devices, "skip") == 0;
  lua_getfield(L, 1, "whiteouts");
  j->o.whiteouts = lua_isnil(L, -1) ? 1 : lua_toboolean(L, -1);
  lua_getfield(L, 1, "chown");
  j->o.chown = lua_isnil(L, -1) ? geteuid() == 0 : lua_toboolean(L, -1);
  lua_getfield(L, 1, "defer_links");
  j->o.defer_links = lua_toboolean(L, -1);
  lua_settop(L, 1);
  return job_start(L, j, unpack_k);
}

/* ---------------------------------------------------------------- remove, scan */

static int
remove_k(lua_State *L, int status, lua_KContext ctx)
{
  struct job *j = job_take(L);
  (void)status;
  (void)ctx;
  if (j->rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, j->msg);
    lua_pushstring(L, j->code ? j->code : "io");
    job_free(j);
    return 3;
  }
  job_free(j);
  lua_pushboolean(L, 1);
  return 1;
}

/* layer.remove(path) -> true | nil, message, code: path and everything
** under it, no symlink followed (a missing path is fine). May yield. */
static int
layer_remove(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  struct job *j = calloc(1, sizeof *j);
  if (!j)
    return luaL_error(L, "out of memory");
  luaL_argcheck(L, *path != '\0' && strcmp(path, "/") != 0, 1, "not the root");
  j->kind = JOB_REMOVE;
  j->file = strdup(path);
  if (!j->file) {
    free(j);
    return luaL_error(L, "out of memory");
  }
  return job_start(L, j, remove_k);
}

static int
scan_k(lua_State *L, int status, lua_KContext ctx)
{
  struct job *j = job_take(L);
  size_t i;
  (void)status;
  (void)ctx;
  if (j->rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, j->msg);
    lua_pushstring(L, j->code ? j->code : "io");
    job_free(j);
    return 3;
  }
  lua_createtable(L, 0, 2);
  lua_createtable(L, (int)j->n, 0); /* [t, entries] */
  lua_newtable(L);                  /* [t, entries, files] */
  for (i = 0; i < j->n; i++) {
    struct scan_entry *s = &j->entries[i];
    char type[2] = { s->type, 0 };
    lua_createtable(L, 0, 4);
    lua_pushstring(L, s->name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, type);
    lua_setfield(L, -2, "type");
    lua_pushinteger(L, (lua_Integer)s->size);
    lua_setfield(L, -2, "size");
    if (s->link) {
      lua_pushstring(L, s->link);
      lua_setfield(L, -2, "link");
    }
    lua_rawseti(L, -3, (lua_Integer)i + 1);
    if (s->data) {
      lua_pushlstring(L, s->data, s->data_len);
      lua_setfield(L, -2, s->name);
    }
  }
  lua_setfield(L, -3, "files");
  lua_setfield(L, -2, "entries");
  job_free(j);
  return 1;
}

/*
** layer.scan(file, { root =, small =, total = }) -> { entries = { { name,
** type ("f", "d", "l", "h", "o"), size, link }, ... }, files = { [name] =
** content } } | nil, message, code
** The members of a tar archive, and the content of its regular files of at
** most small bytes (default 1 MiB) up to total bytes in all (16 MiB).
** Runs on a worker thread; may yield.
*/
static int
layer_scan(lua_State *L)
{
  const char *file = luaL_checkstring(L, 1);
  struct job *j;
  if (!lua_isnoneornil(L, 2))
    luaL_checktype(L, 2, LUA_TTABLE);
  j = calloc(1, sizeof *j);
  if (!j)
    return luaL_error(L, "out of memory");
  j->kind = JOB_SCAN;
  j->file = strdup(file);
  j->small = 1024 * 1024;
  j->total = 16 * 1024 * 1024;
  if (lua_istable(L, 2)) {
    j->root = opt_strdup(L, 2, "root");
    j->small = (size_t)opt_size(L, 2, "small", j->small);
    j->total = (size_t)opt_size(L, 2, "total", j->total);
  }
  if (!j->file) {
    job_free(j);
    return luaL_error(L, "out of memory");
  }
  lua_settop(L, 0);
  return job_start(L, j, scan_k);
}

/* ---------------------------------------------------------------- small calls */

/*
** layer.read(path, max [, root]) -> content | nil, message, code. At most
** max bytes (more is "too_large"); with root, path is resolved inside it.
*/
static int
layer_read(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  lua_Integer max = luaL_checkinteger(L, 2);
  const char *root = luaL_optstring(L, 3, NULL);
  luaL_Buffer b;
  char *p;
  ssize_t n;
  size_t got = 0;
  int fd;
  luaL_argcheck(L, max >= 0, 2, "a size >= 0");
  fd = open_in(root, path);
  if (fd < 0)
    return push_errno(L, "cannot open", path);
  luaL_buffinit(L, &b);
  for (;;) {
    p = luaL_prepbuffsize(&b, 65536);
    n = read(fd, p, 65536);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      errno = e;
      return push_errno(L, "cannot read", path);
    }
    if (n == 0)
      break;
    got += (size_t)n;
    if (got > (size_t)max) {
      close(fd);
      return sbx_pushfail(L, "too_large", "%s is larger than %d bytes", path, (int)max);
    }
    luaL_addsize(&b, (size_t)n);
  }
  close(fd);
  luaL_pushresult(&b);
  return 1;
}

/* layer.sha256(data) -> "sha256:<hex>" */
static int
layer_sha256(lua_State *L)
{
  size_t n, i;
  const char *s = luaL_checklstring(L, 1, &n);
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int dn = 0;
  char hex[7 + 2 * EVP_MAX_MD_SIZE + 1] = "sha256:";
  if (!EVP_Digest(s, n, d, &dn, EVP_sha256(), NULL))
    return luaL_error(L, "sha256 failed");
  for (i = 0; i < dn; i++)
    snprintf(hex + 7 + 2 * i, 3, "%02x", d[i]);
  lua_pushstring(L, hex);
  return 1;
}

/* layer.mkdirs(path [, mode]) -> true | nil, message, code (mkdir -p; the
** mode, default 0755, is given whatever the umask says). */
static int
layer_mkdirs(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  mode_t mode = (mode_t)luaL_optinteger(L, 2, 0755);
  size_t n = strlen(path), i;
  char *p = malloc(n + 1);
  struct stat st;
  if (!p)
    return luaL_error(L, "out of memory");
  memcpy(p, path, n + 1);
  for (i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0')
      continue;
    p[i] = '\0';
    if (mkdir(p, mode) == 0)
      chmod(p, mode);
    else if (errno != EEXIST || stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
      int e = errno == EEXIST ? ENOTDIR : errno;
      lua_pushstring(L, p);
      free(p);
      errno = e;
      return push_errno(L, "cannot make the directory", lua_tostring(L, -1));
    }
    if (i < n)
      p[i] = '/';
  }
  free(p);
  lua_pushboolean(L, 1);
  return 1;
}

/* layer.mkdtemp(prefix) -> path of a new directory prefix + 6 characters */
static int
layer_mkdtemp(lua_State *L)
{
  const char *prefix = luaL_checkstring(L, 1);
  size_t n = strlen(prefix);
  char *p = malloc(n + 7);
  if (!p)
    return luaL_error(L, "out of memory");
  memcpy(p, prefix, n);
  memcpy(p + n, "XXXXXX", 7);
  if (!mkdtemp(p)) {
    int e = errno;
    free(p);
    errno = e;
    return push_errno(L, "cannot make a directory at", prefix);
  }
  lua_pushstring(L, p);
  free(p);
  return 1;
}

/* layer.list(dir) -> { names } (sorted by nothing) | nil, message, code */
static int
layer_list(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  DIR *d = opendir(path);
  struct dirent *de;
  lua_Integer i = 0;
  if (!d)
    return push_errno(L, "cannot list", path);
  lua_newtable(L);
  while ((de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    lua_pushstring(L, de->d_name);
    lua_rawseti(L, -2, ++i);
  }
  closedir(d);
  return 1;
}

/* layer.stat(path) -> { type, size, mtime, mode, uid, dev, ino } | nil,
** message, code. lstat: a symlink is "link". */
static int
layer_stat(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  if (lstat(path, &st) != 0)
    return push_errno(L, "cannot stat", path);
  lua_createtable(L, 0, 7);
  lua_pushstring(L, S_ISREG(st.st_mode)   ? "file"
                    : S_ISDIR(st.st_mode) ? "dir"
                    : S_ISLNK(st.st_mode) ? "link"
                                          : "other");
  lua_setfield(L, -2, "type");
  lua_pushinteger(L, (lua_Integer)st.st_size);
  lua_setfield(L, -2, "size");
  lua_pushnumber(L, (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9);
  lua_setfield(L, -2, "mtime");
  lua_pushinteger(L, (lua_Integer)(st.st_mode & 07777));
  lua_setfield(L, -2, "mode");
  lua_pushinteger(L, (lua_Integer)st.st_uid);
  lua_setfield(L, -2, "uid");
  lua_pushinteger(L, (lua_Integer)st.st_dev);
  lua_setfield(L, -2, "dev");
  lua_pushinteger(L, (lua_Integer)st.st_ino);
  lua_setfield(L, -2, "ino");
  return 1;
}

/* layer.touch(path) -> true | nil, message, code: its times become now. */
static int
layer_touch(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  if (utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW) != 0)
    return push_errno(L, "cannot touch", path);
  lua_pushboolean(L, 1);
  return 1;
}

/* layer.machine() -> uname's machine ("x86_64", "aarch64", ...) */
static int
layer_machine(lua_State *L)
{
  struct utsname u;
  if (uname(&u) != 0)
    return push_errno(L, "uname", "");
  lua_pushstring(L, u.machine);
  return 1;
}

static int
layer_euid(lua_State *L)
{
  lua_pushinteger(L, (lua_Integer)geteuid());
  return 1;
}

/* ---------------------------------------------------------------- locks */

struct lock_ud {
  int fd; /* -1 once released */
};

/*
** layer.lock(path, "ex"|"sh") -> lock | nil, message, code. Never waits:
** a lock another holder keeps is nil, "busy", "busy" (the caller polls).
** Creates the file (0600). flock(2): released by lock:close(), <close>,
** the collector, or the process's end, whatever kills it.
*/
static int
layer_lock(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  const char *mode = luaL_checkstring(L, 2);
  struct lock_ud *ud;
  int op;
  if (strcmp(mode, "ex") == 0)
    op = LOCK_EX;
  else if (strcmp(mode, "sh") == 0)
    op = LOCK_SH;
  else
    return luaL_argerror(L, 2, "\"ex\" or \"sh\"");
  ud = lua_newuserdatauv(L, sizeof *ud, 0);
  ud->fd = -1;
  luaL_setmetatable(L, LOCK_MT);
  ud->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (ud->fd < 0)
    return push_errno(L, "cannot open the lock", path);
  if (flock(ud->fd, op | LOCK_NB) != 0) {
    int e = errno;
    close(ud->fd);
    ud->fd = -1;
    if (e == EWOULDBLOCK)
      return sbx_pushfail(L, "busy", "busy");
    errno = e;
    return push_errno(L, "cannot lock", path);
  }
  return 1;
}

static int
lock_close(lua_State *L)
{
  struct lock_ud *ud = luaL_checkudata(L, 1, LOCK_MT);
  int fd = ud->fd;
  ud->fd = -1;
  if (fd >= 0)
    close(fd);
  return 0;
}

static int
lock_held(lua_State *L)
{
  struct lock_ud *ud = luaL_checkudata(L, 1, LOCK_MT);
  lua_pushboolean(L, ud->fd >= 0);
  return 1;
}

static const luaL_Reg lock_methods[] = { { "close", lock_close }, { "held", lock_held }, { NULL, NULL } };

static const luaL_Reg lock_meta[] = { { "__gc", lock_close },
                                      { "__close", lock_close },
                                      { "__index", NULL },
                                      { NULL, NULL } };

/*
** layer.link_lower(root, lowers, links) -> true | nil, message, code:
** makes each hard link { path, target } of links in the layer at root to
** target as the layers lowers (directories, top first) show it
** (sbx_layer_link_lower). Small and synchronous.
*/
static int
layer_link_lower(lua_State *L)
{
  const char *root = luaL_checkstring(L, 1);
  int fds[128], rfd, rc = 0;
  size_t n, i, k;
  char code[32], msg[SBX_LAYER_MSG];
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  n = (size_t)luaL_len(L, 2);
  luaL_argcheck(L, n <= 128, 2, "at most 128 layers");
  rfd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (rfd < 0)
    return push_errno(L, "cannot open", root);
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, 2, (lua_Integer)i + 1);
    fds[i] = open(luaL_checkstring(L, -1), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fds[i] < 0) {
      int e = errno;
      for (k = 0; k < i; k++)
        close(fds[k]);
      close(rfd);
      errno = e;
      return push_errno(L, "cannot open the layer", lua_tostring(L, -1));
    }
    lua_pop(L, 1);
  }
  for (i = 1; rc == 0 && i <= (size_t)luaL_len(L, 3); i++) {
    const char *path, *target;
    lua_rawgeti(L, 3, (lua_Integer)i);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    path = lua_tostring(L, -2);
    target = lua_tostring(L, -1);
    if (!path || !target)
      rc = -2;
    else
      rc = sbx_layer_link_lower(rfd, fds, n, path, target, code, sizeof code, msg, sizeof msg);
    lua_pop(L, 3);
  }
  for (k = 0; k < n; k++)
    close(fds[k]);
  close(rfd);
  if (rc == -2)
    return luaL_error(L, "layer.link_lower: links must be { path, target } pairs of strings");
  if (rc != 0)
    return sbx_pushfail(L, code, "%s", msg);
  lua_pushboolean(L, 1);
  return 1;
}

/* ---------------------------------------------------------------- budgets */

/*
** layer.budget(limit, message) -> budget: bytes that the unpacks given it
** (unpack's budgets) share, message the error of the one that would pass
** limit (layer.h). budget:used(), budget:limit(), budget:over() (a charge
** did not fit).
*/
static int
layer_budget(lua_State *L)
{
  lua_Integer limit = luaL_checkinteger(L, 1);
  const char *message = luaL_checkstring(L, 2);
  struct sbx_layer_budget **ud;
  luaL_argcheck(L, limit >= 0, 1, "a budget is >= 0 bytes");
  ud = lua_newuserdatauv(L, sizeof *ud, 0);
  *ud = NULL;
  luaL_setmetatable(L, BUDGET_MT);
  *ud = sbx_layer_budget_new((uint64_t)limit, message);
  if (!*ud)
    return luaL_error(L, "out of memory");
  return 1;
}

static struct sbx_layer_budget *
check_budget(lua_State *L)
{
  struct sbx_layer_budget **ud = luaL_checkudata(L, 1, BUDGET_MT);
  if (!*ud)
    luaL_error(L, "attempt to use a released budget");
  return *ud;
}

static int
budget_used(lua_State *L)
{
  lua_pushinteger(L, (lua_Integer)sbx_layer_budget_used(check_budget(L)));
  return 1;
}

static int
budget_limit(lua_State *L)
{
  lua_pushinteger(L, (lua_Integer)sbx_layer_budget_limit(check_budget(L)));
  return 1;
}

static int
budget_over(lua_State *L)
{
  lua_pushboolean(L, sbx_layer_budget_over(check_budget(L)));
  return 1;
}

/* __gc: lets go of this reference (a job still running keeps its own). */
static int
budget_gc(lua_State *L)
{
  struct sbx_layer_budget **ud = luaL_checkudata(L, 1, BUDGET_MT);
  struct sbx_layer_budget *b = *ud;
  *ud = NULL;
  sbx_layer_budget_unref(b);
  return 0;
}

static const luaL_Reg budget_methods[] = { { "used", budget_used },
                                           { "limit", budget_limit },
                                           { "over", budget_over },
                                           { NULL, NULL } };

static const luaL_Reg budget_meta[] = { { "__gc", budget_gc }, { "__index", NULL }, { NULL, NULL } };

static const luaL_Reg layer_funcs[] = { { "budget", layer_budget },   { "link_lower", layer_link_lower },
                                        { "unpack", layer_unpack },   { "remove", layer_remove },
                                        { "scan", layer_scan },       { "read", layer_read },
                                        { "sha256", layer_sha256 },   { "mkdirs", layer_mkdirs },
                                        { "mkdtemp", layer_mkdtemp }, { "list", layer_list },
                                        { "stat", layer_stat },       { "touch", layer_touch },
                                        { "machine", layer_machine }, { "euid", layer_euid },
                                        { "lock", layer_lock },       { NULL, NULL } };

int
sbx_open_layer(lua_State *L)
{
  luaL_newmetatable(L, LOCK_MT);
  luaL_setfuncs(L, lock_meta, 0);
  luaL_newlib(L, lock_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newmetatable(L, BUDGET_MT);
  luaL_setfuncs(L, budget_meta, 0);
  luaL_newlib(L, budget_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, layer_funcs);
  return 1;
}

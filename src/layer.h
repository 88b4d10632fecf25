/*
** Image layers: a tar stream (gzip, zstd, xz, bzip2 or plain, as libarchive
** detects) unpacked safely into one directory, with the digests of its raw
** and its uncompressed bytes checked on the way. Pure C, no Lua: the binding
** (layer_lua.c) runs it on a worker thread, the fuzz target directly.
**
** What "safely" means here, for every entry of a hostile tar:
**   - its name is made relative to the root; an empty, "." or ".." component
**     is refused (sbx_layer_clean_path), never resolved;
**   - every directory on its way is opened with O_NOFOLLOW relative to the
**     one before it, so nothing is written through a symlink, even one this
**     layer made itself (symlinks are written as they are, absolute targets
**     included: they are data inside the image, followed only in a box);
**   - a hard link names an entry this layer already wrote, found the same
**     way; a target outside the tree is an error;
**   - device nodes are refused (or skipped, if asked): an unprivileged user
**     cannot make them, and a box gets its /dev from the backend;
**   - the bytes of regular files are capped (max_bytes, the declared size
**     checked before anything is written) and so is the number of entries;
**     budgets shared with other unpacks cap them together (one image, the
**     cache);
**   - OCI whiteouts become overlayfs ones: ".wh.NAME" a 0/0 character device
**     NAME (which the kernel lets unprivileged users make), ".wh..wh..opq"
**     the xattr user.overlay.opaque=y on its directory (trusted.overlay.opaque
**     too when the process may set it), so the directory is a lowerdir of a
**     mount with or without userxattr. A whiteout never hides an entry of its
**     own layer (OCI image spec).
** A failure leaves the root half written: the caller unpacks into a fresh
** directory and renames it into place only on success.
*/
#ifndef SBX_LAYER_H
#define SBX_LAYER_H

#include <stddef.h>
#include <stdint.h>

#define SBX_LAYER_MSG 512

/*
** Disk that several unpacks share (the layers of one image, unpacked at
** once on worker threads; the room left in the cache): every entry is
** charged what it may take (a file its declared size rounded up to 4 KiB,
** a directory 4 KiB) before anything of it is written, so a layer stops
** at the limit while it unpacks, whatever its compressed size. A charge
** that does not fit fails the unpack with "too_large" and the budget's
** message, and marks the budget over. Reference-counted: sbx_layer_budget_new
** gives one reference; each holder takes its own (sbx_layer_budget_ref) and
** lets go of it (sbx_layer_budget_unref), the last frees it.
*/
struct sbx_layer_budget;

struct sbx_layer_budget *sbx_layer_budget_new(uint64_t limit, const char *message);
void sbx_layer_budget_ref(struct sbx_layer_budget *b);
void sbx_layer_budget_unref(struct sbx_layer_budget *b);
uint64_t sbx_layer_budget_used(const struct sbx_layer_budget *b);
uint64_t sbx_layer_budget_limit(const struct sbx_layer_budget *b);
int sbx_layer_budget_over(const struct sbx_layer_budget *b);

#define SBX_LAYER_BUDGETS 2

struct sbx_layer_opts {
  int in_fd;            /* the input, read from its current offset to its end */
  const char *member;   /* NULL, or the name of the input's tar entry holding the layer */
  int root_fd;          /* the directory to write into (should be empty) */
  const char *digest;   /* "sha256:<hex>" of the raw bytes (the blob), or NULL */
  const char *diff_id;  /* "sha256:<hex>" of the uncompressed tar, or NULL */
  uint64_t max_bytes;   /* regular file bytes the layer may hold */
  uint64_t max_entries; /* entries the layer may hold */
  int skip_devices;     /* 1: skip device nodes; 0: refuse them */
  int whiteouts;        /* 1: .wh. names are OCI whiteouts; 0: plain names */
  int chown;            /* 1: give entries the tar's owners (root only) */
  volatile int *cancel; /* set from another thread: stop with "cancelled" */
  struct sbx_layer_budget *budgets[SBX_LAYER_BUDGETS]; /* NULL or shared budgets, each charged */
  int defer_links; /* 1: a hard link to a file this layer lacks is put off (result's deferred) */
};

struct sbx_layer_result {
  uint64_t bytes; /* regular file bytes written */
  uint64_t disk;  /* an estimate of the disk space used */
  uint64_t entries;
  uint64_t whiteouts;
  uint64_t skipped;   /* entries skipped (sockets, devices when asked) */
  uint64_t raw_bytes; /* bytes read from the input (the blob's size) */
  char digest[80];    /* "sha256:<hex>" of the raw bytes */
  char diff_id[80];   /* "sha256:<hex>" of the uncompressed tar */
  char code[32];      /* "" on success, else a stable short code */
  char message[SBX_LAYER_MSG];
  /* With defer_links: hard links whose target a lower layer holds, as
  ** "path\0target\0" pairs (clean paths), in the tar's order; freed by
  ** sbx_layer_result_free. */
  char *deferred;
  size_t deferred_len;
  size_t ndeferred;
};

void sbx_layer_result_free(struct sbx_layer_result *r);

/*
** Makes the hard link path (a clean path below root_fd, the layer being
** made) to target, a file of the layers below it as a box would see them:
** root_fd itself first (a link made before), then lowers[0..n) top first,
** where a whiteout (a 0/0 character device) or a file on the way hides
** what is below, and so does an opaque directory (user.overlay.opaque)
** for the layers under it. Every directory is opened with O_NOFOLLOW, so
** nothing outside the layers is ever linked. An entry the layer already
** has at path (written after the link in the tar) wins: nothing is done.
** Returns 0, or -1 with code ("unsafe_entry", "io") and msg filled.
*/
int sbx_layer_link_lower(int root_fd, const int *lowers, size_t n, const char *path, const char *target,
                         char *code, size_t codesz, char *msg, size_t msgsz);

/*
** Unpacks one layer. Returns 0, or -1 with r->code ("bad_layer",
** "digest_mismatch", "too_large", "unsafe_entry", "device", "io",
** "cancelled", "not_found") and r->message set.
*/
int sbx_layer_unpack(const struct sbx_layer_opts *o, struct sbx_layer_result *r);

/*
** The name of a tar entry as a path relative to the root, into out:
** leading "/" and "./" dropped, empty and "." components dropped. Returns
** the length (0: the root itself), or -1 for a ".." component, a component
** longer than 255 bytes or a result that does not fit in outsz (at most
** 4095 bytes are ever written).
*/
int sbx_layer_clean_path(const char *in, char *out, size_t outsz);

/*
** Removes path and everything under it, never following a symlink; gives
** the owner write and search permission on a directory first where it
** lacks them (unpacked layers keep their modes). Returns 0 or -1 with
** errno set and msg filled.
*/
int sbx_layer_remove(int dirfd, const char *path, char *msg, size_t msgsz);

#endif

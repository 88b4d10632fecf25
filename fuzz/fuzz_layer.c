/* needs: root */
/*
** The layer unpacker's path handling (src/layer.c). Each input is used
** twice:
**   - as a tar entry name for sbx_layer_clean_path, checked against a
**     reference: the result is relative, has no empty, "." or ".."
**     component, is the input's own components in order, fails exactly for
**     a ".." component or a name too long, and cleaning it again changes
**     nothing;
**   - as a whole layer (any compression libarchive detects), unpacked into
**     box/root of a scratch directory, whiteouts on: whatever it holds,
**     box holds only root afterwards and the canary directory, which the
**     corpus's symlinks point at, stays empty. A shared budget smaller than
**     the layer's own limit is never passed. Hard links to files the layer
**     lacks are put off and then made against a fixed lower layer (a file,
**     a file in a directory, a symlink to the canary): the lower layer
**     keeps exactly its entries and the canary stays empty.
*/
#define _GNU_SOURCE
#include "fuzz.h"
#include "layer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CANARY "/tmp/sbx-fuzz-layer-canary"

/* Entries in dir other than . and .., and the first one's name in first. */
static int
count_entries(const char *dir, char *first, size_t firstsz)
{
  DIR *d = opendir(dir);
  struct dirent *de;
  int n = 0;
  CHECK(d != NULL);
  while ((de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (n++ == 0 && first)
      snprintf(first, firstsz, "%s", de->d_name);
  }
  closedir(d);
  return n;
}

static void
check_path(const uint8_t *data, size_t size)
{
  char in[8192], out[4096], again[4096], want[8192];
  size_t n = size < sizeof in - 1 ? size : sizeof in - 1, w = 0, i = 0;
  int rc, bad = 0;
  memcpy(in, data, n);
  in[n] = '\0';
  /* The reference: the components, split by hand. */
  while (in[i]) {
    size_t start, len;
    while (in[i] == '/')
      i++;
    start = i;
    while (in[i] && in[i] != '/')
      i++;
    len = i - start;
    if (len == 0 || (len == 1 && in[start] == '.'))
      continue;
    if (len == 2 && in[start] == '.' && in[start + 1] == '.')
      bad = 1;
    if (len > 255)
      bad = 1;
    if (w)
      want[w++] = '/';
    memcpy(want + w, in + start, len);
    w += len;
  }
  want[w] = '\0';
  if (w > 4095)
    bad = 1;
  rc = sbx_layer_clean_path(in, out, sizeof out);
  CHECK((rc < 0) == (bad != 0));
  if (rc < 0)
    return;
  CHECK((size_t)rc == strlen(out) && (size_t)rc == w);
  CHECK(strcmp(out, want) == 0);
  CHECK(out[0] != '/' && (rc == 0 || out[rc - 1] != '/'));
  CHECK(strstr(out, "//") == NULL);
  CHECK(sbx_layer_clean_path(out, again, sizeof again) == rc && strcmp(again, out) == 0);
}

static char scratch[64];
static char lower[96];

/* The scratch directory goes with the process (the canary stays: every
** run shares it, and it must stay empty). */
static void
remove_scratch(void)
{
  sbx_layer_remove(AT_FDCWD, lower, NULL, 0);
  rmdir(scratch);
}

/* The fixed lower layer deferred links are made against. */
static void
make_lower(void)
{
  char p[160];
  int fd;
  snprintf(lower, sizeof lower, "%s/lower", scratch);
  CHECK(mkdir(lower, 0700) == 0);
  snprintf(p, sizeof p, "%s/f", lower);
  fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
  CHECK(fd >= 0);
  close(fd);
  snprintf(p, sizeof p, "%s/d", lower);
  CHECK(mkdir(p, 0755) == 0);
  snprintf(p, sizeof p, "%s/d/g", lower);
  fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
  CHECK(fd >= 0);
  close(fd);
  snprintf(p, sizeof p, "%s/s", lower);
  CHECK(symlink(CANARY, p) == 0);
}

static void
check_unpack(const uint8_t *data, size_t size)
{
  char box[128], root[160], first[256];
  struct sbx_layer_opts o;
  struct sbx_layer_result r;
  struct sbx_layer_budget *budget;
  int in, rfd;
  if (!scratch[0]) {
    snprintf(scratch, sizeof scratch, "/tmp/sbx-fuzz-layer-%d", (int)getpid());
    mkdir(scratch, 0700);
    mkdir(CANARY, 0700);
    make_lower();
    atexit(remove_scratch);
  }
  snprintf(box, sizeof box, "%s/box", scratch);
  snprintf(root, sizeof root, "%s/root", box);
  CHECK(mkdir(box, 0700) == 0 && mkdir(root, 0700) == 0);
  in = memfd_create("layer", MFD_CLOEXEC);
  CHECK(in >= 0);
  CHECK(write(in, data, size) == (ssize_t)size);
  CHECK(lseek(in, 0, SEEK_SET) == 0);
  rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK(rfd >= 0);
  memset(&o, 0, sizeof o);
  o.in_fd = in;
  o.root_fd = rfd;
  o.max_bytes = 1 << 20;
  o.max_entries = 2000;
  o.whiteouts = 1;
  o.defer_links = 1;
  budget = sbx_layer_budget_new(512 * 1024, "over the fuzz budget");
  CHECK(budget != NULL);
  o.budgets[0] = budget;
  if (sbx_layer_unpack(&o, &r) != 0) {
    CHECK(r.code[0] != '\0' && r.message[0] != '\0');
  }
  else {
    const char *p = r.deferred, *end = r.deferred + r.deferred_len;
    int lfd = open(lower, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    size_t n = 0;
    CHECK(r.bytes <= o.max_bytes && r.entries <= o.max_entries && r.raw_bytes == size);
    CHECK(lfd >= 0);
    while (p < end) {
      const char *target = p + strlen(p) + 1;
      char code[32] = "", msg[SBX_LAYER_MSG] = "";
      if (sbx_layer_link_lower(rfd, &lfd, 1, p, target, code, sizeof code, msg, sizeof msg) != 0)
        CHECK(code[0] != '\0' && msg[0] != '\0');
      p = target + strlen(target) + 1;
      n++;
    }
    CHECK(n == r.ndeferred);
    close(lfd);
  }
  CHECK(sbx_layer_budget_used(budget) <= sbx_layer_budget_limit(budget));
  sbx_layer_budget_unref(budget);
  sbx_layer_result_free(&r);
  close(rfd);
  close(in);
  CHECK(count_entries(box, first, sizeof first) == 1 && strcmp(first, "root") == 0);
  CHECK(count_entries(scratch, NULL, 0) == 2);
  CHECK(count_entries(lower, NULL, 0) == 3);
  CHECK(count_entries(CANARY, NULL, 0) == 0);
  CHECK(sbx_layer_remove(AT_FDCWD, box, NULL, 0) == 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  check_path(data, size);
  check_unpack(data, size);
  return 0;
}

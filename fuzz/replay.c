/*
** Replays fuzz inputs through one target without libFuzzer, so `make test`
** (and `make check`, under ASan and UBSan) runs every checked-in corpus with
** the normal compiler. Linked with one fuzz/fuzz_<name>.c.
**   replay_<name> DIR|FILE...
** TAP: one test per argument (every file of a directory, in name order).
** A broken invariant aborts; the handler then names the input as "not ok"
** before the process dies, and so does a sanitizer's report.
*/
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where we are, for the crash note: set before each input runs. */
static int test_no;
static char current[4096];

static void
say(const char *s)
{
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(2, s, n);
    if (w <= 0)
      return;
    s += w;
    n -= (size_t)w;
  }
}

/* Async-signal-safe: writes "not ok N - crashed on PATH" and nothing else. */
static void
crash_note(void)
{
  char num[24];
  int i = (int)sizeof num - 1, v = test_no;
  num[i] = '\0';
  do {
    num[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0 && i > 0);
  say("not ok ");
  say(num + i);
  say(" - crashed on ");
  say(current);
  say("\n");
}

static void
on_signal(int sig)
{
  crash_note();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Present only in a sanitized build: called before a report ends the run. */
extern void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

static int
run_file(const char *path)
{
  FILE *f;
  unsigned char *buf = NULL;
  size_t len = 0, cap = 0, got;
  snprintf(current, sizeof current, "%s", path);
  if (!(f = fopen(path, "rb")))
    return -1;
  do {
    if (len == cap) {
      cap = cap ? 2 * cap : 65536;
      buf = realloc(buf, cap);
      CHECK(buf != NULL);
    }
    got = fread(buf + len, 1, cap - len, f);
    len += got;
  } while (got > 0);
  fclose(f);
  /* A copy of exactly len bytes, so ASan sees any read past the input. */
  {
    unsigned char *exact = fuzz_alloc(len);
    if (len)
      memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
  }
  return 0;
}

static int
by_name(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every regular file of dir in name order; returns how many, or -1. */
static long
run_dir(const char *dir)
{
  DIR *d = opendir(dir);
  struct dirent *e;
  char **names = NULL, path[4096];
  size_t n = 0, cap = 0, i;
  long done = 0;
  if (!d)
    return -1;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      names = realloc(names, cap * sizeof *names);
      CHECK(names != NULL);
    }
    names[n] = strdup(e->d_name);
    CHECK(names[n] != NULL);
    n++;
  }
  closedir(d);
  if (n)
    qsort(names, n, sizeof *names, by_name);
  for (i = 0; i < n; i++) {
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && run_file(path) == 0)
      done++;
    free(names[i]);
  }
  free(names);
  return done;
}

int
main(int argc, char **argv)
{
  static const int sigs[] = { SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE };
  int i, failed = 0;
  for (i = 0; i < (int)(sizeof sigs / sizeof sigs[0]); i++)
    signal(sigs[i], on_signal);
  if (__sanitizer_set_death_callback)
    __sanitizer_set_death_callback(crash_note);
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR|FILE...\n", argv[0]);
    return 2;
  }
  printf("1..%d\n", argc - 1);
  fflush(stdout);
  for (i = 1; i < argc; i++) {
    struct stat st;
    long n;
    test_no = i;
    if (stat(argv[i], &st) != 0)
      n = -1;
    else if (S_ISDIR(st.st_mode))
      n = run_dir(argv[i]);
    else
      n = run_file(argv[i]) == 0 ? 1 : -1;
    if (n <= 0) {
      printf("not ok %d - %s: %s\n", i, argv[i], n == 0 ? "no inputs" : strerror(errno));
      failed++;
    }
    else
      printf("ok %d - %s: %ld inputs replayed\n", i, argv[i], n);
    fflush(stdout);
  }
  return failed ? 1 : 0;
}

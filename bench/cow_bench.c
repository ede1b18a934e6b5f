/* cow_bench: copy-on-write capture (capture = cow) against a copying
 * capture (capture = copy) and against memcpy, measured in one execution
 * (serial, cairn_init). Issue 27, target 1.
 *
 * The application's region: --bytes B of anonymous memory, advised huge
 * pages (--pages huge) or never (--pages small), every page touched.
 * References, medians over --reps:
 *   memcpy_s     memcpy of the bytes into a buffer faulted in before
 *   rewrite_s    the application's rewrite of its whole region (then of a
 *                contiguous --part percent of it), nothing protected
 * Per capture mode (copy, then cow; a handle each, run names cow_bench_copy
 * and cow_bench_cow), --checkpoints timed checkpoints after 2 untimed ones:
 *   blocked_s        time inside cairn_checkpoint (median)
 *   rewrite_all_s    the rewrite of the whole region right after
 *                    cairn_checkpoint returns (the worst case for cow: every
 *                    block faults unless the copy got there first)
 *   rewrite_part_s   the same with --part percent of the region
 *   captured_s       from the start of cairn_checkpoint until
 *                    cairn_wait(CAPTURED) returns
 * Each checkpoint is followed by cairn_wait(PERSISTENT) and a pause of
 * --settle-ms, untimed; the two rewrites alternate between checkpoints.
 * Output: one JSON object. bench/run_cow.py runs it for the sizes and page
 * kinds of the issue and prints the ratios.
 *
 * usage: cow_bench --bytes B [--pages huge|small] [--checkpoints N]
 *                  [--reps R] [--part P] [--settle-ms T] */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cairn.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  fprintf(stderr, "cow_bench: %s: %s\n", what, cairn_last_error());
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static unsigned char *alloc_region(size_t bytes, int huge) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  (void)madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  memset(p, 1, bytes);
  return p;
}

/* The application's compute on its state: one 8-byte store per 64-byte line
 * of `part` percent of the region, contiguous (one of ten arrays, say), at
 * an offset that moves with `seed`; 100: all of it. */
static void rewrite(unsigned char *p, size_t bytes, int part, uint64_t seed) {
  const size_t len = part >= 100 ? bytes : bytes / 100 * (size_t)part / 4096 * 4096;
  const size_t at = part >= 100 ? 0 : (size_t)(seed % (uint64_t)(100 / (part > 0 ? part : 1))) * len;
  uint64_t *w = (uint64_t *)(p + (at + len <= bytes ? at : 0));
  for (size_t i = 0; i < len / 8; i += 8) w[i] = seed + i;
}

static size_t parse_bytes(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
  }
  return (size_t)v;
}

int main(int argc, char **argv) {
  size_t bytes = 64u << 20;
  int huge = 1, checkpoints = 5, reps = 3, part = 10, settle_ms = 200;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "cow_bench: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--bytes")) bytes = parse_bytes(v);
    else if (!strcmp(a, "--pages")) huge = !strcmp(v, "huge");
    else if (!strcmp(a, "--checkpoints")) checkpoints = atoi(v);
    else if (!strcmp(a, "--reps")) reps = atoi(v);
    else if (!strcmp(a, "--part")) part = atoi(v);
    else if (!strcmp(a, "--settle-ms")) settle_ms = atoi(v);
    else {
      fprintf(stderr, "usage: cow_bench --bytes B [--pages huge|small] [--checkpoints N] [--reps R] [--part P] "
                      "[--settle-ms T]\n");
      return 2;
    }
    ++i;
  }
  bytes = bytes / 4096 * 4096;
  unsigned char *region = alloc_region(bytes, huge);
  unsigned char *dst = alloc_region(bytes, 1);
  double *t = calloc((size_t)(checkpoints + reps) * 4, sizeof(double));

  double memcpy_s, rewrite_all_ref, rewrite_part_ref;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    memcpy(dst, region, bytes);
    t[r] = now() - t0;
  }
  memcpy_s = median(t, reps);
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    rewrite(region, bytes, 100, (uint64_t)r);
    t[r] = now() - t0;
    t0 = now();
    rewrite(region, bytes, part, (uint64_t)r);
    t[reps + r] = now() - t0;
  }
  rewrite_all_ref = median(t, reps);
  rewrite_part_ref = median(t + reps, reps);

  printf("{\"bytes\": %zu, \"pages\": \"%s\", \"part_percent\": %d, \"memcpy_s\": %.6f, "
         "\"rewrite_all_s\": %.6f, \"rewrite_part_s\": %.6f",
         bytes, huge ? "huge" : "small", part, memcpy_s, rewrite_all_ref, rewrite_part_ref);
  const char *modes[] = {"copy", "cow"};
  for (int m = 0; m < 2; ++m) {
    char run[64];
    snprintf(run, sizeof run, "cow_bench_%s", modes[m]);
    setenv("CAIRN_CAPTURE", modes[m], 1);
    setenv("CAIRN_RUN", run, 1);
    cairn_t *c = NULL;
    if (cairn_init(NULL, &c) != CAIRN_OK) die("cairn_init");
    if (cairn_protect(c, "state", region, bytes, CAIRN_BYTE) != CAIRN_OK) die("cairn_protect");
    double *blocked = t, *all = t + checkpoints, *some = t + 2 * checkpoints, *captured = t + 3 * checkpoints;
    int n_all = 0, n_some = 0;
    for (int v = 1; v <= checkpoints + 2; ++v) {
      rewrite(region, bytes, part, (uint64_t)v * 977);
      usleep((useconds_t)settle_ms * 1000);
      const int whole = v % 2;  /* the two rewrites alternate */
      double t0 = now();
      if (cairn_checkpoint(c, "s", v) != CAIRN_OK) die("cairn_checkpoint");
      double t1 = now();
      rewrite(region, bytes, whole ? 100 : part, (uint64_t)v);
      double t2 = now();
      if (cairn_wait(c, "s", v, CAIRN_LEVEL_CAPTURED) != CAIRN_OK) die("cairn_wait(CAPTURED)");
      double t3 = now();
      if (cairn_wait(c, "s", v, CAIRN_LEVEL_PERSISTENT) != CAIRN_OK) die("cairn_wait(PERSISTENT)");
      if (v <= 2) continue;
      blocked[v - 3] = t1 - t0;
      captured[v - 3] = t3 - t0;
      if (whole) all[n_all++] = t2 - t1;
      else some[n_some++] = t2 - t1;
    }
    if (cairn_finalize(&c, 1) != CAIRN_OK) die("cairn_finalize");
    printf(", \"%s\": {\"blocked_s\": %.6f, \"rewrite_all_s\": %.6f, \"rewrite_part_s\": %.6f, \"captured_s\": %.6f}",
           modes[m], median(blocked, checkpoints), n_all ? median(all, n_all) : 0.0,
           n_some ? median(some, n_some) : 0.0, median(captured, checkpoints));
  }
  printf("}\n");
  free(t);
  return 0;
}

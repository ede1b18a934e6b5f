/* ckpt_loop (C): the blocked time of cairn_checkpoint on one array of
 * doubles, for bench/run_fortran_vs_c.py against ckpt_loop_f (the same loop
 * through the Fortran module). Serial (cairn_init). Each version changes the
 * array, is checkpointed (timed) and waited for at the persistent level before
 * the next.
 * usage: ckpt_loop MIB VERSIONS  -> prints "blocked_ms <v1> <v2> ..." */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cairn.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: ckpt_loop MIB VERSIONS\n");
    return 2;
  }
  size_t n = (size_t)atol(argv[1]) * 1024 * 1024 / sizeof(double);
  int versions = atoi(argv[2]);
  double *x = malloc(n * sizeof(double));
  if (x == NULL) return 1;
  for (size_t i = 0; i < n; ++i) x[i] = (double)i * 0.5;
  cairn_t *c = NULL;
  if (cairn_init(NULL, &c) != CAIRN_OK || cairn_protect(c, "x", x, n, CAIRN_FLOAT64) != CAIRN_OK) {
    fprintf(stderr, "ckpt_loop: %s\n", cairn_last_error());
    return 1;
  }
  printf("blocked_ms");
  for (int v = 1; v <= versions; ++v) {
    x[v] += 1.0;
    double t = now();
    int rc = cairn_checkpoint(c, "b", v);
    double dt = now() - t;
    if (rc == CAIRN_OK) rc = cairn_wait(c, "b", v, CAIRN_LEVEL_PERSISTENT);
    if (rc != CAIRN_OK) {
      fprintf(stderr, "ckpt_loop: %s\n", cairn_last_error());
      return 1;
    }
    printf(" %.3f", dt * 1e3);
  }
  printf("\n");
  cairn_finalize(&c, 1);
  free(x);
  return 0;
}

/* Writes a checkpoint history for the history benchmark (bench/run_history.py):
 * one process (cairn_init, no MPI), one FLOAT64 region of --bytes, --versions
 * versions. --perturb R adds a relative perturbation R to every element from
 * version --from on (a diverged history); 0 gives an identical history for the
 * same --seed. Prints one JSON line: the time blocked in each cairn_checkpoint
 * (each version is waited for, untimed, before the next, as if computing)
 * and the time to drain (cairn_finalize). Configuration from CAIRN_* variables. */
#include <cairn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void check(int rc, const char *what) {
  if (rc != CAIRN_OK) {
    fprintf(stderr, "history_writer: %s: %s: %s\n", what, cairn_strerror(rc), cairn_last_error());
    exit(1);
  }
}

int main(int argc, char **argv) {
  size_t bytes = 64u << 20;
  int versions = 4, from = 1;
  double perturb = 0;
  unsigned seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--bytes")) bytes = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--versions")) versions = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--perturb")) perturb = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--from")) from = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--seed")) seed = (unsigned)atoi(argv[i + 1]);
    else { fprintf(stderr, "history_writer: unknown option %s\n", argv[i]); return 2; }
  }
  size_t n = bytes / sizeof(double);
  double *x = malloc(n * sizeof(double));
  if (!x) return 1;
  cairn_t *c = NULL;
  check(cairn_init(NULL, &c), "cairn_init");
  check(cairn_protect(c, "x", x, n, CAIRN_FLOAT64), "cairn_protect");
  printf("{\"bytes\": %zu, \"versions\": %d, \"blocked_s\": [", n * sizeof(double), versions);
  for (int v = 1; v <= versions; ++v) {
    /* Deterministic "physics": smooth field drifting with the version. */
    for (size_t i = 0; i < n; ++i) {
      /* Not aligned with decimal quanta (values on a 1e-3 grid would straddle every tree quantum). */
      double base = ((double)((i * 2654435761u + seed) % 100000) * 1e-3 + v * 0.25) * 1.0000000123456789;
      x[i] = v >= from && perturb != 0 ? base * (1 + perturb) : base;
    }
    double t0 = now();
    check(cairn_checkpoint(c, "history", v), "cairn_checkpoint");
    printf("%s%.6f", v > 1 ? ", " : "", now() - t0);
    /* Outside the timed part: let the version reach the store, as an
     * application computing between checkpoints would, so that the next
     * checkpoint measures the capture and not waiting for a staging slot. */
    check(cairn_wait(c, "history", v, CAIRN_LEVEL_PERSISTENT), "cairn_wait");
  }
  double t0 = now();
  check(cairn_finalize(&c, 1), "cairn_finalize");
  printf("], \"finalize_s\": %.6f}\n", now() - t0);
  free(x);
  return 0;
}

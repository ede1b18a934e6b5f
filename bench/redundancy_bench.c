/* redundancy_bench: node-loss redundancy end to end (bench/run_redundancy.py,
 * docs/benchmarks.md "Redundancy"). Every rank protects one region of --bytes
 * bytes.
 *
 *   checkpoint mode (default): --checkpoints timed versions after one warm-up;
 *   per version, from the start of cairn_checkpoint: blocked_s (inside it),
 *   protected_s (cairn_wait(PROTECTED) returned) and, unless --no-persistent,
 *   persistent_s (cairn_wait(PERSISTENT)). Medians of the maximum over ranks.
 *   --restart: cairn_restart_test + cairn_restart of the newest version, the
 *   maximum over ranks (the driver wipes a node's directory before it to time
 *   a rebuild, or not, to time a restart from intact node-local shards).
 * Output: one JSON object on rank 0's stdout.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cairn.h"
#include "cairn_mpi.h"

static double now(void) { return MPI_Wtime(); }

static double max_over_ranks(double v) {
  double m;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void check(int rc, const char* what) {
  if (rc != CAIRN_OK) {
    fprintf(stderr, "redundancy_bench: %s: %s (%s)\n", what, cairn_strerror(rc), cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  unsigned long long bytes = 64ull << 20;
  int checkpoints = 3, restart = 0, persistent = 1;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--bytes") && i + 1 < argc) bytes = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--checkpoints") && i + 1 < argc) checkpoints = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--restart")) restart = 1;
    else if (!strcmp(argv[i], "--no-persistent")) persistent = 0;
  }
  unsigned char* data = malloc(bytes);
  for (unsigned long long i = 0; i < bytes; ++i) data[i] = (unsigned char)(i * 2654435761u + (unsigned)rank);
  cairn_t* c = NULL;
  check(cairn_init_mpi(MPI_COMM_WORLD, NULL, &c), "cairn_init_mpi");
  check(cairn_protect(c, "data", data, bytes, CAIRN_BYTE), "cairn_protect");
  if (restart) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    int64_t v = -1;
    check(cairn_restart_test(c, "bench", &v), "cairn_restart_test");
    check(cairn_restart(c, "bench", v), "cairn_restart");
    double t = max_over_ranks(now() - t0);
    if (rank == 0) printf("{\"restart_s\": %.6f, \"version\": %lld}\n", t, (long long)v);
  } else {
    double* blocked = calloc((size_t)checkpoints, sizeof(double));
    double* prot = calloc((size_t)checkpoints, sizeof(double));
    double* pers = calloc((size_t)checkpoints, sizeof(double));
    for (int i = 0; i <= checkpoints; ++i) {
      data[0] = (unsigned char)i;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      check(cairn_checkpoint(c, "bench", i + 1), "cairn_checkpoint");
      double tb = now() - t0;
      check(cairn_wait(c, "bench", i + 1, CAIRN_LEVEL_PROTECTED), "cairn_wait(PROTECTED)");
      double tp = now() - t0, tq = 0;
      if (persistent) {
        check(cairn_wait(c, "bench", i + 1, CAIRN_LEVEL_PERSISTENT), "cairn_wait(PERSISTENT)");
        tq = now() - t0;
      }
      tb = max_over_ranks(tb);
      tp = max_over_ranks(tp);
      tq = max_over_ranks(tq);
      if (i > 0) {
        blocked[i - 1] = tb;
        prot[i - 1] = tp;
        pers[i - 1] = tq;
      }
    }
    if (rank == 0)
      printf("{\"blocked_s\": %.6f, \"protected_s\": %.6f, \"persistent_s\": %.6f}\n", median(blocked, checkpoints),
             median(prot, checkpoints), persistent ? median(pers, checkpoints) : 0.0);
  }
  check(cairn_finalize(&c, 1), "cairn_finalize");
  free(data);
  MPI_Finalize();
  return 0;
}

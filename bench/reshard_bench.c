/* Restart on another rank count against restart on the same count
 * (docs/design/reshard.md); driven by bench/run_reshard.py.
 *
 * usage: reshard_bench write|restart ROWS COLS
 *   write:   a ROWS x COLS float64 global array, block-decomposed over a
 *            px x py grid (px the largest factor of the rank count not above
 *            its square root), each block protected with cairn_protect_block,
 *            checkpointed once as version 1 of "bench", waited to the
 *            persistent level.
 *   restart: the same decomposition for this job's rank count,
 *            cairn_restart_test + cairn_restart, timed; the restored block is
 *            checked element by element against the values written.
 * Prints one line per rank: "rank R seconds S read_bytes B needed_bytes N",
 * where B is the growth of /proc/self/io rchar over restart_test + restart
 * (every byte this process read from files: MANIFEST, headers, trees, data)
 * and N the bytes of the rank's block. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cairn.h"
#include "cairn_mpi.h"

static unsigned long long rchar(void) {
  FILE *f = fopen("/proc/self/io", "r");
  char line[128];
  unsigned long long v = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "rchar: %llu", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

static void split(long n, int parts, int i, long *start, long *count) {
  long base = n / parts, extra = n % parts;
  *count = base + (i < extra);
  *start = i * base + (i < extra ? i : extra);
}

static double value(long i, long j) { return (double)i * 1e-3 + (double)j * 1e-7; }

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: reshard_bench write|restart ROWS COLS\n");
    return 2;
  }
  const int writing = strcmp(argv[1], "write") == 0;
  const long rows = atol(argv[2]), cols = atol(argv[3]);
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int px = 1;
  for (int f = 1; f * f <= n; ++f)
    if (n % f == 0) px = f;
  const int py = n / px;
  long x0, bx, y0, by;
  split(rows, px, rank / py, &x0, &bx);
  split(cols, py, rank % py, &y0, &by);
  double *u = malloc((size_t)bx * by * sizeof *u);
  cairn_t *c = NULL;
  if (cairn_init_mpi(MPI_COMM_WORLD, NULL, &c) != CAIRN_OK) {
    fprintf(stderr, "cairn_init_mpi: %s\n", cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const uint64_t global[2] = {(uint64_t)rows, (uint64_t)cols}, start[2] = {(uint64_t)x0, (uint64_t)y0},
                 count[2] = {(uint64_t)bx, (uint64_t)by};
  if (cairn_protect_block(c, "u", u, CAIRN_FLOAT64, 2, global, start, count, NULL, NULL, 0) != CAIRN_OK) {
    fprintf(stderr, "protect: %s\n", cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int rc = 0;
  if (writing) {
    for (long i = 0; i < bx; ++i)
      for (long j = 0; j < by; ++j) u[i * by + j] = value(x0 + i, y0 + j);
    if (cairn_checkpoint(c, "bench", 1) != CAIRN_OK || cairn_wait(c, "bench", 1, CAIRN_LEVEL_PERSISTENT) != CAIRN_OK) {
      fprintf(stderr, "checkpoint: %s\n", cairn_last_error());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  } else {
    memset(u, 0, (size_t)bx * by * sizeof *u);
    int64_t v = -1;
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned long long r0 = rchar();
    double t0 = MPI_Wtime();
    int ok = cairn_restart_test(c, "bench", &v) == CAIRN_OK;
    double t_test = MPI_Wtime() - t0;
    if (!ok || cairn_restart(c, "bench", v) != CAIRN_OK) {
      fprintf(stderr, "restart: %s\n", cairn_last_error());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double t = MPI_Wtime() - t0;
    unsigned long long r1 = rchar();
    double tmax = 0;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    for (long i = 0; i < bx && rc == 0; ++i)
      for (long j = 0; j < by; ++j)
        if (u[i * by + j] != value(x0 + i, y0 + j)) {
          fprintf(stderr, "rank %d: element (%ld, %ld) restored wrong\n", rank, x0 + i, y0 + j);
          rc = 1;
          break;
        }
    printf("rank %d seconds %.6f read_bytes %llu needed_bytes %llu restart_test_seconds %.6f\n", rank, t, r1 - r0,
           (unsigned long long)bx * by * sizeof *u, t_test);
    if (rank == 0) printf("max_seconds %.6f\n", tmax);
  }
  cairn_finalize(&c, 1);
  free(u);
  MPI_Finalize();
  return rc;
}

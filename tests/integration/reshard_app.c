/* Restart on another rank count (docs/design/reshard.md), driven by
 * tests/integration/test_reshard.py.
 *
 * usage: reshard_app MODE STEPS STOP OUT
 *   MODE  block:    "u" is a block of a 2-D global array (NX x NY doubles),
 *                   declared with cairn_protect_block, in a buffer with one
 *                   halo cell on every side; "step" (int64, the same on every
 *                   rank) with cairn_protect.
 *         nolayout: "u" is the whole halo buffer, declared with cairn_protect
 *                   (no global layout: it cannot be redistributed).
 * The ranks form a px x py grid (px the largest factor of the rank count not
 * above its square root); rows and columns are split unevenly. Each step is a
 * 5-point stencil with a halo exchange and fixed boundary values, so the
 * result does not depend on the decomposition. A checkpoint every 2 steps
 * (version = step). With STOP > 0 the run stops after the checkpoint of step
 * STOP (waiting for the persistent level) as if killed there.
 * Prints "restarted <v>" or "fresh", then on completion rank 0 writes the
 * global array (row-major doubles) to OUT and prints "done".
 * A failed restart_test prints "restart_test: <code> <message>" and exits 3. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cairn.h"
#include "cairn_mpi.h"

#define NX 61
#define NY 47

static void split(int n, int parts, int i, int *start, int *count) {
  int base = n / parts, extra = n % parts;
  *count = base + (i < extra);
  *start = i * base + (i < extra ? i : extra);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: reshard_app block|nolayout STEPS STOP OUT\n");
    return 2;
  }
  const int nolayout = strcmp(argv[1], "nolayout") == 0;
  const long steps = atol(argv[2]), stop = atol(argv[3]);
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int px = 1;
  for (int f = 1; f * f <= n; ++f)
    if (n % f == 0) px = f;
  const int py = n / px, ix = rank / py, iy = rank % py;
  int x0, bx, y0, by;
  split(NX, px, ix, &x0, &bx);
  split(NY, py, iy, &y0, &by);
  const int W = by + 2;  /* halo buffer: (bx + 2) x (by + 2) */
  double *u = calloc((size_t)(bx + 2) * W, sizeof *u), *v = calloc((size_t)(bx + 2) * W, sizeof *v);
#define AT(a, i, j) (a)[(size_t)(i) * W + (j)]
  cairn_t *c = NULL;
  if (cairn_init_mpi(MPI_COMM_WORLD, NULL, &c) != CAIRN_OK) {
    fprintf(stderr, "cairn_init_mpi: %s\n", cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int64_t step = 0;
  const uint64_t global[2] = {NX, NY}, start[2] = {(uint64_t)x0, (uint64_t)y0}, count[2] = {(uint64_t)bx, (uint64_t)by},
                 mem_shape[2] = {(uint64_t)bx + 2, (uint64_t)W}, mem_start[2] = {1, 1};
  int rc = nolayout ? cairn_protect(c, "u", u, (size_t)(bx + 2) * W, CAIRN_FLOAT64)
                    : cairn_protect_block(c, "u", u, CAIRN_FLOAT64, 2, global, start, count, mem_shape, mem_start, 0);
  if (rc == CAIRN_OK) rc = cairn_protect(c, "step", &step, 1, CAIRN_INT64);
  if (rc != CAIRN_OK) {
    fprintf(stderr, "protect: %s\n", cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int64_t version = -1;
  rc = cairn_restart_test(c, "grid", &version);
  if (rc == CAIRN_OK) {
    if ((rc = cairn_restart(c, "grid", version)) != CAIRN_OK) {
      if (rank == 0) printf("restart: %d %s\n", rc, cairn_last_error());
      cairn_finalize(&c, 0);
      MPI_Finalize();
      return 3;
    }
    if (rank == 0) printf("restarted %lld\n", (long long)version);
  } else if (rc == CAIRN_ENOTFOUND) {
    for (int i = 1; i <= bx; ++i)
      for (int j = 1; j <= by; ++j) AT(u, i, j) = sin(0.1 * (x0 + i - 1)) * cos(0.07 * (y0 + j - 1));
    if (rank == 0) printf("fresh\n");
  } else {
    if (rank == 0) printf("restart_test: %d %s\n", rc, cairn_last_error());
    cairn_finalize(&c, 0);
    MPI_Finalize();
    return 3;
  }
  fflush(stdout);
  /* Neighbours in the grid (MPI_PROC_NULL at the boundary). */
  const int up = ix > 0 ? rank - py : MPI_PROC_NULL, down = ix < px - 1 ? rank + py : MPI_PROC_NULL;
  const int left = iy > 0 ? rank - 1 : MPI_PROC_NULL, right = iy < py - 1 ? rank + 1 : MPI_PROC_NULL;
  MPI_Datatype column;
  MPI_Type_vector(bx, 1, W, MPI_DOUBLE, &column);
  MPI_Type_commit(&column);
  for (++step; step <= steps; ++step) {
    /* Halos: fixed boundary value 1.0 outside the global array. */
    for (int i = 0; i < bx + 2; ++i) AT(u, i, 0) = AT(u, i, by + 1) = 1.0;
    for (int j = 0; j < W; ++j) AT(u, 0, j) = AT(u, bx + 1, j) = 1.0;
    MPI_Sendrecv(&AT(u, 1, 1), by, MPI_DOUBLE, up, 0, &AT(u, bx + 1, 1), by, MPI_DOUBLE, down, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    MPI_Sendrecv(&AT(u, bx, 1), by, MPI_DOUBLE, down, 1, &AT(u, 0, 1), by, MPI_DOUBLE, up, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    MPI_Sendrecv(&AT(u, 1, 1), 1, column, left, 2, &AT(u, 1, by + 1), 1, column, right, 2, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    MPI_Sendrecv(&AT(u, 1, by), 1, column, right, 3, &AT(u, 1, 0), 1, column, left, 3, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    for (int i = 1; i <= bx; ++i)
      for (int j = 1; j <= by; ++j)
        AT(v, i, j) = 0.2 * (AT(u, i, j) + AT(u, i - 1, j) + AT(u, i + 1, j) + AT(u, i, j - 1) + AT(u, i, j + 1)) +
                      1e-3 * (double)step;
    for (int i = 1; i <= bx; ++i) memcpy(&AT(u, i, 1), &AT(v, i, 1), (size_t)by * sizeof *u);
    if (step % 2 == 0) {
      if ((rc = cairn_checkpoint(c, "grid", step)) != CAIRN_OK) {
        fprintf(stderr, "checkpoint: %s\n", cairn_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      if (step == stop) {
        if ((rc = cairn_wait(c, "grid", step, CAIRN_LEVEL_PERSISTENT)) != CAIRN_OK) {
          fprintf(stderr, "wait: %s\n", cairn_last_error());
          MPI_Abort(MPI_COMM_WORLD, 2);
        }
        if (rank == 0) printf("stopped %lld\n", (long long)step);
        cairn_finalize(&c, 1);
        MPI_Finalize();
        return 0;
      }
    }
  }
  /* Rank 0 assembles the global array from every block. */
  int meta[4] = {x0, bx, y0, by};
  double *blk = malloc((size_t)bx * by * sizeof *blk);
  for (int i = 0; i < bx; ++i) memcpy(blk + (size_t)i * by, &AT(u, i + 1, 1), (size_t)by * sizeof *u);
  if (rank == 0) {
    double *g = malloc((size_t)NX * NY * sizeof *g);
    for (int r = 0; r < n; ++r) {
      int m[4];
      double *b = blk;
      if (r > 0) {
        MPI_Recv(m, 4, MPI_INT, r, 10, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        b = malloc((size_t)m[1] * m[3] * sizeof *b);
        MPI_Recv(b, m[1] * m[3], MPI_DOUBLE, r, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        memcpy(m, meta, sizeof m);
      }
      for (int i = 0; i < m[1]; ++i) memcpy(g + (size_t)(m[0] + i) * NY + m[2], b + (size_t)i * m[3], (size_t)m[3] * sizeof *g);
      if (r > 0) free(b);
    }
    FILE *f = fopen(argv[4], "wb");
    if (!f || fwrite(g, sizeof *g, (size_t)NX * NY, f) != (size_t)NX * NY || fclose(f) != 0) {
      fprintf(stderr, "cannot write %s\n", argv[4]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    free(g);
    printf("done\n");
  } else {
    MPI_Send(meta, 4, MPI_INT, 0, 10, MPI_COMM_WORLD);
    MPI_Send(blk, bx * by, MPI_DOUBLE, 0, 11, MPI_COMM_WORLD);
  }
  free(blk);
  MPI_Type_free(&column);
  rc = cairn_finalize(&c, 1);
  free(u);
  free(v);
  MPI_Finalize();
  return rc == CAIRN_OK ? 0 : 2;
}

/* A heat-diffusion solver written against VELOC's public header only, in the
 * way VELOC's heatdis examples use it (tests/compat/test_veloc.py builds it
 * with nothing but -I and -l pointing at the drop-in).
 *
 *   veloc_heat mem|file CONFIG ITERATIONS CKPT_EVERY COLS ROWS [SLEEP_US]
 *
 * mem:  the iteration counter and both grids are protected memory regions;
 *       VELOC_Checkpoint / VELOC_Restart.
 * file: the application writes and reads its own file through
 *       VELOC_Checkpoint_begin / VELOC_Route_file / VELOC_Checkpoint_end.
 * Prints "restart from N" (or "fresh start"), "step N residual R" at every
 * checkpoint step and "result iterations N residual R hash H" at the end; H
 * hashes every rank's grid bit for bit, so equal lines mean equal state. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <veloc.h>

#define CKPT "heat"

#include "heat_common.h"

static int write_file(const char *path, int step, double residual, const double *grid, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  int ok = fwrite(&step, sizeof step, 1, f) == 1 && fwrite(&residual, sizeof residual, 1, f) == 1 &&
           fwrite(grid, sizeof(double), n, f) == n;
  return fclose(f) == 0 && ok;
}

static int read_file(const char *path, int *step, double *residual, double *grid, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  int ok = fread(step, sizeof *step, 1, f) == 1 && fread(residual, sizeof *residual, 1, f) == 1 &&
           fread(grid, sizeof(double), n, f) == n;
  fclose(f);
  return ok;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: %s mem|file CONFIG ITERATIONS CKPT_EVERY COLS ROWS [SLEEP_US]\n", argv[0]);
    return 1;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int file_mode = strcmp(argv[1], "file") == 0;
  int iterations = atoi(argv[3]), every = atoi(argv[4]), cols = atoi(argv[5]), rows = atoi(argv[6]);
  int sleep_us = argc > 7 ? atoi(argv[7]) : 0;

  if (VELOC_Init(MPI_COMM_WORLD, argv[2]) != VELOC_SUCCESS) {
    printf("rank %d: VELOC_Init failed\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 2;
  }
  size_t n = (size_t)cols * (rows + 2);
  double *cur = calloc(n, sizeof(double)), *next = calloc(n, sizeof(double));
  if (rank == 0)
    for (int j = cols / 8; j < cols - cols / 8; ++j) cur[j] = 100.0;
  memcpy(next, cur, n * sizeof(double));
  int step = 0;
  double residual = 0;

  if (!file_mode) {
    VELOC_Mem_protect(0, &step, 1, sizeof(int));
    VELOC_Mem_protect(1, cur, n, sizeof(double));
    VELOC_Mem_protect(2, &residual, 1, sizeof(double));
  }
  int v = VELOC_Restart_test(CKPT, 0);
  if (v > 0) {
    if (rank == 0) printf("restart from %d\n", v);
    if (!file_mode) {
      if (VELOC_Restart(CKPT, v) != VELOC_SUCCESS) {
        printf("rank %d: VELOC_Restart failed\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
    } else {
      char name[VELOC_MAX_NAME], path[VELOC_MAX_NAME];
      int ok = VELOC_Restart_begin(CKPT, v) == VELOC_SUCCESS;
      snprintf(name, sizeof name, "heat-%d-%d.bin", v, rank);
      ok = ok && VELOC_Route_file(name, path) == VELOC_SUCCESS;
      ok = ok && read_file(path, &step, &residual, cur, n);
      if (VELOC_Restart_end(ok) != VELOC_SUCCESS || !ok) {
        printf("rank %d: file restart failed\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
    }
  } else if (rank == 0) {
    printf("fresh start\n");
  }
  fflush(stdout);

  while (step < iterations) {
    residual = sweep(cols, rows, cur, next);
    double *t = cur;
    cur = next;
    next = t;
    ++step;
    if (sleep_us) usleep(sleep_us);
    if (step % every == 0) {
      if (rank == 0) printf("step %d residual %.17g\n", step, residual);
      fflush(stdout);
      int rc;
      if (!file_mode) {
        VELOC_Mem_protect(1, cur, n, sizeof(double)); /* the grids swap: protect the current one */
        rc = VELOC_Checkpoint(CKPT, step);
      } else {
        char name[VELOC_MAX_NAME], path[VELOC_MAX_NAME];
        rc = VELOC_Checkpoint_wait();
        if (rc == VELOC_SUCCESS) rc = VELOC_Checkpoint_begin(CKPT, step);
        snprintf(name, sizeof name, "heat-%d-%d.bin", step, rank);
        int ok = rc == VELOC_SUCCESS && VELOC_Route_file(name, path) == VELOC_SUCCESS && write_file(path, step, residual, cur, n);
        if (rc == VELOC_SUCCESS) rc = VELOC_Checkpoint_end(ok);
      }
      if (rc != VELOC_SUCCESS) {
        printf("rank %d: checkpoint %d failed\n", rank, step);
        MPI_Abort(MPI_COMM_WORLD, 4);
      }
    }
  }
  /* The state is the interior of the current grid: hash it on every rank, in rank order. */
  uint64_t h = fnv(cur + cols, (size_t)rows * cols * sizeof(double), 1469598103934665603ull);
  uint64_t *all = rank == 0 ? malloc(sizeof(uint64_t) * nranks) : NULL;
  MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    uint64_t total = fnv(all, sizeof(uint64_t) * nranks, 1469598103934665603ull);
    printf("result iterations %d residual %.17g hash %016llx\n", step, residual, (unsigned long long)total);
    free(all);
  }
  fflush(stdout);
  int rc = VELOC_Finalize(1);
  if (rc != VELOC_SUCCESS) printf("rank %d: VELOC_Finalize failed\n", rank);
  free(cur);
  free(next);
  MPI_Finalize();
  return rc == VELOC_SUCCESS ? 0 : 5;
}

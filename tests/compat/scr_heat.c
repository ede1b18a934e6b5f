/* A heat-diffusion solver written against SCR's public header only, in the
 * way SCR's example test_api.c uses it: restart through SCR_Have_restart /
 * SCR_Start_restart / SCR_Route_file / SCR_Complete_restart (looping to an
 * older checkpoint when a restart fails), checkpoints when SCR_Need_checkpoint
 * says so, through SCR_Start_output / SCR_Route_file / SCR_Complete_output,
 * and SCR_Should_exit after each. tests/compat/test_scr.py builds it with
 * nothing but -I and -l pointing at the drop-in.
 *
 *   scr_heat ITERATIONS COLS ROWS [SLEEP_US]
 *
 * SCR_HEAT_NO_RESTART=1 skips the restart, as SCR's test_ckpt does;
 * SCR_HEAT_INTERVAL=n sets SCR_CHECKPOINT_INTERVAL through SCR_Configf, and
 * SCR_HEAT_DELETE=name calls SCR_Delete and SCR_Drop on it at the end (as
 * SCR 3's test_api can).
 * Prints "restart from NAME step N" (or "fresh start"), "checkpoint NAME" for
 * each checkpoint taken, and "result iterations N hash H" at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <scr.h>

#include "heat_common.h"

static int write_ckpt(const char *path, int step, const double *grid, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  int ok = fwrite(&step, sizeof step, 1, f) == 1 && fwrite(grid, sizeof(double), n, f) == n;
  return fclose(f) == 0 && ok;
}

static int read_ckpt(const char *path, int *step, double *grid, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  int ok = fread(step, sizeof *step, 1, f) == 1 && fread(grid, sizeof(double), n, f) == n;
  fclose(f);
  return ok;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s ITERATIONS COLS ROWS [SLEEP_US]\n", argv[0]);
    return 1;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int iterations = atoi(argv[1]), cols = atoi(argv[2]), rows = atoi(argv[3]);
  int sleep_us = argc > 4 ? atoi(argv[4]) : 0;
  if (getenv("SCR_HEAT_INTERVAL")) SCR_Configf("SCR_CHECKPOINT_INTERVAL=%d", atoi(getenv("SCR_HEAT_INTERVAL")));
  if (SCR_Init() != SCR_SUCCESS) {
    printf("rank %d: SCR_Init failed\n", rank);
    MPI_Finalize();
    return 2;
  }
  size_t n = (size_t)cols * (rows + 2);
  double *cur = calloc(n, sizeof(double)), *next = calloc(n, sizeof(double));
  int step = 0;

  /* Restart: the newest checkpoint every rank reads, else an older one. */
  /* Test hook: SCR_HEAT_REJECT=n makes the last rank report the first n
   * restarts it is offered as unreadable (SCR then offers older ones). */
  int reject = getenv("SCR_HEAT_REJECT") ? atoi(getenv("SCR_HEAT_REJECT")) : 0;
  int have = 0, restarted = 0;
  char dset[SCR_MAX_FILENAME];
  do {
    if (getenv("SCR_HEAT_NO_RESTART")) break;
    if (SCR_Have_restart(&have, dset) != SCR_SUCCESS) printf("rank %d: SCR_Have_restart failed\n", rank);
    if (!have) break;
    SCR_Start_restart(dset);
    char name[SCR_MAX_FILENAME + 32], file[SCR_MAX_FILENAME];
    snprintf(name, sizeof name, "%s/rank_%d.ckpt", dset, rank);
    int valid = SCR_Route_file(name, file) == SCR_SUCCESS && read_ckpt(file, &step, cur, n);
    if (reject > 0) {
      --reject;
      if (rank == nranks - 1) valid = 0;
      if (rank == 0) printf("rejecting %s\n", dset);
    }
    if (SCR_Complete_restart(valid) == SCR_SUCCESS) {
      restarted = 1;
      if (rank == 0) printf("restart from %s step %d\n", dset, step);
    }
  } while (!restarted);
  if (!restarted) {
    step = 0;
    memset(cur, 0, n * sizeof(double));
    if (rank == 0) {
      for (int j = cols / 8; j < cols - cols / 8; ++j) cur[j] = 100.0;
      printf("fresh start\n");
    }
  }
  memcpy(next, cur, n * sizeof(double));
  fflush(stdout);

  while (step < iterations) {
    (void)sweep(cols, rows, cur, next);
    double *t = cur;
    cur = next;
    next = t;
    ++step;
    if (sleep_us) usleep(sleep_us);
    int need = 0;
    SCR_Need_checkpoint(&need);
    if (need) {
      char dname[64], name[SCR_MAX_FILENAME], file[SCR_MAX_FILENAME];
      snprintf(dname, sizeof dname, "ckpt.%d", step);
      if (SCR_Start_output(dname, SCR_FLAG_CHECKPOINT) != SCR_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 3);
      snprintf(name, sizeof name, "%s/rank_%d.ckpt", dname, rank);
      int valid = SCR_Route_file(name, file) == SCR_SUCCESS && write_ckpt(file, step, cur, n);
      if (SCR_Complete_output(valid) != SCR_SUCCESS) {
        printf("rank %d: checkpoint %s failed\n", rank, dname);
        MPI_Abort(MPI_COMM_WORLD, 4);
      }
      if (rank == 0) printf("checkpoint %s\n", dname);
      fflush(stdout);
    }
    int stop = 0;
    SCR_Should_exit(&stop);
    if (stop) {
      if (rank == 0) printf("asked to exit at step %d\n", step);
      break;
    }
  }
  uint64_t h = fnv(cur + cols, (size_t)rows * cols * sizeof(double), 1469598103934665603ull);
  uint64_t *all = rank == 0 ? malloc(sizeof(uint64_t) * nranks) : NULL;
  MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("result iterations %d hash %016llx\n", step,
           (unsigned long long)fnv(all, sizeof(uint64_t) * nranks, 1469598103934665603ull));
    free(all);
  }
  if (getenv("SCR_HEAT_DELETE")) {
    int deleted = SCR_Delete(getenv("SCR_HEAT_DELETE")), dropped = SCR_Drop(getenv("SCR_HEAT_DELETE"));
    if (rank == 0) printf("delete %s drop %s\n", deleted == SCR_SUCCESS ? "ok" : "failed",
                          dropped == SCR_SUCCESS ? "ok" : "failed");
  }
  fflush(stdout);
  int rc = SCR_Finalize();
  free(cur);
  free(next);
  MPI_Finalize();
  return rc == SCR_SUCCESS ? 0 : 5;
}

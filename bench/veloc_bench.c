/* The VELOC drop-in against cairn's C API on the same data (issue 14):
 *
 *   veloc_bench cairn|veloc CONFIG MIB CHECKPOINTS
 *
 * cairn: cairn_init_mpi + cairn_protect + cairn_checkpoint (CONFIG: cairn TOML);
 * veloc: VELOC_Init + VELOC_Mem_protect + VELOC_Checkpoint (CONFIG: VELOC file).
 * Each rank protects MIB MiB, changes it before every checkpoint, and takes
 * CHECKPOINTS versions. Rank 0 prints the time the checkpoint calls blocked
 * (slowest rank) and the total including the final wait for durability:
 *   "<api> blocked_s B total_s T". bench/run_compat.py runs both and compares. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cairn_mpi.h>
#include <veloc.h>

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s cairn|veloc CONFIG MIB CHECKPOINTS\n", argv[0]);
    return 1;
  }
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int use_veloc = strcmp(argv[1], "veloc") == 0;
  size_t bytes = (size_t)atol(argv[3]) << 20;
  int n = atoi(argv[4]);
  uint64_t *data = malloc(bytes);
  size_t words = bytes / sizeof(uint64_t);
  for (size_t i = 0; i < words; ++i) data[i] = i * 2654435761u + (uint64_t)rank;
  cairn_t *c = NULL;
  int rc = use_veloc ? VELOC_Init(MPI_COMM_WORLD, argv[2]) : cairn_init_mpi(MPI_COMM_WORLD, argv[2], &c);
  if (rc != 0) {
    fprintf(stderr, "init failed: %s\n", use_veloc ? "see above" : cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (use_veloc)
    VELOC_Mem_protect(0, data, words, sizeof(uint64_t));
  else
    cairn_protect(c, "veloc.0", data, bytes, CAIRN_BYTE);
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime(), blocked = 0;
  for (int v = 1; v <= n; ++v) {
    for (size_t i = 0; i < words; i += 512) data[i] += (uint64_t)v;  /* touch every 4 KiB page */
    double t0 = MPI_Wtime();
    rc = use_veloc ? VELOC_Checkpoint("bench", v) : cairn_checkpoint(c, "bench", v);
    blocked += MPI_Wtime() - t0;
    if (rc != 0) {
      fprintf(stderr, "checkpoint %d failed: %s\n", v, use_veloc ? "see above" : cairn_last_error());
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  }
  rc = use_veloc ? VELOC_Finalize(1) : cairn_finalize(&c, 1);
  double total = MPI_Wtime() - start, max_blocked = 0, max_total = 0;
  MPI_Reduce(&blocked, &max_blocked, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(&total, &max_total, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("%s blocked_s %.6f total_s %.6f\n", argv[1], max_blocked, max_total);
  free(data);
  MPI_Finalize();
  return rc == 0 ? 0 : 4;
}

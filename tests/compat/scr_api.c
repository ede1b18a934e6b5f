/* A program written against SCR's public header only, in the style of SCR's
 * examples/test_api.c: each checkpoint is a dataset "ckpt.<t>" of one file
 * per rank ("rank_<r>.ckpt") or, with --shared-file, of one file all ranks
 * write ("rank_shared.ckpt": rank 0 creates and sizes it, every rank writes
 * its part at its offset with pwrite, fsync, close). At start it restarts
 * from the newest dataset SCR offers (falling back to older ones when a read
 * fails) and checks every byte it reads. tests/compat/test_scr.py builds it
 * with nothing but -I and -l pointing at the drop-in.
 *
 *   scr_api TIMES BYTES [--shared-file]
 *
 * Prints "restart from NAME timestep T" (or "no restart"), "checkpoint NAME"
 * for each dataset completed, and "errors N" (N bad reads or writes). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>
#include <scr.h>

static int rank, nranks, shared;
static size_t bytes;

/* The byte at position i of rank r's part of timestep t. */
static unsigned char pattern(int r, int t, size_t i) {
  uint64_t x = ((uint64_t)r << 40) ^ ((uint64_t)t << 20) ^ i;
  x ^= x >> 13;
  x *= 0x9e3779b97f4a7c15ull;
  return (unsigned char)(x >> 56);
}

static off_t my_offset(void) { return shared ? (off_t)bytes * rank : 0; }

static int write_part(const char *file, int t, unsigned char *buf) {
  int fd = -1;
  if (shared) {
    int made = 1;
    if (rank == 0) {
      fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      made = fd >= 0 && ftruncate(fd, (off_t)bytes * nranks) == 0;
      if (fd >= 0) close(fd);
    }
    MPI_Bcast(&made, 1, MPI_INT, 0, MPI_COMM_WORLD); /* rank 0 created it */
    fd = made ? open(file, O_WRONLY) : -1;
  } else {
    fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  }
  if (fd < 0) {
    printf("rank %d: cannot open %s for writing\n", rank, file);
    return 0;
  }
  memcpy(buf, &t, sizeof t);
  for (size_t i = sizeof t; i < bytes; ++i) buf[i] = pattern(rank, t, i);
  int ok = pwrite(fd, buf, bytes, my_offset()) == (ssize_t)bytes && fsync(fd) == 0;
  return close(fd) == 0 && ok;
}

static int read_part(const char *file, int *t, unsigned char *buf) {
  int fd = open(file, O_RDONLY);
  if (fd < 0) {
    printf("rank %d: cannot open %s\n", rank, file);
    return 0;
  }
  struct stat sb;
  int ok = fstat(fd, &sb) == 0 && (size_t)sb.st_size == (shared ? bytes * nranks : bytes) &&
           pread(fd, buf, bytes, my_offset()) == (ssize_t)bytes;
  close(fd);
  if (!ok) {
    printf("rank %d: %s has the wrong size or cannot be read\n", rank, file);
    return 0;
  }
  memcpy(t, buf, sizeof *t);
  for (size_t i = sizeof *t; i < bytes; ++i)
    if (buf[i] != pattern(rank, *t, i)) {
      printf("rank %d: %s: byte %zu of timestep %d is wrong\n", rank, file, i, *t);
      return 0;
    }
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s TIMES BYTES [--shared-file]\n", argv[0]);
    return 1;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int times = atoi(argv[1]);
  bytes = (size_t)atol(argv[2]);
  shared = argc > 3 && strcmp(argv[3], "--shared-file") == 0;
  if (bytes < sizeof(int)) bytes = sizeof(int);
  unsigned char *buf = malloc(bytes);
  const char *base = shared ? "rank_shared.ckpt" : NULL;
  char base_own[64];
  snprintf(base_own, sizeof base_own, "rank_%d.ckpt", rank);
  if (!base) base = base_own;
  if (SCR_Init() != SCR_SUCCESS) {
    printf("rank %d: SCR_Init failed\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int errors = 0, timestep = 0, have = 0, restarted = 0;
  char dset[SCR_MAX_FILENAME], name[2 * SCR_MAX_FILENAME], file[SCR_MAX_FILENAME];
  do {
    if (SCR_Have_restart(&have, dset) != SCR_SUCCESS || !have) break;
    SCR_Start_restart(dset);
    snprintf(name, sizeof name, "%s/%s", dset, base);
    int t = -1;
    int valid = SCR_Route_file(name, file) == SCR_SUCCESS && read_part(file, &t, buf);
    if (SCR_Complete_restart(valid) == SCR_SUCCESS) {
      restarted = 1;
      timestep = t + 1;
      if (rank == 0) printf("restart from %s timestep %d\n", dset, t);
    } else if (rank == 0) {
      printf("restart from %s failed\n", dset);
    }
  } while (!restarted);
  if (!restarted && rank == 0) printf("no restart\n");
  for (int i = 0; i < times; ++i, ++timestep) {
    char out[64];
    snprintf(out, sizeof out, "ckpt.%d", timestep);
    if (SCR_Start_output(out, SCR_FLAG_CHECKPOINT) != SCR_SUCCESS) {
      ++errors;
      continue;
    }
    snprintf(name, sizeof name, "%s/%s", out, base);
    int valid = SCR_Route_file(name, file) == SCR_SUCCESS && write_part(file, timestep, buf);
    if (!valid) ++errors;
    if (SCR_Complete_output(valid) != SCR_SUCCESS) {
      ++errors;
      if (rank == 0) printf("checkpoint %s failed\n", out);
    } else if (rank == 0) {
      printf("checkpoint %s\n", out);
    }
    fflush(stdout);
  }
  int all = 0;
  MPI_Reduce(&errors, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("errors %d\n", all);
  fflush(stdout);
  int rc = SCR_Finalize();
  free(buf);
  MPI_Finalize();
  return rc == SCR_SUCCESS ? 0 : 5;
}

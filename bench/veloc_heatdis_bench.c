/*
 * heatdis_mem-style checkpoint/restart benchmark against VELOC's public C API
 * (veloc.h) only, so that the same source builds against real VELOC and
 * against cairn's VELOC drop-in (issue 25; bench/run_veloc_heatdis.sh).
 *
 * Each rank protects an iteration counter (region 0) and a grid of BYTES
 * bytes (region 1), as VELOC's heatdis_mem protects its counter and its two
 * matrices. The grid is a sequence of 64-bit words; version v of rank r holds
 *     word[i] = base(r, i) + v * STEP
 * so that going from one version to the next is one add per word (every byte
 * of the grid changes, cheaply and deterministically), and restart can check
 * every byte against the version it restored.
 *
 *   veloc_heatdis_bench CFG BYTES ckpt K      K checkpoints, versions 1..K
 *   veloc_heatdis_bench CFG BYTES restart K   restart the newest version (must be K)
 *   veloc_heatdis_bench -   BYTES ref SHMDIR DISKDIR   physical reference, no VELOC
 *
 * BYTES takes a K, M or G suffix (powers of 1024) and must be a multiple of 8.
 * Every time printed is the slowest rank's (MPI_MAX), in seconds, one measure
 * per line:  "heatdis <mode> <measure>=<seconds>".
 * Exit status: 0 on success; 1 on a failed call, no restart, the wrong
 * version or wrong data; 2 on bad arguments.
 */
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "veloc.h"

#define CKPT_NAME "heatdis"
static const uint64_t STEP = 0x9E3779B97F4A7C15ULL;

static int rank, nranks;

static uint64_t base_word(int r, uint64_t i) {
  uint64_t x = i * 0xD6E8FEB86659FD93ULL + ((uint64_t)(r + 1) << 56);
  return x ^ (x >> 29);
}

/* Sets the grid to version v. */
static void fill(uint64_t *g, size_t words, int v) {
  for (size_t i = 0; i < words; i++) g[i] = base_word(rank, i) + (uint64_t)v * STEP;
}

/* Version v-1 -> v. */
static void step(uint64_t *g, size_t words) {
  for (size_t i = 0; i < words; i++) g[i] += STEP;
}

/* Number of words that differ from version v. */
static size_t check(const uint64_t *g, size_t words, int v) {
  size_t bad = 0;
  for (size_t i = 0; i < words; i++)
    if (g[i] != base_word(rank, i) + (uint64_t)v * STEP) bad++;
  return bad;
}

static double tmax(double t) {
  double m;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

static void report(const char *mode, const char *what, double local) {
  double m = tmax(local);
  if (rank == 0) printf("heatdis %s %s=%.6f\n", mode, what, m);
}

static int all_ok(int ok) {
  int all;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all;
}

static int parse_bytes(const char *s, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long n = strtoull(s, &end, 10);
  if (errno || end == s) return 0;
  switch (*end) {
    case 'G': case 'g': n <<= 10; /* fall through */
    case 'M': case 'm': n <<= 10; /* fall through */
    case 'K': case 'k': n <<= 10; end++; break;
    case '\0': break;
    default: return 0;
  }
  if (*end != '\0' || n == 0 || n % 8 != 0) return 0;
  *out = (size_t)n;
  return 1;
}

/* ---- physical reference ---------------------------------------------------- */

static int write_file(const char *path, const void *buf, size_t n, int do_fsync) {
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return 0;
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) { close(fd); return 0; }
    p += w;
    n -= (size_t)w;
  }
  if (do_fsync && fsync(fd) != 0) { close(fd); return 0; }
  return close(fd) == 0;
}

static int read_file(const char *path, void *buf, size_t n) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  char *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) { close(fd); return 0; }
    p += r;
    n -= (size_t)r;
  }
  close(fd);
  return 1;
}

static int run_ref(uint64_t *g, size_t bytes, const char *shm, const char *disk) {
  size_t words = bytes / 8;
  uint64_t *dst = malloc(bytes);
  if (!dst) return 1;
  memset(dst, 0x5a, bytes);
  fill(g, words, 1);
  char pshm[4096], pdisk[4096];
  snprintf(pshm, sizeof pshm, "%s/ref.%d", shm, rank);
  snprintf(pdisk, sizeof pdisk, "%s/ref.%d", disk, rank);
  int ok = 1;
  double t;

  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  memcpy(dst, g, bytes);
  report("ref", "memcpy", MPI_Wtime() - t);
  ok &= dst[words - 1] == g[words - 1];

  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  ok &= write_file(pshm, g, bytes, 1);
  report("ref", "write_fsync_shm", MPI_Wtime() - t);

  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  ok &= write_file(pdisk, g, bytes, 0);
  report("ref", "write_nofsync_disk", MPI_Wtime() - t);

  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  ok &= write_file(pdisk, g, bytes, 1);
  report("ref", "write_fsync_disk", MPI_Wtime() - t);

  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  ok &= read_file(pshm, dst, bytes);
  report("ref", "read_shm", MPI_Wtime() - t);

  memset(dst, 0x5a, bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  ok &= read_file(pdisk, dst, bytes); /* page cache: just written */
  report("ref", "read_disk_cached", MPI_Wtime() - t);

  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  ok &= check(dst, words, 1) == 0;
  report("ref", "verify", MPI_Wtime() - t);

  unlink(pshm);
  unlink(pdisk);
  free(dst);
  ok = all_ok(ok);
  if (!ok && rank == 0) fprintf(stderr, "heatdis ref: an I/O call failed or the data read back differ\n");
  return ok ? 0 : 1;
}

/* ---- checkpoint and restart through VELOC ---------------------------------- */

static int run_ckpt(const char *cfg, uint64_t *g, size_t words, int k) {
  int iter = 0;
  double t = MPI_Wtime();
  int ok = VELOC_Init(MPI_COMM_WORLD, cfg) == VELOC_SUCCESS;
  report("ckpt", "init", MPI_Wtime() - t);
  if (!all_ok(ok)) {
    if (rank == 0) fprintf(stderr, "heatdis ckpt: VELOC_Init failed\n");
    return 1;
  }
  ok &= VELOC_Mem_protect(0, &iter, 1, sizeof iter) == VELOC_SUCCESS;
  ok &= VELOC_Mem_protect(1, g, words, sizeof *g) == VELOC_SUCCESS;
  fill(g, words, 0);
  double in_calls = 0;
  ok = all_ok(ok);
  for (int v = 1; v <= k && ok; v++) {
    step(g, words); /* the "work" between checkpoints: grid at version v */
    iter = v;
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    ok &= VELOC_Checkpoint(CKPT_NAME, v) == VELOC_SUCCESS;
    double d = MPI_Wtime() - t;
    in_calls += d;
    char what[32];
    snprintf(what, sizeof what, "i=%d blocked", v);
    report("ckpt", what, d);
    ok = all_ok(ok);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  ok &= VELOC_Checkpoint_wait() == VELOC_SUCCESS;
  double d = MPI_Wtime() - t;
  in_calls += d;
  report("ckpt", "wait", d);
  report("ckpt", "total", in_calls);
  MPI_Barrier(MPI_COMM_WORLD);
  t = MPI_Wtime();
  ok &= VELOC_Finalize(1) == VELOC_SUCCESS;
  report("ckpt", "finalize", MPI_Wtime() - t);
  ok = all_ok(ok);
  if (!ok && rank == 0) fprintf(stderr, "heatdis ckpt: a VELOC call failed\n");
  return ok ? 0 : 1;
}

static int run_restart(const char *cfg, uint64_t *g, size_t words, int k) {
  int iter = -1;
  memset(g, 0x5a, words * sizeof *g); /* the application's grid, allocated and touched */
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  int ok = VELOC_Init(MPI_COMM_WORLD, cfg) == VELOC_SUCCESS;
  double t_init = MPI_Wtime() - t0;
  report("restart", "init", t_init);
  if (!all_ok(ok)) {
    if (rank == 0) fprintf(stderr, "heatdis restart: VELOC_Init failed\n");
    return 1;
  }
  ok &= VELOC_Mem_protect(0, &iter, 1, sizeof iter) == VELOC_SUCCESS;
  ok &= VELOC_Mem_protect(1, g, words, sizeof *g) == VELOC_SUCCESS;
  MPI_Barrier(MPI_COMM_WORLD);
  double t1 = MPI_Wtime();
  int v = VELOC_Restart_test(CKPT_NAME, 0);
  double t2 = MPI_Wtime();
  int restarted = v > 0 && VELOC_Restart(CKPT_NAME, v) == VELOC_SUCCESS;
  double t3 = MPI_Wtime();
  report("restart", "test", t2 - t1);
  report("restart", "restart", t3 - t2);
  report("restart", "total", t3 - t1);
  report("restart", "init_total", t_init + (t3 - t1));
  if (!all_ok(restarted)) {
    if (rank == 0) fprintf(stderr, "heatdis restart: no restart (VELOC_Restart_test gave %d)\n", v);
    VELOC_Finalize(0);
    return 1;
  }
  t0 = MPI_Wtime();
  size_t bad = check(g, words, v);
  report("restart", "verify", MPI_Wtime() - t0);
  int good = ok && v == k && iter == v && bad == 0;
  if (!good)
    fprintf(stderr, "heatdis restart: rank %d: version %d (expected %d), counter %d, %zu of %zu words wrong\n",
            rank, v, k, iter, bad, words);
  if (rank == 0) printf("heatdis restart version=%d\n", v);
  VELOC_Finalize(0);
  return all_ok(good) ? 0 : 1;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  size_t bytes = 0;
  int k = 0, rc;
  int args_ok = argc >= 5 && parse_bytes(argv[2], &bytes);
  if (args_ok && strcmp(argv[3], "ref") == 0) {
    args_ok = argc == 6;
  } else if (args_ok && (strcmp(argv[3], "ckpt") == 0 || strcmp(argv[3], "restart") == 0)) {
    k = atoi(argv[4]);
    args_ok = argc == 5 && k > 0;
  } else {
    args_ok = 0;
  }
  if (!args_ok) {
    if (rank == 0)
      fprintf(stderr,
              "usage: %s CFG BYTES ckpt K | CFG BYTES restart K | - BYTES ref SHMDIR DISKDIR\n"
              "  BYTES per rank, K/M/G suffix, a multiple of 8\n",
              argv[0]);
    MPI_Finalize();
    return 2;
  }
  uint64_t *g = malloc(bytes);
  if (!g) {
    fprintf(stderr, "heatdis: rank %d cannot allocate %zu bytes\n", rank, bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(g, 0x5a, bytes); /* nonzero: malloc+memset(0) may become calloc, leaving pages untouched */
  if (strcmp(argv[3], "ref") == 0)
    rc = run_ref(g, bytes, argv[4], argv[5]);
  else if (strcmp(argv[3], "ckpt") == 0)
    rc = run_ckpt(argv[1], g, bytes / 8, k);
  else
    rc = run_restart(argv[1], g, bytes / 8, k);
  fflush(stdout);
  free(g);
  MPI_Finalize();
  return rc;
}

/* Checkpoint and restart time through SCR's public C API (scr.h), in the
 * manner of SCR's examples/test_api.c: every rank writes one file of BYTES
 * bytes per checkpoint (a pattern that names the rank, the checkpoint and the
 * word's offset), fsyncs and closes it, between SCR_Start_output and
 * SCR_Complete_output. The same source builds against real SCR and against
 * cairn's drop-in (compat/scr); bench/run_scr_api.sh compares the two.
 *
 *   scr_api_bench BYTES CKPTS ckpt      write checkpoints ckpt.1 .. ckpt.CKPTS
 *   scr_api_bench BYTES CKPTS restart   restart (a new mpirun): the newest
 *                                       dataset must be ckpt.CKPTS and every
 *                                       byte must match; exit 1 otherwise
 *   scr_api_bench BYTES CKPTS plain DIR the physical reference, no SCR call:
 *                                       CKPTS times write+fsync+close of
 *                                       DIR/plain.<rank>, then one read and
 *                                       verification of it
 *
 * BYTES takes a K, M or G suffix (powers of 1024). Files are routed from the
 * relative paths ckpt.<i>/rank_<r>.ckpt, as test_api does, so run it in the
 * directory SCR_PREFIX names. Times are the slowest rank's (MPI_MAX), printed
 * by rank 0 as lines of key=value:
 *
 *   scr_api init seconds=S                   SCR_Init
 *   scr_api ckpt i=I bytes=B seconds=S       SCR_Start_output .. SCR_Complete_output returned
 *   scr_api finalize seconds=S               SCR_Finalize
 *   scr_api ckpt_total seconds=S             first SCR_Start_output .. SCR_Finalize returned
 *   scr_api restart name=N seconds=S         SCR_Have_restart .. SCR_Complete_restart
 *                                            returned (read and verification included)
 *   scr_api restart_total seconds=S          SCR_Init + the above
 *   scr_api plain write i=I seconds=S        open .. write, fsync, close (plain mode)
 *   scr_api plain read seconds=S             open .. read, verify, close (plain mode)
 */
#define _GNU_SOURCE 1
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "scr.h"

static int rank, ranks;

static void die(const char *what)
{
  fprintf(stderr, "scr_api_bench rank %d: %s\n", rank, what);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static size_t parse_bytes(const char *s)
{
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || v <= 0) return 0;
  switch (*end) {
  case 'k': case 'K': v *= 1024.0; end++; break;
  case 'm': case 'M': v *= 1024.0 * 1024.0; end++; break;
  case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; end++; break;
  default: break;
  }
  if (*end == 'b' || *end == 'B') end++;
  if (*end != '\0') return 0;
  return (size_t) v;
}

/* Word w of the file rank r writes for checkpoint c: rank in the top byte,
 * checkpoint in the next, the word's index below (legible in a hex dump). */
static inline uint64_t pattern_word(int r, int c, uint64_t w)
{
  return ((uint64_t)(r & 0xff) << 56) | ((uint64_t)(c & 0xff) << 48) | (w & 0xffffffffffffULL);
}

static void fill(unsigned char *buf, size_t bytes, int r, int c)
{
  size_t words = bytes / 8;
  uint64_t *w = (uint64_t *) buf;
  for (size_t i = 0; i < words; i++) w[i] = pattern_word(r, c, i);
  if (bytes % 8) {
    uint64_t last = pattern_word(r, c, words);
    memcpy(buf + words * 8, &last, bytes % 8);
  }
}

/* 1 when buf holds exactly what fill(r, c) writes. */
static int check(const unsigned char *buf, size_t bytes, int r, int c)
{
  size_t words = bytes / 8;
  const uint64_t *w = (const uint64_t *) buf;
  uint64_t bad = 0;
  for (size_t i = 0; i < words; i++) bad |= w[i] ^ pattern_word(r, c, i);
  if (bytes % 8) {
    uint64_t last = pattern_word(r, c, words);
    if (memcmp(buf + words * 8, &last, bytes % 8) != 0) bad = 1;
  }
  return bad == 0;
}

static int write_all(int fd, const unsigned char *buf, size_t bytes)
{
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = write(fd, buf + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    done += (size_t) n;
  }
  return 1;
}

/* Reads the whole file into buf; 1 when it holds exactly `bytes` bytes. */
static int read_exact(const char *path, unsigned char *buf, size_t bytes)
{
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    fprintf(stderr, "scr_api_bench rank %d: open %s: %s\n", rank, path, strerror(errno));
    return 0;
  }
  struct stat st;
  int ok = fstat(fd, &st) == 0 && (size_t) st.st_size == bytes;
  if (!ok) fprintf(stderr, "scr_api_bench rank %d: %s: size %lld, expected %zu\n", rank, path,
                   (long long) st.st_size, bytes);
  size_t done = 0;
  while (ok && done < bytes) {
    ssize_t n = read(fd, buf + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = 0;
      break;
    }
    done += (size_t) n;
  }
  close(fd);
  return ok;
}

static double max_over_ranks(double v)
{
  double m = 0.0;
  MPI_Reduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  return m;
}

static int run_ckpt(unsigned char *buf, size_t bytes, int ckpts)
{
  int failures = 0;
  double first_start = 0.0;
  for (int c = 1; c <= ckpts; c++) {
    fill(buf, bytes, rank, c); /* outside the timed phase */
    char dset[64], name[SCR_MAX_FILENAME], file[SCR_MAX_FILENAME];
    snprintf(dset, sizeof dset, "ckpt.%d", c);
    snprintf(name, sizeof name, "%s/rank_%d.ckpt", dset, rank);

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (c == 1) first_start = t0;
    if (SCR_Start_output(dset, SCR_FLAG_CHECKPOINT) != SCR_SUCCESS) die("SCR_Start_output failed");
    if (SCR_Route_file(name, file) != SCR_SUCCESS) die("SCR_Route_file failed");
    int valid = 0;
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, S_IRUSR | S_IWUSR);
    if (fd >= 0) {
      valid = write_all(fd, buf, bytes) && fsync(fd) == 0;
      if (close(fd) != 0) valid = 0;
    }
    if (!valid) fprintf(stderr, "scr_api_bench rank %d: writing %s: %s\n", rank, file, strerror(errno));
    int rc = SCR_Complete_output(valid);
    double t1 = MPI_Wtime();
    if (rc != SCR_SUCCESS) failures++;
    double worst = max_over_ranks(t1 - t0);
    if (rank == 0) {
      printf("scr_api ckpt i=%d bytes=%zu seconds=%.6f%s\n", c, bytes, worst,
             rc == SCR_SUCCESS ? "" : " failed=1");
      fflush(stdout);
    }
  }
  double t0 = MPI_Wtime();
  int rc = SCR_Finalize();
  double t1 = MPI_Wtime();
  if (rc != SCR_SUCCESS) failures++;
  double fin = max_over_ranks(t1 - t0);
  double total = max_over_ranks(t1 - first_start);
  if (rank == 0) {
    printf("scr_api finalize seconds=%.6f\n", fin);
    printf("scr_api ckpt_total ckpts=%d seconds=%.6f\n", ckpts, total);
  }
  return failures == 0;
}

static int run_restart(unsigned char *buf, size_t bytes, int ckpts, double init_secs)
{
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  int have = 0, valid = 0, ckpt = -1;
  char dset[SCR_MAX_FILENAME] = "", file[SCR_MAX_FILENAME] = "-";
  if (SCR_Have_restart(&have, dset) != SCR_SUCCESS) die("SCR_Have_restart failed");
  if (have) {
    if (SCR_Start_restart(dset) != SCR_SUCCESS) die("SCR_Start_restart failed");
    char name[SCR_MAX_FILENAME];
    snprintf(name, sizeof name, "%s/rank_%d.ckpt", dset, rank);
    if (SCR_Route_file(name, file) != SCR_SUCCESS) die("SCR_Route_file failed");
    if (sscanf(dset, "ckpt.%d", &ckpt) == 1 && read_exact(file, buf, bytes)) {
      valid = check(buf, bytes, rank, ckpt);
      if (!valid) fprintf(stderr, "scr_api_bench rank %d: %s: wrong data\n", rank, file);
    }
  }
  int rc = have ? SCR_Complete_restart(valid) : SCR_SUCCESS;
  double t1 = MPI_Wtime();

  int all_valid = 0;
  MPI_Allreduce(&valid, &all_valid, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  double worst = max_over_ranks(t1 - t0);
  double total = max_over_ranks(init_secs + (t1 - t0));
  int ok = have && all_valid && rc == SCR_SUCCESS && ckpt == ckpts;
  if (rank == 0) {
    if (!have) fprintf(stderr, "scr_api_bench: no restart found\n");
    else if (ckpt != ckpts) fprintf(stderr, "scr_api_bench: restarted from %s, expected ckpt.%d\n", dset, ckpts);
    printf("scr_api restart name=%s bytes=%zu verified=%d seconds=%.6f file=%s\n", have ? dset : "-",
           bytes, have && all_valid, worst, file);
    printf("scr_api restart_total seconds=%.6f\n", total);
  }
  if (SCR_Finalize() != SCR_SUCCESS) ok = 0;
  return ok;
}

/* The same bytes without SCR: what the storage itself costs. */
static int run_plain(unsigned char *buf, size_t bytes, int ckpts, const char *dir)
{
  char file[4096];
  snprintf(file, sizeof file, "%s/plain.%d", dir, rank);
  int ok = 1;
  for (int c = 1; c <= ckpts; c++) {
    fill(buf, bytes, rank, c);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, S_IRUSR | S_IWUSR);
    int valid = fd >= 0 && write_all(fd, buf, bytes) && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0) valid = 0;
    double worst = max_over_ranks(MPI_Wtime() - t0);
    if (!valid) ok = 0;
    if (rank == 0) printf("scr_api plain write i=%d bytes=%zu seconds=%.6f\n", c, bytes, worst);
  }
  memset(buf, 0, bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  int valid = read_exact(file, buf, bytes) && check(buf, bytes, rank, ckpts);
  double worst = max_over_ranks(MPI_Wtime() - t0);
  if (!valid) ok = 0;
  if (rank == 0) printf("scr_api plain read bytes=%zu seconds=%.6f\n", bytes, worst);
  unlink(file);
  return ok;
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  size_t bytes = argc >= 4 ? parse_bytes(argv[1]) : 0;
  int ckpts = argc >= 4 ? atoi(argv[2]) : 0;
  const char *mode = argc >= 4 ? argv[3] : "";
  int restart = strcmp(mode, "restart") == 0, plain = strcmp(mode, "plain") == 0;
  int args_ok = (plain && argc == 5) || (!plain && argc == 4 && (restart || strcmp(mode, "ckpt") == 0));
  if (bytes == 0 || ckpts <= 0 || ckpts > 255 || !args_ok) {
    if (rank == 0) fprintf(stderr, "usage: %s BYTES CKPTS ckpt|restart|plain DIR\n", argv[0]);
    MPI_Finalize();
    return 2;
  }

  unsigned char *buf = NULL;
  if (posix_memalign((void **) &buf, 4096, bytes) != 0) die("out of memory");
  memset(buf, 0, bytes); /* fault the pages in before any timing */

  if (plain) {
    int ok = run_plain(buf, bytes, ckpts, argv[4]), all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    free(buf);
    MPI_Finalize();
    return all_ok ? 0 : 1;
  }

  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  if (SCR_Init() != SCR_SUCCESS) die("SCR_Init failed");
  double init_secs = MPI_Wtime() - t0;
  double worst = max_over_ranks(init_secs);
  if (rank == 0) printf("scr_api init seconds=%.6f\n", worst);

  int ok = restart ? run_restart(buf, bytes, ckpts, init_secs) : run_ckpt(buf, bytes, ckpts);
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  free(buf);
  MPI_Finalize();
  return all_ok ? 0 : 1;
}

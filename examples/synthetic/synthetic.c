/* synthetic: measures what checkpointing with cairn costs a compute-bound
 * MPI application.
 *
 * Each rank protects one BYTE region ("data") of --bytes bytes and runs
 * --checkpoints intervals of
 *   compute   a fixed amount of CPU work (multiply-adds over a 4 KiB array that
 *             stays in L1), calibrated at start-up to take --compute-ms; the
 *             work is fixed, so interference from cairn's background threads
 *             shows up as a longer compute time (--compute-passes fixes it
 *             explicitly, so that two runs do exactly the same work)
 *   fill      the region is overwritten with rank- and version-dependent data,
 *             then a barrier (neither is timed: it stands for the application
 *             having produced new state)
 *   checkpoint  cairn_checkpoint(c, "synthetic", version), timed; with --wait
 *             also cairn_wait(..., CAIRN_LEVEL_PERSISTENT), timed separately
 * and finally cairn_finalize(&c, 1), timed (the drain of pending flushes).
 * --no-checkpoint runs the same loop without cairn at all: the baseline for
 * the slowdown (compare wall_s of the two runs).
 *
 * Reported on rank 0 (times are the maximum over ranks):
 *   blocked_s      per checkpoint, the time spent inside cairn_checkpoint
 *   wait_s         per checkpoint, the time spent inside cairn_wait (--wait)
 *   compute_s      total compute time
 *   wall_s         compute + checkpoint + wait time (the loop without fills)
 *   finalize_s     time of cairn_finalize(&c, 1)
 *   rate           ranks * bytes * checkpoints / sum(blocked_s + wait_s)
 * --json prints one object: bytes_per_rank, ranks, checkpoints, checkpoint
 * (false with --no-checkpoint), wait, skipped (checkpoints refused with
 * CAIRN_EAGAIN), blocked_s (array; empty without checkpoints), blocked_min_s,
 * blocked_median_s, blocked_max_s, wait_s (array; empty without --wait),
 * wall_s, compute_s, finalize_s, total_s (= wall_s + finalize_s), compute_ms,
 * compute_passes, rate_bytes_per_s, mode (CAIRN_MODE, else a top-level
 * `mode = "..."` line of --config, else "thread").
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "cairn.h"
#include "cairn_mpi.h"

#define CKPT_NAME "synthetic"
#define KERNEL_LEN 512 /* doubles: 4 KiB, fits in any L1 data cache */

static int g_rank = 0;

static void cairn_die(const char *fn, int rc) {
  const char *msg = cairn_last_error();
  fprintf(stderr, "synthetic: %s failed: %s: %s\n", fn, cairn_strerror(rc), msg ? msg : "");
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1); /* not reached */
}

#define CAIRN_CHECK(fn, ...)                 \
  do {                                       \
    int rc_ = fn(__VA_ARGS__);               \
    if (rc_ != CAIRN_OK) cairn_die(#fn, rc_); \
  } while (0)

static void fail(const char *msg, const char *arg) {
  if (g_rank == 0) fprintf(stderr, "synthetic: %s%s\n", msg, arg ? arg : "");
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: synthetic [--bytes B] [--compute-ms T] [--checkpoints N] [--no-checkpoint]\n"
          "                 [--compute-passes P] [--wait] [--first-version V] [--config PATH]\n"
          "                 [--json]\n"
          "  --bytes B          bytes protected per rank, suffixes K, M, G (x1024) (default 64M)\n"
          "  --compute-ms T     compute time per interval, in ms (default 1000)\n"
          "  --compute-passes P fixed work per interval instead of calibrating --compute-ms\n"
          "                     (use the compute_passes of a baseline run for equal work)\n"
          "  --checkpoints N    number of intervals / checkpoints (default 10)\n"
          "  --no-checkpoint    same loop without cairn (baseline)\n"
          "  --wait             cairn_wait(PERSISTENT) after every checkpoint\n"
          "  --first-version V  version of the first checkpoint (default 1)\n"
          "  --config PATH      cairn configuration file (default none)\n"
          "  --json             print the results as one JSON object\n");
}

static long long parse_int(const char *opt, const char *s, long long min) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min) {
    if (g_rank == 0)
      fprintf(stderr, "synthetic: invalid value '%s' for %s (an integer >= %lld)\n", s, opt, min);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
  }
  return v;
}

/* "123", "64K", "64k", "1.5M", "2G", "2GiB", "2GB": binary multiples. */
static uint64_t parse_size(const char *s) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || !(v >= 0)) fail("invalid value for --bytes: ", s);
  double mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = 1024.0; ++end; break;
    case 'm': case 'M': mult = 1024.0 * 1024.0; ++end; break;
    case 'g': case 'G': mult = 1024.0 * 1024.0 * 1024.0; ++end; break;
    default: break;
  }
  if (mult > 1 && *end == 'i') ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') fail("invalid value for --bytes: ", s);
  double bytes = v * mult;
  if (bytes < 1 || bytes > 9.0e18) fail("--bytes out of range: ", s);
  return (uint64_t)bytes;
}

typedef struct options {
  uint64_t bytes;
  long long compute_ms, compute_passes, checkpoints, first_version;
  int checkpoint, wait, json;
  const char *config;
} options_t;

static void parse_options(int argc, char **argv, options_t *o) {
  o->bytes = 64u << 20;
  o->compute_ms = 1000;
  o->compute_passes = -1; /* calibrate */
  o->checkpoints = 10;
  o->first_version = 1;
  o->checkpoint = 1;
  o->wait = 0;
  o->json = 0;
  o->config = NULL;
  for (int i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    const char *eq = strchr(arg, '=');
    size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
    char name[64]; /* the option without "=value", for messages */
    snprintf(name, sizeof name, "%.*s", (int)(name_len < 63 ? name_len : 63), arg);
#define OPT_IS(name) (strlen(name) == name_len && strncmp(arg, name, name_len) == 0)
    if (!eq && (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)) {
      if (g_rank == 0) usage(stdout);
      MPI_Finalize();
      exit(0);
    } else if (!eq && strcmp(arg, "--no-checkpoint") == 0) {
      o->checkpoint = 0;
      continue;
    } else if (!eq && strcmp(arg, "--wait") == 0) {
      o->wait = 1;
      continue;
    } else if (!eq && strcmp(arg, "--json") == 0) {
      o->json = 1;
      continue;
    }
    const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
    int known = OPT_IS("--bytes") || OPT_IS("--compute-ms") || OPT_IS("--compute-passes") ||
                OPT_IS("--checkpoints") ||
                OPT_IS("--first-version") || OPT_IS("--config");
    if (!known) {
      if (g_rank == 0) usage(stderr);
      fail("unknown option ", arg);
    }
    if (value == NULL) fail("missing value for ", arg);
    if (OPT_IS("--bytes")) {
      o->bytes = parse_size(value);
    } else if (OPT_IS("--compute-ms")) {
      o->compute_ms = parse_int(name, value, 0);
    } else if (OPT_IS("--compute-passes")) {
      o->compute_passes = parse_int(name, value, 0);
    } else if (OPT_IS("--checkpoints")) {
      o->checkpoints = parse_int(name, value, 1);
      if (o->checkpoints > 1000000) fail("--checkpoints too large: ", value);
    } else if (OPT_IS("--first-version")) {
      o->first_version = parse_int(name, value, 0);
    } else {
      o->config = value;
    }
#undef OPT_IS
    if (!eq) ++i;
  }
  if (o->wait && !o->checkpoint) fail("--wait and --no-checkpoint exclude each other", NULL);
}

/* The compute kernel: `passes` sweeps of a multiply-add over an L1-resident
 * array. The values converge to 1.0 and stay normal (no denormal slow path);
 * the compiler can neither hoist nor drop the loop because every pass depends
 * on the previous one and the array is observed afterwards. */
static double g_kernel[KERNEL_LEN];
static volatile double g_sink;

static void kernel(long long passes) {
  double *a = g_kernel;
  const double m = 0.9999999, b = 1.0e-7;
  for (long long p = 0; p < passes; ++p)
    for (int i = 0; i < KERNEL_LEN; ++i) a[i] = a[i] * m + b;
  g_sink = a[(unsigned long long)passes % KERNEL_LEN];
}

/* Number of kernel passes that take `ms` milliseconds on this rank: the best
 * of three timings of a run of at least 50 ms. The minimum over ranks is
 * used, so that every rank does the same work. */
static long long calibrate(long long ms) {
  for (int i = 0; i < KERNEL_LEN; ++i) g_kernel[i] = 0.5 + (double)i / KERNEL_LEN;
  if (ms <= 0) return 0;
  long long n = 256;
  double t = 0;
  for (;;) {
    double t0 = MPI_Wtime();
    kernel(n);
    t = MPI_Wtime() - t0;
    if (t >= 0.05 || n > (1LL << 40)) break;
    n *= 2;
  }
  double best_rate = (double)n / t;
  for (int trial = 0; trial < 3; ++trial) {
    double t0 = MPI_Wtime();
    kernel(n);
    t = MPI_Wtime() - t0;
    if ((double)n / t > best_rate) best_rate = (double)n / t;
  }
  long long passes = llround(best_rate * (double)ms / 1000.0);
  if (passes < 1) passes = 1;
  long long min_passes = passes;
  MPI_Allreduce(&passes, &min_passes, 1, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  return min_passes;
}

static uint64_t splitmix64(uint64_t x) {
  x += UINT64_C(0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
  return x ^ (x >> 31);
}

/* Pseudo-random (incompressible) contents depending on rank and version. */
static void fill(unsigned char *data, uint64_t bytes, int rank, int64_t version) {
  const uint64_t seed = splitmix64(((uint64_t)rank << 40) ^ (uint64_t)version);
  uint64_t *w = (uint64_t *)data; /* data is page-aligned */
  const uint64_t nwords = bytes / 8;
  for (uint64_t i = 0; i < nwords; ++i) w[i] = splitmix64(seed + i);
  uint64_t last = splitmix64(seed + nwords);
  for (uint64_t i = nwords * 8; i < bytes; ++i) data[i] = (unsigned char)(last >> (8 * (i % 8)));
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The engine mode, as far as the program can tell: CAIRN_MODE wins, then a
 * top-level `mode = "..."` line of the configuration file, then the default.
 * (The C API has no call that reports the effective configuration.) */
static void detect_mode(const char *config, char *out, size_t len) {
  const char *env = getenv("CAIRN_MODE");
  snprintf(out, len, "%s", "thread");
  if (env && *env) {
    snprintf(out, len, "%s", env);
    return;
  }
  if (!config) return;
  FILE *f = fopen(config, "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *p = line;
    while (isspace((unsigned char)*p)) ++p;
    if (*p == '[') break; /* a table starts: top-level keys are over */
    if (strncmp(p, "mode", 4) != 0) continue;
    p += 4;
    while (*p == ' ' || *p == '\t') ++p;
    if (*p++ != '=') continue;
    while (*p == ' ' || *p == '\t') ++p;
    char quote = *p;
    if (quote != '"' && quote != '\'') continue;
    char *end = strchr(p + 1, quote);
    if (!end) continue;
    *end = '\0';
    snprintf(out, len, "%s", p + 1);
    break;
  }
  fclose(f);
}

static void print_json_array(const double *v, long long n) {
  printf("[");
  for (long long i = 0; i < n; ++i) printf("%s%.9g", i ? ", " : "", v[i]);
  printf("]");
}

/* JSON has no way to write a control character or quote raw: escape them. */
static void print_json_string(const char *s) {
  putchar('"');
  for (; *s; ++s) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int rank = g_rank;

  options_t opt;
  parse_options(argc, argv, &opt);
  const long long n = opt.checkpoints;

  /* Calibrate before cairn starts any thread. */
  const long long calibrated = calibrate(opt.compute_passes >= 0 ? 0 : opt.compute_ms);
  const long long passes = opt.compute_passes >= 0 ? opt.compute_passes : calibrated;

  const size_t alloc = (size_t)((opt.bytes + 4095) / 4096 * 4096);
  unsigned char *data = aligned_alloc(4096, alloc);
  if (!data) fail("out of memory allocating the region", NULL);
  memset(data, 0, alloc); /* fault every page in before anything is timed */

  double *blocked = calloc((size_t)n, sizeof(double));
  double *waited = calloc((size_t)n, sizeof(double));
  if (!blocked || !waited) fail("out of memory", NULL);

  cairn_t *c = NULL;
  if (opt.checkpoint) {
    CAIRN_CHECK(cairn_init_mpi, MPI_COMM_WORLD, opt.config, &c);
    CAIRN_CHECK(cairn_protect, c, "data", data, (size_t)opt.bytes, CAIRN_BYTE);
  }

  double compute = 0, excluded = 0;
  long long skipped = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (long long k = 0; k < n; ++k) {
    const int64_t version = (int64_t)(opt.first_version + k);

    double t0 = MPI_Wtime();
    kernel(passes);
    double t1 = MPI_Wtime();
    compute += t1 - t0;

    fill(data, opt.bytes, rank, version);
    MPI_Barrier(MPI_COMM_WORLD);
    double t2 = MPI_Wtime();
    excluded += t2 - t1;

    if (!opt.checkpoint) continue;
    int rc = cairn_checkpoint(c, CKPT_NAME, version);
    double t3 = MPI_Wtime();
    blocked[k] = t3 - t2;
    if (rc == CAIRN_EAGAIN) {
      /* staging_policy = eagain, no slot free: the same on every rank. */
      ++skipped;
      continue;
    }
    if (rc == CAIRN_EEARLIER) {  /* this version was taken; an earlier one failed */
      if (g_rank == 0) fprintf(stderr, "synthetic: warning: %s\n", cairn_last_error());
    } else if (rc != CAIRN_OK) {
      cairn_die("cairn_checkpoint", rc);
    }
    if (opt.wait) {
      CAIRN_CHECK(cairn_wait, c, CKPT_NAME, version, CAIRN_LEVEL_PERSISTENT);
      waited[k] = MPI_Wtime() - t3;
    }
  }
  const double wall = MPI_Wtime() - start - excluded;

  double finalize = 0;
  if (opt.checkpoint) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    CAIRN_CHECK(cairn_finalize, &c, 1);
    finalize = MPI_Wtime() - t0;
  }

  /* Maxima over ranks. */
  double local[3] = {compute, wall, finalize}, global[3];
  MPI_Reduce(local, global, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  double *blocked_max = calloc((size_t)n, sizeof(double));
  double *waited_max = calloc((size_t)n, sizeof(double));
  if (!blocked_max || !waited_max) fail("out of memory", NULL);
  MPI_Reduce(blocked, blocked_max, (int)n, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(waited, waited_max, (int)n, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

  if (rank == 0) {
    const long long nck = opt.checkpoint ? n : 0; /* entries in blocked_s */
    double *sorted = malloc((size_t)n * sizeof(double));
    if (!sorted) fail("out of memory", NULL);
    double bmin = 0, bmed = 0, bmax = 0, blocked_sum = 0, wait_sum = 0;
    if (nck > 0) {
      memcpy(sorted, blocked_max, (size_t)n * sizeof(double));
      qsort(sorted, (size_t)n, sizeof(double), cmp_double);
      bmin = sorted[0];
      bmax = sorted[n - 1];
      bmed = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
      for (long long k = 0; k < n; ++k) {
        blocked_sum += blocked_max[k];
        wait_sum += waited_max[k];
      }
    }
    const double total_bytes = (double)opt.bytes * size * (double)(nck - skipped);
    const double app_blocked = blocked_sum + wait_sum;
    const double rate = app_blocked > 0 ? total_bytes / app_blocked : 0;
    char mode[64];
    detect_mode(opt.config, mode, sizeof mode);

    if (opt.json) {
      printf("{\"bytes_per_rank\": %" PRIu64 ", \"ranks\": %d, \"checkpoints\": %lld", opt.bytes,
             size, n);
      printf(", \"checkpoint\": %s, \"wait\": %s, \"skipped\": %lld",
             opt.checkpoint ? "true" : "false", opt.wait ? "true" : "false", skipped);
      printf(", \"blocked_s\": ");
      print_json_array(blocked_max, nck);
      printf(", \"blocked_min_s\": %.9g, \"blocked_median_s\": %.9g, \"blocked_max_s\": %.9g", bmin,
             bmed, bmax);
      printf(", \"wait_s\": ");
      print_json_array(waited_max, opt.wait ? n : 0);
      printf(", \"wall_s\": %.9g, \"compute_s\": %.9g, \"finalize_s\": %.9g, \"total_s\": %.9g",
             global[1], global[0], global[2], global[1] + global[2]);
      printf(", \"compute_ms\": %lld, \"compute_passes\": %lld", opt.compute_ms, passes);
      printf(", \"rate_bytes_per_s\": %.9g, \"mode\": ", rate);
      print_json_string(mode);
      printf("}\n");
    } else {
      const double mib = (double)opt.bytes / (1024.0 * 1024.0);
      char work[64];
      if (opt.compute_passes >= 0)
        snprintf(work, sizeof work, "%s", "fixed");
      else
        snprintf(work, sizeof work, "calibrated to %lld ms", opt.compute_ms);
      printf("synthetic: %d ranks, %.3f MiB per rank, %lld intervals of %lld compute passes "
             "(%s), %s\n",
             size, mib, n, passes, work,
             opt.checkpoint ? (opt.wait ? "checkpoint + wait persistent" : "checkpoint")
                            : "no checkpoint (baseline)");
      if (opt.checkpoint) {
        printf("synthetic: mode %s, %lld checkpoints (%lld skipped)\n", mode, n, skipped);
        printf("synthetic: blocked in cairn_checkpoint (max over ranks): min %.6f s, median %.6f s, "
               "max %.6f s\n",
               bmin, bmed, bmax);
        if (opt.wait) printf("synthetic: blocked in cairn_wait: total %.6f s\n", wait_sum);
      }
      printf("synthetic: compute %.6f s, wall %.6f s, finalize %.6f s, total %.6f s\n", global[0],
             global[1], global[2], global[1] + global[2]);
      if (opt.checkpoint)
        printf("synthetic: rate %.3f MiB/s (all ranks' bytes per second blocked)\n",
               rate / (1024.0 * 1024.0));
    }
    fflush(stdout);
    free(sorted);
  }

  free(blocked);
  free(waited);
  free(blocked_max);
  free(waited_max);
  free(data);
  MPI_Finalize();
  return 0;
}

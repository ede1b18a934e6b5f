/* heat2d: Jacobi solver for the 2-D heat equation, checkpointed with cairn.
 *
 * The global interior grid has NX rows and NY columns. It is split into blocks
 * of whole rows, one per rank (the first NX % P ranks get one row more). Each
 * rank stores its rows plus one halo row above and below and one fixed boundary
 * column left and right, so a local grid is (rows + 2) x (NY + 2) doubles.
 * Boundary conditions are fixed: the row above the global grid is 1.0 (hot),
 * the row below it and the columns left and right of it are 0.0.
 *
 * Each iteration exchanges halo rows with MPI_Sendrecv and writes
 *   next[i][j] = 0.25 * ((cur[i-1][j] + cur[i+1][j]) + (cur[i][j-1] + cur[i][j+1]))
 * for every interior point, then swaps the two grids. The update is point-wise
 * and each point sees the same operands in the same order whatever the number
 * of ranks, so the result is bit-identical for any rank count, and whether or
 * not the run was interrupted and restarted: the state is the current grid's
 * interior only; the fixed boundary values are set at start-up in both grids
 * (restarted or not), the halo rows are exchanged before every iteration
 * (so also before the first one after a restart), and the other grid's
 * interior is overwritten before it is read.
 *
 * Checkpointed state (checkpoint "heat2d", version = completed iterations):
 *   grid  FLOAT64, a block of the global NX x NY interior
 *         (cairn_protect_block: global start row = this rank's first row,
 *         memory shape (rows + 2) x (NY + 2), block at memory (1, 1); the
 *         halo rows and boundary columns are not stored). Runs with different
 *         rank counts therefore store the same global array, and
 *         `cairn diff` compares them element by element.
 *         The region is re-registered before each checkpoint to point at the
 *         current one of the two grids; a restart restores into grid 0.
 *   iter  INT64[3] on every rank: completed iterations, NX, NY (checked after
 *         restart)
 *
 * Output on rank 0 (stdout):
 *   heat2d: grid NXxNY, P ranks, N iterations, checkpoint every K
 *     (or "..., no checkpoints" with --every 0)
 *   heat2d: starting from scratch
 *     or heat2d: restarted from version V (iteration I)
 *   heat2d: checkpoint version V                    (after each checkpoint)
 *   heat2d: iterations N
 *   heat2d: final checksum <16 hex digits>          (FNV-1a 64 of the interior
 *                                                    doubles in global row order)
 *
 * Batch jobs: after every iteration heat2d asks cairn_should_checkpoint
 * (collective, the same answer on every rank). When the job is about to end
 * (Slurm's --signal=USR1@T, SIGTERM at preemption, or the deadline nearer than
 * the measured time to durable) it checkpoints that iteration, waits until it
 * is durable at the persistent level, prints
 *   heat2d: the job ends: version V durable, stopping (resubmit to continue)
 * and ends without the final lines; the next job restarts from V.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "cairn.h"
#include "cairn_mpi.h"

#define CKPT_NAME "heat2d"

enum { STATE_ITER = 0, STATE_NX = 1, STATE_NY = 2, STATE_LEN = 3 };

static int g_rank = 0;

static void cairn_die(const char *fn, int rc) {
  const char *msg = cairn_last_error();
  fprintf(stderr, "heat2d: %s failed: %s: %s\n", fn, cairn_strerror(rc), msg ? msg : "");
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1); /* not reached */
}

/* Calls cairn function `fn`; any return other than CAIRN_OK is fatal. */
#define CAIRN_CHECK(fn, ...)                 \
  do {                                       \
    int rc_ = fn(__VA_ARGS__);               \
    if (rc_ != CAIRN_OK) cairn_die(#fn, rc_); \
  } while (0)

static void die(const char *fmt, const char *arg) {
  fprintf(stderr, "heat2d: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: heat2d [--nx N] [--ny N] [--iters N] [--every K] [--sleep-ms M]\n"
          "              [--config PATH]\n"
          "  --nx N        global interior rows (default 512)\n"
          "  --ny N        global interior columns (default 512)\n"
          "  --iters N     total Jacobi iterations (default 1000)\n"
          "  --every K     checkpoint every K iterations, 0 = never (default 100)\n"
          "  --sleep-ms M  sleep M ms per iteration, for demos (default 0)\n"
          "  --config PATH cairn configuration file (default none)\n");
}

/* Parses a non-negative integer option value; exits on anything else. */
static long long parse_count(const char *opt, const char *s, long long min) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min) {
    if (g_rank == 0)
      fprintf(stderr, "heat2d: invalid value '%s' for %s (an integer >= %lld)\n", s, opt, min);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
  }
  return v;
}

typedef struct options {
  long long nx, ny, iters, every, sleep_ms;
  const char *config;
} options_t;

static void parse_options(int argc, char **argv, options_t *o) {
  o->nx = 512;
  o->ny = 512;
  o->iters = 1000;
  o->every = 100;
  o->sleep_ms = 0;
  o->config = NULL;
  for (int i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      if (g_rank == 0) usage(stdout);
      MPI_Finalize();
      exit(0);
    }
    /* Accept both "--opt value" and "--opt=value". */
    const char *eq = strchr(arg, '=');
    size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
    char name[64]; /* the option without "=value", for messages */
    snprintf(name, sizeof name, "%.*s", (int)(name_len < 63 ? name_len : 63), arg);
    const char *value = NULL;
    if (eq) {
      value = eq + 1;
    } else if (i + 1 < argc) {
      value = argv[i + 1];
    }
#define OPT_IS(name) (strlen(name) == name_len && strncmp(arg, name, name_len) == 0)
    long long *target = NULL;
    long long min = 0;
    if (OPT_IS("--nx")) {
      target = &o->nx;
      min = 1;
    } else if (OPT_IS("--ny")) {
      target = &o->ny;
      min = 1;
    } else if (OPT_IS("--iters")) {
      target = &o->iters;
    } else if (OPT_IS("--every")) {
      target = &o->every;
    } else if (OPT_IS("--sleep-ms")) {
      target = &o->sleep_ms;
    } else if (!OPT_IS("--config")) {
      if (g_rank == 0) {
        fprintf(stderr, "heat2d: unknown option '%s'\n", arg);
        usage(stderr);
      }
      MPI_Abort(MPI_COMM_WORLD, 1);
      exit(1);
    }
#undef OPT_IS
    if (value == NULL) {
      if (g_rank == 0) fprintf(stderr, "heat2d: option %s needs a value\n", arg);
      MPI_Abort(MPI_COMM_WORLD, 1);
      exit(1);
    }
    if (target) {
      *target = parse_count(name, value, min);
    } else {
      o->config = value;
    }
    if (!eq) ++i;
  }
}

static void sleep_ms(long long ms) {
  if (ms <= 0) return;
  struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* FNV-1a, 64 bit, continued from state h. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = (const unsigned char *)data;
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int rank = g_rank;

  options_t opt;
  parse_options(argc, argv, &opt);
  if (opt.nx < size) {
    if (rank == 0)
      fprintf(stderr, "heat2d: --nx %lld is smaller than the number of ranks (%d)\n", opt.nx,
              size);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  /* Row block of this rank: the first `rem` ranks get one extra row. */
  const long long base = opt.nx / size, rem = opt.nx % size;
  const long long rows = base + (rank < rem ? 1 : 0);
  const long long first_row = rank * base + (rank < rem ? rank : rem); /* global index */
  const long long ncols = opt.ny + 2; /* with the left and right boundary columns */
  const size_t nelem = (size_t)(rows + 2) * (size_t)ncols;
  const int up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
  const int down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
  if (ncols > INT_MAX) die("%s", "--ny too large for one MPI message per row");

  double *grid[2];
  for (int g = 0; g < 2; ++g) {
    grid[g] = calloc(nelem, sizeof(double));
    if (grid[g] == NULL) die("%s", "out of memory allocating the grids");
    /* Fixed boundaries, in both grids and also when the run restarts (a
     * restart restores only the interior): calloc gave 0.0 everywhere; the
     * row above the global grid (rank 0's upper halo) is hot. Other ranks'
     * halos are overwritten by the exchange before every use. */
    if (rank == 0)
      for (long long j = 0; j < ncols; ++j) grid[g][j] = 1.0;
  }
  int64_t state[STATE_LEN] = {0, opt.nx, opt.ny};

  if (rank == 0) {
    if (opt.every > 0)
      printf("heat2d: grid %lldx%lld, %d ranks, %lld iterations, checkpoint every %lld\n", opt.nx,
             opt.ny, size, opt.iters, opt.every);
    else
      printf("heat2d: grid %lldx%lld, %d ranks, %lld iterations, no checkpoints\n", opt.nx, opt.ny,
             size, opt.iters);
    fflush(stdout);
  }

  cairn_t *c = NULL;
  CAIRN_CHECK(cairn_init_mpi, MPI_COMM_WORLD, opt.config, &c);
  /* The interior of the current grid as a block of the global NX x NY array. */
  const uint64_t global_shape[2] = {(uint64_t)opt.nx, (uint64_t)opt.ny};
  const uint64_t block_start[2] = {(uint64_t)first_row, 0};
  const uint64_t block_count[2] = {(uint64_t)rows, (uint64_t)opt.ny};
  const uint64_t mem_shape[2] = {(uint64_t)(rows + 2), (uint64_t)ncols};
  const uint64_t mem_start[2] = {1, 1};
#define PROTECT_GRID(g)                                                                        \
  CAIRN_CHECK(cairn_protect_block, c, "grid", grid[g], CAIRN_FLOAT64, 2, global_shape,         \
              block_start, block_count, mem_shape, mem_start, 0)
  PROTECT_GRID(0);
  CAIRN_CHECK(cairn_protect, c, "iter", state, (size_t)STATE_LEN, CAIRN_INT64);

  int64_t version = -1;
  int rc = cairn_restart_test(c, CKPT_NAME, &version);
  if (rc == CAIRN_OK) {
    CAIRN_CHECK(cairn_restart, c, CKPT_NAME, version);
    if (state[STATE_NX] != opt.nx || state[STATE_NY] != opt.ny) {
      if (rank == 0)
        fprintf(stderr,
                "heat2d: checkpoint version %" PRId64 " is of a %" PRId64 "x%" PRId64
                " grid, not %lldx%lld: rerun with the same --nx/--ny or remove the store\n",
                version, state[STATE_NX], state[STATE_NY], opt.nx, opt.ny);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (state[STATE_ITER] > opt.iters) {
      if (rank == 0)
        fprintf(stderr,
                "heat2d: checkpoint version %" PRId64 " is at iteration %" PRId64
                ", beyond --iters %lld\n",
                version, state[STATE_ITER], opt.iters);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
      printf("heat2d: restarted from version %" PRId64 " (iteration %" PRId64 ")\n", version,
             state[STATE_ITER]);
      fflush(stdout);
    }
  } else if (rc == CAIRN_ENOTFOUND) {
    if (rank == 0) {
      printf("heat2d: starting from scratch\n");
      fflush(stdout);
    }
  } else {
    cairn_die("cairn_restart_test", rc);
  }

  int cur = 0; /* the restart (if any) restored into grid 0 */
  int stopped = 0;
  for (long long it = state[STATE_ITER] + 1; it <= opt.iters; ++it) {
    double *u = grid[cur];
    double *v = grid[1 - cur];

    /* Halo exchange: first row up / lower halo from below, then last row
     * down / upper halo from above. MPI_PROC_NULL leaves the fixed boundary
     * rows of the first and last rank untouched. */
    MPI_Sendrecv(u + 1 * ncols, (int)ncols, MPI_DOUBLE, up, 0, u + (rows + 1) * ncols,
                 (int)ncols, MPI_DOUBLE, down, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Sendrecv(u + rows * ncols, (int)ncols, MPI_DOUBLE, down, 1, u, (int)ncols, MPI_DOUBLE, up,
                 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);

    for (long long i = 1; i <= rows; ++i) {
      const double *above = u + (i - 1) * ncols;
      const double *row = u + i * ncols;
      const double *below = u + (i + 1) * ncols;
      double *out = v + i * ncols;
      for (long long j = 1; j <= opt.ny; ++j)
        out[j] = 0.25 * ((above[j] + below[j]) + (row[j - 1] + row[j + 1]));
    }
    cur = 1 - cur;
    sleep_ms(opt.sleep_ms);

    int ending = 0;
    if ((rc = cairn_should_checkpoint(c, &ending)) != CAIRN_OK) cairn_die("cairn_should_checkpoint", rc);
    if (ending) {
      state[STATE_ITER] = it;
      PROTECT_GRID(cur);
      CAIRN_CHECK(cairn_checkpoint, c, CKPT_NAME, (int64_t)it);
      CAIRN_CHECK(cairn_wait, c, CKPT_NAME, (int64_t)it, CAIRN_LEVEL_PERSISTENT);
      if (rank == 0) {
        printf("heat2d: the job ends: version %lld durable, stopping (resubmit to continue)\n", it);
        fflush(stdout);
      }
      stopped = 1;
      break;
    }
    if (opt.every > 0 && it % opt.every == 0) {
      state[STATE_ITER] = it;
      PROTECT_GRID(cur);
      rc = cairn_checkpoint(c, CKPT_NAME, (int64_t)it);
      if (rc == CAIRN_EAGAIN) {
        /* staging_policy = eagain and no staging slot free: agreed by every
         * rank, so every rank skips this checkpoint and computes on. */
        if (rank == 0) {
          printf("heat2d: checkpoint version %lld skipped (staging memory full)\n", it);
          fflush(stdout);
        }
      } else if (rc != CAIRN_OK && rc != CAIRN_EEARLIER) {
        cairn_die("cairn_checkpoint", rc);
      } else if (rank == 0) {
        /* CAIRN_EEARLIER: this version was taken; an earlier one failed. */
        if (rc == CAIRN_EEARLIER) fprintf(stderr, "heat2d: warning: %s\n", cairn_last_error());
        printf("heat2d: checkpoint version %lld\n", it);
        fflush(stdout);
      }
      /* With remote checkpoint agents (configuration key agents), take any
       * change of agents the controller decided; without, this returns at once. */
      int change = CAIRN_AGENTS_UNCHANGED;
      if ((rc = cairn_probe(c, &change)) != CAIRN_OK) cairn_die("cairn_probe", rc);
      if (change != CAIRN_AGENTS_UNCHANGED && rank == 0) {
        static const char *what[] = {"unchanged", "expanded", "reduced", "migrated"};
        printf("heat2d: agents %s\n", what[change]);
        fflush(stdout);
      }
    }
  }

  CAIRN_CHECK(cairn_finalize, &c, 1);
  if (stopped) {
    free(grid[0]);
    free(grid[1]);
    MPI_Finalize();
    return 0;
  }

  /* Checksum of the interior in global row order, independent of the rank
   * count: the FNV-1a state is passed from rank to rank, each continuing it
   * over its own rows, and the last rank hands the result to rank 0. */
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  if (rank > 0) MPI_Recv(&h, 1, MPI_UINT64_T, rank - 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  for (long long i = 1; i <= rows; ++i)
    h = fnv1a(h, grid[cur] + i * ncols + 1, (size_t)opt.ny * sizeof(double));
  if (size > 1) {
    if (rank < size - 1) {
      MPI_Send(&h, 1, MPI_UINT64_T, rank + 1, 2, MPI_COMM_WORLD);
    } else {
      MPI_Send(&h, 1, MPI_UINT64_T, 0, 3, MPI_COMM_WORLD);
    }
    if (rank == 0) MPI_Recv(&h, 1, MPI_UINT64_T, size - 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }

  if (rank == 0) {
    printf("heat2d: iterations %lld\n", opt.iters);
    printf("heat2d: final checksum %016" PRIx64 "\n", h);
    fflush(stdout);
  }

  free(grid[0]);
  free(grid[1]);
  MPI_Finalize();
  return 0;
}

/* nbody: MPI + OpenMP gravitational N-body code, checkpointed with cairn, whose
 * floating-point results depend on thread timing (a client of the history
 * analytics with real divergence).
 *
 * N particles of mass 1/N (G = 1, Plummer softening EPS) start from
 * deterministic initial conditions: particle g's position is uniform in the
 * unit ball and its velocity uniform in a ball of radius V0, both drawn from a
 * splitmix64 stream seeded by g, so they do not depend on the rank count.
 * Each rank owns a contiguous slice of particles (the first N % P ranks one
 * more). Every step
 *   1. the positions of all particles are gathered on every rank (MPI_Allgatherv);
 *   2. the accelerations of this rank's particles are computed by the OpenMP
 *      threads: the loop over source particles j is shared out dynamically in
 *      chunks of one, and each thread adds the pull of its j on every owned
 *      particle i into the shared array acc[i] with `#pragma omp atomic`.
 *      Which thread's contribution reaches acc[i] first depends on thread
 *      timing, and floating-point addition is not associative, so with more
 *      than one thread two runs give different last bits, which the chaotic
 *      dynamics then amplify. With OMP_NUM_THREADS=1 the order is fixed (j
 *      ascending) and runs are bit-identical;
 *   3. symplectic Euler (leapfrog) update: v += a dt, then x += v dt.
 * With the defaults (512 particles, dt 0.005, 2000 steps) two runs with
 * OMP_NUM_THREADS=2 differ by about 1e-16 at step 100 and the difference
 * doubles every ~40 steps, to about 1e-3 .. 1e-2 at step 2000 (see
 * scripts/demo-history.sh); the energy changes by ~0.3 %.
 *
 * Checkpointed state (checkpoint "nbody", version = completed steps), every K
 * steps; (x, v) alone determine the next step, so a restart continues exactly
 * where the run stopped (bit-identical with one thread):
 *   pos   FLOAT64, block rows [first, first + n) of the global N x 3 array; the
 *         memory is the gathered N x 3 array, block at memory row `first`
 *   vel   FLOAT64, block rows [first, first + n) of the global N x 3 array
 *   step  INT64[3] on every rank: completed steps, N, seed (checked after restart)
 *
 * Output on rank 0 (stdout):
 *   nbody: N particles, P ranks, T threads, S steps, dt D, checkpoint every K
 *   nbody: starting from scratch | nbody: restarted from version V (step S)
 *   nbody: checkpoint version V                     (after each checkpoint)
 *   nbody: steps S
 *   nbody: energy E (initial E0, relative change R)
 *   nbody: final checksum <16 hex digits>            (FNV-1a 64 of pos then vel,
 *                                                     each in global particle order)
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>
#include <omp.h>

#include "cairn.h"
#include "cairn_mpi.h"

#define CKPT_NAME "nbody"
#define EPS 0.02 /* Plummer softening length */
#define V0 0.3   /* radius of the initial velocity ball */

enum { STATE_STEP = 0, STATE_N = 1, STATE_SEED = 2, STATE_LEN = 3 };

static int g_rank = 0;

static void cairn_die(const char *fn, int rc) {
  const char *msg = cairn_last_error();
  fprintf(stderr, "nbody: %s failed: %s: %s\n", fn, cairn_strerror(rc), msg ? msg : "");
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1); /* not reached */
}

#define CAIRN_CHECK(fn, ...)                  \
  do {                                        \
    int rc_ = fn(__VA_ARGS__);                \
    if (rc_ != CAIRN_OK) cairn_die(#fn, rc_); \
  } while (0)

static void fail(const char *msg) {
  if (g_rank == 0) fprintf(stderr, "nbody: %s\n", msg);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: nbody [--particles N] [--steps S] [--every K] [--dt D] [--seed X]\n"
          "             [--sleep-ms M] [--config PATH]\n"
          "  --particles N  number of particles (default 512)\n"
          "  --steps S      total steps (default 2000)\n"
          "  --every K      checkpoint every K steps, 0 = never (default 100)\n"
          "  --dt D         time step (default 0.005)\n"
          "  --seed X       seed of the initial conditions (default 1)\n"
          "  --sleep-ms M   sleep M ms per step, for demos (default 0)\n"
          "  --config PATH  cairn configuration file (default none)\n"
          "Threads: OMP_NUM_THREADS (results depend on thread timing when > 1).\n");
}

static long long parse_count(const char *opt, const char *s, long long min) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min) {
    if (g_rank == 0)
      fprintf(stderr, "nbody: invalid value '%s' for %s (an integer >= %lld)\n", s, opt, min);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
  }
  return v;
}

static double parse_positive(const char *opt, const char *s) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !(v > 0.0) || !isfinite(v)) {
    if (g_rank == 0) fprintf(stderr, "nbody: invalid value '%s' for %s (a number > 0)\n", s, opt);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
  }
  return v;
}

typedef struct options {
  long long particles, steps, every, seed, sleep_ms;
  double dt;
  const char *config;
} options_t;

static void parse_options(int argc, char **argv, options_t *o) {
  o->particles = 512;
  o->steps = 2000;
  o->every = 100;
  o->seed = 1;
  o->sleep_ms = 0;
  o->dt = 0.005;
  o->config = NULL;
  for (int i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      if (g_rank == 0) usage(stdout);
      MPI_Finalize();
      exit(0);
    }
    const char *eq = strchr(arg, '=');
    size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(name_len < 63 ? name_len : 63), arg);
    const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
#define OPT_IS(s) (strlen(s) == name_len && strncmp(arg, s, name_len) == 0)
    long long *target = NULL;
    long long min = 0;
    int is_dt = 0;
    if (OPT_IS("--particles")) {
      target = &o->particles;
      min = 2;
    } else if (OPT_IS("--steps")) {
      target = &o->steps;
    } else if (OPT_IS("--every")) {
      target = &o->every;
    } else if (OPT_IS("--seed")) {
      target = &o->seed;
    } else if (OPT_IS("--sleep-ms")) {
      target = &o->sleep_ms;
    } else if (OPT_IS("--dt")) {
      is_dt = 1;
    } else if (!OPT_IS("--config")) {
      if (g_rank == 0) {
        fprintf(stderr, "nbody: unknown option '%s'\n", arg);
        usage(stderr);
      }
      MPI_Abort(MPI_COMM_WORLD, 1);
      exit(1);
    }
#undef OPT_IS
    if (value == NULL) {
      if (g_rank == 0) fprintf(stderr, "nbody: option %s needs a value\n", arg);
      MPI_Abort(MPI_COMM_WORLD, 1);
      exit(1);
    }
    if (target)
      *target = parse_count(name, value, min);
    else if (is_dt)
      o->dt = parse_positive(name, value);
    else
      o->config = value;
    if (!eq) ++i;
  }
}

static void sleep_ms(long long ms) {
  if (ms <= 0) return;
  struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = (const unsigned char *)data;
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static double uniform(uint64_t *s) { return (double)(splitmix64(s) >> 11) * 0x1.0p-52 - 1.0; }

/* A point uniform in the ball of radius r (rejection sampling). */
static void in_ball(uint64_t *s, double r, double out[3]) {
  double x, y, z;
  do {
    x = uniform(s);
    y = uniform(s);
    z = uniform(s);
  } while (x * x + y * y + z * z >= 1.0);
  out[0] = r * x;
  out[1] = r * y;
  out[2] = r * z;
}

/* Accelerations of particles [first, first + n) from all N particles, summed
 * in an order that depends on thread timing (see the top of the file). */
static void accelerations(long long N, long long first, long long n, const double *pos, double *acc) {
  const double m = 1.0 / (double)N, eps2 = EPS * EPS;
  memset(acc, 0, (size_t)n * 3 * sizeof(double));
#pragma omp parallel for schedule(dynamic, 1)
  for (long long j = 0; j < N; ++j) {
    const double xj = pos[3 * j], yj = pos[3 * j + 1], zj = pos[3 * j + 2];
    for (long long i = 0; i < n; ++i) {
      if (first + i == j) continue;
      const double *xi = pos + 3 * (first + i);
      const double dx = xj - xi[0], dy = yj - xi[1], dz = zj - xi[2];
      const double r2 = dx * dx + dy * dy + dz * dz + eps2;
      const double s = m / (r2 * sqrt(r2));
#pragma omp atomic
      acc[3 * i] += s * dx;
#pragma omp atomic
      acc[3 * i + 1] += s * dy;
#pragma omp atomic
      acc[3 * i + 2] += s * dz;
    }
  }
}

/* Total energy (kinetic + softened potential) of all particles; every rank
 * gets it. Deterministic for a given state (fixed summation order). */
static double energy(long long N, long long first, long long n, const double *pos, const double *vel) {
  const double m = 1.0 / (double)N, eps2 = EPS * EPS;
  double e = 0.0;
  for (long long i = 0; i < n; ++i) {
    const double *v = vel + 3 * i;
    e += 0.5 * m * (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    const double *xi = pos + 3 * (first + i);
    for (long long j = 0; j < N; ++j) {
      if (j == first + i) continue;
      const double dx = pos[3 * j] - xi[0], dy = pos[3 * j + 1] - xi[1], dz = pos[3 * j + 2] - xi[2];
      e -= 0.5 * m * m / sqrt(dx * dx + dy * dy + dz * dz + eps2);
    }
  }
  double total = 0.0;
  MPI_Allreduce(&e, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

int main(int argc, char **argv) {
  int provided = 0;
  /* Only the main thread calls MPI. */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int rank = g_rank;

  options_t opt;
  parse_options(argc, argv, &opt);
  const long long N = opt.particles;
  if (N < size) fail("--particles is smaller than the number of ranks");
  if (N > (long long)(INT32_MAX / 3)) fail("--particles too large");

  /* Particle slice of this rank: the first `rem` ranks get one more. */
  const long long base = N / size, rem = N % size;
  const long long n = base + (rank < rem ? 1 : 0);
  const long long first = rank * base + (rank < rem ? rank : rem);
  int *counts = malloc((size_t)size * sizeof(int));
  int *displs = malloc((size_t)size * sizeof(int));
  double *pos = malloc((size_t)N * 3 * sizeof(double)); /* all particles (gathered) */
  double *vel = malloc((size_t)n * 3 * sizeof(double)); /* this rank's particles */
  double *acc = malloc((size_t)n * 3 * sizeof(double));
  if (!counts || !displs || !pos || !vel || !acc) fail("out of memory");
  for (int r = 0; r < size; ++r) {
    counts[r] = (int)(3 * (base + (r < rem ? 1 : 0)));
    displs[r] = (int)(3 * (r * base + (r < rem ? r : rem)));
  }

  /* Deterministic initial conditions, one stream per global particle index. */
  for (long long g = 0; g < N; ++g) {
    uint64_t s = (uint64_t)opt.seed * UINT64_C(0x100000001b3) + (uint64_t)g;
    double v[3];
    in_ball(&s, 1.0, pos + 3 * g);
    in_ball(&s, V0, v);
    if (g >= first && g < first + n) memcpy(vel + 3 * (g - first), v, sizeof v);
  }
  int64_t state[STATE_LEN] = {0, N, opt.seed};
  const int threads = omp_get_max_threads();

  if (rank == 0) {
    printf("nbody: %lld particles, %d ranks, %d threads, %lld steps, dt %g, ", N, size, threads,
           opt.steps, opt.dt);
    if (opt.every > 0)
      printf("checkpoint every %lld\n", opt.every);
    else
      printf("no checkpoints\n");
    fflush(stdout);
  }

  cairn_t *c = NULL;
  CAIRN_CHECK(cairn_init_mpi, MPI_COMM_WORLD, opt.config, &c);
  const uint64_t global_shape[2] = {(uint64_t)N, 3};
  const uint64_t block_start[2] = {(uint64_t)first, 0};
  const uint64_t block_count[2] = {(uint64_t)n, 3};
  const uint64_t pos_mem_shape[2] = {(uint64_t)N, 3};
  CAIRN_CHECK(cairn_protect_block, c, "pos", pos, CAIRN_FLOAT64, 2, global_shape, block_start,
              block_count, pos_mem_shape, block_start, 0);
  CAIRN_CHECK(cairn_protect_block, c, "vel", vel, CAIRN_FLOAT64, 2, global_shape, block_start,
              block_count, NULL, NULL, 0);
  CAIRN_CHECK(cairn_protect, c, "step", state, (size_t)STATE_LEN, CAIRN_INT64);

  /* Energy of the initial conditions (for the drift shown at the end). */
  const double e0 = energy(N, first, n, pos, vel);

  int64_t version = -1;
  int rc = cairn_restart_test(c, CKPT_NAME, &version);
  if (rc == CAIRN_OK) {
    CAIRN_CHECK(cairn_restart, c, CKPT_NAME, version);
    if (state[STATE_N] != N || state[STATE_SEED] != opt.seed) {
      if (rank == 0)
        fprintf(stderr,
                "nbody: checkpoint version %" PRId64 " has %" PRId64 " particles and seed %" PRId64
                ", not %lld and %lld: rerun with the same options or remove the store\n",
                version, state[STATE_N], state[STATE_SEED], N, opt.seed);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (state[STATE_STEP] > opt.steps) {
      if (rank == 0)
        fprintf(stderr, "nbody: checkpoint version %" PRId64 " is at step %" PRId64 ", beyond --steps %lld\n",
                version, state[STATE_STEP], opt.steps);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
      printf("nbody: restarted from version %" PRId64 " (step %" PRId64 ")\n", version, state[STATE_STEP]);
      fflush(stdout);
    }
  } else if (rc == CAIRN_ENOTFOUND) {
    if (rank == 0) {
      printf("nbody: starting from scratch\n");
      fflush(stdout);
    }
  } else {
    cairn_die("cairn_restart_test", rc);
  }

  for (long long step = state[STATE_STEP] + 1; step <= opt.steps; ++step) {
    /* Every rank's own rows of pos are current; gather the others. */
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, pos, counts, displs, MPI_DOUBLE,
                   MPI_COMM_WORLD);
    accelerations(N, first, n, pos, acc);
    for (long long k = 0; k < 3 * n; ++k) {
      vel[k] += opt.dt * acc[k];
      pos[3 * first + k] += opt.dt * vel[k];
    }
    sleep_ms(opt.sleep_ms);

    if (opt.every > 0 && step % opt.every == 0) {
      state[STATE_STEP] = step;
      rc = cairn_checkpoint(c, CKPT_NAME, (int64_t)step);
      if (rc == CAIRN_EAGAIN) {
        if (rank == 0) {
          printf("nbody: checkpoint version %lld skipped (staging memory full)\n", step);
          fflush(stdout);
        }
      } else if (rc == CAIRN_EDIVERGED) {
        /* Online comparison with a reference run (on_divergence = stop): every
         * rank gets this at the same checkpoint, so all leave the loop together. */
        cairn_divergence_t d;
        if (cairn_divergence(c, &d) == CAIRN_OK && rank == 0) {
          printf("nbody: diverged from the reference at version %lld (rank %d, region '%s', element %llu: %s vs %s); "
                 "stopping at step %lld\n",
                 (long long)d.version, d.rank, d.region, (unsigned long long)d.index, d.value, d.reference, step);
          fflush(stdout);
        }
        opt.steps = step;
        break;
      } else if (rc != CAIRN_OK && rc != CAIRN_EEARLIER) {
        cairn_die("cairn_checkpoint", rc);
      } else if (rank == 0) {
        /* CAIRN_EEARLIER: this version was taken; an earlier one failed. */
        if (rc == CAIRN_EEARLIER) fprintf(stderr, "nbody: warning: %s\n", cairn_last_error());
        printf("nbody: checkpoint version %lld\n", step);
        fflush(stdout);
      }
    }
  }

  CAIRN_CHECK(cairn_finalize, &c, 1);

  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, pos, counts, displs, MPI_DOUBLE, MPI_COMM_WORLD);
  const double e1 = energy(N, first, n, pos, vel);

  /* Checksum of pos (global order, every rank has it) then vel (passed along
   * the ranks in order, each continuing the FNV-1a state over its rows). */
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  if (rank == 0)
    h = fnv1a(h, pos, (size_t)N * 3 * sizeof(double));
  else
    MPI_Recv(&h, 1, MPI_UINT64_T, rank - 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  h = fnv1a(h, vel, (size_t)n * 3 * sizeof(double));
  if (size > 1) {
    if (rank < size - 1)
      MPI_Send(&h, 1, MPI_UINT64_T, rank + 1, 2, MPI_COMM_WORLD);
    else
      MPI_Send(&h, 1, MPI_UINT64_T, 0, 3, MPI_COMM_WORLD);
    if (rank == 0) MPI_Recv(&h, 1, MPI_UINT64_T, size - 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }

  if (rank == 0) {
    printf("nbody: steps %lld\n", opt.steps);
    printf("nbody: energy %.12g (initial %.12g, relative change %.3g)\n", e1, e0, (e1 - e0) / fabs(e0));
    printf("nbody: final checksum %016" PRIx64 "\n", h);
    fflush(stdout);
  }

  free(counts);
  free(displs);
  free(pos);
  free(vel);
  free(acc);
  MPI_Finalize();
  return 0;
}

/* ckpt_app: deterministic MPI test application for the integration and fault
 * tests (tests/integration, tests/fault). Built twice from this file:
 *   ckpt_app         with MPI (cairn_init_mpi); --serial uses cairn_init and
 *                    never calls MPI at all
 *   ckpt_app_serial  compiled with CKPT_NO_MPI: no <mpi.h>, always cairn_init
 *
 * State of each rank (checkpoint "ckpt", version = completed steps):
 *   "field"  FLOAT64[bytes / 8]     x = x * c + 1 / (1 + i + s + r) + coupling
 *   "ints"   INT32[25 x 40] shaped  LCG per element, mixed with s and r
 *   "bytes"  UINT8[777]             xor with a pattern of s, i, r
 *   "step"   INT64                  completed steps
 * where s is the step being computed and r the rank (--variant K adds K to
 * the "bytes" pattern: the same sizes, another history). "coupling" is the global
 * (MPI_Allreduce) integer sum of ints[0] of every rank, so the state of a rank
 * depends on all ranks; integer sums are exact, so runs are bit-reproducible.
 *
 * The raw bytes of the regions in the order step, field, ints, bytes are what
 * the dump options write (one file per rank, FILE.<rank>) and what the final
 * hash covers (FNV-1a 64 of each rank's bytes, combined in rank order).
 *
 * Output (rank 0 unless stated): "starting from scratch" | "restarted from
 * version V"; with --wait-persistent, per rank "rank R wait V rc=C"; with
 * --keep-going, per rank "rank R checkpoint V rc=C msg=M" for a failed
 * checkpoint and "rank R finalize rc=C msg=M" for a failed finalize;
 * "final hash <16 hex>" and "steps N".
 *
 * File mode (--file-mode): the same bytes are written to a routed file
 * "state.bin" between cairn_checkpoint_begin/_end and read back between
 * cairn_restart_begin/_end; no region is protected.
 *
 * --pause-after V FILE (repeatable): after checkpoint V (and its
 * --wait-persistent), each rank creates FILE.ready.<rank> and waits for FILE,
 * so a test can change the levels (or the agents) under a running job.
 *
 * Agents: --wait-protected waits for CAIRN_LEVEL_PROTECTED after every
 * checkpoint and prints per rank "rank R protected V rc=C"; --probe calls
 * cairn_probe after every checkpoint (and pause) and prints "probe V change=C";
 * --wait-captured waits for CAIRN_LEVEL_CAPTURED before the state changes
 * again (what agents_lend asks of an application).
 *
 * --finalize-nowait: cairn_finalize(&c, 0) (versions still pending are
 * abandoned) instead of cairn_finalize(&c, 1); prints "finalize took S s".
 *
 * --fresh-on-error: an application written like VELOC's examples: any error of
 * cairn_restart_test prints per rank "rank R restart_test rc=C msg=M" and the
 * run starts from scratch.
 *
 * --pause-before-restart FILE: after cairn_restart_test found a version, each
 * rank writes FILE.ready.<rank> and waits (up to 60 s) until FILE exists, then
 * calls cairn_restart (a test breaks a level meanwhile).
 *
 * --bad-restart size|type|extra: after cairn_restart_test found a version,
 * protect one region wrongly (one element more / another type / a region the
 * checkpoint lacks), fill every buffer with a sentinel, call cairn_restart and
 * print per rank "rank R bad restart rc=C untouched=0|1 msg=M"; then protect
 * the regions correctly again and restart as usual.
 *
 * --die-after V: once cairn_checkpoint(V) returned on every rank (a barrier,
 * no cairn call in between), every rank kills itself with SIGKILL: the whole
 * application dies right after the checkpoint (engine_host = daemon tests).
 * With --silence-ms MS the ranks first compute for MS milliseconds without
 * any cairn call (the version must be committed meanwhile), then a barrier,
 * then the kill.
 *
 * Batch jobs: --on-warning asks cairn_should_checkpoint after every step; when
 * it says yes the step is checkpointed (whatever --every says), waited for at
 * the persistent level, and rank 0 prints "warning checkpoint V durable in S s
 * left L s" (L: cairn_time_left, "inf" when unknown); the run then goes on
 * without checkpoints (as an application that ends its work would), so that
 * the batch system kills it at the time limit with that version the newest.
 * Rank 0 prints "node N" with SLURMD_NODENAME of every rank ("-" when unset),
 * in rank order, after init.
 *
 * Exit status: 0 on success, 1 on any unexpected error (message on stderr).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cairn.h"
#ifndef CKPT_NO_MPI
#include <mpi.h>

#include "cairn_mpi.h"
#endif

#define CKPT_NAME "ckpt"
#define NINTS_ROWS 25
#define NINTS_COLS 40
#define NINTS (NINTS_ROWS * NINTS_COLS)
#define NBYTES 777
#define MAX_DUMP_AT 16

typedef struct options {
  long long steps, every, bytes, sleep_ms;
  const char *config;
  const char *dump_restored;
  const char *dump_every; /* prefix: PREFIX.v<V>.<rank> after each checkpoint */
  long long dump_at_version[MAX_DUMP_AT];
  const char *dump_at_file[MAX_DUMP_AT];
  int ndump_at;
  long long variant; /* changes the evolution (not the sizes): another "timeline" */
  int wait_persistent, keep_going, serial, file_mode, fresh_on_error;
  const char *bad_restart;
  const char *pause_before_restart;   /* --pause-before-restart FILE */
  int npause;                         /* --pause-after V FILE, repeatable */
  long long pause_after[MAX_DUMP_AT];
  const char *pause_file[MAX_DUMP_AT];
  int probe;                          /* --probe */
  int wait_protected;                 /* --wait-protected */
  int wait_captured;                  /* --wait-captured */
  int finalize_nowait;                /* --finalize-nowait */
  int on_warning;                     /* --on-warning */
  int advice;                         /* --advice: print cairn_advice before the first and after the last checkpoint */
  long long die_after;                /* --die-after V (0: never) */
  long long silence_ms;               /* --silence-ms MS: before the --die-after kill */
} options_t;

typedef struct state {
  int64_t step;
  double *field;
  size_t nfield;
  int32_t ints[NINTS];
  uint8_t bytes[NBYTES];
} state_t;

#ifndef CKPT_NO_MPI
static int g_mpi = 0; /* MPI initialised and used */
#endif
static int g_rank = 0, g_size = 1;

static void print_advice(cairn_t *c, const char *when) {
  cairn_advice_t a;
  int rc = cairn_advice(c, &a);
  printf("rank %d advice %s rc=%d interval=%.9g young=%.9g cost=%.9g mtbf=%.9g checkpoints=%lld msg=%s\n", g_rank,
         when, rc, a.interval_s, a.young_s, a.cost_s, a.mtbf_s, (long long)a.checkpoints,
         rc != CAIRN_OK && cairn_last_error() ? cairn_last_error() : "");
  fflush(stdout);
}

static void finish_mpi(void) {
#ifndef CKPT_NO_MPI
  if (g_mpi) MPI_Finalize();
#endif
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ckpt_app: rank %d: ", g_rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stdout);
  fflush(stderr);
#ifndef CKPT_NO_MPI
  if (g_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
  exit(1);
}

static void cairn_fail(const char *what, int rc) {
  const char *msg = cairn_last_error();
  fail("%s failed: %s (%d): %s", what, cairn_strerror(rc), rc, msg ? msg : "");
}

static long long parse_ll(const char *opt, const char *s, long long min) {
  char *end = NULL;
  errno = 0;
  long long v = s ? strtoll(s, &end, 10) : 0;
  if (!s || errno || end == s || *end || v < min) fail("invalid value '%s' for %s (integer >= %lld)", s ? s : "", opt, min);
  return v;
}

static void parse_options(int argc, char **argv, options_t *o) {
  memset(o, 0, sizeof *o);
  o->steps = 10;
  o->every = 2;
  o->bytes = 64 * 1024;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE() (++i, next)
    if (!strcmp(a, "--steps")) o->steps = parse_ll(a, TAKE(), 0);
    else if (!strcmp(a, "--every")) o->every = parse_ll(a, TAKE(), 1);
    else if (!strcmp(a, "--bytes")) o->bytes = parse_ll(a, TAKE(), 8);
    else if (!strcmp(a, "--sleep-ms")) o->sleep_ms = parse_ll(a, TAKE(), 0);
    else if (!strcmp(a, "--variant")) o->variant = parse_ll(a, TAKE(), 0);
    else if (!strcmp(a, "--config")) o->config = TAKE();
    else if (!strcmp(a, "--dump-restored")) o->dump_restored = TAKE();
    else if (!strcmp(a, "--dump-every")) o->dump_every = TAKE();
    else if (!strcmp(a, "--dump-at")) {
      if (o->ndump_at == MAX_DUMP_AT) fail("at most %d --dump-at options", MAX_DUMP_AT);
      if (i + 2 >= argc) fail("--dump-at needs V FILE");
      o->dump_at_version[o->ndump_at] = parse_ll(a, argv[++i], 0);
      o->dump_at_file[o->ndump_at] = argv[++i];
      ++o->ndump_at;
    } else if (!strcmp(a, "--wait-persistent")) o->wait_persistent = 1;
    else if (!strcmp(a, "--keep-going")) o->keep_going = 1;
    else if (!strcmp(a, "--fresh-on-error")) o->fresh_on_error = 1;
    else if (!strcmp(a, "--serial")) o->serial = 1;
    else if (!strcmp(a, "--file-mode")) o->file_mode = 1;
    else if (!strcmp(a, "--bad-restart")) o->bad_restart = TAKE();
    else if (!strcmp(a, "--pause-before-restart")) o->pause_before_restart = TAKE();
    else if (!strcmp(a, "--pause-after")) {
      if (i + 2 >= argc) fail("--pause-after needs V FILE");
      if (o->npause == MAX_DUMP_AT) fail("at most %d --pause-after options", MAX_DUMP_AT);
      o->pause_after[o->npause] = parse_ll(a, argv[++i], 1);
      o->pause_file[o->npause] = argv[++i];
      ++o->npause;
    }
    else if (!strcmp(a, "--probe")) o->probe = 1;
    else if (!strcmp(a, "--wait-protected")) o->wait_protected = 1;
    else if (!strcmp(a, "--finalize-nowait")) o->finalize_nowait = 1;
    else if (!strcmp(a, "--wait-captured")) o->wait_captured = 1;
    else if (!strcmp(a, "--on-warning")) o->on_warning = 1;
    else if (!strcmp(a, "--advice")) o->advice = 1;
    else if (!strcmp(a, "--die-after")) o->die_after = parse_ll(a, TAKE(), 1);
    else if (!strcmp(a, "--silence-ms")) o->silence_ms = parse_ll(a, TAKE(), 0);
    else fail("unknown option '%s'", a);
#undef TAKE
    if (i >= argc) fail("option '%s' needs a value", a);
  }
  if (o->bad_restart && strcmp(o->bad_restart, "size") && strcmp(o->bad_restart, "type") &&
      strcmp(o->bad_restart, "extra"))
    fail("--bad-restart takes size, type or extra");
}

/* ---- deterministic state ------------------------------------------------ */

/* The state of step 0 (also after a restart that failed part-way wrote into it). */
static void state_fill(state_t *st) {
  st->step = 0;
  for (size_t i = 0; i < st->nfield; ++i) st->field[i] = (double)(g_rank + 1) + (double)i * 0.001;
  for (int i = 0; i < NINTS; ++i) st->ints[i] = (int32_t)(i * 7 + g_rank * 1000);
  for (int i = 0; i < NBYTES; ++i) st->bytes[i] = (uint8_t)(i + g_rank * 13);
}

static void state_init(state_t *st, long long bytes) {
  st->nfield = (size_t)bytes / sizeof(double);
  st->field = malloc(st->nfield * sizeof(double));
  if (!st->field) fail("out of memory");
  state_fill(st);
}

static int64_t global_sum(int64_t v) {
#ifndef CKPT_NO_MPI
  if (g_mpi) {
    int64_t out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return out;
  }
#endif
  return v;
}

static void state_step(state_t *st, long long variant) {
  const int64_t s = st->step + 1;
  const int64_t coupling = global_sum(st->ints[0]);
  const double c = 0.9990234375;
  for (size_t i = 0; i < st->nfield; ++i) {
    double x = st->field[i] * c + 1.0 / (1.0 + (double)i + (double)s + (double)g_rank);
    if (i % 64 == 0) x += (double)(coupling % 1000) * 1e-6;
    st->field[i] = x;
  }
  for (int i = 0; i < NINTS; ++i) {
    uint32_t u = (uint32_t)st->ints[i];
    u = u * 1103515245u + 12345u + (uint32_t)s + (uint32_t)g_rank * 7u + (uint32_t)coupling;
    st->ints[i] = (int32_t)u;
  }
  for (int i = 0; i < NBYTES; ++i) st->bytes[i] ^= (uint8_t)(s * 31 + i + g_rank + variant);
  st->step = s;
}

/* The state's bytes in dump order: step, field, ints, bytes. */
static size_t state_size(const state_t *st) {
  return sizeof st->step + st->nfield * sizeof(double) + sizeof st->ints + sizeof st->bytes;
}

static void state_serialize(const state_t *st, unsigned char *out) {
  memcpy(out, &st->step, sizeof st->step);
  out += sizeof st->step;
  memcpy(out, st->field, st->nfield * sizeof(double));
  out += st->nfield * sizeof(double);
  memcpy(out, st->ints, sizeof st->ints);
  out += sizeof st->ints;
  memcpy(out, st->bytes, sizeof st->bytes);
}

static void state_deserialize(state_t *st, const unsigned char *in) {
  memcpy(&st->step, in, sizeof st->step);
  in += sizeof st->step;
  memcpy(st->field, in, st->nfield * sizeof(double));
  in += st->nfield * sizeof(double);
  memcpy(st->ints, in, sizeof st->ints);
  in += sizeof st->ints;
  memcpy(st->bytes, in, sizeof st->bytes);
}

static void write_file(const char *path, const unsigned char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) fail("cannot open %s: %s", path, strerror(errno));
  if (n && fwrite(data, 1, n, f) != n) fail("cannot write %s: %s", path, strerror(errno));
  if (fclose(f) != 0) fail("cannot close %s: %s", path, strerror(errno));
}

/* The serialized state (the bytes the final hash covers) into `path`. */
static void write_state(const state_t *st, const char *path) {
  size_t n = state_size(st);
  unsigned char *buf = malloc(n);
  if (!buf) fail("out of memory");
  state_serialize(st, buf);
  write_file(path, buf, n);
  free(buf);
}

static void dump_state(const state_t *st, const char *file) {
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", file, g_rank);
  write_state(st, path);
}

static uint64_t fnv1a(const unsigned char *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static const uint64_t kFnvBasis = 14695981039346656037ull;

static void print_final_hash(const state_t *st) {
  size_t n = state_size(st);
  unsigned char *buf = malloc(n);
  if (!buf) fail("out of memory");
  state_serialize(st, buf);
  uint64_t mine = fnv1a(buf, n, kFnvBasis);
  free(buf);
  uint64_t *all = calloc((size_t)g_size, sizeof *all);
  if (!all) fail("out of memory");
  all[0] = mine;
#ifndef CKPT_NO_MPI
  if (g_mpi) MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
#endif
  if (g_rank == 0) {
    uint64_t h = fnv1a((const unsigned char *)all, (size_t)g_size * sizeof *all, kFnvBasis);
    printf("final hash %016" PRIx64 "\n", h);
  }
  free(all);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(long long ms) {
  if (ms <= 0) return;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* --pause-after: tells the test that this rank is paused (FILE.ready.<rank>)
 * and waits up to 60 s for FILE to appear. */
static void pause_for_test(const char *file) {
  char ready[4096];
  snprintf(ready, sizeof ready, "%s.ready.%d", file, g_rank);
  write_file(ready, (const unsigned char *)"", 0);
  for (int i = 0; i < 6000; ++i) {
    FILE *f = fopen(file, "rb");
    if (f) {
      fclose(f);
      return;
    }
    sleep_ms(10);
  }
  fail("test pause: %s did not appear within 60 s", file);
}

/* ---- cairn --------------------------------------------------------------- */

static void protect_all(cairn_t *c, state_t *st) {
  static const uint64_t dims[2] = {NINTS_ROWS, NINTS_COLS};
  int rc;
  if ((rc = cairn_protect(c, "step", &st->step, 1, CAIRN_INT64)) != CAIRN_OK) cairn_fail("cairn_protect(step)", rc);
  if ((rc = cairn_protect(c, "field", st->field, st->nfield, CAIRN_FLOAT64)) != CAIRN_OK)
    cairn_fail("cairn_protect(field)", rc);
  if ((rc = cairn_protect_shaped(c, "ints", st->ints, CAIRN_INT32, 2, dims, 0)) != CAIRN_OK)
    cairn_fail("cairn_protect_shaped(ints)", rc);
  if ((rc = cairn_protect(c, "bytes", st->bytes, NBYTES, CAIRN_UINT8)) != CAIRN_OK) cairn_fail("cairn_protect(bytes)", rc);
}

/* Checkpoint `version`; returns the cairn return code. */
static int take_checkpoint(cairn_t *c, const options_t *o, state_t *st, int64_t version) {
  if (!o->file_mode) return cairn_checkpoint(c, CKPT_NAME, version);
  int rc = cairn_checkpoint_begin(c, CKPT_NAME, version);
  if (rc != CAIRN_OK) return rc;
  char path[4096];
  rc = cairn_route_file(c, "state.bin", path, sizeof path);
  if (rc != CAIRN_OK) cairn_fail("cairn_route_file", rc);
  write_state(st, path);
  /* A second, small file, to check that several files round-trip. */
  rc = cairn_route_file(c, "dir/step.txt", path, sizeof path);
  if (rc != CAIRN_OK) cairn_fail("cairn_route_file", rc);
  char text[64];
  int len = snprintf(text, sizeof text, "%lld\n", (long long)st->step);
  write_file(path, (const unsigned char *)text, (size_t)len);
  return cairn_checkpoint_end(c, 1);
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) fail("cannot open %s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc(len > 0 ? (size_t)len : 1);
  if (!buf) fail("out of memory");
  if (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len) fail("cannot read %s", path);
  fclose(f);
  *n = (size_t)len;
  return buf;
}

/* CAIRN_OK, or CAIRN_ECORRUPT when every copy of the version was found
 * damaged while cairn_restart read it (restart_verify = while): the caller
 * asks cairn_restart_test again, as cairn.h says. */
static int restore(cairn_t *c, const options_t *o, state_t *st, int64_t version) {
  int rc;
  if (!o->file_mode) {
    rc = cairn_restart(c, CKPT_NAME, version);
    if (rc != CAIRN_OK && rc != CAIRN_ECORRUPT) cairn_fail("cairn_restart", rc);
    return rc;
  }
  if ((rc = cairn_restart_begin(c, CKPT_NAME, version)) != CAIRN_OK) cairn_fail("cairn_restart_begin", rc);
  char path[4096];
  if ((rc = cairn_route_file(c, "state.bin", path, sizeof path)) != CAIRN_OK) cairn_fail("cairn_route_file", rc);
  size_t n = 0;
  unsigned char *buf = read_file(path, &n);
  if (n != state_size(st)) fail("restored state.bin has %zu bytes, expected %zu", n, state_size(st));
  state_deserialize(st, buf);
  free(buf);
  if ((rc = cairn_route_file(c, "step.txt", path, sizeof path)) != CAIRN_OK) cairn_fail("cairn_route_file", rc);
  buf = read_file(path, &n);
  char text[64];
  snprintf(text, sizeof text, "%lld\n", (long long)st->step);
  if (n != strlen(text) || memcmp(buf, text, n) != 0) fail("restored step.txt does not hold the step %s", text);
  free(buf);
  /* A file that was never checkpointed is not found. */
  if ((rc = cairn_route_file(c, "missing.bin", path, sizeof path)) != CAIRN_ENOTFOUND)
    fail("cairn_route_file(missing.bin) returned %d, expected CAIRN_ENOTFOUND", rc);
  if ((rc = cairn_restart_end(c, 1)) != CAIRN_OK) cairn_fail("cairn_restart_end", rc);
  return CAIRN_OK;
}

/* --bad-restart: a wrongly protected region must give CAIRN_EINVAL and leave
 * every buffer untouched. */
/* Rank 0 prints every rank's SLURMD_NODENAME ("-" when unset), in rank order. */
static void print_nodes(void) {
  char mine[64];
  const char *n = getenv("SLURMD_NODENAME");
  snprintf(mine, sizeof mine, "%s", n && *n ? n : "-");
#ifndef CKPT_NO_MPI
  if (g_mpi) {
    char all[64 * 64];
    if (g_size > 64) fail("--on-warning prints nodes of at most 64 ranks");
    MPI_Gather(mine, 64, MPI_CHAR, all, 64, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (g_rank == 0)
      for (int r = 0; r < g_size; ++r) printf("node %s\n", all + 64 * r);
    fflush(stdout);
    return;
  }
#endif
  printf("node %s\n", mine);
  fflush(stdout);
}

static void bad_restart(cairn_t *c, const options_t *o, state_t *st, int64_t version) {
  const unsigned char sentinel = 0xA5;
  int32_t big[NINTS + 1];
  double wrong_type[NINTS / 2]; /* same byte count as ints, other type */
  int32_t extra[8];
  int rc = CAIRN_OK;
  if (!strcmp(o->bad_restart, "size")) rc = cairn_protect(c, "ints", big, NINTS + 1, CAIRN_INT32);
  else if (!strcmp(o->bad_restart, "type")) rc = cairn_protect(c, "ints", wrong_type, NINTS / 2, CAIRN_FLOAT64);
  else rc = cairn_protect(c, "extra", extra, 8, CAIRN_INT32);
  if (rc != CAIRN_OK) cairn_fail("cairn_protect (bad restart)", rc);

  memset(&st->step, sentinel, sizeof st->step);
  memset(st->field, sentinel, st->nfield * sizeof(double));
  memset(st->ints, sentinel, sizeof st->ints);
  memset(st->bytes, sentinel, sizeof st->bytes);
  memset(big, sentinel, sizeof big);
  memset(wrong_type, sentinel, sizeof wrong_type);
  memset(extra, sentinel, sizeof extra);

  rc = cairn_restart(c, CKPT_NAME, version);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", rc != CAIRN_OK && cairn_last_error() ? cairn_last_error() : "");

  int untouched = 1;
#define CHECK_BUF(p, n)                                                      \
  for (size_t k_ = 0; k_ < (n); ++k_)                                        \
    if (((const unsigned char *)(p))[k_] != sentinel) {                      \
      untouched = 0;                                                         \
      break;                                                                 \
    }
  CHECK_BUF(&st->step, sizeof st->step);
  CHECK_BUF(st->field, st->nfield * sizeof(double));
  CHECK_BUF(st->ints, sizeof st->ints);
  CHECK_BUF(st->bytes, sizeof st->bytes);
  CHECK_BUF(big, sizeof big);
  CHECK_BUF(wrong_type, sizeof wrong_type);
  CHECK_BUF(extra, sizeof extra);
#undef CHECK_BUF
  printf("rank %d bad restart rc=%d untouched=%d msg=%s\n", g_rank, rc, untouched, msg);
  fflush(stdout);

  /* Put the protection right again: the caller then restores normally. */
  if (!strcmp(o->bad_restart, "extra")) rc = cairn_unprotect(c, "extra");
  else rc = cairn_protect_shaped(c, "ints", st->ints, CAIRN_INT32, 2, (const uint64_t[]){NINTS_ROWS, NINTS_COLS}, 0);
  if (rc != CAIRN_OK) cairn_fail("re-protecting after the bad restart", rc);
}

int main(int argc, char **argv) {
  options_t o;
#ifdef CKPT_NO_MPI
  parse_options(argc, argv, &o);
  o.serial = 1;
#else
  /* --serial must be known before deciding to initialise MPI. */
  int serial = 0;
  for (int i = 1; i < argc; ++i)
    if (!strcmp(argv[i], "--serial")) serial = 1;
  if (!serial) {
    MPI_Init(&argc, &argv);
    g_mpi = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  }
  parse_options(argc, argv, &o);
#endif

  cairn_t *c = NULL;
  int rc;
#ifndef CKPT_NO_MPI
  if (g_mpi) rc = cairn_init_mpi(MPI_COMM_WORLD, o.config, &c);
  else
#endif
    rc = cairn_init(o.config, &c);
  if (rc != CAIRN_OK) cairn_fail("cairn_init", rc);
  if (cairn_rank(c) != g_rank || cairn_size(c) != g_size)
    fail("cairn_rank/cairn_size say %d/%d, expected %d/%d", cairn_rank(c), cairn_size(c), g_rank, g_size);

  state_t st;
  state_init(&st, o.bytes);
  if (!o.file_mode) protect_all(c, &st);

  int64_t version = -1;
  rc = cairn_restart_test(c, CKPT_NAME, &version);
  if (rc == CAIRN_OK && o.bad_restart) bad_restart(c, &o, &st, version);
  if (rc == CAIRN_OK && o.pause_before_restart) pause_for_test(o.pause_before_restart);
  int restore_failed = 0;
  while (rc == CAIRN_OK && restore(c, &o, &st, version) == CAIRN_ECORRUPT) {
    if (g_rank == 0) printf("restart of version %lld failed: %s\n", (long long)version, cairn_last_error());
    restore_failed = 1;
    rc = cairn_restart_test(c, CKPT_NAME, &version);
  }
  if (rc != CAIRN_OK && restore_failed) state_fill(&st); /* the regions hold part of a damaged version */
  if (rc == CAIRN_OK) {
    if (st.step != version) fail("restored step %lld differs from the version %lld", (long long)st.step, (long long)version);
    if (g_rank == 0) printf("restarted from version %lld\n", (long long)version);
    if (o.dump_restored) dump_state(&st, o.dump_restored);
  } else if (rc == CAIRN_ENOTFOUND) {
    if (o.bad_restart) fail("--bad-restart needs a checkpoint to restart from");
    if (g_rank == 0) printf("starting from scratch\n");
  } else if (o.fresh_on_error) {
    printf("rank %d restart_test rc=%d msg=%s\n", g_rank, rc, cairn_last_error());
    if (g_rank == 0) printf("starting from scratch\n");
  } else {
    cairn_fail("cairn_restart_test", rc);
  }
  fflush(stdout);

  if (o.on_warning) print_nodes();
  int warned_once = 0;
  if (o.advice) print_advice(c, "before");
  while (st.step < o.steps) {
    state_step(&st, o.variant);
    sleep_ms(o.sleep_ms);
    int warned = 0;
    if (o.on_warning && (rc = cairn_should_checkpoint(c, &warned)) != CAIRN_OK) cairn_fail("cairn_should_checkpoint", rc);
    if (warned) warned_once = 1;
    else if (warned_once) continue; /* after the warning: no more checkpoints */
    if (st.step % o.every != 0 && !warned) continue;
    int64_t v = st.step;
    struct timespec w0;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    rc = take_checkpoint(c, &o, &st, v);
    if (rc != CAIRN_OK) {
      /* CAIRN_EEARLIER is a warning: this version was taken. */
      if (!o.keep_going && rc != CAIRN_EEARLIER) cairn_fail("cairn_checkpoint", rc);
      printf("rank %d checkpoint %lld rc=%d msg=%s\n", g_rank, (long long)v, rc, cairn_last_error());
      fflush(stdout);
      if (rc != CAIRN_EEARLIER) continue;
    }
    if (o.die_after == v) {
#ifndef CKPT_NO_MPI
      if (!o.serial) MPI_Barrier(MPI_COMM_WORLD);
#endif
      if (o.silence_ms > 0) {
        sleep_ms(o.silence_ms);
#ifndef CKPT_NO_MPI
        if (!o.serial) MPI_Barrier(MPI_COMM_WORLD);
#endif
      }
      raise(SIGKILL);
    }
    if (warned) {
      double left = 0;
      if ((rc = cairn_time_left(c, &left)) != CAIRN_OK) cairn_fail("cairn_time_left", rc);
      if ((rc = cairn_wait(c, CKPT_NAME, v, CAIRN_LEVEL_PERSISTENT)) != CAIRN_OK) cairn_fail("cairn_wait(PERSISTENT)", rc);
      struct timespec w1;
      clock_gettime(CLOCK_MONOTONIC, &w1);
      if (g_rank == 0) {
        char lt[32];
        if (left > 1e300) snprintf(lt, sizeof lt, "inf");
        else snprintf(lt, sizeof lt, "%.1f", left);
        printf("warning checkpoint %lld durable in %.3f s left %s s\n", (long long)v,
               (double)(w1.tv_sec - w0.tv_sec) + (double)(w1.tv_nsec - w0.tv_nsec) * 1e-9, lt);
      }
      fflush(stdout);
    }
    for (int i = 0; i < o.ndump_at; ++i)
      if (o.dump_at_version[i] == v) dump_state(&st, o.dump_at_file[i]);
    if (o.dump_every) {
      char prefix[4096];
      snprintf(prefix, sizeof prefix, "%s.v%lld", o.dump_every, (long long)v);
      dump_state(&st, prefix);
    }
    if (o.wait_captured) {
      /* agents_lend: the regions are the agents' to read until CAPTURED. */
      rc = cairn_wait(c, CKPT_NAME, v, CAIRN_LEVEL_CAPTURED);
      if (rc != CAIRN_OK) cairn_fail("cairn_wait(CAPTURED)", rc);
    }
    if (o.wait_persistent) {
      rc = cairn_wait(c, CKPT_NAME, v, CAIRN_LEVEL_PERSISTENT);
      printf("rank %d wait %lld rc=%d%s%s\n", g_rank, (long long)v, rc, rc ? " msg=" : "", rc ? cairn_last_error() : "");
      fflush(stdout);
      if (rc != CAIRN_OK && !o.keep_going) cairn_fail("cairn_wait", rc);
    }
    if (o.wait_protected) {
      rc = cairn_wait(c, CKPT_NAME, v, CAIRN_LEVEL_PROTECTED);
      printf("rank %d protected %lld rc=%d\n", g_rank, (long long)v, rc);
      fflush(stdout);
    }
    for (int i = 0; i < o.npause; ++i)
      if (v == o.pause_after[i]) pause_for_test(o.pause_file[i]);
    if (o.probe) {
      int change = -1;
      rc = cairn_probe(c, &change);
      if (rc != CAIRN_OK) cairn_fail("cairn_probe", rc);
      if (g_rank == 0) printf("probe %lld change=%d\n", (long long)v, change);
      fflush(stdout);
    }
  }

  if (o.advice) print_advice(c, "after");
  double fin0 = now_s();
  rc = cairn_finalize(&c, o.finalize_nowait ? 0 : 1);
  if (o.finalize_nowait && g_rank == 0) printf("finalize took %.3f s\n", now_s() - fin0);
  if (rc != CAIRN_OK) {
    if (!o.keep_going) cairn_fail("cairn_finalize", rc);
    printf("rank %d finalize rc=%d msg=%s\n", g_rank, rc, cairn_last_error());
  }
  if (c != NULL) fail("cairn_finalize did not reset the handle");
  print_final_hash(&st);
  if (g_rank == 0) printf("steps %lld\n", (long long)st.step);
  fflush(stdout);
  free(st.field);
  finish_mpi();
  return 0;
}

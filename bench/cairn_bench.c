/* cairn_bench: the core capability benchmark (capture, two-level flush, restart)
 * against the physical references measured in the same run.
 *
 * Every rank protects one region of --bytes bytes. In one execution it measures,
 * with barriers around every timed section and the maximum over ranks of each
 * timing (all ranks work at the same time, as they do in cairn):
 *
 *   memcpy_s        memcpy of the bytes into a pre-faulted buffer allocated as
 *                   cairn allocates staging (mmap, MADV_HUGEPAGE, every page
 *                   touched): the reference for the time blocked in capture
 *   write_direct_s  O_DIRECT write of the bytes to a new file in the persistent
 *                   directory, then fdatasync, issued as cairn's persistent stage
 *                   issues it (pwrites of up to 1 GiB from a staging-like
 *                   buffer): the best raw write of the same bytes, a reference
 *                   for the time to persistent (bench/run_core.py adds `dd
 *                   oflag=direct`, measured by the driver, as the headline one)
 *   per mode (--modes, default "thread,sync"; CAIRN_MODE is set per handle):
 *     first_blocked_s  the first cairn_checkpoint, --first-after-s S after
 *                      cairn_protect (the application's first compute phase;
 *                      default 3 s, 0 = at once), during which an engine task
 *                      makes the staging slots; excluded, with the untimed
 *                      checkpoints after it (at least --warmup K in all, for at
 *                      least --warmup-s S), from the timed ones
 *     blocked_s        time inside cairn_checkpoint, median over --checkpoints
 *     blocked_cpu_s    CPU time of the application thread inside cairn_checkpoint,
 *                      mean per checkpoint (busiest rank): blocked_s without the
 *                      waits for a core on a loaded machine (and for I/O)
 *     local_s          from the start of cairn_checkpoint until
 *                      cairn_wait(LOCAL) returns
 *     persistent_s     from the start of cairn_checkpoint until
 *                      cairn_wait(PERSISTENT) returns (the version committed)
 *     background_cpu_s CPU time of all threads but the application's, per
 *                      checkpoint, from the first timed checkpoint to the end
 *                      of cairn_finalize (getrusage): what cairn's engine takes
 *                      from the cores the application computes on (the
 *                      busiest rank; background_cpu_all_s: summed over ranks)
 *     stage times      from the version's MANIFEST (capture, checksum, hash tree,
 *                      local, persistent stage; max over shards) and the manifest
 *                      commit latency (committed_at - max persistent_at)
 *   restart, from the local level (tmpfs) and from the persistent level (local
 *   level hidden by pointing CAIRN_SCRATCH at an empty directory), each in a
 *   fresh handle, --reps times: cairn_restart_test + cairn_restart, against
 *   read(2) of the same bytes from a file in the same directory into the
 *   application buffer (medians); then, --first-after-s S after the restart,
 *   the execution's first cairn_checkpoint (first_checkpoint_s: its blocked
 *   time, against a later checkpoint's blocked_s). With --drop-caches rank 0 runs `sync; echo 3 >
 *   /proc/sys/vm/drop_caches` before each persistent-level read (cairn's and the
 *   reference's); without it, or if that fails (not root), both reads may be
 *   warm and the output says so ("cold": false).
 *   prefault_s      allocating and faulting in one buffer as cairn allocates a
 *                   staging slot: what the engine task pays per slot (two by
 *                   default) after cairn_protect, and the first checkpoint
 *                   when it comes before the first slot is ready
 *
 * --settle-ms T pauses T ms before each timed checkpoint (after the region is
 * refilled), standing for the application's compute between checkpoints: the
 * background tasks that follow a commit (catalog update, retention) then finish
 * before the next capture instead of competing with it. 0 = back to back.
 *
 * Remote checkpoint agents (CAIRN_AGENTS set in the environment; used by
 * bench/run_agents.py): per mode also
 *     protected_s      from the start of cairn_checkpoint until
 *                      cairn_wait(PROTECTED) returns, i.e. the agents hold the
 *                      version (or, where an agent did not take it, the rank
 *                      wrote it itself: counted in protected_failed)
 * and cairn_wait(PERSISTENT) waits for the agents' commit. --no-wait-persistent
 * skips that wait (agents that keep versions in memory only), --no-restart the
 * restart measurements, --run NAME sets the run (the application's name at the
 * controller), and --until-file F ends the timed checkpoints early once F
 * exists (a background load that runs as long as a measurement next to it).
 *
 * Output: a human-readable table on rank 0, or with --json one JSON object.
 * The restored contents are verified (the benchmark fails if they are wrong).
 *
 * Environment: CAIRN_PERSISTENT, CAIRN_SCRATCH, CAIRN_RUN and CAIRN_MODE are set by
 * the program from --store, --scratch, --run and --modes; CAIRN_KEEP_PERSISTENT
 * defaults to 2 (bounded disk use) unless set. Other CAIRN_* variables pass
 * through to cairn.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "cairn.h"
#include "cairn_mpi.h"

#define RUN_ID "cairn_bench" /* default of --run */
#define IO_CHUNK (8u << 20)       /* reads */
#define WRITE_CHUNK (1u << 30)   /* writes: as cairn's posix storage env */
#define MAX_MODES 4

static int g_rank = 0, g_size = 1;
static int g_settle_ms = 0; /* pause before each timed checkpoint (--settle-ms) */
static int g_warmup = 3;     /* untimed checkpoints before the timed ones (--warmup), the first one timed apart */
static double g_warmup_s = 3; /* ... and for at least this long after the first (--warmup-s) */
static double g_first_after_s = 3; /* from cairn_protect to the first checkpoint (--first-after-s) */
static int g_paired = 0;           /* a raw write before each timed checkpoint (--paired) */
static const char *g_run = RUN_ID;       /* --run */
static int g_agents = 0;                 /* CAIRN_AGENTS is set: wait for PROTECTED too */
static int g_wait_persistent = 1;        /* --no-wait-persistent clears it */
static const char *g_until_file = NULL;  /* --until-file */

static void die(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "cairn_bench: rank %d: ", g_rank);
  fprintf(stderr, fmt, a ? a : "", b ? b : "");
  fprintf(stderr, "\n");
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

static void check(const char *what, int rc) {
  if (rc != CAIRN_OK) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", cairn_strerror(rc));
    fprintf(stderr, "cairn_bench: rank %d: %s failed: %s: %s\n", g_rank, what, buf, cairn_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: cairn_bench --store DIR --scratch DIR [--bytes B] [--checkpoints N]\n"
          "                   [--reps R] [--settle-ms T] [--warmup K] [--warmup-s S] [--first-after-s S] [--paired] [--modes thread,sync]\n"
          "                   [--drop-caches]\n"
          "                   [--run NAME] [--no-restart] [--no-wait-persistent] [--until-file F]\n"
          "                   [--json]\n"
          "  --store DIR       persistent level; reference files are written here too\n"
          "  --scratch DIR     local level (e.g. under /dev/shm)\n"
          "  --bytes B         bytes per rank, suffixes K, M, G (default 64M)\n"
          "  --checkpoints N   timed checkpoints per mode after the warm-up (default 5)\n"
          "  --reps R          repetitions of the references and of restart (default 3)\n"
          "  --settle-ms T     pause before each timed checkpoint (default 0)\n"
          "  --warmup K        untimed checkpoints first, the first timed apart (default 3)\n"
          "  --warmup-s S      ... and for at least S seconds after the first (default 3)\n"
          "  --first-after-s S the first checkpoint S seconds after cairn_protect (default 3)\n"
          "  --paired          also time the raw write just before each timed checkpoint\n"
          "  --modes LIST      comma-separated engine modes (default thread,sync)\n"
          "  --drop-caches     drop the page cache before persistent-level reads\n"
          "  --run NAME        run name, CAIRN_RUN (default cairn_bench)\n"
          "  --no-restart      skip the restart measurements\n"
          "  --no-wait-persistent  do not wait for the persistent level after each checkpoint\n"
          "  --until-file F    end the timed checkpoints early once file F exists\n"
          "  --json            print one JSON object\n");
}

static uint64_t parse_size(const char *s) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !(v > 0)) die("bad size '%s'%s", s, NULL);
  double m = 1;
  switch (*end) {
    case 'k': case 'K': m = 1024.0; ++end; break;
    case 'm': case 'M': m = 1048576.0; ++end; break;
    case 'g': case 'G': m = 1073741824.0; ++end; break;
    default: break;
  }
  if (m > 1 && *end == 'i') ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end) die("bad size '%s'%s", s, NULL);
  return (uint64_t)(v * m);
}

/* ---- helpers --------------------------------------------------------------- */

static double gmax(double x) {
  double y = x;
  MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return y;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const double *v, int n) {
  if (n <= 0) return 0;
  double *s = malloc((size_t)n * sizeof(double));
  memcpy(s, v, (size_t)n * sizeof(double));
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  free(s);
  return m;
}

/* Allocated as cairn allocates staging slots: anonymous mapping, huge pages
 * advised, every page touched. */
static unsigned char *alloc_prefaulted(size_t bytes) {
  size_t sz = (bytes + 4095) / 4096 * 4096;
  void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap failed%s%s", NULL, NULL);
  (void)madvise(p, sz, MADV_HUGEPAGE);
  memset(p, 0, sz);
  return p;
}

/* Cheap rank- and version-dependent contents (incompressible enough for a
 * plain file system; cairn does not compress). */
static void fill(unsigned char *data, uint64_t bytes, int64_t version) {
  uint64_t *w = (uint64_t *)data;
  const uint64_t seed = ((uint64_t)g_rank << 48) ^ ((uint64_t)version * UINT64_C(0x9e3779b97f4a7c15));
  const uint64_t n = bytes / 8;
  for (uint64_t i = 0; i < n; ++i) w[i] = (i * UINT64_C(0xbf58476d1ce4e5b9)) ^ seed;
  for (uint64_t i = n * 8; i < bytes; ++i) data[i] = (unsigned char)(version + (int64_t)i);
}

/* The application's step before a checkpoint: new contents, then --settle-ms
 * of "compute" (the engine's work of the previous version ends meanwhile). */
static void refill(unsigned char *data, uint64_t bytes, int64_t version) {
  fill(data, bytes, version);
  if (g_settle_ms > 0) {
    struct timespec ts = {g_settle_ms / 1000, (long)(g_settle_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

static int verify(const unsigned char *data, uint64_t bytes, int64_t version) {
  const uint64_t *w = (const uint64_t *)data;
  const uint64_t seed = ((uint64_t)g_rank << 48) ^ ((uint64_t)version * UINT64_C(0x9e3779b97f4a7c15));
  const uint64_t n = bytes / 8;
  for (uint64_t i = 0; i < n; ++i)
    if (w[i] != ((i * UINT64_C(0xbf58476d1ce4e5b9)) ^ seed)) return 0;
  for (uint64_t i = n * 8; i < bytes; ++i)
    if (data[i] != (unsigned char)(version + (int64_t)i)) return 0;
  return 1;
}

/* Writes `bytes` from buf to path: O_DIRECT pwrites of up to 1 GiB (a tail
 * that is not a multiple of 4 KiB buffered) and fdatasync when direct, plain
 * writes otherwise. */
static void write_file(const char *path, const unsigned char *buf, uint64_t bytes, int direct) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0 && direct) fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) die("cannot create %s: %s", path, strerror(errno));
  uint64_t off = 0;
  while (off < bytes) {
    size_t len = bytes - off < WRITE_CHUNK ? (size_t)(bytes - off) : WRITE_CHUNK;
    if (direct && len % 4096 && len > 4096) len -= len % 4096; /* aligned part first */
    if (direct && len % 4096) {
      int fl = fcntl(fd, F_GETFL);
      (void)fcntl(fd, F_SETFL, fl & ~O_DIRECT);
    }
    ssize_t n = pwrite(fd, buf + off, len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) die("write to %s failed: %s", path, strerror(errno));
    off += (uint64_t)n;
  }
  if (direct && fdatasync(fd) != 0) die("fdatasync of %s failed: %s", path, strerror(errno));
  close(fd);
}

static void read_file(const char *path, unsigned char *buf, uint64_t bytes) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("cannot open %s: %s", path, strerror(errno));
  uint64_t off = 0;
  while (off < bytes) {
    size_t len = bytes - off < IO_CHUNK ? (size_t)(bytes - off) : IO_CHUNK;
    ssize_t n = pread(fd, buf + off, len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) die("read of %s failed: %s", path, n == 0 ? "short file" : strerror(errno));
    off += (uint64_t)n;
  }
  close(fd);
}

/* Rank 0 drops the page cache; every rank learns whether it worked. */
static int drop_caches(int enabled) {
  int ok = 0;
  if (enabled && g_rank == 0) {
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (f) {
      ok = fputs("3\n", f) >= 0;
      if (fclose(f) != 0) ok = 0;
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok;
}

/* Finds `"key": <number>` occurrences in text; returns the max (stage times of
 * all shards). */
static double json_max(const char *text, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  double best = 0;
  int found = 0;
  for (const char *p = strstr(text, pat); p; p = strstr(p + 1, pat)) {
    double v = strtod(p + strlen(pat), NULL);
    if (!found || v > best) best = v;
    found = 1;
  }
  return best;
}

typedef struct stage_times {
  double capture, checksum, hash, local, persistent, commit_latency;
} stage_times;

/* Rank 0 reads the version's MANIFEST (written before cairn_wait(PERSISTENT)
 * returned) for the per-stage times recorded by the engine. */
static stage_times manifest_times(const char *store, const char *name, int64_t version) {
  stage_times t = {0, 0, 0, 0, 0, 0};
  if (g_rank != 0) return t;
  char path[8192];
  snprintf(path, sizeof path, "%s/runs/%s/%s/v%012" PRId64 "/MANIFEST", store, g_run, name, version);
  FILE *f = fopen(path, "r");
  if (!f) return t;
  static char text[1 << 20];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  t.capture = json_max(text, "capture_s");
  t.checksum = json_max(text, "checksum_s");
  t.hash = json_max(text, "hash_s"); /* hash-tree stage (hash_trees = true) */
  t.local = json_max(text, "local_s");
  t.persistent = json_max(text, "persistent_s");
  /* Manifests committed by agents carry no stage times: latency unknown (0). */
  const double persistent_at = json_max(text, "persistent_at");
  t.commit_latency = persistent_at > 0 ? json_max(text, "committed_at") - persistent_at : 0;
  return t;
}

/* ---- measurements ---------------------------------------------------------- */

typedef struct mode_result {
  int64_t last; /* the newest version taken (restarted from) */
  char mode[32];
  int n;
  double first_blocked;
  int local_enabled;
  double background_cpu; /* CPU seconds of cairn's threads per checkpoint (max over ranks) */
  double background_cpu_all; /* the same, summed over ranks */
  double blocked_cpu; /* CPU seconds of the application thread inside cairn_checkpoint, mean per checkpoint (max over ranks) */
  double *blocked, *local, *persistent;
  double *paired_write; /* the raw O_DIRECT write just before each timed checkpoint (--paired) */
  double *protected_; /* agents only: until cairn_wait(PROTECTED) returned */
  int protected_failed; /* versions some rank's agent did not take (agents only) */
  stage_times *stages;
  /* File system operations per timed checkpoint, summed over ranks
   * (cairn_io_counters from the first timed checkpoint to the end of
   * cairn_finalize: retention and commits included). */
  double creates, opens, fsyncs, renames, dir_fsyncs, mkdirs, removes, bytes_written;
} mode_result;

typedef struct restart_result {
  double test_s, restart_s, total_s, reference_s;
  double first_s; /* the execution's first cairn_checkpoint, right after the restart */
  int cold; /* page cache dropped before both reads */
} restart_result;

static double cpu_s(int who) {
  struct rusage ru;
  if (getrusage(who, &ru) != 0) return 0;
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
         1e-6 * ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec);
}

static void set_env(const char *key, const char *value) {
  if (setenv(key, value, 1) != 0) die("setenv %s failed%s", key, NULL);
}

static void run_mode(const char *mode, const char *store, const char *ref_write, unsigned char *data, uint64_t bytes,
                     int n, mode_result *out) {
  char name[32];
  snprintf(name, sizeof name, "bench_%.16s", mode);
  set_env("CAIRN_MODE", mode);
  cairn_t *c = NULL;
  check("cairn_init_mpi", cairn_init_mpi(MPI_COMM_WORLD, NULL, &c));
  check("cairn_protect", cairn_protect(c, "data", data, (size_t)bytes, CAIRN_BYTE));

  snprintf(out->mode, sizeof out->mode, "%.16s", mode);
  out->n = n;
  out->blocked = calloc((size_t)n, sizeof(double));
  out->local = calloc((size_t)n, sizeof(double));
  out->persistent = calloc((size_t)n, sizeof(double));
  out->paired_write = calloc((size_t)n, sizeof(double));
  out->protected_ = calloc((size_t)n, sizeof(double));
  out->protected_failed = 0;
  out->stages = calloc((size_t)n, sizeof(stage_times));

  /* Warm-up: the first checkpoint, after the application's first compute
   * phase (an engine task makes the staging slots meanwhile). */
  const double tp = MPI_Wtime();
  fill(data, bytes, 0);
  const double rest = g_first_after_s - (MPI_Wtime() - tp);
  if (rest > 0) {
    struct timespec ts = {(time_t)rest, (long)((rest - (double)(time_t)rest) * 1e9)};
    nanosleep(&ts, NULL);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  check("cairn_checkpoint", cairn_checkpoint(c, name, 0));
  out->first_blocked = gmax(MPI_Wtime() - t0);
  if (g_agents) (void)cairn_wait(c, name, 0, CAIRN_LEVEL_PROTECTED);
  if (g_wait_persistent) check("cairn_wait", cairn_wait(c, name, 0, CAIRN_LEVEL_PERSISTENT));
  /* The rest of the warm-up: one-time work that follows the first checkpoint
   * (the staging slots it did not make, the catalog's first writes) ends
   * before the steady state is timed. */
  const double warm0 = t0;
  int64_t warm = 1;
  for (;; ++warm) {
    int more = warm < g_warmup || MPI_Wtime() - warm0 < g_warmup_s;
    MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD); /* the same count on every rank */
    if (!more) break;
    const int64_t v = warm;
    refill(data, bytes, v);
    check("cairn_checkpoint", cairn_checkpoint(c, name, v));
    if (g_agents) (void)cairn_wait(c, name, v, CAIRN_LEVEL_PROTECTED);
    if (g_wait_persistent) check("cairn_wait", cairn_wait(c, name, v, CAIRN_LEVEL_PERSISTENT));
  }

  /* CPU time of every thread but this one over the timed checkpoints, up to
   * the end of cairn_finalize (which joins cairn's threads, whose time stays
   * in RUSAGE_SELF): the CPU that cairn's background work takes from the
   * application's cores. The main thread's fill and waits are excluded. */
  const double self0 = cpu_s(RUSAGE_SELF), main0 = cpu_s(RUSAGE_THREAD);
  double blocked_cpu_sum = 0; /* the application thread's CPU inside cairn_checkpoint */
  cairn_io_counters_t io0, io1;
  cairn_io_counters(&io0);
  int done = 0;
  for (int k = 0; k < n; ++k) {
    const int64_t v = warm + k;
    if (g_until_file) {
      int stop = g_rank == 0 && access(g_until_file, F_OK) == 0;
      MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (stop) break;
    }
    refill(data, bytes, v);
    if (g_paired && g_wait_persistent) {
      /* The reference for this checkpoint's time to persistent, measured
       * beside it: this VM's disk drifts more between minutes than the two
       * differ. After the settle pause, so the engine is idle for both. */
      unlink(ref_write);
      MPI_Barrier(MPI_COMM_WORLD);
      const double w0 = MPI_Wtime();
      write_file(ref_write, data, bytes, 1);
      out->paired_write[k] = gmax(MPI_Wtime() - w0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double c0 = cpu_s(RUSAGE_THREAD);
    t0 = MPI_Wtime();
    check("cairn_checkpoint", cairn_checkpoint(c, name, v));
    double t1 = MPI_Wtime();
    blocked_cpu_sum += cpu_s(RUSAGE_THREAD) - c0;
    /* CAIRN_ENOTFOUND: the local level is off (CAIRN_LOCAL_ENABLED=false). */
    int lrc = cairn_wait(c, name, v, CAIRN_LEVEL_LOCAL);
    if (lrc != CAIRN_ENOTFOUND) check("cairn_wait(LOCAL)", lrc);
    out->local_enabled = lrc != CAIRN_ENOTFOUND;
    double t2 = MPI_Wtime();
    double tp = t2;
    if (g_agents) {
      /* Fails where an agent did not take the version (the rank wrote it
       * itself): counted, not fatal. Ranks agree on the level's outcome. */
      int prc = cairn_wait(c, name, v, CAIRN_LEVEL_PROTECTED), all_ok = 0, ok = prc == CAIRN_OK;
      tp = MPI_Wtime();
      MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      if (!all_ok) ++out->protected_failed;
    }
    if (g_wait_persistent) check("cairn_wait(PERSISTENT)", cairn_wait(c, name, v, CAIRN_LEVEL_PERSISTENT));
    double t3 = MPI_Wtime();
    out->blocked[k] = gmax(t1 - t0);
    out->local[k] = gmax(t2 - t0);
    out->protected_[k] = gmax(tp - t0);
    out->persistent[k] = g_wait_persistent ? gmax(t3 - t0) : 0;
    out->stages[k] = g_wait_persistent ? manifest_times(store, name, v) : (stage_times){0, 0, 0, 0, 0, 0};
    ++done;
  }
  if (done == 0) die("no timed checkpoint was taken (--until-file existed from the start)%s%s", NULL, NULL);
  out->n = n = done;
  out->last = warm + done - 1;
  check("cairn_finalize", cairn_finalize(&c, 1));
  const double background = (cpu_s(RUSAGE_SELF) - self0) - (cpu_s(RUSAGE_THREAD) - main0);
  out->background_cpu = gmax(background / n);
  out->blocked_cpu = gmax(blocked_cpu_sum / n);
  double per = background / n;
  MPI_Allreduce(MPI_IN_PLACE, &per, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  out->background_cpu_all = per;
  cairn_io_counters(&io1);
  double mine[8] = {(double)(io1.creates - io0.creates), (double)(io1.opens - io0.opens),
                    (double)(io1.fsyncs - io0.fsyncs), (double)(io1.renames - io0.renames),
                    (double)(io1.dir_fsyncs - io0.dir_fsyncs), (double)(io1.mkdirs - io0.mkdirs),
                    (double)(io1.removes - io0.removes), (double)(io1.bytes_written - io0.bytes_written)};
  double all[8];
  MPI_Allreduce(mine, all, 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  out->creates = all[0] / n;
  out->opens = all[1] / n;
  out->fsyncs = all[2] / n;
  out->renames = all[3] / n;
  out->dir_fsyncs = all[4] / n;
  out->mkdirs = all[5] / n;
  out->removes = all[6] / n;
  out->bytes_written = all[7] / n;
}

/* Restart of the newest version of `name` (expected: `version`) in a fresh
 * handle, `reps` times, alternating with the reference: read(2) of `ref_path`
 * (same bytes, same directory) into the application buffer. Medians. */
static void run_restart(const char *name, int64_t version, unsigned char *data, uint64_t bytes,
                        const char *ref_path, int want_drop, int reps, restart_result *out) {
  double *ref = calloc((size_t)reps, sizeof(double)), *test = calloc((size_t)reps, sizeof(double));
  double *rest = calloc((size_t)reps, sizeof(double)), *total = calloc((size_t)reps, sizeof(double));
  double *first = calloc((size_t)reps, sizeof(double));
  static int64_t after_version = 0; /* of checkpoint "after_restart", across calls */
  int cold = 1;
  for (int r = 0; r < reps; ++r) {
    cold &= drop_caches(want_drop);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    read_file(ref_path, data, bytes);
    ref[r] = gmax(MPI_Wtime() - t0);

    memset(data, 0, bytes);
    cairn_t *c = NULL;
    check("cairn_init_mpi", cairn_init_mpi(MPI_COMM_WORLD, NULL, &c));
    check("cairn_protect", cairn_protect(c, "data", data, (size_t)bytes, CAIRN_BYTE));
    cold &= drop_caches(want_drop);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    int64_t found = -1;
    check("cairn_restart_test", cairn_restart_test(c, name, &found));
    double t1 = MPI_Wtime();
    check("cairn_restart", cairn_restart(c, name, found));
    double t2 = MPI_Wtime();
    test[r] = gmax(t1 - t0);
    rest[r] = gmax(t2 - t1);
    total[r] = gmax(t2 - t0);
    if (found != version) {
      char a[32], b[32];
      snprintf(a, sizeof a, "%" PRId64, found);
      snprintf(b, sizeof b, "%" PRId64, version);
      die("restart found version %s, expected %s", a, b);
    }
    int ok = verify(data, bytes, version), all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) die("restored contents differ from the checkpoint%s%s", NULL, NULL);
    /* The execution's first checkpoint, under another name (the restarted
     * one stays the newest of its name), after a compute phase of
     * --first-after-s as in the modes' first checkpoint. */
    const double rest_s = g_first_after_s - (MPI_Wtime() - t2);
    if (rest_s > 0) {
      struct timespec ts = {(time_t)rest_s, (long)((rest_s - (double)(time_t)rest_s) * 1e9)};
      nanosleep(&ts, NULL);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    check("cairn_checkpoint", cairn_checkpoint(c, "after_restart", ++after_version));
    first[r] = gmax(MPI_Wtime() - t0);
    check("cairn_finalize", cairn_finalize(&c, 0));
  }
  out->reference_s = median(ref, reps);
  out->test_s = median(test, reps);
  out->restart_s = median(rest, reps);
  out->total_s = median(total, reps);
  out->first_s = median(first, reps);
  out->cold = cold;
  free(ref);
  free(test);
  free(rest);
  free(total);
  free(first);
}

/* ---- output ---------------------------------------------------------------- */

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static double stage_median(const mode_result *m, size_t field_offset) {
  double *v = malloc((size_t)m->n * sizeof(double));
  for (int k = 0; k < m->n; ++k) v[k] = *(const double *)((const char *)&m->stages[k] + field_offset);
  double r = median(v, m->n);
  free(v);
  return r;
}

/* Median over the timed checkpoints of time to persistent / the raw write
 * just before it (--paired). */
static double paired_ratio(const mode_result *m) {
  double *v = malloc((size_t)m->n * sizeof(double));
  for (int k = 0; k < m->n; ++k) v[k] = ratio(m->persistent[k], m->paired_write[k]);
  double r = median(v, m->n);
  free(v);
  return r;
}

static void print_array(const double *v, int n) {
  printf("[");
  for (int i = 0; i < n; ++i) printf("%s%.6g", i ? ", " : "", v[i]);
  printf("]");
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);

  uint64_t bytes = 64u << 20;
  int n = 5, reps = 3, json = 0, want_drop = 0, no_restart = 0;
  const char *store = NULL, *scratch = NULL, *modes_arg = "thread,sync";
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      if (g_rank == 0) usage(stdout);
      MPI_Finalize();
      return 0;
    } else if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--drop-caches")) {
      want_drop = 1;
    } else if (!strcmp(a, "--no-restart")) {
      no_restart = 1;
    } else if (!strcmp(a, "--no-wait-persistent")) {
      g_wait_persistent = 0;
    } else if (v && !strcmp(a, "--run")) {
      g_run = v, ++i;
    } else if (v && !strcmp(a, "--until-file")) {
      g_until_file = v, ++i;
    } else if (v && !strcmp(a, "--bytes")) {
      bytes = parse_size(v), ++i;
    } else if (v && !strcmp(a, "--checkpoints")) {
      n = atoi(v), ++i;
    } else if (v && !strcmp(a, "--warmup")) {
      g_warmup = atoi(v), ++i;
    } else if (!strcmp(a, "--paired")) {
      g_paired = 1;
    } else if (v && !strcmp(a, "--first-after-s")) {
      g_first_after_s = atof(v), ++i;
    } else if (v && !strcmp(a, "--warmup-s")) {
      g_warmup_s = atof(v), ++i;
    } else if (v && !strcmp(a, "--settle-ms")) {
      g_settle_ms = atoi(v), ++i;
    } else if (v && !strcmp(a, "--reps")) {
      reps = atoi(v), ++i;
    } else if (v && !strcmp(a, "--store")) {
      store = v, ++i;
    } else if (v && !strcmp(a, "--scratch")) {
      scratch = v, ++i;
    } else if (v && !strcmp(a, "--modes")) {
      modes_arg = v, ++i;
    } else {
      if (g_rank == 0) usage(stderr);
      die("unknown option or missing value: %s%s", a, NULL);
    }
  }
  if (!store || !scratch) {
    if (g_rank == 0) usage(stderr);
    die("--store and --scratch are required%s%s", NULL, NULL);
  }
  if (n < 1 || reps < 1) die("--checkpoints and --reps must be >= 1%s%s", NULL, NULL);

  char modes[MAX_MODES][16];  /* "thread", "sync" */
  int nmodes = 0;
  {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", modes_arg);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && nmodes < MAX_MODES;
         tok = strtok_r(NULL, ",", &save))
      snprintf(modes[nmodes++], sizeof modes[0], "%.15s", tok);
  }

  char path[4096], ref_persistent[4096], ref_local[4096], empty_scratch[4096];
  snprintf(path, sizeof path, "%s/store", store);
  set_env("CAIRN_PERSISTENT", path);
  char store_dir[4096];
  snprintf(store_dir, sizeof store_dir, "%s", path);
  snprintf(path, sizeof path, "%s/local", scratch);
  set_env("CAIRN_SCRATCH", path);
  char local_dir[4096];
  snprintf(local_dir, sizeof local_dir, "%s", path);
  snprintf(empty_scratch, sizeof empty_scratch, "%s/empty", scratch);
  set_env("CAIRN_RUN", g_run);
  {
    const char *agents = getenv("CAIRN_AGENTS");
    g_agents = agents && *agents;
  }
  if (!getenv("CAIRN_KEEP_PERSISTENT")) set_env("CAIRN_KEEP_PERSISTENT", "2");
  /* "Restart from local" restores what the checkpointing handle left at the
   * node-local level, which finalize removes by default (the run finished
   * normally): without this it measured the persistent level. */
  set_env("CAIRN_KEEP_LOCAL_AFTER_FINALIZE", "true");
  snprintf(ref_persistent, sizeof ref_persistent, "%s/ref.%06d", store, g_rank);
  snprintf(ref_local, sizeof ref_local, "%s/ref.%06d", scratch, g_rank);

  unsigned char *data = alloc_prefaulted(bytes); /* the application's region */
  /* memcpy reference target; its allocation is timed as the reference for the
   * first checkpoint, which allocates the staging slots the same way. */
  MPI_Barrier(MPI_COMM_WORLD);
  double tp = MPI_Wtime();
  unsigned char *dst = alloc_prefaulted(bytes);
  const double prefault_s = gmax(MPI_Wtime() - tp);

  /* memcpy reference (one unmeasured warm-up). */
  fill(data, bytes, 1);
  memcpy(dst, data, bytes);
  double *memcpy_s = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    memcpy(dst, data, bytes);
    memcpy_s[r] = gmax(MPI_Wtime() - t0);
  }

  /* Raw O_DIRECT write + fdatasync of the same bytes, all ranks at once. */
  double *write_s = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; ++r) {
    unlink(ref_persistent);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    write_file(ref_persistent, dst, bytes, 1);
    write_s[r] = gmax(MPI_Wtime() - t0);
  }
  write_file(ref_local, dst, bytes, 0); /* tmpfs reference for the local restart */

  mode_result res[MAX_MODES];
  for (int m = 0; m < nmodes; ++m) run_mode(modes[m], store_dir, ref_persistent, data, bytes, n, &res[m]);

  /* Restart of the first mode's newest version: from the local level, then from
   * the persistent level with the local one hidden. */
  char name0[32];
  snprintf(name0, sizeof name0, "bench_%.16s", modes[0]);
  restart_result rl = {0, 0, 0, 0, 0, 0}, rp = {0, 0, 0, 0, 0, 0};
  if (!no_restart) {
    set_env("CAIRN_MODE", modes[0]);
    if (res[0].local_enabled) run_restart(name0, res[0].last, data, bytes, ref_local, 0, reps, &rl);
    set_env("CAIRN_SCRATCH", empty_scratch);
    run_restart(name0, res[0].last, data, bytes, ref_persistent, want_drop, reps, &rp);
    set_env("CAIRN_SCRATCH", local_dir);
  }

  unlink(ref_persistent);
  unlink(ref_local);

  if (g_rank == 0) {
    const double mc = median(memcpy_s, reps), wr = median(write_s, reps);
    const double mib = (double)bytes / 1048576.0;
    if (json) {
      printf("{\"bytes_per_rank\": %" PRIu64 ", \"ranks\": %d, \"checkpoints\": %d, \"reps\": %d", bytes,
             g_size, n, reps);
      printf(", \"prefault_s\": %.6g, \"settle_ms\": %d, \"first_after_s\": %.6g", prefault_s, g_settle_ms,
             g_first_after_s);
      printf(", \"memcpy_s\": %.6g, \"memcpy_all_s\": ", mc);
      print_array(memcpy_s, reps);
      printf(", \"write_direct_s\": %.6g, \"write_direct_all_s\": ", wr);
      print_array(write_s, reps);
      printf(", \"modes\": {");
      for (int m = 0; m < nmodes; ++m) {
        const mode_result *r = &res[m];
        printf("%s\"%s\": {\"first_blocked_s\": %.6g, \"background_cpu_s\": %.6g", m ? ", " : "", r->mode,
               r->first_blocked, r->background_cpu);
        printf(", \"background_cpu_all_s\": %.6g", r->background_cpu_all);
        printf(", \"blocked_cpu_s\": %.6g", r->blocked_cpu);
        printf(", \"checkpoints\": %d", r->n);
        printf(", \"blocked_s\": %.6g, \"local_s\": %.6g, \"persistent_s\": %.6g", median(r->blocked, r->n),
               median(r->local, r->n), median(r->persistent, r->n));
        printf(", \"blocked_all_s\": ");
        print_array(r->blocked, r->n);
        printf(", \"local_all_s\": ");
        print_array(r->local, r->n);
        printf(", \"persistent_all_s\": ");
        print_array(r->persistent, r->n);
        if (g_paired) {
          printf(", \"paired_write_all_s\": ");
          print_array(r->paired_write, r->n);
          printf(", \"persistent_per_paired_write\": %.6g", paired_ratio(r));
        }
        if (g_agents) {
          printf(", \"protected_s\": %.6g, \"protected_failed\": %d, \"protected_all_s\": ",
                 median(r->protected_, r->n), r->protected_failed);
          print_array(r->protected_, r->n);
        }
        printf(", \"stage_capture_s\": %.6g, \"stage_checksum_s\": %.6g, \"stage_hash_s\": %.6g"
               ", \"stage_local_s\": %.6g, \"stage_persistent_s\": %.6g, \"commit_latency_s\": %.6g",
               stage_median(r, offsetof(stage_times, capture)), stage_median(r, offsetof(stage_times, checksum)),
               stage_median(r, offsetof(stage_times, hash)),
               stage_median(r, offsetof(stage_times, local)), stage_median(r, offsetof(stage_times, persistent)),
               stage_median(r, offsetof(stage_times, commit_latency)));
        printf(", \"io_per_checkpoint\": {\"creates\": %.6g, \"opens\": %.6g, \"fsyncs\": %.6g, \"renames\": %.6g"
               ", \"dir_fsyncs\": %.6g, \"mkdirs\": %.6g, \"removes\": %.6g, \"bytes_written\": %.6g}}",
               r->creates, r->opens, r->fsyncs, r->renames, r->dir_fsyncs, r->mkdirs, r->removes, r->bytes_written);
      }
      printf("}");
      if (!no_restart) {
        printf(", \"restart_local\": {\"test_s\": %.6g, \"restart_s\": %.6g, \"total_s\": %.6g, "
               "\"reference_read_s\": %.6g, \"first_checkpoint_s\": %.6g, \"cold\": false, \"level\": \"local\"}",
               rl.test_s, rl.restart_s, rl.total_s, rl.reference_s, rl.first_s);
        printf(", \"restart_persistent\": {\"test_s\": %.6g, \"restart_s\": %.6g, \"total_s\": %.6g, "
               "\"reference_read_s\": %.6g, \"first_checkpoint_s\": %.6g, \"cold\": %s, \"level\": \"persistent\"}",
               rp.test_s, rp.restart_s, rp.total_s, rp.reference_s, rp.first_s, rp.cold ? "true" : "false");
      }
      printf("}\n");
    } else {
      printf("cairn_bench: %d ranks x %.1f MiB, %d checkpoints per mode (median, max over ranks)\n", g_size,
             mib, n);
      printf("  allocate + fault in a staging-like buffer %9.4f s\n", prefault_s);
      printf("  memcpy into pre-faulted buffer     %9.4f s  (%.2f GiB/s per rank)\n", mc,
             mib / 1024.0 / (mc > 0 ? mc : 1));
      printf("  O_DIRECT write + fdatasync         %9.4f s  (%.1f MiB/s all ranks)\n", wr,
             mib * g_size / (wr > 0 ? wr : 1));
      for (int m = 0; m < nmodes; ++m) {
        const mode_result *r = &res[m];
        double b = median(r->blocked, r->n), l = median(r->local, r->n), p = median(r->persistent, r->n);
        printf("  mode %-6s first checkpoint      %9.4f s (%g s after cairn_protect)\n", r->mode, r->first_blocked,
               g_first_after_s);
        printf("  mode %-6s blocked               %9.4f s  = %.2f x memcpy\n", r->mode, b, ratio(b, mc));
        printf("  mode %-6s until local           %9.4f s\n", r->mode, l);
        if (g_agents)
          printf("  mode %-6s until held by agents  %9.4f s  (%d version(s) not taken)\n", r->mode,
                 median(r->protected_, r->n), r->protected_failed);
        printf("  mode %-6s until persistent      %9.4f s  = %.2f x O_DIRECT write\n", r->mode, p, ratio(p, wr));
        if (g_paired)
          printf("  mode %-6s until persistent      %9.2f x the write just before (median of %d; write %.4f s)\n",
                 r->mode, paired_ratio(r), r->n, median(r->paired_write, r->n));
        printf("  mode %-6s background CPU        %9.4f s per checkpoint (other threads)\n", r->mode,
               r->background_cpu);
        printf("  mode %-6s stages: capture %.4f checksum %.4f hash %.4f local %.4f persistent %.4f commit %.4f s\n",
               r->mode, stage_median(r, offsetof(stage_times, capture)),
               stage_median(r, offsetof(stage_times, checksum)), stage_median(r, offsetof(stage_times, hash)),
               stage_median(r, offsetof(stage_times, local)),
               stage_median(r, offsetof(stage_times, persistent)),
               stage_median(r, offsetof(stage_times, commit_latency)));
      }
      if (!no_restart) {
        printf("  restart from local (tmpfs)         %9.4f s  (test %.4f + restart %.4f) = %.2f x read %.4f s\n",
               rl.total_s, rl.test_s, rl.restart_s, ratio(rl.total_s, rl.reference_s), rl.reference_s);
        printf("  restart from persistent (%s)      %9.4f s  (test %.4f + restart %.4f) = %.2f x read %.4f s\n",
               rp.cold ? "cold" : "warm", rp.total_s, rp.test_s, rp.restart_s, ratio(rp.total_s, rp.reference_s),
               rp.reference_s);
        printf("  first checkpoint after a restart   %9.4f s from local, %.4f s from persistent, %g s after it "
               "(blocked of a later one: %.4f s)\n", rl.first_s, rp.first_s, g_first_after_s,
               median(res[0].blocked, res[0].n));
      }
    }
    fflush(stdout);
  }

  for (int m = 0; m < nmodes; ++m) {
    free(res[m].blocked);
    free(res[m].local);
    free(res[m].persistent);
    free(res[m].protected_);
    free(res[m].stages);
  }
  free(memcpy_s);
  free(write_s);
  munmap(data, (bytes + 4095) / 4096 * 4096);
  munmap(dst, (bytes + 4095) / 4096 * 4096);
  MPI_Finalize();
  return 0;
}

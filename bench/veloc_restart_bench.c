/*
 * veloc_restart_bench.c -- time VELOC restart from the node-local scratch level
 * and compare it with a plain read(2) of a same-sized file in the same scratch dir.
 *
 * Usage (2 MPI ranks intended, 1 buffer of B bytes per rank):
 *   veloc_restart_bench CFG B R all
 *       one process lifetime: checkpoint v1 once, then R repetitions of
 *       {memset 0, Barrier, Restart_test+Restart, verify} alternating with
 *       {memset 0, Barrier, open+read(2)+close of reference file, verify}
 *       on the SAME VELOC instance (no finalize/re-init: VELOC (commit 5e8c1fa)
 *       does not support VELOC_Finalize + VELOC_Init in one process -- Finalize
 *       deletes the client but leaves the static pointer set, re-init returns the
 *       freed object and the next call segfaults; see reinit_probe.c).
 *   veloc_restart_bench CFG B R ckpt
 *       checkpoint v1 (+ flush to persistent), write reference files, finalize.
 *   veloc_restart_bench CFG B R restart REP RESULTS
 *       fresh process = fresh VELOC state: VELOC_Init, protect, one repetition
 *       (VELOC restart and read(2), order alternating with REP), appends one line
 *       to RESULTS; when REP == R prints the medians over RESULTS.
 *   (bench/run_veloc_restart.sh builds it against a VELOC install and drives
 *   the ckpt/restart sequence; docs/benchmarks.md says how VELOC was built.)
 *
 * B accepts K/M/G suffixes (powers of 2) and must be a multiple of 8.
 * Times are max over ranks of the per-rank time (MPI_Allreduce MAX).
 */
#include <mpi.h>
#include <veloc.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CKPT_NAME "bench"
#define VERSION 1
#define MAXREP 1000

static int rank, nranks;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void die(const char *msg) {
    fprintf(stderr, "rank %d: FATAL: %s (errno=%d %s)\n", rank, msg, errno, strerror(errno));
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (toupper((unsigned char)*end)) {
    case 'K': v <<= 10; break;
    case 'M': v <<= 20; break;
    case 'G': v <<= 30; break;
    case 0: break;
    default: die("bad size suffix");
    }
    return (size_t)v;
}

/* rank- and version-dependent pattern */
static inline uint64_t pat(size_t i, int r, int v) {
    uint64_t x = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ULL;
    return x ^ ((uint64_t)(r + 1) << 56) ^ ((uint64_t)v << 40);
}

static void fill(uint64_t *b, size_t n, int r, int v) {
    for (size_t i = 0; i < n; i++)
        b[i] = pat(i, r, v);
}

/* returns number of mismatching words */
static size_t check(const uint64_t *b, size_t n, int r, int v) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += (b[i] != pat(i, r, v));
    return bad;
}

/* read "scratch = <path>" from the VELOC config file */
static void cfg_scratch(const char *cfg, char *out, size_t outlen) {
    FILE *f = fopen(cfg, "r");
    char line[4096];
    out[0] = 0;
    if (!f)
        die("cannot open config file");
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (isspace((unsigned char)*p)) p++;
        if (strncmp(p, "scratch", 7) != 0) continue;
        p += 7;
        while (isspace((unsigned char)*p)) p++;
        if (*p != '=') continue;
        p++;
        while (isspace((unsigned char)*p)) p++;
        size_t l = strcspn(p, " \t\r\n#;");
        if (l >= outlen) die("scratch path too long");
        memcpy(out, p, l);
        out[l] = 0;
    }
    fclose(f);
    if (!out[0])
        die("no scratch in config file");
}

static char ref_path[4200];

static void write_ref(const void *buf, size_t B) {
    int fd = open(ref_path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) die("open ref for write");
    size_t done = 0;
    while (done < B) {
        ssize_t w = write(fd, (const char *)buf + done, B - done);
        if (w <= 0) die("write ref");
        done += (size_t)w;
    }
    if (close(fd) != 0) die("close ref");
}

/* timed: open + read(2) loop + close; returns per-rank seconds */
static double read_ref(void *buf, size_t B) {
    double t0 = now();
    int fd = open(ref_path, O_RDONLY);
    if (fd < 0) die("open ref for read");
    size_t done = 0;
    while (done < B) {
        ssize_t r = read(fd, (char *)buf + done, B - done);
        if (r <= 0) die("read ref");
        done += (size_t)r;
    }
    close(fd);
    return now() - t0;
}

struct rep { double test, restart, total, rd; };

/* VELOC restart: returns max-over-ranks {test, restart, total} */
static void do_veloc(uint64_t *buf, size_t B, struct rep *out) {
    memset(buf, 0, B);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    int v = VELOC_Restart_test(CKPT_NAME, 0);
    double t1 = now();
    if (v != VERSION) {
        fprintf(stderr, "rank %d: VELOC_Restart_test returned %d, expected %d\n", rank, v, VERSION);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (VELOC_Restart(CKPT_NAME, v) != VELOC_SUCCESS)
        die("VELOC_Restart failed");
    double t2 = now();
    double loc[3] = {t1 - t0, t2 - t1, t2 - t0}, mx[3];
    MPI_Allreduce(loc, mx, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    out->test = mx[0]; out->restart = mx[1]; out->total = mx[2];
    size_t bad = check(buf, B / 8, rank, VERSION), allbad;
    MPI_Allreduce(&bad, &allbad, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (allbad) {
        if (rank == 0) fprintf(stderr, "VERIFY FAILED after VELOC restart: %zu bad words\n", allbad);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

static void do_read(uint64_t *buf, size_t B, struct rep *out) {
    memset(buf, 0, B);
    MPI_Barrier(MPI_COMM_WORLD);
    double t = read_ref(buf, B), mx;
    MPI_Allreduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    out->rd = mx;
    size_t bad = check(buf, B / 8, rank, VERSION), allbad;
    MPI_Allreduce(&bad, &allbad, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (allbad) {
        if (rank == 0) fprintf(stderr, "VERIFY FAILED after read(2): %zu bad words\n", allbad);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

/* order alternates: odd rep -> VELOC first, even rep -> read(2) first */
static void one_rep(int rep, uint64_t *buf, size_t B, struct rep *out) {
    if (rep % 2) { do_veloc(buf, B, out); do_read(buf, B, out); }
    else         { do_read(buf, B, out);  do_veloc(buf, B, out); }
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double t[MAXREP];
    memcpy(t, v, n * sizeof(double));
    qsort(t, n, sizeof(double), cmpd);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void report(const struct rep *r, int n, size_t B, const char *how) {
    double te[MAXREP], re[MAXREP], to[MAXREP], rd[MAXREP];
    for (int i = 0; i < n; i++) {
        te[i] = r[i].test; re[i] = r[i].restart; to[i] = r[i].total; rd[i] = r[i].rd;
        printf("  rep %d: test %.6f s, restart %.6f s, total %.6f s; read(2) %.6f s\n",
               i + 1, te[i], re[i], to[i], rd[i]);
    }
    double X = median(te, n), Y = median(re, n), Z = median(to, n), W = median(rd, n);
    printf("# B=%zu bytes/rank (%.1f MiB), ranks=%d, R=%d, mode=%s, verify OK; medians of max-over-ranks times\n",
           B, B / 1048576.0, nranks, n, how);
    printf("veloc restart local: test %.6f s + restart %.6f s = %.6f s; read(2) %.6f s; ratio %.3f\n",
           X, Y, Z, W, Z / W);
    printf("# per-rank bandwidth (median): veloc %.2f GiB/s, read(2) %.2f GiB/s\n",
           B / Z / 1073741824.0, B / W / 1073741824.0);
    fflush(stdout);
}

static void checkpoint_phase(uint64_t *buf, size_t B) {
    fill(buf, B / 8, rank, VERSION);
    write_ref(buf, B);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    if (VELOC_Checkpoint(CKPT_NAME, VERSION) != VELOC_SUCCESS)
        die("VELOC_Checkpoint failed");
    if (VELOC_Checkpoint_wait() != VELOC_SUCCESS)
        die("VELOC_Checkpoint_wait failed");
    double t = now() - t0, mx;
    MPI_Allreduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        printf("# checkpoint v%d (scratch write + sync flush to persistent): %.6f s (max over ranks)\n",
               VERSION, mx);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc < 5) {
        if (rank == 0)
            fprintf(stderr, "usage: %s CFG B R all|ckpt|restart [REP RESULTS]\n", argv[0]);
        MPI_Finalize();
        return 1;
    }
    const char *cfg = argv[1], *phase = argv[4];
    size_t B = parse_size(argv[2]);
    int R = atoi(argv[3]);
    if (B == 0 || B % 8) die("B must be a positive multiple of 8");
    if (R < 1 || R > MAXREP) die("bad R");

    char scratch[4096];
    cfg_scratch(cfg, scratch, sizeof scratch);
    snprintf(ref_path, sizeof ref_path, "%s/readref-%d.bin", scratch, rank);

    uint64_t *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, B) != 0) die("alloc");
    memset(buf, 0, B); /* fault pages in up front */

    if (VELOC_Init(MPI_COMM_WORLD, cfg) != VELOC_SUCCESS) die("VELOC_Init");
    if (VELOC_Mem_protect(0, buf, B, 1) != VELOC_SUCCESS) die("VELOC_Mem_protect");

    if (!strcmp(phase, "all")) {
        checkpoint_phase(buf, B);
        struct rep reps[MAXREP];
        for (int i = 1; i <= R; i++)
            one_rep(i, buf, B, &reps[i - 1]);
        if (rank == 0)
            report(reps, R, B, "inproc (same VELOC instance)");
    } else if (!strcmp(phase, "ckpt")) {
        checkpoint_phase(buf, B);
    } else if (!strcmp(phase, "restart") && argc >= 7) {
        int rep = atoi(argv[5]);
        const char *results = argv[6];
        struct rep r;
        one_rep(rep, buf, B, &r);
        if (rank == 0) {
            FILE *f = fopen(results, "a");
            if (!f) die("open results");
            fprintf(f, "%d %.9f %.9f %.9f %.9f\n", rep, r.test, r.restart, r.total, r.rd);
            fclose(f);
            if (rep == R) {
                struct rep reps[MAXREP];
                int n = 0, k;
                f = fopen(results, "r");
                if (!f) die("reopen results");
                while (n < MAXREP && fscanf(f, "%d %lf %lf %lf %lf", &k, &reps[n].test,
                                            &reps[n].restart, &reps[n].total, &reps[n].rd) == 5)
                    n++;
                fclose(f);
                report(reps, n, B, "fresh (new process + VELOC_Init per rep)");
            }
        }
    } else {
        die("bad phase / arguments");
    }

    VELOC_Finalize(1);
    free(buf);
    MPI_Finalize();
    return 0;
}

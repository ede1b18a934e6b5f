/* cairn: checkpoint/restart runtime for parallel applications. C API.
 *
 * Conventions
 *  - Every function returns CAIRN_OK (0) or a negative CAIRN_E* code. On failure
 *    cairn_last_error() gives a message for the calling thread that says what
 *    failed, where, and what to do.
 *  - A handle is used by one application thread at a time (the engine's own
 *    threads are internal). Under MPI (cairn_init_mpi) the calls marked
 *    "collective" must be made by every rank of the communicator, in the same
 *    order, with the same arguments for name and version.
 *  - Background failures (a level that could not be written) are latched and
 *    returned by the next cairn_checkpoint (which still takes its own version)
 *    or cairn_finalize on every rank, and by cairn_wait for the version
 *    concerned (with the failing rank's message). They are never dropped.
 *
 * The on-disk formats are described in docs/format/.
 */
#ifndef CAIRN_H
#define CAIRN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__) /* exported from libcairn, which hides everything else */
#pragma GCC visibility push(default)
#endif

#define CAIRN_VERSION_MAJOR 0
#define CAIRN_VERSION_MINOR 1
#define CAIRN_VERSION_PATCH 0

/* Return codes. */
enum {
  CAIRN_OK = 0,
  CAIRN_EINVAL = -1,       /* bad argument or configuration */
  CAIRN_ENOTFOUND = -2,    /* no such checkpoint, version or region */
  CAIRN_ECORRUPT = -3,     /* checksum or format mismatch */
  CAIRN_EIO = -4,          /* an I/O operation failed (message holds errno) */
  CAIRN_ENOSPC = -5,       /* a level ran out of space */
  CAIRN_EAGAIN = -6,       /* staging memory full and staging_policy = eagain */
  CAIRN_ECANCELLED = -7,   /* operation cancelled (e.g. finalize without wait) */
  CAIRN_ENOTSUP = -8,      /* not supported in this build or configuration */
  CAIRN_EINTERNAL = -9,    /* a bug in cairn: please report the message */
  CAIRN_EDIVERGED = -10,   /* the run diverged from its reference run (on_divergence = stop) */
  CAIRN_EUNUSABLE = -11,   /* checkpoints exist but this job cannot restore them (other rank count,
                              damaged copies, agents that do not answer): not the same as ENOTFOUND */
  CAIRN_EEXIST = -12,      /* the version is already committed in this run by an earlier execution */
  CAIRN_EEARLIER = -13,    /* cairn_checkpoint took its version, but an earlier version failed in the
                              background (the message says which and why) */
  CAIRN_EBUSY = -14        /* cairn_init: another execution is writing this run (the message names it) */
};

/* Element types of protected regions. Values are stored on disk: never renumber. */
typedef enum cairn_type {
  CAIRN_BYTE = 0,
  CAIRN_INT8 = 1,
  CAIRN_INT16 = 2,
  CAIRN_INT32 = 3,
  CAIRN_INT64 = 4,
  CAIRN_UINT8 = 5,
  CAIRN_UINT16 = 6,
  CAIRN_UINT32 = 7,
  CAIRN_UINT64 = 8,
  CAIRN_FLOAT32 = 9,
  CAIRN_FLOAT64 = 10
} cairn_type_t;

/* Storage levels, as bits of a mask. */
#define CAIRN_LEVEL_CAPTURED 0x1u   /* L0: copied into staging memory; with agents_lend, held by the
                                       agents (until then the regions must not change); with
                                       capture = cow, the background copy ended */
#define CAIRN_LEVEL_LOCAL 0x2u      /* L1: node-local directory */
#define CAIRN_LEVEL_PROTECTED 0x4u  /* L2: survives the loss of nodes: held in the memory of remote checkpoint
                                       agents, or the version's redundancy set (partner copies, XOR or
                                       Reed-Solomon parity) is complete on other nodes */
#define CAIRN_LEVEL_PERSISTENT 0x8u /* L3: shared directory, fsync'd and committed */

#define CAIRN_MAX_DIMS 8

/* In C the handle is `struct cairn`; in C++ the tag is cairn_handle so that it
 * does not clash with namespace cairn (extern "C" linkage ignores the tag). */
#ifdef __cplusplus
typedef struct cairn_handle cairn_t;
#else
typedef struct cairn cairn_t;
#endif

/* Creates a single-process handle. config_path names a TOML file or is NULL;
 * every key can also be set by the environment variable CAIRN_<KEY>, which wins
 * over the file. On success *out owns the handle: release it with cairn_finalize. */
int cairn_init(const char *config_path, cairn_t **out);

/* Registers (or re-registers, replacing) a region of `count` elements of `type`
 * at `ptr`. The memory stays owned by the caller and must stay valid until
 * cairn_unprotect or cairn_finalize. Region names are at most 255 bytes.
 * cairn keeps `ptr`, not the data: each cairn_checkpoint reads the region
 * where it is then, and cairn_restart writes it there. A buffer that moves
 * (realloc, or the double-buffer pattern where `cur` and `next` are swapped
 * every step) must be protected again under the same name before each
 * checkpoint, pointing at the buffer that holds the state; restart restores
 * into whatever is protected when it is called (examples/heat2d does both). */
int cairn_protect(cairn_t *c, const char *region, void *ptr, size_t count, cairn_type_t type);

/* As cairn_protect, with a shape (ndims <= CAIRN_MAX_DIMS, product == count).
 * column_major != 0 records Fortran storage order. */
int cairn_protect_shaped(cairn_t *c, const char *region, void *ptr, cairn_type_t type,
                         int ndims, const uint64_t *dims, int column_major);

/* As cairn_protect_shaped, for a block of a global array (as ADIOS2 declares
 * variables): this rank holds `count` elements starting at `start` of a global
 * array of shape `global_shape`. The buffer itself has shape `mem_shape` and the
 * block starts at `mem_start` in it (e.g. a grid with halo cells); pass NULL for
 * both when the buffer is exactly the block. Only the block is checkpointed and
 * restored. The layout lets `cairn diff` compare runs with different rank
 * counts element by element, and lets a version be restored on another rank
 * count: each rank then gets its block (same global shape, type and order) from
 * the old blocks it overlaps (docs/design/reshard.md). All arrays have ndims
 * entries, in the storage order of the data (fastest-varying last, or first
 * when column_major != 0). */
int cairn_protect_block(cairn_t *c, const char *region, void *ptr, cairn_type_t type, int ndims,
                        const uint64_t *global_shape, const uint64_t *start, const uint64_t *count,
                        const uint64_t *mem_shape, const uint64_t *mem_start, int column_major);

/* With capture = cow, waits for a background copy still reading the region,
 * so that its memory may be freed once this returns. */
int cairn_unprotect(cairn_t *c, const char *region);

/* Collective. Captures every protected region as version `version` (>= 0, larger
 * than any earlier version of `name` in this run) of checkpoint `name` and
 * returns: in mode "thread" once the copy to staging memory is complete, in
 * mode "sync" once the local and (when due) persistent levels are written.
 * With capture = cow (thread mode), once the regions are write-protected: they
 * are copied in the background, a write to a part not copied yet waits for
 * that part's copy, and CAIRN_LEVEL_CAPTURED says when the copy ended. Until
 * then, do not unmap, madvise(MADV_DONTNEED) or mremap a region's memory
 * (docs/design/cow-capture.md).
 * An earlier version's background failure (on any rank) never costs this
 * version: it is captured all the same, and the call then returns
 * CAIRN_EEARLIER on every rank, once per failure, with a message that starts
 * "checkpoint 'NAME' version V was taken; an earlier version failed" and gives
 * that failure's code, version and cause. CAIRN_EEARLIER is a warning: this
 * version is on its way, so do not repeat the call (a repeat gives
 * CAIRN_EINVAL, the version is not larger); cairn_test and cairn_wait on the
 * failed version return its own error on every rank from then on.
 * Versions grow across the executions of a run: a version at or below one an
 * earlier execution committed (or left complete in agent memory) gives
 * CAIRN_EEXIST and changes nothing, so a job relaunched by mistake cannot
 * overwrite good checkpoints. */
int cairn_checkpoint(cairn_t *c, const char *name, int64_t version);

/* Local. Sets *levels_reached to the CAIRN_LEVEL_* bits this rank's part of
 * the version has reached; PERSISTENT is set only once the whole version is
 * committed. Returns the version's own error if a level failed on this rank,
 * or on any rank once the ranks have agreed on it (in the next collective
 * call: cairn_checkpoint, cairn_wait, cairn_should_checkpoint). */
int cairn_test(cairn_t *c, const char *name, int64_t version, unsigned *levels_reached);

/* Collective. Blocks until the version has reached `level` (one CAIRN_LEVEL_*
 * bit) on every rank, or returns the error that prevented it (the same on all
 * ranks). CAIRN_ENOTFOUND if the version was never checkpointed by this handle
 * or `level` is not scheduled for it (persistent_interval). */
int cairn_wait(cairn_t *c, const char *name, int64_t version, unsigned level);

/* Collective. Finds the newest version of `name` that every rank has complete,
 * committed and intact (all checksums verified) at some level; the same on all
 * ranks. CAIRN_ENOTFOUND if the run has no checkpoint of `name`;
 * CAIRN_EUNUSABLE if it has some that this job cannot restore (written by
 * another rank count with a region that has no global layout and differs
 * between ranks, every copy damaged, or checkpoint agents that may hold them
 * do not answer within agents_restart_wait), with a message that says which
 * and what to do. Neither changes anything on disk.
 * A committed version written by another rank count is restartable when every
 * region is a block (cairn_protect_block) or the same on every rank that wrote
 * it (docs/design/reshard.md); when the regions are protected already, the
 * bytes this rank needs are read and verified here.
 * With restart_verify = while, a committed node-local shard's header (its
 * identity and its MANIFEST entry) is checked here and its data are verified
 * by cairn_restart, as they are read into the regions. */
int cairn_restart_test(cairn_t *c, const char *name, int64_t *version);

/* As cairn_restart_test, for the newest restartable version at or below
 * max_version (>= 0); CAIRN_ENOTFOUND / CAIRN_EUNUSABLE as there when there is none. */
int cairn_restart_test_max(cairn_t *c, const char *name, int64_t max_version, int64_t *version);

/* Collective. The newest version of `name` that earlier executions of this
 * run committed (a MANIFEST on the persistent level, or complete in agent
 * memory), restartable or not: this execution's checkpoints of `name` must be
 * above it. CAIRN_ENOTFOUND when there is none. For libraries that number
 * versions themselves (the SCR drop-in starts above it when nothing was
 * restarted). */
int cairn_committed_newest(cairn_t *c, const char *name, int64_t *version);

/* Collective. Restores `version` of `name` into the protected regions, taking
 * each rank's shard from the fastest intact level. Every checksum is verified
 * before any region is written. A protected region missing from the checkpoint
 * or with another type or count gives CAIRN_EINVAL (naming the region and both
 * sizes) and leaves every buffer untouched.
 * With restart_verify = while, a node-local shard is verified as it is read
 * into the regions (one pass over memory instead of two). Where a checksum
 * differs, that rank's shard is read again from the next level that holds
 * the same image (verified first) and copied over before cairn_restart
 * returns. Only if no level holds it intact does it return CAIRN_ECORRUPT;
 * the regions then hold part of the version and part of what was there
 * before, and cairn_restart_test no longer offers the version, in this
 * execution or a later one (a DAMAGED file beside its MANIFEST records it):
 * call it again for an older one. */
int cairn_restart(cairn_t *c, const char *name, int64_t version);

/* Collective. With wait_for_pending != 0 waits until every pending version has
 * reached every level scheduled for it, and returns the first error; otherwise
 * pending background work is cancelled (committed versions stay intact).
 * Releases the handle and sets *c = NULL, also on error. */
int cairn_finalize(cairn_t **c, int wait_for_pending);

const char *cairn_strerror(int code);
const char *cairn_last_error(void);

/* What this process asked of the file system (every level, every handle)
 * since it started: for benchmarks and monitoring (metadata operations per
 * version: compare the counts before and after). Thread-safe, never fails. */
typedef struct {
  uint64_t creates;       /* files opened for writing (created or truncated) */
  uint64_t opens;         /* files opened for reading */
  uint64_t fsyncs;        /* fdatasync of files */
  uint64_t renames;
  uint64_t dir_fsyncs;    /* fsync of directories */
  uint64_t mkdirs;        /* mkdir calls, one per path component of a new directory */
  uint64_t removes;       /* unlink and rmdir */
  uint64_t bytes_written;
} cairn_io_counters_t;
void cairn_io_counters(cairn_io_counters_t *out);

/* Run identity, recorded in <store>/runs/<run>/RUN and the catalog (also
 * settable by the configuration keys code_version and tags). Rank 0's values
 * are recorded; other ranks may call these too (they do nothing there). */
int cairn_set_code_version(cairn_t *c, const char *code_version);
int cairn_tag(cairn_t *c, const char *key, const char *value);

/* Online comparison with a reference run (configuration reference_run,
 * compare_abs / compare_rel / compare_ulps, on_divergence = continue | stop).
 * Filled by cairn_divergence with what every rank agreed on at the last
 * collective call; with on_divergence = stop, the cairn_checkpoint after a
 * divergence returns CAIRN_EDIVERGED on every rank. */
typedef struct cairn_divergence {
  int diverged;          /* 1 once a version differed beyond the tolerance */
  int64_t version;       /* the first such version (-1 if none) */
  int rank;              /* a rank where it differs (the lowest) */
  char name[256];        /* checkpoint name */
  char region[256];      /* region ("" for a different rank count) */
  uint64_t index;        /* first mismatching element of the region (of the block for layout regions) */
  char value[64];        /* this run's value there, as text */
  char reference[64];    /* the reference run's value */
  int structural;        /* 1 if the shapes, types or rank counts differ */
  int64_t compared;      /* versions of this rank compared so far */
  int64_t pending;       /* versions of this rank waiting for the reference */
} cairn_divergence_t;
int cairn_divergence(cairn_t *c, cairn_divergence_t *info);

/* Remote checkpoint agents (configuration agents = host:port of the
 * controller, CAIRN_AGENTS). Collective. Applies a pending change of this
 * application's agents decided by the controller (more agents, fewer, or an
 * agent moved to another node) and sets *change to what happened. Call it
 * between checkpoints, e.g. every few iterations; without agents it sets
 * CAIRN_AGENTS_UNCHANGED. Versions already held stay restartable. */
#define CAIRN_AGENTS_UNCHANGED 0
#define CAIRN_AGENTS_EXPANDED 1
#define CAIRN_AGENTS_REDUCED 2
#define CAIRN_AGENTS_MIGRATED 3
int cairn_probe(cairn_t *c, int *change);

/* Batch jobs: checkpoint before the end (docs/design/core.md, "Batch jobs").
 * Collective (one small allreduce, which also moves pending versions on).
 * Sets *yes to 1 on every rank when
 *  - some rank received one of the warning_signals (default SIGUSR1 and
 *    SIGTERM: Slurm's --signal=USR1@T, preemption) since its last
 *    cairn_checkpoint, or
 *  - the time left (cairn_time_left, the smallest over the ranks) is below
 *    deadline_factor x the last measured time from capture to the persistent
 *    level, plus deadline_margin seconds, and no checkpoint was taken since.
 * The answer is the same on every rank even when the signal reached the
 * ranks at different moments, so the application can act on it with a
 * collective cairn_checkpoint (then cairn_wait for CAIRN_LEVEL_PERSISTENT).
 * The handler of the warning signals only counts them; a handler the
 * application installed before cairn_init is still called (chained). The
 * default action of a warning signal is not taken: SIGTERM and SIGUSR1 no
 * longer end the process by themselves (checkpoint, then end; the batch
 * system's SIGKILL follows). warning_signals = none keeps the defaults. */
int cairn_should_checkpoint(cairn_t *c, int *yes);

/* Local. Seconds until the job's end: configuration key deadline, else
 * Slurm's SLURM_JOB_END_TIME; HUGE_VAL when neither is known (negative once
 * the end has passed). */
int cairn_time_left(cairn_t *c, double *seconds);

/* Local. Copies into `value` (len bytes, with its terminating NUL) the value
 * of configuration key `key` (docs/design/core.md) as cairn_init resolved it:
 * the CAIRN_<KEY> environment variable, else the configuration file, else the
 * default. CAIRN_ENOTFOUND for a key cairn does not have; CAIRN_EINVAL if
 * the buffer is too short (the message says how many bytes it needs). Lets a
 * binding act on the configuration (e.g. how checkpoints capture) without
 * resolving it a second time. */
int cairn_config_value(cairn_t *c, const char *key, char *value, size_t len);

/* The checkpoint interval that minimises lost time (docs/design/advise.md),
 * from this rank's measured cost per checkpoint so far and the configuration
 * key mtbf (CAIRN_MTBF: the job's mean time between failures, seconds).
 * The cost is the mean over this execution's checkpoints whose stages have
 * all run: in sync mode the time cairn_checkpoint blocked (every stage); in
 * thread mode the capture plus the checksum, hash-tree and local stages (the
 * passes that take memory bandwidth and CPU from the application). Local: no
 * communication; ranks may differ slightly, so an application that decides
 * collectively uses one rank's answer. CAIRN_EINVAL when mtbf is not set (or
 * advice is NULL); CAIRN_EAGAIN when no checkpoint has finished its stages
 * yet (call it after a cairn_wait, or later). */
typedef struct cairn_advice {
  double interval_s;    /* Daly's higher-order optimum: seconds between checkpoints */
  double young_s;       /* Young's first-order sqrt(2 C M) */
  double cost_s;        /* C: the measured cost per checkpoint (mean) */
  double mtbf_s;        /* M: the configured mtbf */
  int64_t checkpoints;  /* checkpoints C was measured over */
} cairn_advice_t;
int cairn_advice(cairn_t *c, cairn_advice_t *advice);

/* Rank and size of the handle's communicator (0 and 1 for cairn_init). */
int cairn_rank(const cairn_t *c);
int cairn_size(const cairn_t *c);

/* ---- File-based mode (for applications that write their own files) -------
 * Checkpoint:  cairn_checkpoint_begin; for each file cairn_route_file gives the
 *              path to write it to; cairn_checkpoint_end(success) captures the
 *              files as a version that moves through the levels like any other.
 * Restart:     cairn_restart_begin(version) restores the files; cairn_route_file
 *              gives the path to read each from; cairn_restart_end.
 * Routed paths live in the node-local directory; files are identified by their
 * base name. begin/end are collective. Between cairn_restart_begin and
 * cairn_restart_end, cairn_restart may restore the version's memory regions
 * (once or more); with restart_verify = while, a version without routed files
 * is then read and verified in place as outside a sequence, and one with
 * routed files is verified whole by cairn_restart_begin. */
int cairn_checkpoint_begin(cairn_t *c, const char *name, int64_t version);
int cairn_route_file(cairn_t *c, const char *file, char *routed, size_t routed_len);
int cairn_checkpoint_end(cairn_t *c, int success);
int cairn_restart_begin(cairn_t *c, const char *name, int64_t version);
int cairn_restart_end(cairn_t *c, int success);
/* Local, between cairn_restart_begin and cairn_restart_end: sets *bytes to the
 * size of `region` (a protected region's name, or "file:<base name>") in the
 * version being restored; CAIRN_ENOTFOUND if the version has no such region.
 * Lets a caller size a buffer before protecting it and calling cairn_restart,
 * which restores the protected regions from the same verified image. */
int cairn_restart_region_size(cairn_t *c, const char *region, uint64_t *bytes);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif /* CAIRN_H */

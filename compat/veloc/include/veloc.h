/* VELOC client API over cairn (compat/veloc, docs/design/compat.md).
 *
 * A drop-in for VELOC's C client interface: an application written against
 * VELOC builds against cairn by pointing its include path at this header and
 * linking -lveloc-client (this library, which uses libcairn). Names, argument
 * conventions and return codes are VELOC's: every function returns
 * VELOC_SUCCESS or VELOC_FAILURE (VELOC_Restart_test and VELOC_Recover_size
 * return a value or VELOC_FAILURE); a failure prints what went wrong and what
 * to do on stderr (prefix "VELOC (cairn):") and never exits the process.
 *
 * The configuration file is VELOC's ("key = value" lines, '#' or ';'
 * comments); its keys and how they map to cairn's are in
 * docs/design/compat.md. Where VELOC's semantics would lose data (a failed
 * file checkpoint taken as a version, a restart version chosen as the maximum
 * over ranks), cairn's guarantees are kept; the differences are listed there.
 *
 * Threads: one application thread calls these functions, as with VELOC.
 * Under MPI (VELOC_Init) the checkpoint and restart calls are collective over
 * the communicator given to VELOC_Init, as in VELOC's examples.
 */
#ifndef VELOC_H
#define VELOC_H

#include <stddef.h>
#include <string.h>
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* VELOC_SUCCESS, VELOC_FAILURE, VELOC_MAX_NAME (the size of the buffers
 * VELOC_Route_file writes into), the modes of VELOC_Recover_selective and
 * VELOC_Checkpoint_selective, as VELOC defines them. */
#include "veloc/defs.h"

/* ---- init / finalize ------------------------------------------------------
 * VELOC_Init: collective over comm (MPI must be initialized). cfg_file: the
 * VELOC configuration file. Unknown keys, missing required keys (scratch,
 * persistent, mode) and bad values give VELOC_FAILURE with a message.
 * VELOC_Init_single: one process without MPI; id tells independent processes
 * apart (each gets its own cairn run).
 * VELOC_Finalize: drain != 0 waits until every checkpoint is durable at the
 * persistent level and returns the first error; drain == 0 cancels pending
 * flushes (committed versions stay intact). */
int VELOC_Init(MPI_Comm comm, const char *cfg_file);
int VELOC_Init_single(unsigned int id, const char *cfg_file);
int VELOC_Finalize(int drain);

/* ---- memory regions -------------------------------------------------------
 * VELOC_Mem_protect registers (or replaces) `count` elements of `base_size`
 * bytes at ptr under the integer id; the memory stays the caller's and must
 * stay valid while protected. VELOC_Region_* attach the region to a named
 * group: a checkpoint called `name` captures the group `name` if it has
 * regions, else the default group (VELOC_Mem_*). */
int VELOC_Mem_protect(int id, void *ptr, size_t count, size_t base_size);
int VELOC_Mem_unprotect(int id);
int VELOC_Mem_clear(void);
int VELOC_Region_protect(int id, void *ptr, size_t count, size_t base_size, const char *name);
int VELOC_Region_unprotect(int id, const char *name);
int VELOC_Region_clear(const char *name);

/* ---- checkpoint -----------------------------------------------------------
 * VELOC_Checkpoint(name, version): captures every protected region of the
 * group as `version` (>= 0, growing). Returns once the data are copied
 * (mode = async) or written (mode = sync).
 * The same in steps: VELOC_Checkpoint_begin; VELOC_Checkpoint_mem (or
 * _selective) and/or VELOC_Route_file for one file this rank writes itself;
 * VELOC_Checkpoint_end(success). A version is taken only when every rank
 * passes success != 0; otherwise nothing is kept and every rank gets
 * VELOC_FAILURE.
 * VELOC_Checkpoint_wait: collective; waits until the last checkpoint is
 * durable at the persistent level (at once in sync mode).
 * VELOC_Checkpoint_finished: local; VELOC_SUCCESS when the last checkpoint is
 * durable, VELOC_FAILURE while it is still being flushed (or on error). */
int VELOC_Checkpoint(const char *name, int version);
int VELOC_Checkpoint_begin(const char *name, int version);
int VELOC_Checkpoint_mem(void);
int VELOC_Checkpoint_selective(int mode, int *ids, int id_count);
int VELOC_Checkpoint_end(int success);
int VELOC_Checkpoint_wait(void);
int VELOC_Checkpoint_finished(void);

/* Inside a checkpoint or restart sequence: writes to `routed` (at least
 * VELOC_MAX_NAME bytes) the path where this rank writes (or reads back) its
 * checkpoint file. As with VELOC, one file per rank and version: every
 * `original` of a sequence gives the same path. */
int VELOC_Route_file(const char *original, char *routed);

/* Kept for source compatibility: local copies are managed by the retention of
 * cairn (scratch_versions); returns VELOC_SUCCESS and removes nothing. */
int VELOC_Cleanup(const char *name);

/* ---- restart --------------------------------------------------------------
 * VELOC_Restart_test: collective; the newest version of `name` that every rank
 * can restore intact (all checksums verified), at or below `version` when
 * version > 0; VELOC_FAILURE when there is none (the reason on stderr when
 * checkpoints exist that this job cannot use).
 * VELOC_Restart(name, version) = VELOC_Restart_begin + VELOC_Recover_mem +
 * VELOC_Restart_end. VELOC_Recover_size(id): bytes of region id in the version
 * being restored (between begin and end), VELOC_FAILURE if it has none.
 * VELOC_Recover_mem / _selective restore protected regions; a region may be
 * protected larger than it was checkpointed (its first bytes are restored). */
int VELOC_Restart_test(const char *name, int version);
int VELOC_Restart(const char *name, int version);
int VELOC_Restart_begin(const char *name, int version);
int VELOC_Recover_mem(void);
int VELOC_Recover_selective(int mode, int *ids, int id_count);
int VELOC_Recover_size(int id);
int VELOC_Restart_end(int success);

#ifdef __cplusplus
}
#endif

#endif /* VELOC_H */

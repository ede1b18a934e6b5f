/* SCR client API subset over cairn (compat/scr, docs/design/compat.md).
 *
 * A drop-in for the part of SCR's C interface that SCR's example test_api.c
 * uses: an application written against SCR builds against cairn by pointing
 * its include path at this header and linking -lscr (this library, which uses
 * libcairn). Return codes and argument conventions are SCR's: SCR_SUCCESS, or
 * another value with a message on stderr (prefix "SCR (cairn):"); flags set
 * by the collective queries are the same on every rank.
 *
 * Collective over MPI_COMM_WORLD, as in SCR: SCR_Init, SCR_Finalize,
 * SCR_Have_restart, SCR_Start_restart, SCR_Complete_restart,
 * SCR_Need_checkpoint, SCR_Start_checkpoint, SCR_Complete_checkpoint,
 * SCR_Start_output, SCR_Complete_output, SCR_Should_exit, SCR_Current.
 * SCR_Route_file and SCR_Config are local.
 *
 * Configuration: SCR's parameters as environment variables or SCR_Config
 * calls before SCR_Init (SCR_PREFIX, SCR_CACHE_BASE, SCR_CACHE_SIZE,
 * SCR_FLUSH, SCR_CHECKPOINT_INTERVAL, SCR_CHECKPOINT_SECONDS,
 * SCR_CHECKPOINT_OVERHEAD, SCR_HALT_SECONDS); see docs/design/compat.md.
 */
#ifndef SCR_H
#define SCR_H

#ifdef __cplusplus
extern "C" {
#endif

#define SCR_MAJOR_VERSION "3"
#define SCR_MINOR_VERSION "1"
#define SCR_PATCH_VERSION "0"
#define SCR_VERSION "v3.1.0"

#define SCR_SUCCESS (0)

/* Size of the buffers SCR_Route_file, SCR_Have_restart and SCR_Start_restart write into. */
#define SCR_MAX_FILENAME 1024

/* Flags of SCR_Start_output, OR'd together. */
#define SCR_FLAG_NONE (0 << 0)
#define SCR_FLAG_CHECKPOINT (1 << 0) /* the job can restart from this dataset */
#define SCR_FLAG_OUTPUT (1 << 1)     /* the dataset's files must reach their paths on the file system */

/* MPI must be initialized; reads the configuration. */
int SCR_Init(void);
/* Waits until every checkpoint is durable; returns the first error. */
int SCR_Finalize(void);

/* Before SCR_Init: "KEY=VALUE" sets a parameter (returns NULL), "KEY="
 * unsets it (NULL), "KEY" returns a copy of its value (free() it) or NULL. */
const char *SCR_Config(const char *config);
/* SCR_Config of the printf-formatted text (SCR 3). */
const char *SCR_Configf(const char *format, ...);

/* SCR 3's removal of a dataset from the index (SCR_Drop) or from the index
 * and the file system (SCR_Delete): not provided by the cairn drop-in, which
 * keeps SCR_CACHE_SIZE datasets in cache and every committed one in the
 * prefix (remove them with `cairn gc`). They return SCR_FAILURE saying so. */
int SCR_Drop(const char *name);
int SCR_Delete(const char *name);

/* The path to write (inside an output phase) or read (inside a restart phase)
 * the file `name`; outside both, `name` itself. `file` holds at least
 * SCR_MAX_FILENAME bytes. Local. */
int SCR_Route_file(const char *name, char *file);

/* *flag = 1 when a checkpoint can be restored; `name` (may be NULL) gets the
 * dataset's name. The newest dataset every rank has intact is chosen. */
int SCR_Have_restart(int *flag, char *name);
int SCR_Start_restart(char *name);
/* SCR_SUCCESS only when every rank passes valid != 0; otherwise the next
 * older checkpoint is offered by the next SCR_Have_restart. */
int SCR_Complete_restart(int valid);

/* *flag = 1 when a checkpoint is due (SCR_CHECKPOINT_INTERVAL calls,
 * SCR_CHECKPOINT_SECONDS since the last one, or its measured cost below
 * SCR_CHECKPOINT_OVERHEAD percent of the time since it). */
int SCR_Need_checkpoint(int *flag);
int SCR_Start_checkpoint(void);
int SCR_Complete_checkpoint(int valid);

/* name: the dataset's name (the same on every rank; NULL: a default from its
 * id). SCR_Complete_output returns SCR_SUCCESS only when every rank passes
 * valid != 0; a dataset some rank could not write is never kept. */
int SCR_Start_output(const char *name, int flags);
int SCR_Complete_output(int valid);

/* The checkpoint the next SCR_Have_restart offers: the dataset `name`. */
int SCR_Current(const char *name);

/* *flag = 1 when the job should stop (the halt file <SCR_PREFIX>/.scr/halt
 * exists, or fewer than SCR_HALT_SECONDS remain before SCR_END_TIME). */
int SCR_Should_exit(int *flag);

char *SCR_Get_version(void);

#ifdef __cplusplus
}
#endif

#endif /* SCR_H */

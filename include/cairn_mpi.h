/* cairn: MPI entry point. Include after <mpi.h>; link with cairn::cairn. */
#ifndef CAIRN_MPI_H
#define CAIRN_MPI_H

#include <mpi.h>

#include "cairn.h"

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__) /* exported from libcairn, which hides everything else */
#pragma GCC visibility push(default)
#endif

/* Collective over `comm`, which cairn duplicates (the application may free its
 * own afterwards). MPI must be initialized; any thread level suffices because
 * cairn calls MPI only from the thread that calls cairn. Each rank's state is a
 * shard of the checkpoint; restart needs the same number of ranks. */
int cairn_init_mpi(MPI_Comm comm, const char *config_path, cairn_t **out);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif /* CAIRN_MPI_H */

/* The C interface between libcairn and its MPI plugin, libcairn-mpi.so
 * (docs/design/mpi-plugin.md). libcairn does not link libmpi, so that a
 * program without MPI, and a Python wheel on a machine without MPI, load it;
 * cairn_init_mpi loads the plugin, which links the MPI library libcairn was
 * built with, and calls MPI through this table only. Both sides are built from
 * one tree: the table carries an ABI number and the size of MPI_Comm, which
 * the loader checks. */
#ifndef CAIRN_MPI_PLUGIN_H
#define CAIRN_MPI_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CAIRN_MPI_PLUGIN_ABI 1
#define CAIRN_MPI_PLUGIN_SYMBOL "cairn_mpi_plugin_v1"

/* Outcome of write_at_all. */
enum { CAIRN_MPI_OK = 0, CAIRN_MPI_IO_ERROR = 1, CAIRN_MPI_TOO_LARGE = 2 };

typedef struct cairn_mpi_plugin {
  uint32_t abi;       /* CAIRN_MPI_PLUGIN_ABI */
  uint32_t comm_size; /* sizeof(MPI_Comm) in the plugin's build */
  int (*initialized)(void);
  int (*finalized)(void);
  /* Duplicates *(const MPI_Comm*)comm; the duplicate's handle, its rank and size. */
  void* (*dup)(const void* comm, int* rank, int* size);
  /* Frees the duplicate (unless MPI is finalized) and the handle. */
  void (*release)(void* h);
  void (*allreduce_min_i64)(void* h, int64_t* values, int n);
  /* n bytes from every rank to rank 0's `all` (NULL elsewhere), in rank order. */
  void (*gather)(void* h, const void* mine, int n, void* all);
  void (*gatherv)(void* h, const void* mine, int n, void* all, const int* sizes, const int* displs);
  void (*allgather)(void* h, const void* mine, int n, void* all);
  void (*bcast)(void* h, void* buf, int n, int root);
  void (*barrier)(void* h);
  /* Collective write of `len` bytes at `offset` of `path` (created, never
   * truncated), then sync and close; on failure the message in err. */
  int (*write_at_all)(void* h, const char* path, uint64_t offset, const void* data, uint64_t len, char* err,
                      size_t err_size);
} cairn_mpi_plugin;

/* The plugin's one export (CAIRN_MPI_PLUGIN_SYMBOL). */
const cairn_mpi_plugin* cairn_mpi_plugin_v1(void);

#ifdef __cplusplus
}
#endif

#endif /* CAIRN_MPI_PLUGIN_H */

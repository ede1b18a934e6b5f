// libcairn-mpi.so: the MPI calls of cairn's communicator (mpi_plugin.h). The
// only code of cairn that links libmpi; loaded by cairn_init_mpi.
#include "comm/mpi_plugin.h"

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <new>

namespace {

struct handle {
  MPI_Comm comm = MPI_COMM_NULL;
};

MPI_Comm of(void* h) { return static_cast<handle*>(h)->comm; }

int initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag;
}

int finalized() {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag;
}

void* dup(const void* comm, int* rank, int* size) {
  auto* h = new (std::nothrow) handle;
  if (h == nullptr) return nullptr;
  if (MPI_Comm_dup(*static_cast<const MPI_Comm*>(comm), &h->comm) != MPI_SUCCESS) {
    delete h;
    return nullptr;
  }
  MPI_Comm_rank(h->comm, rank);
  MPI_Comm_size(h->comm, size);
  return h;
}

void release(void* h) {
  if (h == nullptr) return;
  if (!finalized()) MPI_Comm_free(&static_cast<handle*>(h)->comm);
  delete static_cast<handle*>(h);
}

void allreduce_min_i64(void* h, int64_t* values, int n) {
  MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_INT64_T, MPI_MIN, of(h));
}

void gather(void* h, const void* mine, int n, void* all) {
  MPI_Gather(mine, n, MPI_BYTE, all, n, MPI_BYTE, 0, of(h));
}

void gatherv(void* h, const void* mine, int n, void* all, const int* sizes, const int* displs) {
  MPI_Gatherv(mine, n, MPI_BYTE, all, sizes, displs, MPI_BYTE, 0, of(h));
}

void allgather(void* h, const void* mine, int n, void* all) {
  MPI_Allgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, of(h));
}

void bcast(void* h, void* buf, int n, int root) { MPI_Bcast(buf, n, MPI_BYTE, root, of(h)); }

void barrier(void* h) { MPI_Barrier(of(h)); }

int write_at_all(void* h, const char* path, uint64_t offset, const void* data, uint64_t len, char* err,
                 size_t err_size) {
  int outcome = CAIRN_MPI_OK;
  auto failed = [&](const char* what, int rc) {
    if (outcome != CAIRN_MPI_OK) return;  // the first failure is the one to tell
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, text, &n);
    std::snprintf(err, err_size, "%s %s: %.*s", what, path, n, text);
    outcome = CAIRN_MPI_IO_ERROR;
  };
  MPI_File fh;
  int rc = MPI_File_open(of(h), path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
  if (rc != MPI_SUCCESS) {
    failed("MPI_File_open", rc);
    return outcome;
  }
  // Counts are ints: pages of 4 KiB (images are page multiples) reach 8 TiB.
  MPI_Datatype unit = MPI_BYTE;
  uint64_t count = len;
  if (count % 4096 == 0) {
    MPI_Type_contiguous(4096, MPI_BYTE, &unit);
    MPI_Type_commit(&unit);
    count /= 4096;
  }
  if (count > INT32_MAX) {
    std::snprintf(err, err_size, "%s: image too large for one MPI-IO call", path);
    outcome = CAIRN_MPI_TOO_LARGE;
    count = 0;  // the collective is still called, by every rank
  }
  rc = MPI_File_write_at_all(fh, static_cast<MPI_Offset>(offset), data, static_cast<int>(count), unit,
                             MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) failed("MPI_File_write_at_all", rc);
  rc = MPI_File_sync(fh);  // collective: every rank calls it, whatever its write did
  if (rc != MPI_SUCCESS) failed("MPI_File_sync", rc);
  rc = MPI_File_close(&fh);
  if (rc != MPI_SUCCESS) failed("MPI_File_close", rc);
  if (unit != MPI_BYTE) MPI_Type_free(&unit);
  return outcome;
}

const cairn_mpi_plugin kPlugin = {CAIRN_MPI_PLUGIN_ABI,
                                  static_cast<uint32_t>(sizeof(MPI_Comm)),
                                  initialized,
                                  finalized,
                                  dup,
                                  release,
                                  allreduce_min_i64,
                                  gather,
                                  gatherv,
                                  allgather,
                                  bcast,
                                  barrier,
                                  write_at_all};

}  // namespace

extern "C" __attribute__((visibility("default"))) const cairn_mpi_plugin* cairn_mpi_plugin_v1(void) {
  return &kPlugin;
}

#ifndef CAIRN_MPI_COMM_HPP
#define CAIRN_MPI_COMM_HPP

#include <mpi.h>

#include "comm/comm.hpp"

namespace cairn::comm {
// Loads cairn's MPI plugin (libcairn-mpi.so, mpi_plugin.h) the first time and
// duplicates `comm`; the duplicate is freed with the object (before
// MPI_Finalize). not_supported, saying where it looked and why it failed,
// where the plugin cannot be loaded. MPI must be initialized.
result<std::unique_ptr<communicator>> make_mpi(MPI_Comm comm);
}  // namespace cairn::comm

#endif

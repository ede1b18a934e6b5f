#ifndef CAIRN_MPI_COMM_HPP
#define CAIRN_MPI_COMM_HPP

#include <mpi.h>

#include "comm/comm.hpp"

namespace cairn::comm {
// Duplicates `comm`; the duplicate is freed with the object (before MPI_Finalize).
std::unique_ptr<communicator> make_mpi(MPI_Comm comm);
}  // namespace cairn::comm

#endif

// cairn C++ API, MPI entry point.
#ifndef CAIRN_MPI_HPP
#define CAIRN_MPI_HPP

#include <mpi.h>

#include "cairn/cairn.hpp"

namespace cairn {
#if defined(__GNUC__)   // exported from libcairn, which hides everything else
#pragma GCC visibility push(default)
#endif
// Collective over comm (duplicated). See cairn_init_mpi.
result<client> create_mpi(MPI_Comm comm, const std::string& config_path = {});
#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
}  // namespace cairn

#endif

// MPI entry points (cairn_mpi.h, cairn/mpi.hpp).
#include "cairn_mpi.h"

#include "cairn/mpi.hpp"
#include "capi/handle.hpp"
#include "client/client.hpp"
#include "comm/mpi_comm.hpp"

namespace cairn {

result<client> create_mpi(MPI_Comm comm, const std::string& config_path) {
  CAIRN_ASSIGN_OR_RETURN(auto c, comm::make_mpi(comm));
  CAIRN_ASSIGN_OR_RETURN(auto impl, client_impl::create(std::move(c), config_path));
  return client(std::move(impl));
}

}  // namespace cairn

extern "C" int cairn_init_mpi(MPI_Comm comm, const char* config_path, cairn_t** out) {
  return cairn::capi::guard(__func__, [&]() -> cairn::status {
    if (out == nullptr) return {cairn::errc::invalid_argument, "cairn_init_mpi: out is NULL"};
    *out = nullptr;
    CAIRN_ASSIGN_OR_RETURN(auto cl, cairn::create_mpi(comm, config_path ? config_path : ""));
    *out = new cairn_t(std::move(cl));
    return {};
  });
}

// The small collective interface the client needs (ADIOS2 helper::Comm style):
// a serial implementation and an MPI one (mpi_comm.cpp, only with MPI).
// Called only from the application thread that calls cairn.
#ifndef CAIRN_COMM_HPP
#define CAIRN_COMM_HPP

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cairn/status.hpp"

namespace cairn::comm {

class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Element-wise minimum over all ranks, in place.
  virtual void allreduce_min(std::span<int64_t> values) = 0;
  // Gathers `mine` (same size on every rank) to rank 0; `all` (rank 0 only)
  // receives size()*mine.size() bytes in rank order.
  virtual void gather(std::span<const std::byte> mine, std::vector<std::byte>* all) = 0;
  // Every rank's `mine` (same size on every rank) on every rank: `all`
  // receives size()*mine.size() bytes in rank order.
  virtual void allgather(std::span<const std::byte> mine, std::vector<std::byte>* all) = 0;
  // Gathers strings of any length to rank 0 (`all`, rank 0 only, in rank order).
  virtual void gather_strings(const std::string& mine, std::vector<std::string>* all) = 0;
  // Collective: every rank writes `data` at `offset` of the shared file
  // `path` (created if missing, never truncated) in one collective call
  // (MPI_File_write_at_all), then the file is synced (MPI_File_sync) and
  // closed. Returns this rank's outcome.
  virtual cairn::status write_at_all(const std::string& path, uint64_t offset, std::span<const std::byte> data) = 0;
  // Broadcasts a string from `root`.
  virtual void broadcast(std::string* s, int root) = 0;
  virtual void barrier() = 0;
  // Host name of this process (for the manifest).
  virtual std::string host() const;

  int64_t min(int64_t v) {
    allreduce_min(std::span<int64_t>(&v, 1));
    return v;
  }
};

std::unique_ptr<communicator> make_serial();

// Collective: every rank's line (no newline in it) on every rank, in rank order.
std::vector<std::string> allgather_lines(communicator& c, const std::string& mine);

}  // namespace cairn::comm

#endif

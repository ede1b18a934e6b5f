#include "comm/mpi_comm.hpp"

#include <cstdint>
#include <string>

namespace cairn::comm {
namespace {

class mpi_comm final : public communicator {
 public:
  explicit mpi_comm(MPI_Comm c) {
    MPI_Comm_dup(c, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~mpi_comm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_min(std::span<int64_t> v) override {
    MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT64_T, MPI_MIN, comm_);
  }
  void gather(std::span<const std::byte> mine, std::vector<std::byte>* all) override {
    if (rank_ == 0) all->resize(mine.size() * static_cast<size_t>(size_));
    MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, rank_ == 0 ? all->data() : nullptr,
               static_cast<int>(mine.size()), MPI_BYTE, 0, comm_);
  }
  void allgather(std::span<const std::byte> mine, std::vector<std::byte>* all) override {
    all->resize(mine.size() * static_cast<size_t>(size_));
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all->data(), static_cast<int>(mine.size()),
                  MPI_BYTE, comm_);
  }
  void gather_strings(const std::string& mine, std::vector<std::string>* all) override {
    int n = static_cast<int>(mine.size());
    std::vector<int> sizes(rank_ == 0 ? static_cast<size_t>(size_) : 0), displs;
    MPI_Gather(&n, 1, MPI_INT, rank_ == 0 ? sizes.data() : nullptr, 1, MPI_INT, 0, comm_);
    std::string buf;
    if (rank_ == 0) {
      int total = 0;
      for (int s : sizes) {
        displs.push_back(total);
        total += s;
      }
      buf.resize(static_cast<size_t>(total));
    }
    MPI_Gatherv(mine.data(), n, MPI_CHAR, rank_ == 0 ? buf.data() : nullptr, rank_ == 0 ? sizes.data() : nullptr,
                rank_ == 0 ? displs.data() : nullptr, MPI_CHAR, 0, comm_);
    if (rank_ != 0) return;
    all->clear();
    for (int r = 0; r < size_; ++r) all->push_back(buf.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(sizes[r])));
  }
  cairn::status write_at_all(const std::string& path, uint64_t offset, std::span<const std::byte> data) override {
    auto failed = [&](const char* what, int rc) {
      char text[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, text, &len);
      return cairn::status(cairn::errc::io_error, std::string(what) + " " + path + ": " + std::string(text, len));
    };
    MPI_File fh;
    int rc = MPI_File_open(comm_, path.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
    if (rc != MPI_SUCCESS) return failed("MPI_File_open", rc);
    // Counts are ints: pages of 4 KiB (images are page multiples) reach 8 TiB.
    MPI_Datatype unit = MPI_BYTE;
    uint64_t count = data.size();
    if (count % 4096 == 0) {
      MPI_Type_contiguous(4096, MPI_BYTE, &unit);
      MPI_Type_commit(&unit);
      count /= 4096;
    }
    cairn::status st;
    if (count > INT32_MAX) st = cairn::status(cairn::errc::invalid_argument, path + ": image too large for one MPI-IO call");
    rc = MPI_File_write_at_all(fh, static_cast<MPI_Offset>(offset), data.data(), st ? static_cast<int>(count) : 0, unit,
                               MPI_STATUS_IGNORE);
    if (st && rc != MPI_SUCCESS) st = failed("MPI_File_write_at_all", rc);
    rc = MPI_File_sync(fh);  // collective: every rank calls it, whatever its write did
    if (st && rc != MPI_SUCCESS) st = failed("MPI_File_sync", rc);
    rc = MPI_File_close(&fh);
    if (st && rc != MPI_SUCCESS) st = failed("MPI_File_close", rc);
    if (unit != MPI_BYTE) MPI_Type_free(&unit);
    return st;
  }
  void broadcast(std::string* s, int root) override {
    int64_t n = static_cast<int64_t>(s->size());
    MPI_Bcast(&n, 1, MPI_INT64_T, root, comm_);
    s->resize(static_cast<size_t>(n));
    MPI_Bcast(s->data(), static_cast<int>(n), MPI_CHAR, root, comm_);
  }
  void barrier() override { MPI_Barrier(comm_); }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<communicator> make_mpi(MPI_Comm comm) { return std::make_unique<mpi_comm>(comm); }

}  // namespace cairn::comm

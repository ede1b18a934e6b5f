#include "comm/mpi_comm.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "comm/mpi_plugin.h"
#include "util/mutex.hpp"

namespace cairn::comm {
namespace {

constexpr const char* kPluginName = "libcairn-mpi.so";

// Where the plugin is looked for: CAIRN_MPI_PLUGIN (a path) alone when set;
// else beside libcairn itself (the build tree, the install's libdir, the
// Python package's cairn/lib), then the dynamic linker's search path.
std::vector<std::string> plugin_candidates() {
  if (const char* env = std::getenv("CAIRN_MPI_PLUGIN"); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> out;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_candidates), &info) != 0 && info.dli_fname != nullptr) {
    std::string self = info.dli_fname;
    auto slash = self.rfind('/');
    if (slash != std::string::npos) out.push_back(self.substr(0, slash + 1) + kPluginName);
  }
  out.push_back(kPluginName);
  return out;
}

// The plugin once loaded (a failed load is tried again at the next call).
struct plugin_slot {
  cairn::mutex mu;
  const cairn_mpi_plugin* loaded CAIRN_GUARDED_BY(mu) = nullptr;
};

result<const cairn_mpi_plugin*> load_plugin() {
  static plugin_slot slot;
  cairn::lock_guard lock(slot.mu);
  if (slot.loaded != nullptr) return slot.loaded;
  std::string tried;
  for (const std::string& path : plugin_candidates()) {
    if (!tried.empty()) tried += "; ";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();  // names the file that failed: the plugin, or the libmpi it needs
      tried += path + " (" + (why != nullptr ? why : "cannot be loaded") + ")";
      continue;
    }
    auto entry = reinterpret_cast<const cairn_mpi_plugin* (*)()>(dlsym(lib, CAIRN_MPI_PLUGIN_SYMBOL));
    const cairn_mpi_plugin* p = entry != nullptr ? entry() : nullptr;
    if (p == nullptr || p->abi != CAIRN_MPI_PLUGIN_ABI || p->comm_size != sizeof(MPI_Comm)) {
      tried += path + ": not the MPI plugin of this libcairn (another build of cairn?)";
      dlclose(lib);
      continue;
    }
    slot.loaded = p;  // never unloaded: communicators of any handle may use it until exit
    return p;
  }
  return status(errc::not_supported,
                std::string("cairn_init_mpi: cannot load cairn's MPI plugin: ") + tried + ". libcairn calls MPI through " +
                    kPluginName + ", which cairn builds where MPI is found and installs beside libcairn, and which "
                    "needs the MPI library cairn was built with; install both, or set CAIRN_MPI_PLUGIN to the "
                    "plugin's path");
}

class mpi_comm final : public communicator {
 public:
  mpi_comm(const cairn_mpi_plugin* p, void* h, int rank, int size) : p_(p), h_(h), rank_(rank), size_(size) {}
  ~mpi_comm() override { p_->release(h_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_min(std::span<int64_t> v) override {
    p_->allreduce_min_i64(h_, v.data(), static_cast<int>(v.size()));
  }
  void gather(std::span<const std::byte> mine, std::vector<std::byte>* all) override {
    if (rank_ == 0) all->resize(mine.size() * static_cast<size_t>(size_));
    p_->gather(h_, mine.data(), static_cast<int>(mine.size()), rank_ == 0 ? all->data() : nullptr);
  }
  void allgather(std::span<const std::byte> mine, std::vector<std::byte>* all) override {
    all->resize(mine.size() * static_cast<size_t>(size_));
    p_->allgather(h_, mine.data(), static_cast<int>(mine.size()), all->data());
  }
  void gather_strings(const std::string& mine, std::vector<std::string>* all) override {
    int n = static_cast<int>(mine.size());
    std::vector<int> sizes(rank_ == 0 ? static_cast<size_t>(size_) : 0), displs;
    p_->gather(h_, &n, static_cast<int>(sizeof n), rank_ == 0 ? sizes.data() : nullptr);
    std::string buf;
    if (rank_ == 0) {
      int total = 0;
      for (int s : sizes) {
        displs.push_back(total);
        total += s;
      }
      buf.resize(static_cast<size_t>(total));
    }
    p_->gatherv(h_, mine.data(), n, rank_ == 0 ? buf.data() : nullptr, rank_ == 0 ? sizes.data() : nullptr,
                rank_ == 0 ? displs.data() : nullptr);
    if (rank_ != 0) return;
    all->clear();
    for (int r = 0; r < size_; ++r) {
      all->push_back(buf.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(sizes[r])));
    }
  }
  cairn::status write_at_all(const std::string& path, uint64_t offset, std::span<const std::byte> data) override {
    char err[512] = "";
    switch (p_->write_at_all(h_, path.c_str(), offset, data.data(), data.size(), err, sizeof err)) {
      case CAIRN_MPI_OK: return {};
      case CAIRN_MPI_TOO_LARGE: return {errc::invalid_argument, err};
      default: return {errc::io_error, err};
    }
  }
  void broadcast(std::string* s, int root) override {
    int64_t n = static_cast<int64_t>(s->size());
    p_->bcast(h_, &n, static_cast<int>(sizeof n), root);
    s->resize(static_cast<size_t>(n));
    p_->bcast(h_, s->data(), static_cast<int>(n), root);
  }
  void barrier() override { p_->barrier(h_); }

 private:
  const cairn_mpi_plugin* p_;
  void* h_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

result<std::unique_ptr<communicator>> make_mpi(MPI_Comm comm) {
  CAIRN_ASSIGN_OR_RETURN(const cairn_mpi_plugin* p, load_plugin());
  if (!p->initialized()) return status(errc::invalid_argument, "cairn_init_mpi: call MPI_Init first");
  int rank = 0, size = 1;
  void* h = p->dup(&comm, &rank, &size);
  if (h == nullptr) return status(errc::internal, "cairn_init_mpi: MPI_Comm_dup failed");
  return std::unique_ptr<communicator>(std::make_unique<mpi_comm>(p, h, rank, size));
}

}  // namespace cairn::comm

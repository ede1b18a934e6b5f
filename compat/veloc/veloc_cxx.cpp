// VELOC's C++ API (include/veloc.hpp) over the drop-in's C API (veloc.h).
// Raw regions go to the C library as they are. A serialized region is written
// into a buffer of its own when a checkpoint captures its group, and that
// buffer is protected in the C library under the region's id; at restart the
// buffer is sized from the version (VELOC_Recover_size), restored, then read
// by the deserializer. Groups are the C library's: "default" is its default
// group (VELOC_Mem_*), any other name a named one (VELOC_Region_*).
#include "veloc.hpp"

#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

namespace veloc {

client_t::~client_t() = default;

namespace {

struct serialized {
  client_t::serializer_t s;
  client_t::deserializer_t d;
  std::string bytes;  // what the C library protects
};

class client_impl;
// The process's client. Not destroyed at exit (MPI is finalized by then):
// deleting it ends the library, as VELOC's does.
client_impl* g_client = nullptr;

class client_impl final : public client_t {
 public:
  ~client_impl() override {
    g_client = nullptr;
    (void)VELOC_Finalize(1);
  }

  bool mem_protect(int id, void* ptr, size_t count, size_t base_size, const std::string& name) override {
    serial_[name].erase(id);
    if (protect(name, id, ptr, count * base_size) != VELOC_SUCCESS) return false;
    raw_[name].insert(id);
    return true;
  }
  bool mem_protect(int id, const serializer_t& s, const deserializer_t& d, const std::string& name) override {
    if (!s || !d) return complain("mem_protect: a serialized region needs a serializer and a deserializer");
    if (raw_[name].erase(id)) (void)unprotect(name, id);
    serial_[name][id] = serialized{s, d, {}};
    return true;
  }
  bool mem_unprotect(int id, const std::string& name) override {
    const bool was_serial = serial_[name].erase(id) > 0;
    const bool was_raw = raw_[name].erase(id) > 0;
    if (was_raw || was_serial) (void)unprotect(name, id);  // a serialized one may not be in the C library yet
    return was_raw || was_serial;
  }
  void mem_clear(const std::string& name) override {
    serial_[name].clear();
    raw_[name].clear();
    (void)(name == default_mem_group ? VELOC_Mem_clear() : VELOC_Region_clear(name.c_str()));
  }
  bool register_observer(int type, const observer_t& obs) override {
    observers_[type] = obs;
    return true;
  }

  std::string route_file(const std::string& original) override {
    char routed[VELOC_MAX_NAME] = {0};
    if (VELOC_Route_file(original.c_str(), routed) != VELOC_SUCCESS) return {};
    return routed;
  }
  bool cleanup(const std::string& name) override { return VELOC_Cleanup(name.c_str()) == VELOC_SUCCESS; }

  bool checkpoint(const std::string& name, int version) override {
    return checkpoint_begin(name, version) && checkpoint_mem(VELOC_CKPT_ALL, {}) && checkpoint_end(true);
  }
  bool checkpoint_begin(const std::string& name, int version) override {
    if (VELOC_Checkpoint_begin(name.c_str(), version) != VELOC_SUCCESS) return false;
    name_ = name;
    version_ = version;
    return true;
  }
  bool checkpoint_mem(int mode, const std::set<int>& ids) override {
    const std::string group = group_of(name_);
    for (auto& [id, r] : serial_[group]) {
      if (!selected(mode, ids, id)) continue;
      std::ostringstream out;
      r.s(out);
      if (!out) return complain("checkpoint_mem: the serializer of region " + std::to_string(id) + " failed");
      r.bytes = std::move(out).str();
      if (protect(group, id, r.bytes.data(), r.bytes.size()) != VELOC_SUCCESS) return false;
    }
    std::vector<int> v(ids.begin(), ids.end());
    return (mode == VELOC_CKPT_ALL ? VELOC_Checkpoint_mem()
                                   : VELOC_Checkpoint_selective(mode, v.data(), static_cast<int>(v.size()))) ==
           VELOC_SUCCESS;
  }
  bool checkpoint_end(bool success) override {
    const bool ok = VELOC_Checkpoint_end(success ? 1 : 0) == VELOC_SUCCESS;
    if (auto it = observers_.find(VELOC_OBSERVE_CKPT_END); ok && it != observers_.end()) it->second(name_, version_);
    return ok;
  }
  bool checkpoint_wait() override { return VELOC_Checkpoint_wait() == VELOC_SUCCESS; }
  bool checkpoint_finished() override { return VELOC_Checkpoint_finished() == VELOC_SUCCESS; }

  int restart_test(const std::string& name, int version, int target_rank) override {
    if (!own_rank(target_rank, "restart_test")) return VELOC_FAILURE;
    return VELOC_Restart_test(name.c_str(), version);
  }
  bool restart(const std::string& name, int version, int target_rank) override {
    return restart_begin(name, version, target_rank) && recover_mem(VELOC_RECOVER_ALL, {}) && restart_end(true);
  }
  bool restart_begin(const std::string& name, int version, int target_rank) override {
    if (!own_rank(target_rank, "restart_begin")) return false;
    if (VELOC_Restart_begin(name.c_str(), version) != VELOC_SUCCESS) return false;
    name_ = name;
    version_ = version;
    return true;
  }
  size_t recover_size(int id) override {
    const int n = VELOC_Recover_size(id);
    return n < 0 ? 0 : static_cast<size_t>(n);
  }
  bool recover_mem(int mode, const std::set<int>& ids) override {
    const std::string group = group_of(name_);
    std::vector<serialized*> read;
    for (auto& [id, r] : serial_[group]) {
      if (!selected(mode, ids, id)) continue;
      const int n = VELOC_Recover_size(id);
      if (n < 0) return complain("recover_mem: version " + std::to_string(version_) + " of '" + name_ +
                                 "' has no region " + std::to_string(id));
      r.bytes.assign(static_cast<size_t>(n), '\0');
      if (protect(group, id, r.bytes.data(), r.bytes.size()) != VELOC_SUCCESS) return false;
      read.push_back(&r);
    }
    std::vector<int> v(ids.begin(), ids.end());
    if ((mode == VELOC_RECOVER_ALL ? VELOC_Recover_mem()
                                   : VELOC_Recover_selective(mode, v.data(), static_cast<int>(v.size()))) !=
        VELOC_SUCCESS)
      return false;
    for (serialized* r : read) {
      std::istringstream in(r->bytes);
      if (!r->d(in)) return complain("recover_mem: a deserializer of '" + name_ + "' refused what was saved");
    }
    return true;
  }
  bool restart_end(bool success) override { return VELOC_Restart_end(success ? 1 : 0) == VELOC_SUCCESS; }

 private:
  static bool complain(const std::string& what) {
    std::fprintf(stderr, "VELOC (cairn drop-in): %s\n", what.c_str());
    return false;
  }
  static bool own_rank(int target_rank, const char* fn) {
    if (target_rank < 0) return true;
    return complain(std::string(fn) + ": restoring another rank's checkpoint (target_rank) is not provided");
  }
  static bool selected(int mode, const std::set<int>& ids, int id) {
    if (mode == VELOC_CKPT_SOME) return ids.count(id) > 0;
    if (mode == VELOC_CKPT_REST) return ids.count(id) == 0;
    return true;
  }
  // The group a checkpoint or restart called `name` uses (the C library's rule).
  std::string group_of(const std::string& name) {
    if (!raw_[name].empty() || !serial_[name].empty()) return name;
    return default_mem_group;
  }
  static int protect(const std::string& group, int id, void* ptr, size_t bytes) {
    return group == default_mem_group ? VELOC_Mem_protect(id, ptr, bytes, 1)
                                      : VELOC_Region_protect(id, ptr, bytes, 1, group.c_str());
  }
  static int unprotect(const std::string& group, int id) {
    return group == default_mem_group ? VELOC_Mem_unprotect(id) : VELOC_Region_unprotect(id, group.c_str());
  }

  std::map<std::string, std::set<int>> raw_;
  std::map<std::string, std::map<int, serialized>> serial_;
  std::map<int, observer_t> observers_;
  std::string name_;
  int version_ = 0;
};

}  // namespace

client_t* get_client(unsigned int id, const std::string& cfg_file) {
  if (g_client == nullptr && VELOC_Init_single(id, cfg_file.c_str()) == VELOC_SUCCESS) g_client = new client_impl();
  return g_client;
}

client_t* get_client(MPI_Comm comm, const std::string& cfg_file) {
  if (g_client == nullptr && VELOC_Init(comm, cfg_file.c_str()) == VELOC_SUCCESS) g_client = new client_impl();
  return g_client;
}

}  // namespace veloc

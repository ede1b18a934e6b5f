#include "engine/recycler.hpp"

#include <algorithm>

#include "format/layout.hpp"
#include "storage/geometry.hpp"
#include "util/mutex.hpp"

namespace cairn::engine {

local_recycler::local_recycler(storage::storage_env* env, const std::string& scratch, const std::string& run,
                               uint32_t rank, size_t max_files)
    : env_(env),
      dir_(storage::join(storage::join(scratch, "recycle"), run)),
      prefix_(format::shard_file_name(rank) + "."),
      max_files_(max_files) {}

status local_recycler::clear() {
  {
    cairn::lock_guard lk(mu_);
    bin_.clear();
    written_.clear();  // their mappings too: the caller removed or leaves the files
  }
  auto names = env_->list(dir_);
  if (!names) return {};  // no bin yet
  for (const auto& n : *names)
    if (n.rfind(prefix_, 0) == 0) CAIRN_RETURN_IF_ERROR(env_->remove_file(storage::join(dir_, n)));
  return {};
}

void local_recycler::wrote(const std::string& path, uint64_t size, std::shared_ptr<storage::mapped_file> map) {
  cairn::lock_guard lk(mu_);
  written_[path] = file{size, std::move(map)};
}

status local_recycler::retire(const std::string& path) {
  cairn::unique_lock lk(mu_);
  auto it = written_.find(path);
  if (it == written_.end() || bin_.size() >= max_files_) {
    if (it != written_.end()) written_.erase(it);  // with its mapping: the file's pages go with the file
    lk.unlock();
    return env_->remove_file(path);
  }
  file f = std::move(it->second);
  written_.erase(it);
  std::string to = storage::join(dir_, prefix_ + std::to_string(next_++));
  lk.unlock();
  if (!env_->exists(path)) return {};  // gone already (cairn gc, a rebuild): nothing to retire
  CAIRN_RETURN_IF_ERROR(env_->make_dirs(dir_));
  if (status st = env_->rename(path, to); !st) {
    // Removed meanwhile (a concurrent retention of the same version, cairn
    // gc): gone already, which is all retiring asks for.
    if (!env_->exists(path)) return {};
    (void)env_->remove_file(path);
    return st;
  }
  lk.lock();
  bin_.emplace_back(std::move(to), std::move(f));
  return {};
}

bool local_recycler::maps_here(const std::string& path) {
  cairn::lock_guard lk(mu_);
  if (tmpfs_ < 0) {
    // Elsewhere stores into a mapping dirty the page cache for the kernel to
    // write back at its own pace, which nothing here measured.
    auto g = storage::detect_geometry(storage::dirname_of(path));
    tmpfs_ = g && g->fs == "tmpfs" ? 1 : 0;
  }
  return tmpfs_ == 1;
}

bool local_recycler::take(uint64_t size, const std::string& to, std::shared_ptr<storage::mapped_file>* map) {
  cairn::unique_lock lk(mu_);
  auto it = std::find_if(bin_.begin(), bin_.end(), [&](const auto& b) { return b.second.size == size; });
  if (it == bin_.end()) return false;
  std::string from = std::move(it->first);
  std::shared_ptr<storage::mapped_file> m = std::move(it->second.map);
  bin_.erase(it);
  lk.unlock();
  if (!env_->rename(from, to)) {
    m.reset();
    (void)env_->remove_file(from);
    return false;
  }
  if (map && maps_here(to)) {
    // The mapping made at the file's last use, if it still maps this file
    // (nothing replaced it meanwhile); else a new one.
    if (m && !m->is(to)) m.reset();
    if (!m) {
      if (auto made = env_->map_shared(to); made && made.value()->bytes().size() == size) m = std::move(made).value();
    }
    *map = std::move(m);
  }
  return true;
}

}  // namespace cairn::engine

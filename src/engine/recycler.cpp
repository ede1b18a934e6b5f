#include "engine/recycler.hpp"

#include <algorithm>

#include "format/layout.hpp"
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
  }
  auto names = env_->list(dir_);
  if (!names) return {};  // no bin yet
  for (const auto& n : *names)
    if (n.rfind(prefix_, 0) == 0) CAIRN_RETURN_IF_ERROR(env_->remove_file(storage::join(dir_, n)));
  return {};
}

void local_recycler::wrote(const std::string& path, uint64_t size) {
  cairn::lock_guard lk(mu_);
  written_[path] = size;
}

status local_recycler::retire(const std::string& path) {
  cairn::unique_lock lk(mu_);
  auto it = written_.find(path);
  if (it == written_.end() || bin_.size() >= max_files_) {
    if (it != written_.end()) written_.erase(it);
    lk.unlock();
    return env_->remove_file(path);
  }
  const uint64_t size = it->second;
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
  bin_.emplace_back(std::move(to), size);
  return {};
}

bool local_recycler::take(uint64_t size, const std::string& to) {
  cairn::unique_lock lk(mu_);
  auto it = std::find_if(bin_.begin(), bin_.end(), [&](const auto& b) { return b.second == size; });
  if (it == bin_.end()) return false;
  std::string from = std::move(it->first);
  bin_.erase(it);
  lk.unlock();
  if (env_->rename(from, to)) return true;
  (void)env_->remove_file(from);
  return false;
}

}  // namespace cairn::engine

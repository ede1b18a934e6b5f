// Recycled node-local files: a retired version's node-local shard becomes the
// next version's temporary file, overwritten in place and renamed, so a
// steady-state checkpoint allocates and frees no tmpfs pages (on this kind of
// VM, freshly touched pages are expensive; on any node, page allocation is
// work the application's cores pay for).
//
// Only files this process wrote are recycled: a shard an earlier execution
// wrote may still be mapped by a restart (format::map_shard_image), and a
// mapped file must never change in place. The bin lives beside the level's
// `runs/` directory, <scratch>/recycle/<run>/shard.<rank>.<k>; it holds at
// most `max_files` files; the next execution of the run on the node empties
// what a crash left there (clear()).
// Thread-safety: every method may be called from any thread.
#ifndef CAIRN_ENGINE_RECYCLER_HPP
#define CAIRN_ENGINE_RECYCLER_HPP

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "storage/storage_env.hpp"
#include "util/mutex.hpp"

namespace cairn::engine {

class local_recycler {
 public:
  local_recycler(storage::storage_env* env, const std::string& scratch, const std::string& run, uint32_t rank,
                 size_t max_files = 2);
  // Empties this rank's part of the bin (at init: a crashed execution's leftovers).
  status clear();
  // The local stage wrote `path` (a committed-to-be shard of `size` bytes).
  void wrote(const std::string& path, uint64_t size);
  // Retention: the shard at `path` is no longer kept. It goes to the bin when
  // this process wrote it and the bin has room, else it is removed.
  status retire(const std::string& path);
  // A binned file of exactly `size` bytes moved to `to` (the caller then
  // overwrites all of it), or false when there is none.
  bool take(uint64_t size, const std::string& to);

 private:
  storage::storage_env* env_;
  std::string dir_;
  std::string prefix_;  // shard.<rank>.
  size_t max_files_;
  cairn::mutex mu_;
  std::map<std::string, uint64_t> written_ CAIRN_GUARDED_BY(mu_);  // path -> size, shards this process wrote
  std::vector<std::pair<std::string, uint64_t>> bin_ CAIRN_GUARDED_BY(mu_);  // binned path, size
  uint64_t next_ CAIRN_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn::engine

#endif

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
//
// On tmpfs, a recycled file is also kept mapped (storage_env::map_shared)
// from its second use on: the local stage copies the next image into the
// mapping, with no write(2) and no new page tables (312 MiB: 16.8 ms against
// 40.8 ms for write(2); bench/local_write_bench). The mapping travels with the
// file through the bin and is dropped when the file is removed.
// Thread-safety: every method may be called from any thread.
#ifndef CAIRN_ENGINE_RECYCLER_HPP
#define CAIRN_ENGINE_RECYCLER_HPP

#include <cstdint>
#include <map>
#include <memory>
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
  // Empties this rank's part of the bin (at init: a crashed execution's
  // leftovers) and forgets the files it wrote, with their mappings (at
  // finalize, once their versions are removed).
  status clear();
  // The local stage wrote `path` (a committed-to-be shard of `size` bytes);
  // `map`: the mapping it wrote it through, kept for the file's next use.
  void wrote(const std::string& path, uint64_t size, std::shared_ptr<storage::mapped_file> map = nullptr);
  // Retention: the shard at `path` is no longer kept. It goes to the bin when
  // this process wrote it and the bin has room, else it is removed.
  status retire(const std::string& path);
  // A binned file of exactly `size` bytes moved to `to` (the caller then
  // overwrites all of it), or false when there is none. With `map`, where the
  // scratch directory is tmpfs, *map is a mapping of the file at `to` to
  // write it through (null where it cannot be mapped: write it).
  bool take(uint64_t size, const std::string& to, std::shared_ptr<storage::mapped_file>* map = nullptr);

 private:
  struct file {
    uint64_t size = 0;
    std::shared_ptr<storage::mapped_file> map;  // null until the file is written through one
  };
  bool maps_here(const std::string& path);

  storage::storage_env* env_;
  std::string dir_;
  std::string prefix_;  // shard.<rank>.
  size_t max_files_;
  cairn::mutex mu_;
  std::map<std::string, file> written_ CAIRN_GUARDED_BY(mu_);  // shards this process wrote, by path
  std::vector<std::pair<std::string, file>> bin_ CAIRN_GUARDED_BY(mu_);  // binned files, by path
  uint64_t next_ CAIRN_GUARDED_BY(mu_) = 0;
  int tmpfs_ CAIRN_GUARDED_BY(mu_) = -1;  // whether the scratch directory is tmpfs (-1: not known yet)
};

}  // namespace cairn::engine

#endif

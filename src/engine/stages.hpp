// The stages of the foundation: checksum (and hash trees), local level,
// persistent level.
#ifndef CAIRN_ENGINE_STAGES_HPP
#define CAIRN_ENGINE_STAGES_HPP

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.hpp"
#include "format/manifest.hpp"
#include "engine/recycler.hpp"
#include "storage/storage_env.hpp"

namespace cairn::engine {

// Where a rank writes: the level roots and its identity.
struct level_paths {
  std::string run;
  std::string scratch;     // local level root
  std::string persistent;  // persistent level root (the store)
};

// xxh3 of every region, then the header (with its own checksum) into the
// image; with hash_trees also the hash trees of every region (tree.md) into
// job.tree_image, computed in the same pass over the data
// (format::checksum_and_tree). Essential. `follows`: it starts with a
// capture that streams (stage::follows_capture), each piece hashed once it
// is copied.
std::unique_ptr<stage> make_checksum_stage(bool hash_trees = false, uint64_t chunk_bytes = 0, double quantum = 0,
                                           bool follows = false);
// Writes the image to <scratch>/.../shard.<rank> (temp name, rename). Survives
// a process crash, not a node loss: no fsync. With a recycler, the temporary
// is a retired shard of the same size when there is one (overwritten in place).
std::unique_ptr<stage> make_local_stage(storage::storage_env* env, level_paths paths,
                                        std::shared_ptr<local_recycler> recycler = nullptr);
// Writes the image to the store with O_DIRECT where possible, fdatasync,
// rename, fsync of the directory: durable before the level is reported.
// After a persistent data stage (below) it writes only the header, then
// makes the shard durable.
std::unique_ptr<stage> make_persistent_stage(storage::storage_env* env, level_paths paths, bool direct_io);
// The persistent write of the image's data part, side by side with the
// checksum pass; with `follows`, begun while the application thread still
// captures, as the bytes are captured (follows_capture). Goes before
// make_persistent_stage, which must follow it and the checksum stage. Its
// failure is the persistent stage's.
std::unique_ptr<stage> make_persistent_data_stage(storage::storage_env* env, level_paths paths, bool direct_io,
                                                  bool follows);

// The commit by the last writer (format::record_part, docs/format/store.md
// "Commit"): once this rank's part of a version is durable at the persistent
// level (after every stage of `after` in the graph ended and the level is
// done), records it; the rank that completes the version writes its MANIFEST,
// on its engine thread, whether or not the application calls cairn again.
// `describe`: the version's manifest without shards. Does not latch: a
// failure only leaves the commit to the client's agreed one (rank 0, after
// every rank reported its part durable).
std::unique_ptr<stage> make_commit_stage(storage::storage_env* env, std::string store,
                                         std::function<format::manifest(const version_job&)> describe,
                                         std::string host);
// This rank's entry in a version's manifest, from its job. `local_over`:
// the node-local stage has ended (its time is read only then: a reader
// outside the engine's threads learns that through engine::levels).
format::shard_entry shard_entry_of(const version_job& job, const std::string& host, bool local_over = true);

// agents_lend: when the agents did not take a version whose regions the
// application lent (PROTECTED failed), copies them into the image and marks
// the version CAPTURED (the application may change them again). Goes right
// after the agents stage.
std::unique_ptr<stage> make_unlend_stage();

// A shard file written through its temporary name (<path>.tmp), whole or
// in pieces, then finished: the hash-tree file beside it (when `tree` is not
// empty), with `durable` the syncs, then the renames (the shard's last: a
// committed shard always has its tree). Destroyed unfinished, it removes
// its temporary.
class shard_file_writer {
 public:
  // tmp_exists: <path>.tmp is there with the right size (a recycled file)
  // and is overwritten, not truncated.
  static result<std::unique_ptr<shard_file_writer>> create(storage::storage_env* env, const std::string& path,
                                                           bool direct, bool tmp_exists);
  ~shard_file_writer();
  shard_file_writer(const shard_file_writer&) = delete;
  shard_file_writer& operator=(const shard_file_writer&) = delete;
  status write(uint64_t offset, const std::byte* data, uint64_t len);
  status finish(bool durable, const std::string& tree);

 private:
  shard_file_writer(storage::storage_env* env, std::string path) : env_(env), path_(std::move(path)) {}
  storage::storage_env* env_;
  std::string path_;
  std::unique_ptr<storage::writable_file> file_;
};

// Writes `image` to `path` and, when `tree` is not empty, the tree file beside it
// (tree first), each through a temporary name; `durable` adds the syncs. The
// shard's rename comes last: a committed shard always has its tree.
// tmp_exists: <path>.tmp is already there with exactly `size` bytes (a
// recycled file) and is overwritten, not truncated.
status write_shard_file(storage::storage_env* env, const std::string& path, const std::byte* image, uint64_t size,
                        bool direct, bool durable, const std::string& tree = {}, bool tmp_exists = false);

}  // namespace cairn::engine

#endif

#include "engine/stages.hpp"

#include <cstring>

#include "cairn.h"
#include "format/layout.hpp"
#include "format/tree.hpp"
#include "util/clock.hpp"
#include "util/hash.hpp"

namespace cairn::engine {

status write_shard_file(storage::storage_env* env, const std::string& path, const std::byte* image, uint64_t size,
                        bool direct, bool durable, const std::string& tree, bool tmp_exists) {
  const std::string dir = storage::dirname_of(path);
  CAIRN_RETURN_IF_ERROR(env->make_dirs(dir));
  const std::string tmp = path + ".tmp";
  uint32_t rank = 0;
  format::parse_shard_name(path.substr(dir.size() + 1), &rank);
  const std::string tree_path = storage::join(dir, format::tree_file_name(rank));
  auto fail = [&](status st) {
    (void)env->remove_file(tmp);  // never leave a partial file behind
    (void)env->remove_file(tree_path + ".tmp");
    return st;
  };
  if (!tree.empty()) {
    auto t = env->create(tree_path + ".tmp", false);
    if (!t) return fail(t.take_status());
    if (status st = (*t)->write_at(0, tree.data(), tree.size()); !st) return fail(st);
    if (durable) {
      if (status st = (*t)->sync(); !st) return fail(st);
    }
    if (status st = (*t)->close(); !st) return fail(st);
  }
  auto f = env->create(tmp, direct, !tmp_exists);
  if (!f) return fail(f.take_status());
  if (status st = (*f)->write_at(0, image, size); !st) return fail(st);
  if (durable) {
    if (status st = (*f)->sync(); !st) return fail(st);
  }
  if (status st = (*f)->close(); !st) return fail(st);
  if (!tree.empty()) {
    if (status st = env->rename(tree_path + ".tmp", tree_path); !st) return fail(st);
  }
  if (status st = env->rename(tmp, path); !st) return fail(st);
  if (durable) return env->sync_dir(dir);
  return {};
}

namespace {

// Checksums and hash trees in one pass over the image (issue 11, item 3):
// each chunk is read from memory once and hashed for the region's checksum
// and for its tree leaves while it is in cache. Essential: a version without
// checksums cannot be written. With hash_trees off, checksums only.
class checksum_stage final : public stage {
 public:
  checksum_stage(bool trees, uint64_t chunk_bytes, double quantum)
      : trees_(trees), chunk_bytes_(chunk_bytes), quantum_(quantum) {}
  const char* name() const override { return trees_ ? "checksum and hash trees" : "checksum"; }
  bool essential() const override { return true; }
  status run(version_job& job) override {
    const double t0 = util::now_s();
    std::vector<const std::byte*> regions(job.header.regions.size());
    for (size_t i = 0; i < regions.size(); ++i) regions[i] = job.region_data(i);
    format::tree_file tree;
    double trees_s = 0;
    format::checksum_and_tree(&job.header, regions, chunk_bytes_, quantum_, trees_ ? &tree : nullptr, &trees_s);
    format::encode_header(job.header, job.image->span());
    if (trees_) {
      const double t1 = util::now_s();
      tree.shard_header_checksum = job.header.header_checksum;  // binds the tree to this shard
      job.tree_image = format::encode_tree(tree);
      trees_s += util::now_s() - t1;
    }
    // checksum_s: the pass itself (the read of the data); hash_s: what the
    // trees add to it (leaves hashed from cache, roots, encoding).
    job.hash_s = trees_s;
    job.checksum_s = util::now_s() - t0 - trees_s;
    return {};
  }

 private:
  bool trees_;
  uint64_t chunk_bytes_;
  double quantum_;
};

class local_stage final : public stage {
 public:
  local_stage(storage::storage_env* env, level_paths paths, std::shared_ptr<local_recycler> recycler)
      : env_(env), paths_(std::move(paths)), recycler_(std::move(recycler)) {}
  const char* name() const override { return "local"; }
  unsigned level() const override { return CAIRN_LEVEL_LOCAL; }
  status run(version_job& job) override {
    double t0 = util::now_s();
    auto& h = job.header;
    std::string path = format::shard_path(paths_.scratch, h.run, h.name, h.version, h.rank);
    // A shard of this version left by an earlier execution must not survive a
    // failed write of the new one.
    CAIRN_RETURN_IF_ERROR(env_->remove_file(path));
    CAIRN_RETURN_IF_ERROR(env_->make_dirs(storage::dirname_of(path)));
    const bool recycled = recycler_ && recycler_->take(h.file_size, path + ".tmp");
    CAIRN_RETURN_IF_ERROR(
        write_shard_file(env_, path, job.image->data(), h.file_size, false, false, job.tree_image, recycled));
    if (recycler_) recycler_->wrote(path, h.file_size);
    job.local_s = util::now_s() - t0;
    return {};
  }

 private:
  storage::storage_env* env_;
  level_paths paths_;
  std::shared_ptr<local_recycler> recycler_;
};

class persistent_stage final : public stage {
 public:
  persistent_stage(storage::storage_env* env, level_paths paths, bool direct)
      : env_(env), paths_(std::move(paths)), direct_(direct) {}
  const char* name() const override { return "persistent"; }
  unsigned level() const override { return CAIRN_LEVEL_PERSISTENT; }
  status run(version_job& job) override {
    double t0 = util::now_s();
    auto& h = job.header;
    std::string path = format::shard_path(paths_.persistent, h.run, h.name, h.version, h.rank);
    CAIRN_RETURN_IF_ERROR(write_shard_file(env_, path, job.image->data(), h.file_size, direct_, true, job.tree_image));
    job.persistent_s = util::now_s() - t0;
    job.persistent_at = util::wall_s();
    return {};
  }

 private:
  storage::storage_env* env_;
  level_paths paths_;
  bool direct_;
};

// agents_lend: copies the regions the application lent into the image when
// the agents did not take the version, so the stages after it (the rank's
// own write) have a complete image and the application its memory back.
class unlend_stage final : public stage {
 public:
  const char* name() const override { return "copy lent regions"; }
  bool essential() const override { return true; }
  bool applies(const version_job& job) const override {
    return !job.lent.empty() && (job.failed & CAIRN_LEVEL_PROTECTED) != 0;
  }
  unsigned completes(const version_job&) const override { return CAIRN_LEVEL_CAPTURED; }
  status run(version_job& job) override {
    double t0 = util::now_s();
    std::byte* img = job.image->data();
    for (size_t i = 0; i < job.lent.size(); ++i) {
      const auto& d = job.header.regions[i];
      if (job.lent[i] && d.length) std::memcpy(img + d.offset, job.lent[i], d.length);
    }
    job.lent.clear();
    job.capture_s += util::now_s() - t0;
    return {};
  }
};

}  // namespace

std::unique_ptr<stage> make_unlend_stage() { return std::make_unique<unlend_stage>(); }
std::unique_ptr<stage> make_checksum_stage(bool hash_trees, uint64_t chunk_bytes, double quantum) {
  return std::make_unique<checksum_stage>(hash_trees, chunk_bytes, quantum);
}
std::unique_ptr<stage> make_local_stage(storage::storage_env* env, level_paths paths,
                                        std::shared_ptr<local_recycler> recycler) {
  return std::make_unique<local_stage>(env, std::move(paths), std::move(recycler));
}
std::unique_ptr<stage> make_persistent_stage(storage::storage_env* env, level_paths paths, bool direct_io) {
  return std::make_unique<persistent_stage>(env, std::move(paths), direct_io);
}

}  // namespace cairn::engine

#include "engine/stages.hpp"

#include <cstring>

#include "format/commit.hpp"
#include "format/layout.hpp"
#include "format/tree.hpp"
#include "util/clock.hpp"
#include "util/copy.hpp"
#include "util/hash.hpp"

namespace cairn::engine {

result<std::unique_ptr<shard_file_writer>> shard_file_writer::create(storage::storage_env* env, const std::string& path,
                                                                    bool direct, bool tmp_exists) {
  CAIRN_RETURN_IF_ERROR(env->make_dirs(storage::dirname_of(path)));
  std::unique_ptr<shard_file_writer> w(new shard_file_writer(env, path));
  CAIRN_ASSIGN_OR_RETURN(w->file_, env->create(path + ".tmp", direct, !tmp_exists));
  return w;
}

shard_file_writer::~shard_file_writer() {
  if (!file_) return;
  (void)file_->close();
  (void)env_->remove_file(path_ + ".tmp");  // never leave a partial file behind
}

status shard_file_writer::write(uint64_t offset, const std::byte* data, uint64_t len) {
  return file_->write_at(offset, data, len);
}

status shard_file_writer::finish(bool durable, const std::string& tree) {
  const std::string dir = storage::dirname_of(path_);
  uint32_t rank = 0;
  format::parse_shard_name(path_.substr(dir.size() + 1), &rank);
  const std::string tree_path = storage::join(dir, format::tree_file_name(rank));
  auto fail = [&](status st) {
    (void)env_->remove_file(tree_path + ".tmp");
    return st;  // the destructor removes the shard's temporary
  };
  std::unique_ptr<storage::writable_file> t;
  if (!tree.empty()) {
    auto made = env_->create(tree_path + ".tmp", false);
    if (!made) return fail(made.take_status());
    t = std::move(made).value();
    if (status st = t->write_at(0, tree.data(), tree.size()); !st) return fail(st);
  }
  if (durable) {
    // The tree first: its sync commits the file system's metadata of both
    // files (one journal commit), and the shard's sync then only flushes.
    if (t) {
      if (status st = t->sync(); !st) return fail(st);
    }
    if (status st = file_->sync(); !st) return fail(st);
  }
  if (t) {
    if (status st = t->close(); !st) return fail(st);
  }
  if (status st = file_->close(); !st) return fail(st);
  // The tree's rename first: a committed shard always has its tree.
  if (t) {
    if (status st = env_->rename(tree_path + ".tmp", tree_path); !st) return fail(st);
  }
  if (status st = env_->rename(path_ + ".tmp", path_); !st) return fail(st);
  file_.reset();
  if (durable) return env_->sync_dir(dir);
  return {};
}

status write_shard_file(storage::storage_env* env, const std::string& path, const std::byte* image, uint64_t size,
                        bool direct, bool durable, const std::string& tree, bool tmp_exists) {
  CAIRN_ASSIGN_OR_RETURN(auto w, shard_file_writer::create(env, path, direct, tmp_exists));
  CAIRN_RETURN_IF_ERROR(w->write(0, image, size));
  return w->finish(durable, tree);
}

namespace {

// Checksums and hash trees in one pass over the image (issue 11, item 3):
// each chunk is read from memory once and hashed for the region's checksum
// and for its tree leaves while it is in cache. Essential: a version without
// checksums cannot be written. With hash_trees off, checksums only.
class checksum_stage final : public stage {
 public:
  checksum_stage(bool trees, uint64_t chunk_bytes, double quantum, bool follows)
      : trees_(trees), chunk_bytes_(chunk_bytes), quantum_(quantum), follows_(follows) {}
  const char* name() const override { return trees_ ? "checksum and hash trees" : "checksum"; }
  bool essential() const override { return true; }
  // Behind the application thread's copy, each piece read as it is
  // captured: where an engine thread runs beside the application's, the
  // pass is mostly done by the time the checkpoint returns.
  bool follows_capture() const override { return follows_; }
  status run(version_job& job) override {
    // A capture that already failed (a background copy that could not
    // finish) leaves nothing worth reading.
    if (job.capture.ended() && !job.capture_error.is_ok()) return job.capture_error;
    const double t0 = util::now_s();
    std::vector<const std::byte*> regions(job.header.regions.size());
    for (size_t i = 0; i < regions.size(); ++i) regions[i] = job.region_data(i);
    format::tree_file tree;
    double trees_s = 0;
    uint64_t captured = 0;  // image bytes known to be captured
    double waited_s = 0;    // for the capture: not the pass's time
    auto ready = [&](size_t i, uint64_t end) {
      const uint64_t need = job.header.regions[i].offset + end;
      while (captured < need) {
        const double w0 = util::now_s();
        const uint64_t upto = job.capture.wait_past(captured);
        waited_s += util::now_s() - w0;
        if (upto <= captured) return false;  // the capture ended short
        captured = upto;
      }
      return true;
    };
    const bool whole = format::checksum_and_tree(&job.header, regions, chunk_bytes_, quantum_,
                                                 trees_ ? &tree : nullptr, &trees_s, ready);
    // The capture has ended here, or the pass could not have read it all
    // (and a background capture may have failed at the end).
    const double w0 = util::now_s();
    (void)job.capture.wait_past(job.header.file_size);
    waited_s += util::now_s() - w0;
    if (!job.capture_error.is_ok()) return job.capture_error;
    if (!whole) return status(errc::internal, "the capture ended before the image was complete");
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
    job.checksum_s = util::now_s() - t0 - trees_s - waited_s;
    return {};
  }

 private:
  bool trees_;
  uint64_t chunk_bytes_;
  double quantum_;
  bool follows_;
};

class local_stage final : public stage {
 public:
  local_stage(storage::storage_env* env, level_paths paths, std::shared_ptr<local_recycler> recycler)
      : env_(env), paths_(std::move(paths)), recycler_(std::move(recycler)) {}
  const char* name() const override { return "local"; }
  unsigned level() const override { return kLevelLocal; }
  status run(version_job& job) override {
    double t0 = util::now_s();
    auto& h = job.header;
    std::string path = format::shard_path(paths_.scratch, h.run, h.name, h.version, h.rank);
    // A shard of this version left by an earlier execution must not survive a
    // failed write of the new one.
    CAIRN_RETURN_IF_ERROR(env_->remove_file(path));
    CAIRN_RETURN_IF_ERROR(env_->make_dirs(storage::dirname_of(path)));
    std::shared_ptr<storage::mapped_file> map;
    const bool recycled = recycler_ && recycler_->take(h.file_size, path + ".tmp", &map);
    if (map) {
      // A recycled file kept mapped: the image is copied in, no write(2).
      util::stream_copy(map->bytes().data(), job.image->data(), h.file_size);
      CAIRN_ASSIGN_OR_RETURN(auto w, shard_file_writer::create(env_, path, false, true));
      CAIRN_RETURN_IF_ERROR(w->finish(false, job.tree_image));
    } else {
      CAIRN_RETURN_IF_ERROR(
          write_shard_file(env_, path, job.image->data(), h.file_size, false, false, job.tree_image, recycled));
    }
    if (recycler_) recycler_->wrote(path, h.file_size, std::move(map));
    job.local_s = util::now_s() - t0;
    return {};
  }

 private:
  storage::storage_env* env_;
  level_paths paths_;
  std::shared_ptr<local_recycler> recycler_;
};

// The persistent write, begun while the application thread still copies
// the image: the data part ([data_offset, file_size)) is written as it is
// captured, side by side with the checksum pass; persistent_stage writes the
// header (known once the checksums are) and makes the shard durable.
struct persistent_carry final : stage_carry {
  std::unique_ptr<shard_file_writer> writer;
  status error;
  double started = 0;
};

class persistent_data_stage final : public stage {
 public:
  persistent_data_stage(storage::storage_env* env, level_paths paths, bool direct, bool follows)
      : env_(env), paths_(std::move(paths)), direct_(direct), follows_(follows) {}
  const char* name() const override { return "persistent (data)"; }
  bool applies(const version_job& job) const override { return job.wanted & kLevelPersistent; }
  bool follows_capture() const override { return follows_; }
  status run(version_job& job) override {
    auto c = std::make_unique<persistent_carry>();
    c->started = util::now_s();
    const auto& h = job.header;
    // A failure is the persistent stage's to report (it owns the level).
    c->error = [&]() -> status {
      CAIRN_ASSIGN_OR_RETURN(c->writer, shard_file_writer::create(
                                            env_, format::shard_path(paths_.persistent, h.run, h.name, h.version, h.rank),
                                            direct_, false));
      // Whatever is captured when the write starts goes in one request: the
      // capture runs several times faster than the device, so this is a few
      // large writes, not one per captured piece.
      for (uint64_t at = h.data_offset; at < h.file_size;) {
        const uint64_t upto = job.capture.wait_past(at);
        if (upto <= at)
          return status(errc::internal, "the capture ended at byte " + std::to_string(at) + " of " +
                                            std::to_string(h.file_size));
        CAIRN_RETURN_IF_ERROR(c->writer->write(at, job.image->data() + at, upto - at));
        at = upto;
      }
      return {};
    }();
    job.carry = std::move(c);
    return {};
  }

 private:
  storage::storage_env* env_;
  level_paths paths_;
  bool direct_;
  bool follows_;
};

class persistent_stage final : public stage {
 public:
  persistent_stage(storage::storage_env* env, level_paths paths, bool direct)
      : env_(env), paths_(std::move(paths)), direct_(direct) {}
  const char* name() const override { return "persistent"; }
  unsigned level() const override { return kLevelPersistent; }
  status run(version_job& job) override {
    double t0 = util::now_s();
    auto& h = job.header;
    if (auto* c = dynamic_cast<persistent_carry*>(job.carry.get())) {
      // The data are written (persistent_data_stage): the header, then durable.
      std::unique_ptr<stage_carry> own = std::move(job.carry);
      CAIRN_RETURN_IF_ERROR(c->error);
      CAIRN_RETURN_IF_ERROR(c->writer->write(0, job.image->data(), h.data_offset));
      CAIRN_RETURN_IF_ERROR(c->writer->finish(true, job.tree_image));
      t0 = c->started;
    } else {
      std::string path = format::shard_path(paths_.persistent, h.run, h.name, h.version, h.rank);
      CAIRN_RETURN_IF_ERROR(write_shard_file(env_, path, job.image->data(), h.file_size, direct_, true, job.tree_image));
    }
    job.persistent_s = util::now_s() - t0;
    job.persistent_at = util::wall_s();
    return {};
  }

 private:
  storage::storage_env* env_;
  level_paths paths_;
  bool direct_;
};

class commit_stage final : public stage {
 public:
  commit_stage(storage::storage_env* env, std::string store,
               std::function<format::manifest(const version_job&)> describe, std::string host)
      : env_(env), store_(std::move(store)), describe_(std::move(describe)), host_(std::move(host)) {}
  const char* name() const override { return "commit"; }
  bool latches() const override { return false; }
  // Called under the engine's lock, which guards job.done.
  bool applies(const version_job& job) const override { return (job.done & kLevelPersistent) != 0; }
  status run(version_job& job) override {
    format::part_record p;
    p.entry = shard_entry_of(job, host_);
    p.aggregated = job.plan != nullptr;
    p.protected_at = job.protected_at;
    return format::record_part(env_, store_, describe_(job), job.header.attempt, p).take_status();
  }

 private:
  storage::storage_env* env_;
  std::string store_;
  std::function<format::manifest(const version_job&)> describe_;
  std::string host_;
};

// agents_lend: copies the regions the application lent into the image when
// the agents did not take the version, so the stages after it (the rank's
// own write) have a complete image and the application its memory back.
class unlend_stage final : public stage {
 public:
  const char* name() const override { return "copy lent regions"; }
  bool essential() const override { return true; }
  bool applies(const version_job& job) const override {
    return !job.lent.empty() && (job.failed & kLevelProtected) != 0;
  }
  unsigned completes(const version_job&) const override { return kLevelCaptured; }
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

format::shard_entry shard_entry_of(const version_job& job, const std::string& host, bool local_over) {
  format::shard_entry e;
  e.rank = job.header.rank;
  e.size = job.header.file_size;
  e.header_checksum = job.header.header_checksum;
  e.captured_at = job.captured_at;
  e.capture_s = job.capture_s;
  e.checksum_s = job.checksum_s;
  e.hash_s = job.hash_s;
  e.tree = !job.tree_image.empty();
  e.local_s = local_over ? job.local_s : 0;  // 0: not recorded
  e.persistent_s = job.persistent_s;
  e.persistent_at = job.persistent_at;
  e.host = host;
  e.extents = job.extents;
  return e;
}

std::unique_ptr<stage> make_commit_stage(storage::storage_env* env, std::string store,
                                         std::function<format::manifest(const version_job&)> describe,
                                         std::string host) {
  return std::make_unique<commit_stage>(env, std::move(store), std::move(describe), std::move(host));
}
std::unique_ptr<stage> make_unlend_stage() { return std::make_unique<unlend_stage>(); }
std::unique_ptr<stage> make_checksum_stage(bool hash_trees, uint64_t chunk_bytes, double quantum, bool follows) {
  return std::make_unique<checksum_stage>(hash_trees, chunk_bytes, quantum, follows);
}
std::unique_ptr<stage> make_local_stage(storage::storage_env* env, level_paths paths,
                                        std::shared_ptr<local_recycler> recycler) {
  return std::make_unique<local_stage>(env, std::move(paths), std::move(recycler));
}
std::unique_ptr<stage> make_persistent_stage(storage::storage_env* env, level_paths paths, bool direct_io) {
  return std::make_unique<persistent_stage>(env, std::move(paths), direct_io);
}
std::unique_ptr<stage> make_persistent_data_stage(storage::storage_env* env, level_paths paths, bool direct_io,
                                                  bool follows) {
  return std::make_unique<persistent_data_stage>(env, std::move(paths), direct_io, follows);
}

}  // namespace cairn::engine

#include "aggregate/stage.hpp"

#include <time.h>

#include <algorithm>
#include <map>

#include "format/container.hpp"
#include "format/layout.hpp"
#include "util/clock.hpp"
#include "util/hash.hpp"

namespace cairn::aggregate {

std::vector<format::image_extent> image_extents_of(const plan& p, uint32_t rank, const std::byte* image) {
  std::vector<format::image_extent> out;
  for (const piece& x : pieces_of(p, rank)) {
    uint64_t src = x.src;
    for (const file_run& run : locate(p, x)) {
      out.push_back({src, run.length, run.file, run.offset, util::xxh3(image + src, run.length)});
      src += run.length;
    }
  }
  return out;
}

status aggregated_stage::run(engine::version_job& job) {
  const double t0 = util::now_s();
  if (!job.plan) return {errc::internal, std::string(name()) + ": a version without its plan"};
  CAIRN_RETURN_IF_ERROR(flush(job));
  job.persistent_s = util::now_s() - t0;
  job.persistent_at = util::wall_s();
  return {};
}

namespace {

class self_write_stage final : public aggregated_stage {
 public:
  self_write_stage(storage::storage_env* env, engine::level_paths paths, stage_options o)
      : env_(env), paths_(std::move(paths)), o_(o) {}
  const char* name() const override { return "persistent (aggregated, own extent)"; }

 protected:
  status flush(engine::version_job& job) override {
    const auto& h = job.header;
    const plan& p = *job.plan;
    const std::string dir = format::version_dir(paths_.persistent, h.run, h.name, h.version);
    CAIRN_RETURN_IF_ERROR(env_->make_dirs(dir));
    const std::byte* image = job.image->data();
    job.extents = image_extents_of(p, h.rank, image);
    // One open per data file this rank writes (normally one); O_DIRECT when
    // every write is page aligned.
    std::map<uint32_t, std::unique_ptr<storage::writable_file>> files;
    for (const auto& e : job.extents) {
      auto it = files.find(e.file);
      if (it == files.end()) {
        const bool direct = o_.direct_io && std::all_of(job.extents.begin(), job.extents.end(), [](const auto& x) {
          return page_aligned(x.src) && page_aligned(x.offset) && page_aligned(x.length);
        });
        auto f = env_->create(storage::join(dir, format::data_file_name(e.file)), direct, /*truncate=*/false);
        if (!f) return f.take_status().with_context("aggregated persistent level");
        it = files.emplace(e.file, std::move(*f)).first;
      }
      CAIRN_RETURN_IF_ERROR(it->second->write_at(e.offset, image + e.src, e.length));
    }
    for (auto& [k, f] : files) {
      CAIRN_RETURN_IF_ERROR(f->sync());
      CAIRN_RETURN_IF_ERROR(f->close());
    }
    return {};
  }

 private:
  storage::storage_env* env_;
  engine::level_paths paths_;
  stage_options o_;
};

class collective_write_stage final : public aggregated_stage {
 public:
  collective_write_stage(storage::storage_env* env, engine::level_paths paths) : env_(env), paths_(std::move(paths)) {}
  const char* name() const override { return "persistent (aggregated, collective MPI-IO)"; }

 protected:
  status flush(engine::version_job& job) override {
    const auto& h = job.header;
    CAIRN_RETURN_IF_ERROR(env_->make_dirs(format::version_dir(paths_.persistent, h.run, h.name, h.version)));
    job.extents = image_extents_of(*job.plan, h.rank, job.image->data());
    job.collective.store(1);
    // The slot stays held (this stage has not returned) until the
    // application thread wrote it.
    for (int c; (c = job.collective.load()) == 1;) {
      if (job.cancelled.load()) return {errc::cancelled, "the collective write was cancelled (another rank failed)"};
      struct timespec ts {0, 200000};
      nanosleep(&ts, nullptr);
    }
    if (job.collective.load() < 0) return job.collective_error;
    return {};
  }

 private:
  storage::storage_env* env_;
  engine::level_paths paths_;
};

}  // namespace

std::unique_ptr<engine::stage> make_collective_write_stage(storage::storage_env* env, engine::level_paths paths) {
  return std::make_unique<collective_write_stage>(env, std::move(paths));
}

std::unique_ptr<engine::stage> make_self_write_stage(storage::storage_env* env, engine::level_paths paths,
                                                     stage_options options) {
  return std::make_unique<self_write_stage>(env, std::move(paths), options);
}

}  // namespace cairn::aggregate

#include "analytics/online_stage.hpp"

#include <cstdio>
#include <optional>

#include "format/layout.hpp"
#include "format/shard_io.hpp"
#include "format/tree.hpp"

namespace cairn::analytics {

online_tracker::online_tracker(storage::storage_env* env, online_reference ref, std::string my_store,
                               std::string my_scratch, std::string my_run)
    : env_(env),
      ref_(std::move(ref)),
      my_store_(std::move(my_store)),
      my_scratch_(std::move(my_scratch)),
      my_run_(std::move(my_run)) {}

void online_tracker::record(online_outcome o, const online_divergence& d, const std::string& name, int64_t version) {
  cairn::lock_guard lk(mu_);
  if (o == online_outcome::pending) {
    pending_.emplace_back(name, version);
    return;
  }
  ++compared_;
  if (o == online_outcome::diverged && version < first_version_) {
    first_version_ = version;
    first_ = d;
  }
}

void online_tracker::compare(const format::shard_header& h, std::span<const std::byte> image,
                             const std::string& tree_image) {
  std::optional<format::tree_file> tree;
  if (!tree_image.empty()) {
    auto t = format::decode_tree(std::as_bytes(std::span<const char>(tree_image.data(), tree_image.size())), "tree");
    if (t) tree = std::move(t).value();
  }
  online_divergence d;
  auto o = compare_with_reference(env_, ref_, h, image, tree ? &*tree : nullptr, &d);
  if (!o) {
    std::fprintf(stderr, "cairn: rank %u: warning: cannot compare '%s' version %lld with run '%s': %s\n", h.rank,
                 h.name.c_str(), static_cast<long long>(h.version), ref_.run.c_str(), o.error().message().c_str());
    return;
  }
  record(*o, d, h.name, h.version);
}

online_tracker::summary online_tracker::state() const {
  cairn::lock_guard lk(mu_);
  return {first_version_, first_, compared_, static_cast<int64_t>(pending_.size())};
}

int64_t online_tracker::first_version() const {
  cairn::lock_guard lk(mu_);
  return first_version_;
}

bool online_tracker::claim_retry() {
  cairn::lock_guard lk(mu_);
  if (pending_.empty() || retrying_) return false;
  retrying_ = true;
  return true;
}

status online_tracker::retry(uint32_t rank) {
  std::vector<std::pair<std::string, int64_t>> todo;
  {
    cairn::lock_guard lk(mu_);
    todo.swap(pending_);
  }
  for (auto& [name, version] : todo) {
    std::string path = format::shard_path(my_scratch_, my_run_, name, version, rank);
    if (my_scratch_.empty() || !env_->exists(path)) path = format::shard_path(my_store_, my_run_, name, version, rank);
    // Compressed (written by an agent) or not, verified.
    auto s = format::read_shard_image(env_, path);
    if (!s) {
      std::fprintf(stderr, "cairn: warning: version %lld of '%s' cannot be compared: %s\n",
                   static_cast<long long>(version), name.c_str(), s.error().message().c_str());
      continue;
    }
    auto tree = env_->read_all(storage::join(storage::dirname_of(path), format::tree_file_name(rank)));
    compare(s->header, {s->image.data(), s->header.file_size}, tree ? *tree : std::string());
  }
  cairn::lock_guard lk(mu_);
  retrying_ = false;
  return {};
}

namespace {
class compare_stage final : public engine::stage {
 public:
  explicit compare_stage(std::shared_ptr<online_tracker> t) : t_(std::move(t)) {}
  const char* name() const override { return "compare"; }
  status run(engine::version_job& job) override {
    t_->compare(job.header, {job.image->data(), job.header.file_size}, job.tree_image);
    return {};
  }

 private:
  std::shared_ptr<online_tracker> t_;
};
}  // namespace

std::unique_ptr<engine::stage> make_compare_stage(std::shared_ptr<online_tracker> tracker) {
  return std::make_unique<compare_stage>(std::move(tracker));
}

}  // namespace cairn::analytics

// The online comparison inside a running job (docs/design/history.md §5): the
// engine's compare stage checks each new version of this rank's shard against
// the reference run as the version is captured (analytics/online.hpp), and the
// client reads what it found at each progress round.
//
// Thread-safety: every method may be called from any thread (the compare stage
// on engine threads, retry on an engine task, the rest on the application
// thread).
#ifndef CAIRN_ANALYTICS_ONLINE_STAGE_HPP
#define CAIRN_ANALYTICS_ONLINE_STAGE_HPP

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "analytics/online.hpp"
#include "engine/engine.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"
#include "util/mutex.hpp"

namespace cairn::analytics {

// This rank's outcomes: the first divergent version, how many versions were
// compared, which still wait for their reference.
class online_tracker {
 public:
  // ref: the run compared with. Versions whose reference is missing are read
  // again later from this rank's own files: my_scratch first (empty: none),
  // then my_store, of run my_run.
  online_tracker(storage::storage_env* env, online_reference ref, std::string my_store, std::string my_scratch,
                 std::string my_run);

  // Compares one version; errors (an unreadable reference) are warnings: the
  // comparison is an observation and never fails the checkpoint.
  void compare(const format::shard_header& h, std::span<const std::byte> image, const std::string& tree_image)
      CAIRN_EXCLUDES(mu_);

  struct summary {
    int64_t first_version = INT64_MAX;  // this rank's first divergent version
    online_divergence first;
    int64_t compared = 0;
    int64_t pending = 0;                // versions waiting for their reference
  };
  summary state() const CAIRN_EXCLUDES(mu_);
  // state().first_version without copying the divergence (every progress round reads it).
  int64_t first_version() const CAIRN_EXCLUDES(mu_);

  // Whether versions wait for their reference and no retry runs: the caller
  // then runs retry (once, on an engine task).
  bool claim_retry() CAIRN_EXCLUDES(mu_);
  // Compares the waiting versions again, from this rank's files.
  status retry(uint32_t rank) CAIRN_EXCLUDES(mu_);

 private:
  void record(online_outcome o, const online_divergence& d, const std::string& name, int64_t version)
      CAIRN_EXCLUDES(mu_);

  storage::storage_env* const env_;
  const online_reference ref_;
  const std::string my_store_, my_scratch_, my_run_;
  mutable cairn::mutex mu_;
  int64_t first_version_ CAIRN_GUARDED_BY(mu_) = INT64_MAX;
  online_divergence first_ CAIRN_GUARDED_BY(mu_);
  int64_t compared_ CAIRN_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::string, int64_t>> pending_ CAIRN_GUARDED_BY(mu_);
  bool retrying_ CAIRN_GUARDED_BY(mu_) = false;
};

// The engine stage: compares each version's finished image (after the checksum
// stage). Never fails.
std::unique_ptr<engine::stage> make_compare_stage(std::shared_ptr<online_tracker> tracker);

}  // namespace cairn::analytics

#endif

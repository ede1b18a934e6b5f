// The persistent level's aggregated implementation (persistent_layout =
// aggregated; docs/design/aggregation.md, docs/format/container.md): one more
// engine stage completing engine::kLevelPersistent, chosen by configuration in
// place of the file-per-process stage. Every rank runs it for every version
// that goes to the persistent level; job.plan (computed by every rank from the
// record the checkpoint's collective carried) says who writes what where.
// It fills job.extents (this rank's image in the data files, checksummed);
// the commit (MANIFEST with the index) stays with the client.
#ifndef CAIRN_AGGREGATE_STAGE_HPP
#define CAIRN_AGGREGATE_STAGE_HPP

#include <memory>
#include <string>

#include "engine/engine.hpp"
#include "engine/stages.hpp"
#include "storage/storage_env.hpp"
#include "util/config.hpp"

namespace cairn::aggregate {

// Test hook (fault_inject level=transfer): SIGKILL in the middle of the
// leaders' exchange of `version` (-1: never), as a leader (reading a sender's
// image) or as a sender (once it announced its image).
struct transfer_kill {
  int64_t version = -1;
  bool leader = false;
};

struct stage_options {
  cairn::aggregate_strategy strategy = cairn::aggregate_strategy::leaders;
  bool direct_io = true;
  transfer_kill kill;
  // leaders: the local level runs before this stage, so a leader may read a
  // sender of its own node from the sender's node-local shard file.
  bool local_level = false;
};

// What every aggregated stage shares: it completes engine::kLevelPersistent,
// needs the version's plan, and records when the rank's part was durable;
// flush() does the strategy's work.
class aggregated_stage : public engine::stage {
 public:
  unsigned level() const override { return engine::kLevelPersistent; }
  status run(engine::version_job& job) final;

 protected:
  virtual status flush(engine::version_job& job) = 0;
};

inline bool page_aligned(uint64_t v) { return v % storage::kDirectAlign == 0; }

// posix_shared and aligned: every rank writes its own image into its extent
// of a shared data file (paper 004, 2.1).
std::unique_ptr<engine::stage> make_self_write_stage(storage::storage_env* env, engine::level_paths paths,
                                                     stage_options options);

// mpiio (paper 004, 2.2): checksums this rank's extent, then waits until the
// client has written the image with its collective MPI-IO call
// (job.collective; comm::communicator::write_at_all).
std::unique_ptr<engine::stage> make_collective_write_stage(storage::storage_env* env, engine::level_paths paths);

// This rank's extents of `p` with their checksums over `image` (the rank's
// whole image), in image order.
std::vector<format::image_extent> image_extents_of(const plan& p, uint32_t rank, const std::byte* image);

}  // namespace cairn::aggregate

#endif

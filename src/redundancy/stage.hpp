// The redundancy level's data plane and engine stage (libfabric builds;
// docs/design/redundancy.md). The stage runs after the local level on an
// engine thread: it exposes the staging image to the other members of the
// rank's set, pulls the data blocks of the stripes it holds parity for,
// encodes them (codec.hpp) and writes its parity file beside its node-local
// shard; engine::kLevelProtected once every member reported its parity written.
// No MPI: sealed READY/HELD messages over this plane's own mailbox.
#ifndef CAIRN_REDUNDANCY_STAGE_HPP
#define CAIRN_REDUNDANCY_STAGE_HPP

#include <memory>

#include "engine/engine.hpp"
#include "engine/stages.hpp"
#include "redundancy/coding.hpp"
#include "redundancy/sets.hpp"

namespace cairn::redundancy {

// Test hook (fault_inject level=redundancy): SIGKILL this rank in the
// middle of encoding `version`, after `after` windows.
struct stage_kill {
  int64_t version = -1;
  int after = 0;
};

std::unique_ptr<engine::stage> make_stage(storage::storage_env* env, engine::level_paths paths, set_info set,
                                          std::shared_ptr<plane> p, stage_kill kill);

}  // namespace cairn::redundancy

#endif

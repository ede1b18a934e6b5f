// version_record: what a client handle knows about one version it
// checkpointed, shared by the client and its levels (level.hpp).
#ifndef CAIRN_CLIENT_VERSION_RECORD_HPP
#define CAIRN_CLIENT_VERSION_RECORD_HPP

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "cairn.h"
#include "cairn/status.hpp"
#include "engine/engine.hpp"

namespace cairn {

// What this handle knows about one version it checkpointed. The global_* and
// phase fields change only from the results of collective calls, so they are
// the same on every rank.
struct version_record {
  std::string name;
  int64_t version = 0;
  std::shared_ptr<engine::version_job> job;
  unsigned wanted = 0;
  unsigned global_done = CAIRN_LEVEL_CAPTURED;
  unsigned global_failed = 0;
  bool shards_durable = false;  // every rank's shard is durable; manifest commit started
  bool step_done = false;  // a level's own collective step was made, or given up (level::step)
  bool committed_seen = false;  // a level that commits itself: this rank saw the MANIFEST (it stays)
  std::map<unsigned, status> level_error;  // per failed level, the failing rank's message
  // A level failed and cairn_checkpoint has reported it (CAIRN_EEARLIER):
  // finalize does not report it again.
  bool failure_reported = false;
  double local_done_at = 0;
  double protected_at = 0;  // when CAIRN_LEVEL_PROTECTED was agreed (redundancy)
  // Rank 0: result of the manifest commit task (0 running, 1 ok, -1 failed).
  std::shared_ptr<std::atomic<int>> manifest_state;
  std::shared_ptr<status> manifest_error;

  bool counted_checksum = false;  // metrics: its checksum seconds were counted

  bool resolved() const { return ((global_done | global_failed) & wanted) == wanted; }
};

}  // namespace cairn

#endif

// Checkpoint metrics in the OpenMetrics text format (docs/design/metrics.md):
// what an application rank writes to its textfile (metrics_dir, for the node
// exporter's textfile collector) and what `cairn stats` derives from the
// catalog, with the same names.
#ifndef CAIRN_HISTORY_METRICS_HPP
#define CAIRN_HISTORY_METRICS_HPP

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "history/catalog.hpp"

namespace cairn::metrics {

// One rank's counters. Levels are "local" and "persistent"; stages
// "capture", "checksum", "local", "persistent" (seconds summed over versions).
struct level_counters {
  uint64_t versions = 0;  // versions complete at the level on every rank
  uint64_t bytes = 0;     // this rank's shard bytes of those versions
  uint64_t errors = 0;    // versions whose level failed
};

struct rank_metrics {
  std::string run;
  uint32_t rank = 0;
  uint64_t checkpoints = 0;  // versions captured (textfile only)
  std::map<std::string, level_counters> levels;
  std::map<std::string, double> stage_seconds;
  double time_to_durable_s = 0;  // newest version: earliest capture to MANIFEST commit (0: none)
  // Only the live process knows these (absent from `cairn stats`).
  std::optional<uint64_t> warning_signals;
  std::optional<uint64_t> staging_bytes;
  std::optional<uint64_t> capture_write_faults;  // capture = cow: writes that waited for their block
  std::optional<uint64_t> cow_captures;          // captures made copy-on-write (cow, auto, copy_or_cow)
};

inline const char* const kLevelNames[] = {"local", "persistent"};
inline const char* const kStageNames[] = {"capture", "checksum", "local", "persistent"};

// The OpenMetrics text exposition of `ranks` (one family per metric, every
// rank a sample with labels run and rank; ends with "# EOF").
std::string to_openmetrics(const std::vector<rank_metrics>& ranks);
// The same as JSON (cairn stats --json).
std::string to_json(const std::vector<rank_metrics>& ranks);

// From the catalog: every committed version of `run` (all executions):
// the persistent level from the manifests, the local level from its runtime
// events, stage seconds from the shard rows. not_found when the run has no
// committed version.
result<std::vector<rank_metrics>> from_catalog(history::catalog& cat, const std::string& run);

}  // namespace cairn::metrics

#endif

// The CLI's view of a store: which runs, checkpoints and versions exist and in
// what state, read from the files (the source of truth), never the catalog.
#ifndef CAIRN_TOOLS_CAIRN_STORE_SCAN_HPP
#define CAIRN_TOOLS_CAIRN_STORE_SCAN_HPP

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "storage/storage_env.hpp"

namespace cairn::cli {

// Exit statuses of every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the operation failed, or verify found a problem
inline constexpr int kExitUsage = 2;    // bad arguments: unknown store, run, checkpoint or version

// kExitUsage for invalid_argument and not_found (the caller named something
// that is not there), kExitFailure otherwise.
int exit_code_for(const status& s);

// ok if root is a directory holding runs/ or catalog.sqlite; not_found or
// invalid_argument (naming the path) otherwise.
status check_store(const std::string& root);

// ok if path is an existing directory; not_found naming it (as `what`) otherwise.
status check_directory(const std::string& path, const std::string& what);

// Run names under <root>/runs and, if scratch is not empty, <scratch>/runs,
// sorted and unique. With `only` not empty: just that run, or not_found
// (listing the runs there are) if it is in neither.
result<std::vector<std::string>> select_runs(const std::string& root, const std::string& scratch,
                                             const std::string& only);

// Checkpoint names of a run under root and scratch (if not empty), sorted, unique.
std::vector<std::string> checkpoint_names(const std::string& root, const std::string& scratch, const std::string& run);

// Versions of run/name under root and scratch (if not empty), ascending, unique.
std::vector<int64_t> version_numbers(const std::string& root, const std::string& scratch, const std::string& run,
                                     const std::string& name);

enum class version_state {
  committed,   // a valid MANIFEST
  incomplete,  // no MANIFEST (being written, or debris of a crash)
  invalid,     // a MANIFEST that cannot be read or is damaged
  absent,      // no directory at this level (the version exists only in scratch)
};
const char* state_name(version_state s);

// One version directory at one level.
struct version_scan {
  std::string dir;
  version_state state = version_state::absent;
  std::optional<format::manifest> manifest;  // when committed
  status manifest_error;                     // when invalid
  std::vector<uint32_t> shard_ranks;         // shard.NNNNNN files present, ascending
  std::vector<uint32_t> data_files;          // data.NNNNNN files present (aggregated layout), ascending
  std::vector<std::string> tmp_files;        // names ending in .tmp
  std::optional<uint32_t> nranks;            // manifest's, else the first readable shard header's
  uint64_t bytes = 0;                        // sizes of the present shard and data files
  // A committed version that a restart found damaged at every level: the
  // reason its DAMAGED record gives. restart_test offers it no more.
  std::optional<std::string> damaged;

  // The aggregated layout (docs/format/container.md): the MANIFEST says so,
  // or, without a valid one, data files are there and no shard file is.
  bool aggregated() const {
    return manifest ? manifest->aggregated : !data_files.empty() && shard_ranks.empty();
  }
};

// "aggregated" or "file_per_process" (the names of --json output).
const char* layout_name(const version_scan& s);

// Scans <root>/runs/<run>/<name>/v<version>: reads the MANIFEST (if any), lists
// the files (shard files, or an aggregated version's data files), and, without
// a valid MANIFEST, reads shard headers until one gives nranks. Never fails: what it finds wrong lands in the fields.
version_scan scan_version(storage::storage_env* env, const std::string& root, const std::string& run,
                          const std::string& name, int64_t version);

// The reason in the DAMAGED record beside a version's MANIFEST, if there is one.
std::optional<std::string> damaged_record(storage::storage_env* env, const std::string& root, const std::string& run,
                                          const std::string& name, int64_t version);

// Size of a file in bytes; 0 if it cannot be stat'ed.
uint64_t file_size_of(const std::string& path);

}  // namespace cairn::cli

#endif

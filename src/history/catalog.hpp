// History catalog: an SQLite index of the store (runs, checkpoints, shards,
// regions, per-level events), derived from the manifests and shard headers,
// which stay the source of truth (rebuild() recreates it from them).
// Schema: docs/format/catalog.md.
//
// Thread-safety: a catalog object is used by one thread at a time (it has no
// lock of its own: callers sharing one serialise their calls); threads and
// processes may each open their own object on the same file (SQLite locking
// with a busy timeout of 10 s; a call that still finds the file locked after
// that returns errc::again).
#ifndef CAIRN_HISTORY_CATALOG_HPP
#define CAIRN_HISTORY_CATALOG_HPP

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"

namespace cairn::history {

// Version of the catalog schema, kept in `PRAGMA user_version`.
inline constexpr int kCatalogSchemaVersion = 4;

// Rows as the query methods return them (see docs/format/catalog.md for the
// meaning of each column). Checksums are 16 lower-case hex digits.
struct run_row {
  std::string run;
  std::string executable;  // of the newest indexed version
  uint32_t nranks = 0;     // of the newest indexed version
  double first_seen = 0;   // committed_at of the oldest indexed version
  double last_seen = 0;    // committed_at of the newest indexed version
};

struct version_row {
  std::string run;
  std::string name;
  int64_t version = 0;
  uint32_t nranks = 0;
  uint64_t bytes = 0;  // sum of the shard file sizes
  double committed_at = 0;
  std::string mode;
  std::string executable;
  // Node-loss redundancy the version was encoded with (manifest `redundancy`);
  // empty scheme: none recorded.
  std::string redundancy;         // e.g. "xor(k=4, m=1)"
  std::string redundancy_scheme;  // partner, xor, rs
  uint32_t redundancy_k = 0;      // members of the largest set
  uint32_t redundancy_m = 0;      // parity blocks per stripe
};

struct shard_row {
  uint32_t rank = 0;
  std::string file;
  uint64_t size = 0;
  std::string header_checksum;
  std::string host;
  double captured_at = 0;
  double capture_s = 0;
  double checksum_s = 0;
  double hash_s = 0;  // the trees' part of the checksum pass; 0 when hash_trees is off
  double local_s = 0;
  double persistent_s = 0;
  double persistent_at = 0;
};

struct region_row {
  uint32_t rank = 0;
  std::string region;
  std::string type;  // format::type_name
  uint64_t count = 0;
  std::vector<uint64_t> dims;  // empty = one-dimensional of `count`
  bool column_major = false;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string checksum;
  std::vector<uint64_t> global;  // global layout (empty without)
  std::vector<uint64_t> start;
  std::string exact_root;        // hash-tree roots (hex), empty without a tree
  std::string tolerant_root;     // empty without tolerant leaves
};

// The identity of a run (RUN file, format/run_info.hpp).
struct run_info_row {
  std::string run;
  std::string application;
  std::string code_version;
  std::string tags;        // JSON object
  int64_t executions = 0;
  double started_at = 0;   // first execution
  double ended_at = 0;     // last execution's end, 0 if it has not ended
  uint32_t nranks = 0;     // last execution
  std::string hosts;       // JSON array, last execution
  std::string config;      // JSON object, last execution
};

struct event_row {
  unsigned level = 0;          // a CAIRN_LEVEL_* bit
  std::optional<uint32_t> rank;  // empty = every rank
  double at = 0;
  double duration_s = 0;
  std::string source;  // "manifest" (derived, rebuildable) or "runtime" (record_level)
};

// What rebuild() found.
struct rebuild_stats {
  int64_t indexed = 0;      // versions indexed
  int64_t uncommitted = 0;  // version directories without a MANIFEST (skipped)
  int64_t invalid = 0;      // MANIFEST or a shard header unreadable or inconsistent (skipped)
  std::vector<std::string> problems;  // one message per invalid version
};

class catalog {
 public:
  virtual ~catalog() = default;

  // Opens (creating if needed) <store_root>/catalog.sqlite. store_root must be
  // an existing directory (not_found otherwise). A catalog written by a newer
  // cairn (higher schema version) gives not_supported; an older one is dropped
  // and rebuilt from the store.
  static result<std::unique_ptr<catalog>> open(const std::string& store_root);

  // The store root given to open().
  virtual const std::string& store_root() const = 0;

  // Indexes one committed version: reads its MANIFEST and every shard header
  // from the store and replaces whatever the catalog had for that version (in
  // one transaction: on error the catalog is unchanged). not_found if there is
  // no MANIFEST; corruption if the MANIFEST or a shard header is damaged or
  // does not match the other (size, header checksum, identity).
  // Runtime events (record_level) of the version are kept.
  virtual status index_version(storage::storage_env* env, const std::string& run, const std::string& name,
                               int64_t version) = 0;

  // Records that `version` reached `level` (a CAIRN_LEVEL_* bit) on every rank
  // at wall-clock time `at` (also for levels that have no manifest, e.g. local).
  // Replaces an earlier runtime record of the same version and level. These
  // records are not derivable from the store: rebuild() drops them.
  virtual status record_level(const std::string& run, const std::string& name, int64_t version, unsigned level,
                              double at, double duration_s) = 0;

  // Indexes <root>/runs/<run>/RUN (replacing the run's identity row).
  virtual status index_run(storage::storage_env* env, const std::string& run) = 0;
  virtual result<std::vector<run_info_row>> list_run_info() = 0;

  // Forgets a version (after retention or gc deleted it). ok if it was unknown.
  virtual status remove_version(const std::string& run, const std::string& name, int64_t version) = 0;

  // Drops everything and re-indexes every committed version found under
  // <root>/runs/*/*/v*, in one transaction (readers see the old catalog until
  // it commits). Versions without a MANIFEST, or whose MANIFEST or shards are
  // invalid, are skipped and counted in *stats (when given). The result equals
  // calling index_version on every indexed version of an empty catalog.
  // Returns the number of versions indexed.
  virtual result<int64_t> rebuild(storage::storage_env* env, rebuild_stats* stats = nullptr) = 0;

  // Queries. Results are ordered by run, name, version, rank (and region
  // name). Empty run/name arguments match everything.
  virtual result<std::vector<run_row>> list_runs() = 0;
  virtual result<std::vector<version_row>> list_versions(const std::string& run = "", const std::string& name = "") = 0;
  virtual result<std::vector<shard_row>> list_shards(const std::string& run, const std::string& name,
                                                     int64_t version) = 0;
  virtual result<std::vector<region_row>> list_regions(const std::string& run, const std::string& name,
                                                       int64_t version) = 0;
  virtual result<std::vector<event_row>> list_events(const std::string& run, const std::string& name,
                                                     int64_t version) = 0;
};

}  // namespace cairn::history

#endif

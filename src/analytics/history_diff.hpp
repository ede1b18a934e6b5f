// Comparison of two runs of a store, version by version, region by region
// (docs/design/history.md §2-§4, the engine of `cairn diff`).
//
// What is compared: every checkpoint name of either run (or one), every
// version committed (valid MANIFEST) in both runs, every region:
//  - regions with a global layout (shard flag kHasLayout) in both runs are
//    assembled by global index, so runs with different rank counts or
//    partitions compare element by element;
//  - other regions compare rank by rank, only when both runs have the same
//    rank count ("not comparable" otherwise).
// Different types, shapes, storage orders or layouts are structural
// differences: reported, not compared.
//
// Exactness: the result equals compare_elements() (compare.hpp) over the raw
// arrays (per rank, or the assembled global arrays). Hash trees only skip work:
// equal exact leaves (equal chunk bytes) count the chunk exact without reading
// it; in mismatch-only mode, equal tolerant leaves count it "within tolerance"
// only when tolerant_leaves_prove() says the tolerance covers every pair with
// equal quanta; everything else is read and compared element by element. A tree
// that is missing, fails to decode, or whose shard_header_checksum is not the
// shard's is ignored (reported) and the data are read. 64-bit hash collisions
// are the one assumption.
//
// I/O: data are read with pread in pieces of at most `read_bytes` per run (or
// one tree chunk, if larger, up to 64 MiB) into two reusable buffers (memory
// stays bounded whatever the store size); a shard
// is read from the run's scratch directory when its copy there has the header
// checksum the MANIFEST records, else from the store. A chunk read where a
// usable tree exists is checked against its exact leaf; a local copy that fails
// is abandoned for the persistent one, a persistent one is reported damaged.
//
// Thread-safety: diff_runs is reentrant; it uses one thread.
#ifndef CAIRN_ANALYTICS_HISTORY_DIFF_HPP
#define CAIRN_ANALYTICS_HISTORY_DIFF_HPP

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analytics/compare.hpp"
#include "cairn/status.hpp"
#include "storage/storage_env.hpp"

namespace cairn::analytics {

struct diff_options {
  std::string store;
  std::string run_a;
  std::string run_b;
  std::string name;                  // empty = every checkpoint name of either run
  std::vector<std::string> regions;  // empty = every region
  tolerance tol;
  // Answer only "where are the mismatches": exact and approximate are not told
  // apart (both count as `within`), which lets equal tolerant leaves skip reads.
  bool mismatches_only = false;
  std::string scratch_a;  // node-local level of run A (holds runs/<run_a>/...); empty = none
  std::string scratch_b;
  bool use_trees = true;             // false: read everything (tests, benchmarks)
  size_t read_bytes = size_t{256} << 10;  // buffer per run (at least 4096; grows to a tree chunk)
  storage::storage_env* env = nullptr;  // nullptr = storage_env::posix()
};

enum class region_state {
  compared,        // the element counts are meaningful
  structural,      // type, shape, layout or storage order differ: not compared
  not_comparable,  // per-rank region and different rank counts
  unreadable,      // a shard (or its data) could not be read: see the version's problems
};
const char* region_state_name(region_state s);

// Where a region's first mismatch is. Per-rank regions: index into the block,
// coords in the block's shape. Global regions: linear index into the global
// array (in the data's storage order), coords in the global shape, and the
// ranks whose blocks hold it.
struct mismatch_location {
  uint64_t index = 0;
  std::vector<uint64_t> coords;  // empty for one-dimensional regions without dims
  int64_t rank_a = -1;
  int64_t rank_b = -1;
  element_value a, b;
};

struct region_diff {
  std::string region;
  bool global = false;  // assembled by global index
  int64_t rank = -1;    // per-rank entries: the rank; -1 otherwise
  region_state state = region_state::compared;
  uint8_t type_a = 0, type_b = 0;
  std::vector<uint64_t> shape_a, shape_b;  // global shape (global) or block shape (per rank)
  std::vector<std::string> problems;       // structural differences / why not compared
  compare_stats stats;                     // indices as in mismatch_location
  uint64_t tolerant_within = 0;            // mismatch-only: elements proven within by tolerant leaves
  uint64_t chunks_skipped = 0;             // chunks decided by the trees without reading
  uint64_t chunks_read = 0;                // chunks (or pieces) read and compared
  uint64_t unmatched_a = 0;                // global: elements in A's blocks that no block of B holds
  uint64_t unmatched_b = 0;
  std::optional<mismatch_location> first;

  uint64_t elements() const { return stats.elements() + tolerant_within; }
  // exact + approximate (what the mismatch-only mode reports)
  uint64_t within() const { return stats.exact + stats.approximate + tolerant_within; }
  bool diverged() const { return state != region_state::compared || stats.mismatch > 0 || unmatched_a || unmatched_b; }
};

struct version_diff {
  int64_t version = 0;
  uint32_t nranks_a = 0, nranks_b = 0;
  std::vector<region_diff> regions;
  std::vector<std::string> problems;  // unreadable shards, shards not matching the MANIFEST, damaged data
  std::vector<std::string> notes;     // recovered: a local copy not used or abandoned for the persistent one
};

struct checkpoint_diff {
  std::string name;
  bool in_a = false, in_b = false;
  std::vector<int64_t> only_a, only_b;                // committed in one run only
  std::vector<int64_t> uncommitted_a, uncommitted_b;  // no valid MANIFEST: skipped
  std::vector<version_diff> versions;                 // committed in both, ascending
};

// The first divergence of the comparison: the lowest (version, rank,
// checkpoint name, region) with a mismatch, a structural difference, a
// non-comparable region or an unreadable shard.
struct divergence {
  std::string name;
  int64_t version = 0;
  int64_t rank = 0;  // per-rank: the rank; global: run A's rank holding the element (0 for structural)
  std::string region;  // empty for a version-level problem
  std::string kind;    // "mismatch", "structural", "not_comparable", "unreadable", "damaged"
  std::string message;
  std::optional<mismatch_location> at;  // for "mismatch"
};

struct io_stats {
  uint64_t tree_bytes = 0;        // tree files read
  uint64_t data_bytes = 0;        // shard data read (both runs)
  uint64_t data_bytes_local = 0;  // of data_bytes: from scratch directories
  uint64_t metadata_bytes = 0;    // MANIFESTs and shard headers
  uint64_t checkpoint_bytes = 0;  // shard sizes of the versions compared (both runs)
  uint64_t shards = 0;            // shards of the versions compared (both runs)
  uint64_t shards_local = 0;      // of shards: served by a scratch copy
  uint64_t trees_used = 0;
  uint64_t trees_absent = 0;    // none written (MANIFEST says so)
  uint64_t trees_unusable = 0;  // missing though written, damaged, or of another shard: data read
  std::vector<std::string> tree_notes;  // one line per unusable tree
};

struct diff_result {
  std::string store, run_a, run_b;
  tolerance tol;
  bool mismatches_only = false;
  tolerant_proof tolerant;  // whether equal tolerant leaves may skip reads (mismatch-only mode)
  std::vector<checkpoint_diff> checkpoints;
  std::optional<divergence> first;
  io_stats io;
  double elapsed_s = 0;

  // Totals over every compared region.
  uint64_t versions_compared = 0;
  uint64_t regions_compared = 0;  // region entries with state compared
  compare_stats total;
  uint64_t tolerant_within = 0;
  uint64_t structural = 0;  // region entries not compared (structural, not comparable, unreadable)
  uint64_t problems = 0;    // version-level problems

  bool diverged() const { return first.has_value(); }
  // "identical" (every element exact), "within_tolerance", "diverged", or
  // "nothing_compared" (no version committed in both runs).
  std::string outcome() const;
};

// Compares run_a with run_b. Errors (no result): invalid_argument for a bad
// tolerance or read size; not_found for a store, run, checkpoint name or
// region that does not exist (the message lists what does). Everything found
// while comparing (damaged shards, unusable trees) is in the result.
result<diff_result> diff_runs(const diff_options& o);

}  // namespace cairn::analytics

#endif

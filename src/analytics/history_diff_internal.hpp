// Internal to the history_diff unit (history_diff.cpp, history_diff_io.cpp,
// history_diff_regions.cpp); nothing outside src/analytics/history_diff*
// includes it. Declares `differ`, the one-shot comparison that diff_runs()
// runs (history_diff.hpp states what it computes), and the records of shards
// and blocks its parts share:
//  - history_diff.cpp: the driver (options, checkpoint names, committed
//    versions, region order and dispatch) and the divergence bookkeeping;
//  - history_diff_io.cpp: opening and validating shards and trees, and every
//    read of shard data (bounded open files, local copy abandoned for the
//    persistent shard when it proves damaged);
//  - history_diff_regions.cpp: comparing a region, per rank or assembled by
//    global index, using the trees to skip what they prove equal.
// A differ is used once, by one thread; it borrows the diff_options it is
// given, which must outlive it.
#ifndef CAIRN_ANALYTICS_HISTORY_DIFF_INTERNAL_HPP
#define CAIRN_ANALYTICS_HISTORY_DIFF_INTERNAL_HPP

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analytics/compare.hpp"
#include "analytics/history_diff.hpp"
#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "format/tree.hpp"
#include "storage/storage_env.hpp"

namespace cairn::analytics::history_diff_internal {

using storage::storage_env;

inline std::vector<uint64_t> block_shape(const format::region_desc& r) {
  return r.dims.empty() ? std::vector<uint64_t>{r.count} : r.dims;
}

// One rank's shard of one run and version: where it is read from, its header
// and (when usable) its tree.
struct shard_src {
  uint32_t rank = 0;
  bool ok = false;
  std::string error;                // why !ok
  uint64_t expect_checksum = 0;     // the MANIFEST's header checksum
  uint64_t expect_size = 0;
  bool tree_written = false;        // the MANIFEST says a tree was written
  std::string persistent_path;      // the shard file, or "<dir>/data.* (rank r)" (aggregated)
  std::string persistent_dir;       // its version directory
  const format::manifest* container = nullptr;  // the version's MANIFEST when aggregated
  std::string local_path;           // empty = no scratch directory given
  bool local = false;               // data come from local_path
  format::shard_header header;
  std::optional<format::tree_file> tree;
  std::unique_ptr<format::shard_reader> file;  // open on data_path(), lazily
  const std::string& data_path() const { return local ? local_path : persistent_path; }
};

struct run_side {
  const char* label;  // "A" or "B"
  std::string run;
  std::string scratch;
  std::vector<shard_src> shards;
};

// One block of a global-layout region.
struct block {
  shard_src* src = nullptr;
  const format::region_desc* desc = nullptr;
  std::vector<uint64_t> start, dims;
};

class differ {
 public:
  explicit differ(const diff_options& o) : o_(o), env_(o.env ? o.env : storage_env::posix()) {}

  result<diff_result> run();

 private:
  // ---- driver (history_diff.cpp) -----------------------------------------------------
  status check_options();

  // ---- versions ----------------------------------------------------------------------
  struct committed {
    std::map<int64_t, format::manifest> ok;
    std::vector<int64_t> uncommitted;
  };

  committed scan_run(const std::string& run, const std::string& name);
  void compare_checkpoint(int name_index, checkpoint_diff& cd);

  // ---- divergence --------------------------------------------------------------------
  struct version_key {
    int64_t version;
    int64_t rank;
    int name_index;
    int region_index;
    auto operator<=>(const version_key&) const = default;
  };

  void version_problem(int64_t rank, const std::string& message, const char* kind);
  void consider(version_key k, const std::string& name, const std::string& region, const std::string& kind,
                const std::string& message, std::optional<mismatch_location> at);
  void finish_region(int64_t version, int region_index, region_diff rd, version_diff& vd);

  // ---- one version -------------------------------------------------------------------
  void compare_version(int name_index, const std::string& name, const format::manifest& ma,
                       const format::manifest& mb, version_diff& vd);
  static const format::region_desc* find_region(const shard_src& s, const std::string& name);
  void compare_region(int ri, const std::string& region, version_diff& vd);
  static void set_types(region_diff& rd, const std::vector<const format::region_desc*>& da,
                        const std::vector<const format::region_desc*>& db);

  // ---- shards and reading (history_diff_io.cpp) --------------------------------------
  result<std::unique_ptr<format::shard_reader>> open_reader(const shard_src& s, bool local);
  status open_shard(shard_src& s, bool local, bool keep_header = false);
  void load_tree(shard_src& s);
  void load_side(run_side& side, const std::string& name, const format::manifest& m, version_diff& vd);
  bool read(shard_src& s, const char* label, uint64_t offset, void* buf, size_t len);
  void close_idle(const shard_src* keep);
  bool fail_read(shard_src& s, const char* label, const std::string& message);
  bool abandon_local(shard_src& s, const char* label);
  bool read_side(shard_src& s, const char* label, const format::region_desc& d, uint64_t e, uint64_t cnt,
                 const format::region_tree* t, uint64_t per, std::byte* buf);

  // ---- per-rank regions (history_diff_regions.cpp) -----------------------------------
  void compare_per_rank(int ri, const std::string& region, const std::vector<const format::region_desc*>& da,
                        const std::vector<const format::region_desc*>& db, version_diff& vd);
  static void structural_checks(region_diff& rd, const format::region_desc& a, const format::region_desc& b);

  // ---- whole blocks ------------------------------------------------------------------
  static const format::region_tree* usable_tree(const shard_src& s, const format::region_desc& d);
  bool compare_blocks(shard_src& sa, const format::region_desc& a, shard_src& sb, const format::region_desc& b,
                      region_diff& rd, compare_stats* st, version_diff& vd);
  bool read_compare(shard_src& sa, const format::region_desc& a, shard_src& sb, const format::region_desc& b,
                    uint64_t e0, uint64_t e1, const format::region_tree* ta, const format::region_tree* tb,
                    uint64_t per, region_diff& rd, compare_stats* st);
  const tolerant_proof& proof(double quantum);

  // ---- global-layout regions ---------------------------------------------------------
  void compare_global(int ri, const std::string& region, const std::vector<const format::region_desc*>& da,
                      const std::vector<const format::region_desc*>& db, bool unreadable, version_diff& vd);
  static bool side_unreadable(const run_side& s);
  static void structural_checks_global(region_diff& rd, const format::region_desc& a, const format::region_desc& b);
  static bool no_overlap(const char* label, const std::vector<block>& bl, region_diff& rd);

  // One row of an intersection: contiguous in both blocks and in the global array.
  struct row {
    uint64_t a_off, b_off;  // element offsets in the blocks
    uint64_t g;             // global linear index of the first element
    uint64_t len;
  };

  bool compare_box(const block& x, const block& y, const std::vector<uint64_t>& lo, const std::vector<uint64_t>& hi,
                   const std::vector<uint64_t>& global, region_diff& rd, compare_stats* st);
  static uint64_t ravel_local(const std::vector<uint64_t>& c, const std::vector<uint64_t>& start,
                              const std::vector<uint64_t>& dims);
  bool gather(shard_src& s, const char* label, const format::region_desc& d, const std::vector<row>& batch, bool side_a,
              uint64_t useful, std::byte* buf, std::vector<uint64_t>* pos);

  const diff_options& o_;
  storage_env* env_;
  diff_result res_;
  std::vector<std::byte> buf_a_, buf_b_;
  run_side side_a_{"A", {}, {}, {}}, side_b_{"B", {}, {}, {}};
  size_t open_files_ = 0;
  version_diff* cur_vd_ = nullptr;
  std::string cur_name_;
  int cur_name_index_ = 0;
  int cur_ri_ = -1;
  std::string cur_region_;
  std::optional<version_key> first_key_;
  std::map<double, tolerant_proof> proofs_;
  bool proof_noted_ = false;
  std::set<std::string> seen_regions_, all_regions_;
};

}  // namespace cairn::analytics::history_diff_internal

#endif

#include "analytics/history_diff.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>

#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "format/tree.hpp"
#include "util/hash.hpp"

namespace cairn::analytics {
namespace {

using storage::storage_env;

// Open data files kept per version; past this, idle ones are closed (a store
// of thousands of ranks must not run out of descriptors).
constexpr size_t kMaxOpenFiles = 256;

// The read buffers grow to a tree's chunk size up to this, so that chunks read
// can be checked against their leaves; larger chunks are compared unchecked.
constexpr uint64_t kMaxChunkBuffer = uint64_t{64} << 20;

std::string join_list(const std::vector<std::string>& items) {
  std::string s;
  for (auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

std::vector<uint64_t> block_shape(const format::region_desc& r) {
  return r.dims.empty() ? std::vector<uint64_t>{r.count} : r.dims;
}

uint64_t volume(const std::vector<uint64_t>& dims) {
  uint64_t v = 1;
  for (uint64_t d : dims) v *= d;
  return v;
}

// Row-major (storage order) coordinates of a linear index.
std::vector<uint64_t> unravel(uint64_t index, const std::vector<uint64_t>& shape) {
  std::vector<uint64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const uint64_t n = shape[d] == 0 ? 1 : shape[d];
    c[d] = index % n;
    index /= n;
  }
  return c;
}

uint64_t ravel(const std::vector<uint64_t>& coords, const std::vector<uint64_t>& shape) {
  uint64_t idx = 0;
  for (size_t d = 0; d < shape.size(); ++d) idx = idx * shape[d] + coords[d];
  return idx;
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

  result<diff_result> run() {
    const auto t0 = std::chrono::steady_clock::now();
    CAIRN_RETURN_IF_ERROR(check_options());
    res_.store = o_.store;
    res_.run_a = o_.run_a;
    res_.run_b = o_.run_b;
    res_.tol = o_.tol;
    res_.mismatches_only = o_.mismatches_only;
    if (o_.mismatches_only) res_.tolerant.reason = "no two trees with tolerant leaves of one quantum were compared";
    buf_a_.resize(std::max<size_t>(o_.read_bytes, 4096));
    buf_b_.resize(buf_a_.size());

    const std::string runs = format::runs_dir(o_.store);
    if (!env_->exists(runs)) {
      return status(errc::not_found, o_.store + " is not a cairn store (no runs/ directory)");
    }
    std::vector<std::string> all_runs = format::list_subdirs(env_, runs);
    for (const std::string* r : {&o_.run_a, &o_.run_b}) {
      if (std::find(all_runs.begin(), all_runs.end(), *r) == all_runs.end()) {
        return status(errc::not_found, "run '" + *r + "' not found in " + o_.store +
                                           (all_runs.empty() ? " (the store has no runs)"
                                                             : " (runs: " + join_list(all_runs) + ")"));
      }
    }
    std::vector<std::string> names_a = format::list_subdirs(env_, storage::join(runs, o_.run_a));
    std::vector<std::string> names_b = format::list_subdirs(env_, storage::join(runs, o_.run_b));
    std::set<std::string> names(names_a.begin(), names_a.end());
    names.insert(names_b.begin(), names_b.end());
    if (!o_.name.empty()) {
      if (names.count(o_.name) == 0) {
        return status(errc::not_found, "no checkpoint '" + o_.name + "' in run '" + o_.run_a + "' or '" + o_.run_b +
                                           "'" +
                                           (names.empty() ? "" : " (checkpoints: " +
                                                                     join_list({names.begin(), names.end()}) + ")"));
      }
      names = {o_.name};
    }
    int name_index = 0;
    for (const std::string& name : names) {
      checkpoint_diff cd;
      cd.name = name;
      cd.in_a = std::find(names_a.begin(), names_a.end(), name) != names_a.end();
      cd.in_b = std::find(names_b.begin(), names_b.end(), name) != names_b.end();
      compare_checkpoint(name_index++, cd);
      res_.checkpoints.push_back(std::move(cd));
    }
    if (!o_.regions.empty()) {
      std::vector<std::string> missing;
      for (auto& r : o_.regions)
        if (seen_regions_.count(r) == 0) missing.push_back("'" + r + "'");
      if (!missing.empty() && res_.versions_compared > 0) {
        return status(errc::not_found, "region " + join_list(missing) + " not found in the compared versions" +
                                           (all_regions_.empty() ? std::string()
                                                                 : " (regions: " +
                                                                       join_list({all_regions_.begin(),
                                                                                  all_regions_.end()}) +
                                                                       ")"));
      }
    }
    res_.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::move(res_);
  }

 private:
  status check_options() {
    auto bad = [](const std::string& m) { return status(errc::invalid_argument, m); };
    if (o_.store.empty()) return bad("no store given");
    if (o_.run_a.empty() || o_.run_b.empty()) return bad("two runs are needed");
    if (!(o_.tol.abs >= 0)) return bad("the absolute tolerance must be a number >= 0");
    if (!(o_.tol.rel >= 0)) return bad("the relative tolerance must be a number >= 0");
    return {};
  }

  // ---- versions --------------------------------------------------------------------
  struct committed {
    std::map<int64_t, format::manifest> ok;
    std::vector<int64_t> uncommitted;
  };

  committed scan_run(const std::string& run, const std::string& name) {
    committed c;
    for (int64_t v : format::list_versions(env_, o_.store, run, name)) {
      const std::string path = format::manifest_path(o_.store, run, name, v);
      auto text = env_->read_all(path);
      if (!text) {
        c.uncommitted.push_back(v);
        continue;
      }
      res_.io.metadata_bytes += text->size();
      auto m = format::decode_manifest(*text, path);
      if (!m) {
        c.uncommitted.push_back(v);
        continue;
      }
      c.ok.emplace(v, std::move(*m));
    }
    return c;
  }

  void compare_checkpoint(int name_index, checkpoint_diff& cd) {
    committed a = scan_run(o_.run_a, cd.name), b = scan_run(o_.run_b, cd.name);
    cd.uncommitted_a = a.uncommitted;
    cd.uncommitted_b = b.uncommitted;
    for (auto& [v, m] : a.ok)
      if (b.ok.count(v) == 0) cd.only_a.push_back(v);
    for (auto& [v, m] : b.ok)
      if (a.ok.count(v) == 0) cd.only_b.push_back(v);
    for (auto& [v, ma] : a.ok) {
      auto it = b.ok.find(v);
      if (it == b.ok.end()) continue;
      version_diff vd;
      vd.version = v;
      compare_version(name_index, cd.name, ma, it->second, vd);
      cd.versions.push_back(std::move(vd));
      ++res_.versions_compared;
    }
  }

  // Opens and validates a shard (its header, and that the file has the size
  // the header says), compressed or not: s's local copy (a shard file) or its
  // persistent shard (a shard file, or the rank's image in the data files of
  // an aggregated version).
  result<std::unique_ptr<format::shard_reader>> open_reader(const shard_src& s, bool local) {
    std::unique_ptr<format::shard_reader> rd;
    if (local || !s.container) {
      CAIRN_ASSIGN_OR_RETURN(rd, format::shard_reader::open(env_, local ? s.local_path : s.persistent_path));
    } else {
      CAIRN_ASSIGN_OR_RETURN(auto file, format::open_container_image(env_, s.persistent_dir, *s.container, s.rank));
      CAIRN_ASSIGN_OR_RETURN(rd, format::shard_reader::open(std::move(file), s.persistent_path));
    }
    res_.io.metadata_bytes += rd->bytes_read();
    return rd;
  }

  // Opens s's local copy or persistent shard as the shard of `s` if it is the
  // image the MANIFEST records. Sets s.header unless it is already known (a
  // header with the same checksum is the same header: references into it stay
  // valid).
  status open_shard(shard_src& s, bool local, bool keep_header = false) {
    const std::string& path = local ? s.local_path : s.persistent_path;
    CAIRN_ASSIGN_OR_RETURN(auto f, open_reader(s, local));
    const format::shard_header& h = f->header();
    if (h.header_checksum != s.expect_checksum || h.file_size != s.expect_size) {
      return status(errc::corruption, path + ": header checksum " + util::hex64(h.header_checksum) + " / size " +
                                          std::to_string(h.file_size) + " do not match the MANIFEST (" +
                                          util::hex64(s.expect_checksum) + " / " + std::to_string(s.expect_size) +
                                          ")");
    }
    if (!keep_header) s.header = h;
    if (open_files_ < kMaxOpenFiles) {  // else reopened when its data are needed
      s.file = std::move(f);
      ++open_files_;
    }
    return {};
  }

  void load_tree(shard_src& s) {
    if (!o_.use_trees) return;
    const std::string name = format::tree_file_name(s.rank);
    std::vector<std::string> paths;
    if (s.local) paths.push_back(storage::join(storage::dirname_of(s.local_path), name));
    // An aggregated version has no trees (container.md): its data are read.
    if (!s.container) paths.push_back(storage::join(s.persistent_dir, name));
    std::string why;
    for (auto& p : paths) {
      if (!env_->exists(p)) continue;
      auto data = env_->read_all(p);
      if (!data) {
        why = data.error().message();
        continue;
      }
      res_.io.tree_bytes += data->size();
      auto t = format::decode_tree(std::as_bytes(std::span<const char>(data->data(), data->size())), p);
      if (!t) {
        why = t.error().message();
        continue;
      }
      if (t->shard_header_checksum != s.header.header_checksum) {
        why = p + ": describes another shard (its shard_header_checksum " + util::hex64(t->shard_header_checksum) +
              " is not the shard's " + util::hex64(s.header.header_checksum) + "); the data are read";
        continue;
      }
      s.tree = std::move(*t);
      ++res_.io.trees_used;
      return;
    }
    if (why.empty() && (!s.tree_written || paths.empty())) {
      ++res_.io.trees_absent;
      return;
    }
    ++res_.io.trees_unusable;
    if (why.empty()) why = paths.back() + ": missing although the MANIFEST says it was written; the data are read";
    res_.io.tree_notes.push_back(why);
  }

  void load_side(run_side& side, const std::string& name, const format::manifest& m, version_diff& vd) {
    side.shards.clear();
    side.shards.resize(m.nranks);
    for (uint32_t r = 0; r < m.nranks; ++r) {
      shard_src& s = side.shards[r];
      s.rank = r;
      s.expect_checksum = m.shards[r].header_checksum;
      s.expect_size = m.shards[r].size;
      s.tree_written = m.shards[r].tree;
      s.container = m.aggregated ? &m : nullptr;  // m outlives side.shards (compare_version)
      s.persistent_dir = format::version_dir(o_.store, side.run, name, m.version);
      s.persistent_path = format::persistent_image_where(o_.store, side.run, name, m.version, r, s.container);
      res_.io.checkpoint_bytes += s.expect_size;
      ++res_.io.shards;
      if (!side.scratch.empty()) {
        s.local_path = format::shard_path(side.scratch, side.run, name, m.version, r);
        if (env_->exists(s.local_path)) {
          status st = open_shard(s, /*local=*/true);
          if (st) {
            s.local = true;
            ++res_.io.shards_local;
          } else {
            vd.notes.push_back("local copy not used: " + st.message());
          }
        }
      }
      if (!s.local) {
        status st = open_shard(s, /*local=*/false);
        if (!st) {
          s.error = st.message();
          version_problem(r, "run " + std::string(side.label) + " (" + side.run + ") rank " + std::to_string(r) +
                                 ": " + st.message(),
                          "unreadable");
          continue;
        }
      }
      s.ok = true;
      load_tree(s);
    }
  }

  // ---- divergence --------------------------------------------------------------------
  struct version_key {
    int64_t version;
    int64_t rank;
    int name_index;
    int region_index;
    auto operator<=>(const version_key&) const = default;
  };

  // A problem of the current version (and region, if any) that makes the
  // comparison incomplete: counted, and a divergence candidate.
  void version_problem(int64_t rank, const std::string& message, const char* kind) {
    cur_vd_->problems.push_back(message);
    ++res_.problems;
    consider(version_key{cur_vd_->version, rank, cur_name_index_, cur_ri_}, cur_name_, cur_region_, kind, message,
             std::nullopt);
  }

  void consider(version_key k, const std::string& name, const std::string& region, const std::string& kind,
                const std::string& message, std::optional<mismatch_location> at) {
    if (first_key_ && !(k < *first_key_)) return;
    first_key_ = k;
    divergence d;
    d.name = name;
    d.version = k.version;
    d.rank = k.rank;
    d.region = region;
    d.kind = kind;
    d.message = message;
    d.at = std::move(at);
    res_.first = std::move(d);
  }

  void finish_region(int64_t version, int region_index, region_diff rd, version_diff& vd) {
    if (rd.state == region_state::compared) {
      ++res_.regions_compared;
      compare_stats s = rd.stats;
      s.first.reset();  // indices of different regions do not compare
      res_.total.merge(s);
      res_.tolerant_within += rd.tolerant_within;
    } else {
      ++res_.structural;
    }
    if (rd.diverged()) {
      const int64_t rank = rd.rank >= 0 ? rd.rank : (rd.first ? rd.first->rank_a : 0);
      std::string kind, message;
      if (rd.state != region_state::compared) {
        kind = region_state_name(rd.state);
        message = join_list(rd.problems);
      } else if (rd.stats.mismatch > 0) {
        kind = "mismatch";
        message = std::to_string(rd.stats.mismatch) + " mismatching elements";
      } else {
        kind = "structural";
        message = join_list(rd.problems);
      }
      consider(version_key{version, rank, cur_name_index_, region_index}, cur_name_, rd.region, kind, message,
               rd.stats.mismatch > 0 ? rd.first : std::nullopt);
    }
    vd.regions.push_back(std::move(rd));
  }

  // ---- one version -------------------------------------------------------------------
  void compare_version(int name_index, const std::string& name, const format::manifest& ma,
                       const format::manifest& mb, version_diff& vd) {
    cur_name_ = name;
    cur_name_index_ = name_index;
    cur_vd_ = &vd;
    cur_ri_ = -1;
    cur_region_.clear();
    vd.nranks_a = ma.nranks;
    vd.nranks_b = mb.nranks;
    side_a_ = run_side{"A", o_.run_a, o_.scratch_a, {}};
    side_b_ = run_side{"B", o_.run_b, o_.scratch_b, {}};
    open_files_ = 0;
    load_side(side_a_, name, ma, vd);
    load_side(side_b_, name, mb, vd);

    // Regions in order of first appearance: run A's ranks, then run B's.
    std::vector<std::string> order;
    std::set<std::string> seen;
    for (run_side* side : {&side_a_, &side_b_})
      for (auto& s : side->shards)
        if (s.ok)
          for (auto& r : s.header.regions)
            if (seen.insert(r.name).second) order.push_back(r.name);
    all_regions_.insert(order.begin(), order.end());

    for (size_t ri = 0; ri < order.size(); ++ri) {
      const std::string& region = order[ri];
      if (!o_.regions.empty() && std::find(o_.regions.begin(), o_.regions.end(), region) == o_.regions.end()) continue;
      seen_regions_.insert(region);
      cur_ri_ = static_cast<int>(ri);
      cur_region_ = region;
      compare_region(static_cast<int>(ri), region, vd);
    }
    // Release the files of this version.
    side_a_.shards.clear();
    side_b_.shards.clear();
  }

  static const format::region_desc* find_region(const shard_src& s, const std::string& name) {
    if (!s.ok) return nullptr;
    for (auto& r : s.header.regions)
      if (r.name == name) return &r;
    return nullptr;
  }

  void compare_region(int ri, const std::string& region, version_diff& vd) {
    std::vector<const format::region_desc*> da(side_a_.shards.size()), db(side_b_.shards.size());
    bool any_layout = false, any_plain = false, a_bad = false, b_bad = false, in_a = false, in_b = false;
    for (size_t r = 0; r < da.size(); ++r) {
      da[r] = find_region(side_a_.shards[r], region);
      a_bad |= !side_a_.shards[r].ok;
      in_a |= da[r] != nullptr;
      if (da[r]) ((da[r]->flags & format::kHasLayout) ? any_layout : any_plain) = true;
    }
    for (size_t r = 0; r < db.size(); ++r) {
      db[r] = find_region(side_b_.shards[r], region);
      b_bad |= !side_b_.shards[r].ok;
      in_b |= db[r] != nullptr;
      if (db[r]) ((db[r]->flags & format::kHasLayout) ? any_layout : any_plain) = true;
    }
    if (in_a != in_b && !(in_a ? b_bad : a_bad)) {
      region_diff rd;
      rd.region = region;
      rd.state = region_state::structural;
      set_types(rd, da, db);
      rd.problems.push_back(std::string("region only in run ") + (in_a ? "A" : "B"));
      finish_region(vd.version, ri, std::move(rd), vd);
      return;
    }
    if (any_layout && any_plain) {
      region_diff rd;
      rd.region = region;
      rd.state = region_state::structural;
      std::string where;
      auto list = [&](const char* label, const std::vector<const format::region_desc*>& d) {
        std::string with, without;
        for (size_t r = 0; r < d.size(); ++r) {
          if (!d[r]) continue;
          ((d[r]->flags & format::kHasLayout) ? with : without) += (std::to_string(r) + " ");
        }
        return std::string(label) + " ranks with a global layout: " + (with.empty() ? "none " : with) +
               "without: " + (without.empty() ? "none" : without);
      };
      rd.problems.push_back("global layout declared on some ranks only (" + list("A", da) + "; " + list("B", db) + ")");
      set_types(rd, da, db);
      finish_region(vd.version, ri, std::move(rd), vd);
      return;
    }
    if (any_layout) {
      compare_global(ri, region, da, db, a_bad || b_bad, vd);
    } else {
      compare_per_rank(ri, region, da, db, vd);
    }
  }

  static void set_types(region_diff& rd, const std::vector<const format::region_desc*>& da,
                        const std::vector<const format::region_desc*>& db) {
    for (auto* d : da)
      if (d) {
        rd.type_a = d->type;
        rd.shape_a = (d->flags & format::kHasLayout) ? d->global : block_shape(*d);
        break;
      }
    for (auto* d : db)
      if (d) {
        rd.type_b = d->type;
        rd.shape_b = (d->flags & format::kHasLayout) ? d->global : block_shape(*d);
        break;
      }
  }

  // ---- per-rank regions --------------------------------------------------------------
  void compare_per_rank(int ri, const std::string& region, const std::vector<const format::region_desc*>& da,
                        const std::vector<const format::region_desc*>& db, version_diff& vd) {
    if (da.size() != db.size()) {
      region_diff rd;
      rd.region = region;
      rd.state = region_state::not_comparable;
      set_types(rd, da, db);
      rd.problems.push_back("not comparable: per-rank region and different rank counts (A has " +
                            std::to_string(da.size()) + " ranks, B has " + std::to_string(db.size()) + ")");
      finish_region(vd.version, ri, std::move(rd), vd);
      return;
    }
    for (size_t r = 0; r < da.size(); ++r) {
      shard_src& sa = side_a_.shards[r];
      shard_src& sb = side_b_.shards[r];
      const format::region_desc* a = da[r];
      const format::region_desc* b = db[r];
      if (!a && !b && sa.ok && sb.ok) continue;  // this rank has no such region in either run
      region_diff rd;
      rd.region = region;
      rd.rank = static_cast<int64_t>(r);
      if (a) rd.type_a = a->type, rd.shape_a = block_shape(*a);
      if (b) rd.type_b = b->type, rd.shape_b = block_shape(*b);
      if (!sa.ok || !sb.ok) {
        rd.state = region_state::unreadable;
        rd.problems.push_back(std::string("shard of rank ") + std::to_string(r) + " unreadable in run " +
                              (!sa.ok ? "A" : "B"));
      } else if (!a || !b) {
        rd.state = region_state::structural;
        rd.problems.push_back(std::string("region only in run ") + (a ? "A" : "B") + " on rank " + std::to_string(r));
      } else {
        structural_checks(rd, *a, *b);
        if (rd.problems.empty()) {
          compare_stats st;
          if (compare_blocks(sa, *a, sb, *b, rd, &st, vd)) {
            rd.stats = std::move(st);
            if (rd.stats.first) {
              mismatch_location loc;
              loc.index = rd.stats.first->index;
              if (!a->dims.empty()) loc.coords = unravel(loc.index, a->dims);
              loc.rank_a = loc.rank_b = static_cast<int64_t>(r);
              loc.a = rd.stats.first->a;
              loc.b = rd.stats.first->b;
              rd.first = std::move(loc);
            }
          } else {
            rd.state = region_state::unreadable;
          }
        } else {
          rd.state = region_state::structural;
        }
      }
      finish_region(vd.version, ri, std::move(rd), vd);
    }
  }

  static void structural_checks(region_diff& rd, const format::region_desc& a, const format::region_desc& b) {
    if (a.type != b.type) {
      rd.problems.push_back(std::string("type differs: A ") + format::type_name(a.type) + ", B " +
                            format::type_name(b.type));
    }
    if (block_shape(a) != block_shape(b)) {
      rd.problems.push_back("shape differs: A " + shape_text(block_shape(a)) + ", B " + shape_text(block_shape(b)));
    }
    if ((a.flags & format::kColumnMajor) != (b.flags & format::kColumnMajor)) {
      rd.problems.push_back(std::string("storage order differs: A ") +
                            ((a.flags & format::kColumnMajor) ? "column" : "row") + "-major, B " +
                            ((b.flags & format::kColumnMajor) ? "column" : "row") + "-major");
    }
  }

  // ---- reading -----------------------------------------------------------------------
  // Reads len bytes at offset of s's data into buf. On failure records a
  // problem and returns false.
  bool read(shard_src& s, const char* label, uint64_t offset, void* buf, size_t len) {
    if (!s.file) {
      if (open_files_ >= kMaxOpenFiles) close_idle(&s);
      auto f = open_reader(s, s.local);
      if (!f) return fail_read(s, label, f.error().message());
      s.file = std::move(*f);
      ++open_files_;
    }
    // Offsets are the image's: a compressed shard decompresses what is read.
    status st = s.file->read(offset, buf, len);
    if (!st) return fail_read(s, label, st.message());
    res_.io.data_bytes += len;
    if (s.local) res_.io.data_bytes_local += len;
    return true;
  }

  void close_idle(const shard_src* keep) {
    for (run_side* side : {&side_a_, &side_b_})
      for (auto& s : side->shards)
        if (&s != keep && s.file) {
          s.file.reset();
          --open_files_;
        }
  }

  bool fail_read(shard_src& s, const char* label, const std::string& message) {
    version_problem(s.rank, std::string("run ") + label + " rank " + std::to_string(s.rank) + ": " + message,
                    "unreadable");
    return false;
  }

  // The local copy of s proved damaged: read the persistent shard from now on.
  bool abandon_local(shard_src& s, const char* label) {
    if (s.file) {
      s.file.reset();
      --open_files_;
    }
    s.local = false;
    --res_.io.shards_local;
    status st = open_shard(s, /*local=*/false, /*keep_header=*/true);
    if (!st) return fail_read(s, label, st.message());
    return true;
  }

  static const format::region_tree* usable_tree(const shard_src& s, const format::region_desc& d) {
    if (!s.tree) return nullptr;
    const format::region_tree* t = s.tree->find(d.name);
    if (!t || t->type != d.type || t->count != d.count) return nullptr;
    return t;
  }

  // Compares the whole blocks a and b (same type and element count), element i
  // with element i, into *st (indices into the block). Uses the trees when
  // both are usable with the same chunking. False when data could not be read.
  bool compare_blocks(shard_src& sa, const format::region_desc& a, shard_src& sb, const format::region_desc& b,
                      region_diff& rd, compare_stats* st, version_diff& vd) {
    cur_vd_ = &vd;
    const uint64_t n = a.count;
    const uint8_t type = a.type;
    const uint64_t es = format::type_size(type);
    const format::region_tree* ta = usable_tree(sa, a);
    const format::region_tree* tb = usable_tree(sb, b);
    const bool trees = ta && tb && sa.tree->chunk_bytes == sb.tree->chunk_bytes;
    if (trees && ta->exact_root == tb->exact_root && ta->exact.size() == tb->exact.size()) {
      st->exact += n;
      rd.chunks_skipped += ta->exact.size();
      return true;
    }
    bool tolerant = false;
    if (trees && o_.mismatches_only && ta->has_tolerant && tb->has_tolerant && sa.tree->quantum == sb.tree->quantum &&
        ta->tolerant.size() == ta->exact.size() && tb->tolerant.size() == tb->exact.size()) {
      tolerant = proof(sa.tree->quantum).usable;
    }
    if (trees && sa.tree->chunk_bytes > buf_a_.size() && sa.tree->chunk_bytes <= kMaxChunkBuffer) {
      // A whole chunk must fit to be checked against its leaf.
      buf_a_.resize(sa.tree->chunk_bytes);
      buf_b_.resize(sa.tree->chunk_bytes);
    }
    const uint64_t per = trees ? format::elements_per_chunk(sa.tree->chunk_bytes, type) : 0;
    const uint64_t buf_elems = buf_a_.size() / es;
    if (!trees) {
      return read_compare(sa, a, sb, b, 0, n, nullptr, nullptr, 0, rd, st);
    }
    // Runs of consecutive chunks that must be read, coalesced up to the buffer.
    const uint64_t nch = ta->exact.size();
    uint64_t run_first = 0, run_len = 0;
    for (uint64_t c = 0; c <= nch; ++c) {
      bool skip = false;
      if (c < nch) {
        const uint64_t first = c * per;
        const uint64_t cnt = std::min(per, n - first);
        if (ta->exact[c] == tb->exact[c]) {
          st->exact += cnt;
          ++rd.chunks_skipped;
          skip = true;
        } else if (tolerant && ta->tolerant[c] == tb->tolerant[c]) {
          rd.tolerant_within += cnt;
          ++rd.chunks_skipped;
          skip = true;
        }
      }
      const bool flush = c == nch || skip || (run_len > 0 && (run_len + 1) * per > buf_elems);
      if (flush && run_len > 0) {
        const uint64_t e0 = run_first * per, e1 = std::min((run_first + run_len) * per, n);
        if (!read_compare(sa, a, sb, b, e0, e1, ta, tb, per, rd, st)) return false;
        run_len = 0;
      }
      if (c < nch && !skip) {
        if (run_len == 0) run_first = c;
        ++run_len;
      }
    }
    return true;
  }

  // Reads elements [e0, e1) of blocks a and b in pieces that fit the buffers
  // and compares them. With leaves (ta, tb, per), pieces are whole chunks and
  // every chunk read is checked against its exact leaf.
  bool read_compare(shard_src& sa, const format::region_desc& a, shard_src& sb, const format::region_desc& b,
                    uint64_t e0, uint64_t e1, const format::region_tree* ta, const format::region_tree* tb,
                    uint64_t per, region_diff& rd, compare_stats* st) {
    const uint8_t type = a.type;
    const uint64_t es = format::type_size(type);
    uint64_t piece = buf_a_.size() / es;
    const bool check = ta && per <= piece;
    if (check) piece = piece / per * per;
    for (uint64_t e = e0; e < e1;) {
      const uint64_t cnt = std::min(piece, e1 - e);
      if (!read_side(sa, "A", a, e, cnt, ta, check ? per : 0, buf_a_.data())) return false;
      if (!read_side(sb, "B", b, e, cnt, tb, check ? per : 0, buf_b_.data())) return false;
      compare_into(st, buf_a_.data(), buf_b_.data(), cnt, type, o_.tol, e);
      rd.chunks_read += check ? (cnt + per - 1) / per : 1;
      e += cnt;
    }
    return true;
  }

  // Reads cnt elements from element e of region d of s into buf; with per > 0
  // (e a multiple of per), checks each chunk against the exact leaves of t,
  // falling back from a damaged local copy to the persistent shard.
  bool read_side(shard_src& s, const char* label, const format::region_desc& d, uint64_t e, uint64_t cnt,
                 const format::region_tree* t, uint64_t per, std::byte* buf) {
    const uint64_t es = format::type_size(d.type);
    for (int attempt = 0;; ++attempt) {
      // After abandoning the local copy, d still describes the persistent
      // shard: its header has the same checksum, hence the same table.
      if (!read(s, label, d.offset + e * es, buf, static_cast<size_t>(cnt * es))) return false;
      if (per == 0) return true;
      bool good = true;
      uint64_t bad_chunk = 0;
      for (uint64_t i = 0; i < cnt && good; i += per) {
        const uint64_t m = std::min(per, cnt - i);
        const uint64_t c = (e + i) / per;
        if (format::exact_leaf(buf + i * es, m, d.type) != t->exact[c]) {
          good = false;
          bad_chunk = c;
        }
      }
      if (good) return true;
      const std::string what = "region '" + d.name + "' chunk " + std::to_string(bad_chunk) + " of " +
                               s.data_path() + " does not match its tree leaf";
      if (s.local && attempt == 0) {
        cur_vd_->notes.push_back(std::string("run ") + label + " rank " + std::to_string(s.rank) + ": " + what +
                                 " (damaged local copy: the persistent shard is read instead)");
        if (!abandon_local(s, label)) return false;
        continue;
      }
      version_problem(s.rank, std::string("run ") + label + " rank " + std::to_string(s.rank) + ": " + what +
                                  " (damaged data or tree: compared as read)",
                      "damaged");
      return true;
    }
  }

  const tolerant_proof& proof(double quantum) {
    auto it = proofs_.find(quantum);
    if (it == proofs_.end()) it = proofs_.emplace(quantum, tolerant_leaves_prove(quantum, o_.tol)).first;
    if (!proof_noted_ || (!it->second.usable && res_.tolerant.usable)) {
      res_.tolerant = it->second;
      proof_noted_ = true;
    }
    return it->second;
  }

  // ---- global-layout regions ---------------------------------------------------------
  void compare_global(int ri, const std::string& region, const std::vector<const format::region_desc*>& da,
                      const std::vector<const format::region_desc*>& db, bool unreadable, version_diff& vd) {
    cur_vd_ = &vd;
    region_diff rd;
    rd.region = region;
    rd.global = true;
    set_types(rd, da, db);
    if (unreadable) {
      rd.state = region_state::unreadable;
      rd.problems.push_back("a shard of run " + std::string(side_unreadable(side_a_) ? "A" : "B") +
                            " is unreadable: its blocks are unknown");
      finish_region(vd.version, ri, std::move(rd), vd);
      return;
    }
    std::vector<block> ba, bb;
    auto collect = [&](run_side& side, const std::vector<const format::region_desc*>& d, std::vector<block>* out) {
      for (size_t r = 0; r < d.size(); ++r) {
        if (!d[r]) continue;
        block b;
        b.src = &side.shards[r];
        b.desc = d[r];
        b.start = d[r]->start;
        b.dims = d[r]->dims;
        out->push_back(std::move(b));
      }
    };
    collect(side_a_, da, &ba);
    collect(side_b_, db, &bb);
    // Everything must agree: type, global shape, storage order, in each run and across.
    auto agree = [&](const char* label, const std::vector<block>& bl) {
      for (auto& b : bl) {
        const auto& f = *bl.front().desc;
        if (b.desc->type != f.type || b.desc->global != f.global ||
            (b.desc->flags & format::kColumnMajor) != (f.flags & format::kColumnMajor)) {
          rd.problems.push_back(std::string("the ranks of run ") + label + " disagree on type, global shape or " +
                                "storage order (rank " + std::to_string(bl.front().src->rank) + ": " +
                                format::type_name(f.type) + " " + shape_text(f.global) + ", rank " +
                                std::to_string(b.src->rank) + ": " + format::type_name(b.desc->type) + " " +
                                shape_text(b.desc->global) + ")");
          return false;
        }
      }
      return true;
    };
    bool ok = agree("A", ba) & agree("B", bb);
    if (ok) {
      structural_checks_global(rd, *ba.front().desc, *bb.front().desc);
      ok = rd.problems.empty();
    }
    if (ok) ok = no_overlap("A", ba, rd) & no_overlap("B", bb, rd);
    if (!ok) {
      rd.state = region_state::structural;
      finish_region(vd.version, ri, std::move(rd), vd);
      return;
    }
    const std::vector<uint64_t>& global = ba.front().desc->global;
    uint64_t vol_a = 0, vol_b = 0, matched = 0;
    for (auto& b : ba) vol_a += volume(b.dims);
    for (auto& b : bb) vol_b += volume(b.dims);
    bool readable = true;
    for (auto& x : ba) {
      for (auto& y : bb) {
        if (!readable) break;
        if (volume(x.dims) == 0 || volume(y.dims) == 0) continue;
        compare_stats part;
        if (x.start == y.start && x.dims == y.dims) {
          // Same block in both runs: the trees apply.
          readable = compare_blocks(*x.src, *x.desc, *y.src, *y.desc, rd, &part, vd);
          if (part.first) {
            std::vector<uint64_t> c = unravel(part.first->index, x.dims);
            for (size_t d = 0; d < c.size(); ++d) c[d] += x.start[d];
            part.first->index = ravel(c, global);
          }
          matched += volume(x.dims);
        } else {
          std::vector<uint64_t> lo(global.size()), hi(global.size());
          bool empty = false;
          for (size_t d = 0; d < global.size(); ++d) {
            lo[d] = std::max(x.start[d], y.start[d]);
            hi[d] = std::min(x.start[d] + x.dims[d], y.start[d] + y.dims[d]);
            if (lo[d] >= hi[d]) empty = true;
          }
          if (empty) continue;
          std::vector<uint64_t> ext(global.size());
          for (size_t d = 0; d < global.size(); ++d) ext[d] = hi[d] - lo[d];
          matched += volume(ext);
          readable = compare_box(x, y, lo, hi, global, rd, &part);
        }
        if (part.first && (!rd.stats.first || part.first->index < rd.stats.first->index)) {
          mismatch_location loc;
          loc.index = part.first->index;
          loc.coords = unravel(loc.index, global);
          loc.rank_a = x.src->rank;
          loc.rank_b = y.src->rank;
          loc.a = part.first->a;
          loc.b = part.first->b;
          rd.first = std::move(loc);
        }
        rd.stats.merge(part);
      }
    }
    if (!readable) {
      rd.state = region_state::unreadable;
      rd.problems.push_back("data could not be read (see the version's problems)");
    }
    rd.unmatched_a = vol_a - matched;
    rd.unmatched_b = vol_b - matched;
    if (rd.unmatched_a > 0) {
      rd.problems.push_back(std::to_string(rd.unmatched_a) +
                            " elements of the global array are held by run A's blocks but by no block of run B "
                            "(cannot be matched)");
    }
    if (rd.unmatched_b > 0) {
      rd.problems.push_back(std::to_string(rd.unmatched_b) +
                            " elements of the global array are held by run B's blocks but by no block of run A "
                            "(cannot be matched)");
    }
    finish_region(vd.version, ri, std::move(rd), vd);
  }

  static bool side_unreadable(const run_side& s) {
    for (auto& sh : s.shards)
      if (!sh.ok) return true;
    return false;
  }

  static void structural_checks_global(region_diff& rd, const format::region_desc& a, const format::region_desc& b) {
    if (a.type != b.type) {
      rd.problems.push_back(std::string("type differs: A ") + format::type_name(a.type) + ", B " +
                            format::type_name(b.type));
    }
    if (a.global != b.global) {
      rd.problems.push_back("global shape differs: A " + shape_text(a.global) + ", B " + shape_text(b.global));
    }
    if ((a.flags & format::kColumnMajor) != (b.flags & format::kColumnMajor)) {
      rd.problems.push_back(std::string("storage order differs: A ") +
                            ((a.flags & format::kColumnMajor) ? "column" : "row") + "-major, B " +
                            ((b.flags & format::kColumnMajor) ? "column" : "row") + "-major");
    }
  }

  static bool no_overlap(const char* label, const std::vector<block>& bl, region_diff& rd) {
    for (size_t i = 0; i < bl.size(); ++i) {
      for (size_t j = i + 1; j < bl.size(); ++j) {
        bool overlap = volume(bl[i].dims) > 0 && volume(bl[j].dims) > 0;
        for (size_t d = 0; d < bl[i].dims.size() && overlap; ++d) {
          overlap = std::max(bl[i].start[d], bl[j].start[d]) <
                    std::min(bl[i].start[d] + bl[i].dims[d], bl[j].start[d] + bl[j].dims[d]);
        }
        if (overlap) {
          rd.problems.push_back(std::string("blocks of ranks ") + std::to_string(bl[i].src->rank) + " and " +
                                std::to_string(bl[j].src->rank) + " of run " + label +
                                " overlap: elements cannot be assigned to one block");
          return false;
        }
      }
    }
    return true;
  }

  // One row of an intersection: contiguous in both blocks and in the global array.
  struct row {
    uint64_t a_off, b_off;  // element offsets in the blocks
    uint64_t g;             // global linear index of the first element
    uint64_t len;
  };

  // Compares the box [lo, hi) (global coordinates) held by block x of run A
  // and block y of run B, row by row along the last dimension, reading rows in
  // batches. Indices in *st are global.
  bool compare_box(const block& x, const block& y, const std::vector<uint64_t>& lo, const std::vector<uint64_t>& hi,
                   const std::vector<uint64_t>& global, region_diff& rd, compare_stats* st) {
    const size_t nd = global.size();
    const uint8_t type = x.desc->type;
    const uint64_t es = format::type_size(type);
    const uint64_t cap = buf_a_.size() / es;
    const uint64_t len = hi[nd - 1] - lo[nd - 1];
    std::vector<row> batch;
    uint64_t useful = 0;
    auto flush = [&]() -> bool {
      if (batch.empty()) return true;
      std::vector<uint64_t> pos_a(batch.size()), pos_b(batch.size());
      if (!gather(*x.src, "A", *x.desc, batch, true, useful, buf_a_.data(), &pos_a)) return false;
      if (!gather(*y.src, "B", *y.desc, batch, false, useful, buf_b_.data(), &pos_b)) return false;
      for (size_t i = 0; i < batch.size(); ++i) {
        compare_into(st, buf_a_.data() + pos_a[i] * es, buf_b_.data() + pos_b[i] * es, batch[i].len, type, o_.tol,
                     batch[i].g);
      }
      ++rd.chunks_read;
      batch.clear();
      useful = 0;
      return true;
    };
    std::vector<uint64_t> c(lo);  // current row's coordinates (last one = lo)
    for (;;) {
      const uint64_t a_off = ravel_local(c, x.start, x.dims), b_off = ravel_local(c, y.start, y.dims);
      const uint64_t g = ravel(c, global);
      // A row longer than the buffer goes in pieces.
      for (uint64_t done = 0; done < len;) {
        const uint64_t n = std::min(len - done, cap);
        if (useful + n > cap && !flush()) return false;
        batch.push_back(row{a_off + done, b_off + done, g + done, n});
        useful += n;
        done += n;
      }
      // Next row: increment the coordinates before the last dimension.
      size_t d = nd - 1;
      while (d > 0) {
        --d;
        if (++c[d] < hi[d]) break;
        c[d] = lo[d];
        if (d == 0) return flush();
      }
      if (nd == 1) return flush();
    }
  }

  static uint64_t ravel_local(const std::vector<uint64_t>& c, const std::vector<uint64_t>& start,
                              const std::vector<uint64_t>& dims) {
    uint64_t idx = 0;
    for (size_t d = 0; d < dims.size(); ++d) idx = idx * dims[d] + (c[d] - start[d]);
    return idx;
  }

  // Reads the rows of a batch from one block into buf: one read of their span
  // when it fits the buffer and is at least a quarter useful, else a read per
  // row, packed. pos[i] receives row i's element position in buf.
  bool gather(shard_src& s, const char* label, const format::region_desc& d, const std::vector<row>& batch, bool side_a,
              uint64_t useful, std::byte* buf, std::vector<uint64_t>* pos) {
    const uint64_t es = format::type_size(d.type);
    const uint64_t cap = buf_a_.size() / es;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (auto& r : batch) {
      const uint64_t off = side_a ? r.a_off : r.b_off;
      lo = std::min(lo, off);
      hi = std::max(hi, off + r.len);
    }
    if (hi - lo <= cap && useful * 4 >= hi - lo) {
      if (!read(s, label, d.offset + lo * es, buf, static_cast<size_t>((hi - lo) * es))) return false;
      for (size_t i = 0; i < batch.size(); ++i) (*pos)[i] = (side_a ? batch[i].a_off : batch[i].b_off) - lo;
      return true;
    }
    uint64_t at = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const uint64_t off = side_a ? batch[i].a_off : batch[i].b_off;
      if (!read(s, label, d.offset + off * es, buf + at * es, static_cast<size_t>(batch[i].len * es))) return false;
      (*pos)[i] = at;
      at += batch[i].len;
    }
    return true;
  }

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

}  // namespace

const char* region_state_name(region_state s) {
  switch (s) {
    case region_state::compared: return "compared";
    case region_state::structural: return "structural";
    case region_state::not_comparable: return "not_comparable";
    case region_state::unreadable: return "unreadable";
  }
  return "unknown";
}

std::string diff_result::outcome() const {
  if (versions_compared == 0) return "nothing_compared";
  if (first) return "diverged";
  if (total.approximate == 0 && tolerant_within == 0) return "identical";
  return "within_tolerance";
}

result<diff_result> diff_runs(const diff_options& o) { return differ(o).run(); }

}  // namespace cairn::analytics

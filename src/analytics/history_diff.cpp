// The driver of diff_runs() (history_diff.hpp): checks the options, finds
// the checkpoint names and the versions committed (valid MANIFEST) in each
// run, loads both sides of every version compared in both, orders its
// regions by first appearance and sends each to the per-rank or global
// comparison (history_diff_regions.cpp); keeps the totals and the first
// divergence, the lowest (version, rank, name, region) over everything
// found. Errors returned are those of diff_runs(); everything else found is
// recorded in the result.
#include "analytics/history_diff.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "analytics/history_diff_internal.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"

namespace cairn::analytics {
namespace history_diff_internal {
namespace {

std::string join_list(const std::vector<std::string>& items) {
  std::string s;
  for (auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

}  // namespace

result<diff_result> differ::run() {
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

status differ::check_options() {
  auto bad = [](const std::string& m) { return status(errc::invalid_argument, m); };
  if (o_.store.empty()) return bad("no store given");
  if (o_.run_a.empty() || o_.run_b.empty()) return bad("two runs are needed");
  if (!(o_.tol.abs >= 0)) return bad("the absolute tolerance must be a number >= 0");
  if (!(o_.tol.rel >= 0)) return bad("the relative tolerance must be a number >= 0");
  return {};
}

// ---- versions ----------------------------------------------------------------------
differ::committed differ::scan_run(const std::string& run, const std::string& name) {
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

void differ::compare_checkpoint(int name_index, checkpoint_diff& cd) {
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

// ---- divergence --------------------------------------------------------------------
// A problem of the current version (and region, if any) that makes the
// comparison incomplete: counted, and a divergence candidate.
void differ::version_problem(int64_t rank, const std::string& message, const char* kind) {
  cur_vd_->problems.push_back(message);
  ++res_.problems;
  consider(version_key{cur_vd_->version, rank, cur_name_index_, cur_ri_}, cur_name_, cur_region_, kind, message,
           std::nullopt);
}

void differ::consider(version_key k, const std::string& name, const std::string& region, const std::string& kind,
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

void differ::finish_region(int64_t version, int region_index, region_diff rd, version_diff& vd) {
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
void differ::compare_version(int name_index, const std::string& name, const format::manifest& ma,
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

const format::region_desc* differ::find_region(const shard_src& s, const std::string& name) {
  if (!s.ok) return nullptr;
  for (auto& r : s.header.regions)
    if (r.name == name) return &r;
  return nullptr;
}

void differ::compare_region(int ri, const std::string& region, version_diff& vd) {
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

void differ::set_types(region_diff& rd, const std::vector<const format::region_desc*>& da,
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

}  // namespace history_diff_internal

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

result<diff_result> diff_runs(const diff_options& o) { return history_diff_internal::differ(o).run(); }

}  // namespace cairn::analytics

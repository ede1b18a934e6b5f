// cairn diff: compares two runs of a store version by version, region by
// region (src/analytics/history_diff.hpp does the work; this file prints it).
//
// JSON (--json) document:
//   store, run_a, run_b, mode ("full" | "mismatches_only"),
//   tolerance {abs, rel, ulps},
//   tolerant_leaves {used, min_rel, reason}       (mismatches_only only)
//   checkpoints: [{name, in_a, in_b, versions_only_a, versions_only_b,
//                  uncommitted_a, uncommitted_b,
//                  versions: [{version, nranks_a, nranks_b, problems, notes,
//                              regions: [region entry]}]}]
//   region entry: {region, layout ("global" | "per_rank"), rank (null for global),
//                  state ("compared" | "structural" | "not_comparable" | "unreadable"),
//                  type_a, type_b, shape_a, shape_b, problems,
//                  elements, exact, approximate (null in mismatches_only), within,
//                  mismatch, nonfinite_mismatch, max_abs, max_rel (over approximate
//                  and mismatching finite pairs; null in mismatches_only),
//                  mismatch_max_abs, mismatch_max_rel (the counts and errors are
//                  null when state is not "compared"), unmatched_a, unmatched_b,
//                  chunks {skipped, read}, first_mismatch (null or location)}
//   location: {index, coords, rank_a, rank_b, a, b, a_text, b_text}
//   first_divergence: null or {name, version, rank, region, kind, message, at}
//   summary {outcome, versions_compared, regions_compared, not_compared,
//            problems, elements, exact, approximate, within, mismatch, max_abs, max_rel}
//   io {tree_bytes, data_bytes, data_bytes_local, metadata_bytes,
//       checkpoint_bytes, read_fraction, shards, shards_local,
//       trees {used, absent, unusable, notes}}
//   elapsed_s
// Numbers that are not finite (values and errors) are the strings "nan",
// "inf", "-inf"; a_text / b_text are the values as decimal text (NaN payloads
// shown).
#include <cmath>
#include <cstdio>

#include "analytics/history_diff.hpp"
#include "commands.hpp"
#include "format/shard.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {
namespace {

using analytics::compare_stats;
using analytics::diff_result;
using analytics::element_value;
using analytics::mismatch_location;
using analytics::region_diff;
using analytics::region_state;
using nlohmann::json;

json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

json value_json(const element_value& v) {
  if (v.is_float()) return number(v.as_double());
  if (v.is_signed()) return v.as_int64();
  return v.as_uint64();
}

std::string err_text(double v) {
  if (v == 0) return "0";
  if (std::isinf(v)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string coords_text(const std::vector<uint64_t>& c) {
  std::string s = "[";
  for (size_t i = 0; i < c.size(); ++i) s += (i ? "," : "") + std::to_string(c[i]);
  return s + "]";
}

std::string where_text(const mismatch_location& m) {
  return "element " + std::to_string(m.index) + (m.coords.empty() ? "" : " " + coords_text(m.coords));
}

json location_json(const std::optional<mismatch_location>& m) {
  if (!m) return nullptr;
  return {{"index", m->index},
          {"coords", m->coords},
          {"rank_a", m->rank_a},
          {"rank_b", m->rank_b},
          {"a", value_json(m->a)},
          {"b", value_json(m->b)},
          {"a_text", m->a.to_string()},
          {"b_text", m->b.to_string()}};
}

json region_json(const region_diff& r, bool mismatches_only) {
  const compare_stats& s = r.stats;
  const bool counted = r.state == region_state::compared;
  json j = {{"region", r.region},
            {"layout", r.global ? "global" : "per_rank"},
            {"rank", r.rank >= 0 ? json(r.rank) : json(nullptr)},
            {"state", analytics::region_state_name(r.state)},
            {"type_a", r.type_a || !r.shape_a.empty() ? json(format::type_name(r.type_a)) : json(nullptr)},
            {"type_b", r.type_b || !r.shape_b.empty() ? json(format::type_name(r.type_b)) : json(nullptr)},
            {"shape_a", r.shape_a},
            {"shape_b", r.shape_b},
            {"problems", r.problems},
            {"elements", counted ? json(r.elements()) : json(nullptr)},
            {"exact", counted && !mismatches_only ? json(s.exact) : json(nullptr)},
            {"approximate", counted && !mismatches_only ? json(s.approximate) : json(nullptr)},
            {"within", counted ? json(r.within()) : json(nullptr)},
            {"mismatch", counted ? json(s.mismatch) : json(nullptr)},
            {"nonfinite_mismatch", counted ? json(s.nonfinite_mismatch) : json(nullptr)},
            {"max_abs", counted && !mismatches_only ? number(s.max_abs) : json(nullptr)},
            {"max_rel", counted && !mismatches_only ? number(s.max_rel) : json(nullptr)},
            {"mismatch_max_abs", counted ? number(s.mismatch_max_abs) : json(nullptr)},
            {"mismatch_max_rel", counted ? number(s.mismatch_max_rel) : json(nullptr)},
            {"unmatched_a", r.unmatched_a},
            {"unmatched_b", r.unmatched_b},
            {"chunks", {{"skipped", r.chunks_skipped}, {"read", r.chunks_read}}},
            {"first_mismatch", location_json(r.first)}};
  return j;
}

json result_json(const diff_result& d) {
  json cps = json::array();
  for (auto& c : d.checkpoints) {
    json versions = json::array();
    for (auto& v : c.versions) {
      json regions = json::array();
      for (auto& r : v.regions) regions.push_back(region_json(r, d.mismatches_only));
      versions.push_back({{"version", v.version},
                          {"nranks_a", v.nranks_a},
                          {"nranks_b", v.nranks_b},
                          {"problems", v.problems},
                          {"notes", v.notes},
                          {"regions", regions}});
    }
    cps.push_back({{"name", c.name},
                   {"in_a", c.in_a},
                   {"in_b", c.in_b},
                   {"versions_only_a", c.only_a},
                   {"versions_only_b", c.only_b},
                   {"uncommitted_a", c.uncommitted_a},
                   {"uncommitted_b", c.uncommitted_b},
                   {"versions", versions}});
  }
  json first = nullptr;
  if (d.first) {
    first = {{"name", d.first->name},     {"version", d.first->version}, {"rank", d.first->rank},
             {"region", d.first->region}, {"kind", d.first->kind},       {"message", d.first->message},
             {"at", location_json(d.first->at)}};
  }
  const auto& io = d.io;
  json j = {{"store", d.store},
            {"run_a", d.run_a},
            {"run_b", d.run_b},
            {"mode", d.mismatches_only ? "mismatches_only" : "full"},
            {"tolerance", {{"abs", number(d.tol.abs)}, {"rel", number(d.tol.rel)}, {"ulps", d.tol.ulps}}},
            {"checkpoints", cps},
            {"first_divergence", first},
            {"summary",
             {{"outcome", d.outcome()},
              {"versions_compared", d.versions_compared},
              {"regions_compared", d.regions_compared},
              {"not_compared", d.structural},
              {"problems", d.problems},
              {"elements", d.total.elements() + d.tolerant_within},
              {"exact", d.mismatches_only ? json(nullptr) : json(d.total.exact)},
              {"approximate", d.mismatches_only ? json(nullptr) : json(d.total.approximate)},
              {"within", d.total.exact + d.total.approximate + d.tolerant_within},
              {"mismatch", d.total.mismatch},
              {"max_abs", d.mismatches_only ? json(nullptr) : number(d.total.max_abs)},
              {"max_rel", d.mismatches_only ? json(nullptr) : number(d.total.max_rel)}}},
            {"io",
             {{"tree_bytes", io.tree_bytes},
              {"data_bytes", io.data_bytes},
              {"data_bytes_local", io.data_bytes_local},
              {"metadata_bytes", io.metadata_bytes},
              {"checkpoint_bytes", io.checkpoint_bytes},
              {"read_fraction",
               io.checkpoint_bytes ? static_cast<double>(io.tree_bytes + io.data_bytes + io.metadata_bytes) /
                                         static_cast<double>(io.checkpoint_bytes)
                                   : 0.0},
              {"shards", io.shards},
              {"shards_local", io.shards_local},
              {"trees",
               {{"used", io.trees_used},
                {"absent", io.trees_absent},
                {"unusable", io.trees_unusable},
                {"notes", io.tree_notes}}}}},
            {"elapsed_s", d.elapsed_s}};
  if (d.mismatches_only) {
    j["tolerant_leaves"] = {
        {"used", d.tolerant.usable}, {"min_rel", d.tolerant.min_rel}, {"reason", d.tolerant.reason}};
  }
  return j;
}

std::string state_cell(const region_diff& r) {
  switch (r.state) {
    case region_state::compared:
      if (r.stats.mismatch > 0) return "mismatch";
      if (r.unmatched_a || r.unmatched_b) return "unmatched";
      return r.stats.approximate || r.tolerant_within ? "within" : "exact";
    case region_state::structural: return "structural";
    case region_state::not_comparable: return "not comparable";
    case region_state::unreadable: return "unreadable";
  }
  return "?";
}

std::string versions_text(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

void print_human(const diff_result& d) {
  const bool mo = d.mismatches_only;
  std::vector<std::string> headers = {"NAME", "VERSION", "REGION", "RANK", "STATE", "ELEMENTS"};
  if (mo) {
    headers.insert(headers.end(), {"WITHIN", "MISMATCH", "MISMATCH_MAX_ABS", "MISMATCH_MAX_REL"});
  } else {
    headers.insert(headers.end(), {"EXACT", "APPROX", "MISMATCH", "MAX_ABS", "MAX_REL"});
  }
  headers.push_back("FIRST_MISMATCH");
  std::vector<bool> right(headers.size(), false);
  right[1] = true;
  for (size_t i = 5; i + 1 < headers.size(); ++i) right[i] = true;
  table t(headers, right);
  std::vector<std::string> lines;  // problems, below the table
  for (auto& c : d.checkpoints) {
    for (auto& v : c.versions) {
      for (auto& r : v.regions) {
        const bool counted = r.state == region_state::compared;
        std::vector<std::string> row = {c.name, std::to_string(v.version), r.region,
                                        r.global ? "all" : r.rank < 0 ? "-" : std::to_string(r.rank), state_cell(r),
                                        counted ? std::to_string(r.elements()) : "-"};
        const compare_stats& s = r.stats;
        if (mo) {
          row.insert(row.end(), {counted ? std::to_string(r.within()) : "-",
                                 counted ? std::to_string(s.mismatch) : "-",
                                 counted ? err_text(s.mismatch_max_abs) : "-",
                                 counted ? err_text(s.mismatch_max_rel) : "-"});
        } else {
          row.insert(row.end(), {counted ? std::to_string(s.exact) : "-", counted ? std::to_string(s.approximate) : "-",
                                 counted ? std::to_string(s.mismatch) : "-", counted ? err_text(s.max_abs) : "-",
                                 counted ? err_text(s.max_rel) : "-"});
        }
        row.push_back(r.first ? where_text(*r.first) + ": " + r.first->a.to_string() + " vs " +
                                    r.first->b.to_string()
                              : "-");
        t.add(std::move(row));
        for (auto& p : r.problems) {
          lines.push_back(c.name + " version " + std::to_string(v.version) + " region '" + r.region + "'" +
                          (r.rank < 0 ? "" : " rank " + std::to_string(r.rank)) + ": " + p);
        }
      }
      for (auto& p : v.problems) lines.push_back(c.name + " version " + std::to_string(v.version) + ": " + p);
      for (auto& p : v.notes) lines.push_back(c.name + " version " + std::to_string(v.version) + ": note: " + p);
    }
    if (!c.in_a || !c.in_b) lines.push_back("checkpoint '" + c.name + "' only in run " + (c.in_a ? "A" : "B"));
    if (!c.only_a.empty()) lines.push_back(c.name + ": versions only in A: " + versions_text(c.only_a));
    if (!c.only_b.empty()) lines.push_back(c.name + ": versions only in B: " + versions_text(c.only_b));
    if (!c.uncommitted_a.empty())
      lines.push_back(c.name + ": uncommitted versions of A skipped: " + versions_text(c.uncommitted_a));
    if (!c.uncommitted_b.empty())
      lines.push_back(c.name + ": uncommitted versions of B skipped: " + versions_text(c.uncommitted_b));
  }
  std::printf("cairn diff %s: A = %s, B = %s (abs %g, rel %g, ulps %llu%s)\n", d.store.c_str(), d.run_a.c_str(),
              d.run_b.c_str(), d.tol.abs, d.tol.rel, static_cast<unsigned long long>(d.tol.ulps),
              mo ? ", mismatches only" : "");
  if (!t.empty()) t.print(stdout);
  for (auto& l : lines) std::printf("%s\n", l.c_str());
  for (auto& n : d.io.tree_notes) std::printf("tree not used: %s\n", n.c_str());
  if (mo) {
    if (d.tolerant.usable) {
      std::printf("tolerant leaves: used (equal quanta prove the tolerance)\n");
    } else {
      std::printf("tolerant leaves: not used: %s\n", d.tolerant.reason.c_str());
    }
  }

  std::string outcome = d.outcome();
  if (d.first) {
    const auto& f = *d.first;
    std::string at = "first divergence: " + f.name + " version " + std::to_string(f.version) + ", rank " +
                     std::to_string(f.rank) + (f.region.empty() ? "" : ", region '" + f.region + "'") + ": ";
    if (f.at) {
      at += where_text(*f.at) + ": A " + f.at->a.to_string() + ", B " + f.at->b.to_string();
      if (f.at->rank_a != f.at->rank_b) {
        at += " (held by rank " + std::to_string(f.at->rank_a) + " of A and rank " + std::to_string(f.at->rank_b) +
              " of B)";
      }
    } else {
      at += f.message;
    }
    std::printf("%s\n", at.c_str());
  } else if (outcome == "nothing_compared") {
    std::printf("nothing compared: no version is committed in both runs\n");
  } else if (outcome == "identical") {
    std::printf("runs are identical (%llu versions, %llu elements)\n",
                static_cast<unsigned long long>(d.versions_compared),
                static_cast<unsigned long long>(d.total.elements() + d.tolerant_within));
  } else if (mo) {
    std::printf("runs are equal within tolerance (%llu versions, %llu elements)\n",
                static_cast<unsigned long long>(d.versions_compared),
                static_cast<unsigned long long>(d.total.elements() + d.tolerant_within));
  } else {
    std::printf("runs are equal within tolerance (%llu versions, %llu elements, max abs error %s, max rel error %s)\n",
                static_cast<unsigned long long>(d.versions_compared),
                static_cast<unsigned long long>(d.total.elements() + d.tolerant_within),
                err_text(d.total.max_abs).c_str(), err_text(d.total.max_rel).c_str());
  }
  const auto& io = d.io;
  const uint64_t read = io.tree_bytes + io.data_bytes + io.metadata_bytes;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.3f %%",
                io.checkpoint_bytes ? 100.0 * static_cast<double>(read) / static_cast<double>(io.checkpoint_bytes)
                                    : 0.0);
  std::printf("read %s (trees %s, data %s of which local %s, metadata %s) = %s of %s of checkpoints; %s s\n",
              format_bytes(read).c_str(), format_bytes(io.tree_bytes).c_str(), format_bytes(io.data_bytes).c_str(),
              format_bytes(io.data_bytes_local).c_str(), format_bytes(io.metadata_bytes).c_str(), pct,
              format_bytes(io.checkpoint_bytes).c_str(), format_seconds(d.elapsed_s).c_str());
}

}  // namespace

int cmd_diff(const diff_options& o) {
  status st = check_store(o.store);
  if (st && !o.scratch_a.empty()) st = check_directory(o.scratch_a, "scratch directory");
  if (st && !o.scratch_b.empty()) st = check_directory(o.scratch_b, "scratch directory");
  if (!st) {
    print_error(st);
    return exit_code_for(st);
  }
  analytics::diff_options a;
  a.store = o.store;
  a.run_a = o.run_a;
  a.run_b = o.run_b;
  a.name = o.name;
  a.regions = o.regions;
  a.tol.abs = o.abs;
  a.tol.rel = o.rel;
  a.tol.ulps = o.ulps;
  a.mismatches_only = o.mismatches_only;
  a.scratch_a = o.scratch_a;
  a.scratch_b = o.scratch_b;
  auto r = analytics::diff_runs(a);
  if (!r) {
    print_error(r.error());
    return exit_code_for(r.error());
  }
  if (o.json) {
    print_json(result_json(*r));
  } else {
    print_human(*r);
  }
  const std::string outcome = r->outcome();
  return outcome == "identical" || outcome == "within_tolerance" ? kExitOk : kExitFailure;
}

}  // namespace cairn::cli

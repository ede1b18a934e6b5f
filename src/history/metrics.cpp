#include "history/metrics.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "cairn.h"

namespace cairn::metrics {
namespace {

// OpenMetrics label values escape backslash, double quote and newline.
std::string escape(const std::string& v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\') out += "\\\\";
    else if (ch == '"') out += "\\\"";
    else if (ch == '\n') out += "\\n";
    else out += ch;
  }
  return out;
}

std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

struct family {
  const char* name;  // without the _total of counter samples
  const char* type;  // counter or gauge
  const char* help;
};

}  // namespace

std::string to_openmetrics(const std::vector<rank_metrics>& ranks) {
  std::string out;
  auto head = [&](const family& f) {
    out += std::string("# TYPE ") + f.name + " " + f.type + "\n";
    out += std::string("# HELP ") + f.name + " " + f.help + "\n";
  };
  auto labels = [](const rank_metrics& r, const std::string& extra = "") {
    return "{run=\"" + escape(r.run) + "\",rank=\"" + std::to_string(r.rank) + "\"" + extra + "}";
  };
  auto sample = [&](const family& f, const std::string& l, const std::string& value) {
    out += std::string(f.name) + (std::string(f.type) == "counter" ? "_total" : "") + l + " " + value + "\n";
  };
  // Families present in every exposition (the textfile and cairn stats).
  const family checkpoints{"cairn_checkpoints", "counter", "Versions this rank captured in this execution."};
  const family versions{"cairn_level_versions", "counter", "Versions complete at the level on every rank."};
  const family bytes{"cairn_level_bytes", "counter", "Bytes of this rank's shards of the versions complete at the level."};
  const family errors{"cairn_level_errors", "counter", "Versions whose level failed."};
  const family stages{"cairn_stage_seconds", "counter", "Seconds this rank spent in a stage, summed over versions."};
  const family durable{"cairn_time_to_durable_seconds", "gauge",
                       "Newest committed version: from the earliest capture of any rank to its MANIFEST commit."};
  const family warnings{"cairn_warning_signals", "counter", "Warning signals (warning_signals) this process received."};
  const family staging{"cairn_staging_bytes", "gauge", "Staging memory this rank holds."};
  const family faults{"cairn_capture_write_faults", "counter",
                      "Writes of the application that waited for their block to be copied (capture = cow)."};
  const family cow_captures{"cairn_captures_copy_on_write", "counter",
                            "Checkpoints this rank captured copy-on-write (the others copied)."};

  if (std::any_of(ranks.begin(), ranks.end(), [](const rank_metrics& r) { return r.checkpoints > 0; }) ||
      std::any_of(ranks.begin(), ranks.end(), [](const rank_metrics& r) { return r.warning_signals.has_value(); })) {
    head(checkpoints);
    for (const auto& r : ranks) sample(checkpoints, labels(r), std::to_string(r.checkpoints));
  }
  const std::pair<const family*, std::function<uint64_t(const level_counters&)>> level_families[] = {
      {&versions, [](const level_counters& c) { return c.versions; }},
      {&bytes, [](const level_counters& c) { return c.bytes; }},
      {&errors, [](const level_counters& c) { return c.errors; }}};
  for (const auto& [f, get] : level_families) {
    head(*f);
    for (const auto& r : ranks)
      for (const char* level : kLevelNames) {
        auto it = r.levels.find(level);
        sample(*f, labels(r, std::string(",level=\"") + level + "\""),
               std::to_string(it == r.levels.end() ? 0 : get(it->second)));
      }
  }
  head(stages);
  for (const auto& r : ranks)
    for (const char* stage : kStageNames) {
      auto it = r.stage_seconds.find(stage);
      sample(stages, labels(r, std::string(",stage=\"") + stage + "\""), number(it == r.stage_seconds.end() ? 0 : it->second));
    }
  head(durable);
  for (const auto& r : ranks) sample(durable, labels(r), number(r.time_to_durable_s));
  if (std::any_of(ranks.begin(), ranks.end(), [](const rank_metrics& r) { return r.warning_signals.has_value(); })) {
    head(warnings);
    for (const auto& r : ranks) sample(warnings, labels(r), std::to_string(r.warning_signals.value_or(0)));
  }
  if (std::any_of(ranks.begin(), ranks.end(), [](const rank_metrics& r) { return r.staging_bytes.has_value(); })) {
    head(staging);
    for (const auto& r : ranks) sample(staging, labels(r), std::to_string(r.staging_bytes.value_or(0)));
  }
  if (std::any_of(ranks.begin(), ranks.end(), [](const rank_metrics& r) { return r.capture_write_faults.has_value(); })) {
    head(faults);
    for (const auto& r : ranks) sample(faults, labels(r), std::to_string(r.capture_write_faults.value_or(0)));
  }
  if (std::any_of(ranks.begin(), ranks.end(), [](const rank_metrics& r) { return r.cow_captures.has_value(); })) {
    head(cow_captures);
    for (const auto& r : ranks) sample(cow_captures, labels(r), std::to_string(r.cow_captures.value_or(0)));
  }
  out += "# EOF\n";
  return out;
}

std::string to_json(const std::vector<rank_metrics>& ranks) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : ranks) {
    nlohmann::json j;
    j["run"] = r.run;
    j["rank"] = r.rank;
    j["checkpoints"] = r.checkpoints;
    for (const char* level : kLevelNames) {
      auto it = r.levels.find(level);
      level_counters c = it == r.levels.end() ? level_counters{} : it->second;
      j["levels"][level] = {{"versions", c.versions}, {"bytes", c.bytes}, {"errors", c.errors}};
    }
    for (const char* stage : kStageNames) {
      auto it = r.stage_seconds.find(stage);
      j["stage_seconds"][stage] = it == r.stage_seconds.end() ? 0.0 : it->second;
    }
    j["time_to_durable_s"] = r.time_to_durable_s;
    if (r.warning_signals) j["warning_signals"] = *r.warning_signals;
    if (r.staging_bytes) j["staging_bytes"] = *r.staging_bytes;
    if (r.capture_write_faults) j["capture_write_faults"] = *r.capture_write_faults;
    if (r.cow_captures) j["cow_captures"] = *r.cow_captures;
    arr.push_back(std::move(j));
  }
  return arr.dump(1) + "\n";
}

result<std::vector<rank_metrics>> from_catalog(history::catalog& cat, const std::string& run) {
  CAIRN_ASSIGN_OR_RETURN(auto versions, cat.list_versions(run));
  if (versions.empty())
    return status(errc::not_found, "run '" + run + "' has no committed version in the catalog (see 'cairn ls'; "
                                   "'cairn reindex' rebuilds the catalog)");
  std::map<uint32_t, rank_metrics> by_rank;
  const history::version_row* newest = nullptr;
  double newest_first = 0;
  for (const auto& v : versions) {
    CAIRN_ASSIGN_OR_RETURN(auto shards, cat.list_shards(run, v.name, v.version));
    CAIRN_ASSIGN_OR_RETURN(auto events, cat.list_events(run, v.name, v.version));
    bool local = false;
    for (const auto& e : events) local = local || e.level == CAIRN_LEVEL_LOCAL;
    double first = v.committed_at;
    for (const auto& s : shards) {
      rank_metrics& r = by_rank[s.rank];
      r.run = run;
      r.rank = s.rank;
      auto& p = r.levels["persistent"];
      ++p.versions;
      p.bytes += s.size;
      if (local) {
        auto& l = r.levels["local"];
        ++l.versions;
        l.bytes += s.size;
      }
      r.stage_seconds["capture"] += s.capture_s;
      r.stage_seconds["checksum"] += s.checksum_s;
      r.stage_seconds["local"] += s.local_s;
      r.stage_seconds["persistent"] += s.persistent_s;
      first = std::min(first, s.captured_at);
    }
    if (!newest || v.committed_at > newest->committed_at) {
      newest = &v;
      newest_first = first;
    }
  }
  std::vector<rank_metrics> out;
  for (auto& [rank, r] : by_rank) {
    r.time_to_durable_s = newest->committed_at - newest_first;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace cairn::metrics

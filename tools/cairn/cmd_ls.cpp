// cairn ls: runs, checkpoints and versions, from the files.
#include <cstdio>

#include "commands.hpp"
#include "format/layout.hpp"
#include "format/run_info.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {

namespace {
// "newest N" or "all" from an execution's keep_persistent (0 = all).
std::string keep_text(const format::execution& e) {
  auto it = e.config.find("keep_persistent");
  if (it == e.config.end()) return "-";
  return it->second == "0" ? "all" : "newest " + it->second;
}
// The run's identity (RUN) as a row of the identities table and fields of
// its JSON. Optional: stores written before it have none.
void describe_identity(storage::storage_env* env, const std::string& store, const std::string& run, table* ids,
                       nlohmann::json* jrun) {
  if (auto info = format::read_run_info(env, store, run)) {
    const auto& last = info->executions.empty() ? format::execution{} : info->executions.back();
    std::string tags;
    for (auto& [k, v] : info->tags) tags += (tags.empty() ? "" : ",") + k + "=" + v;
    ids->add({run, info->application, info->code_version.empty() ? "-" : info->code_version,
              std::to_string(info->executions.size()), std::to_string(last.nranks),
              format_time(info->executions.empty() ? 0 : info->executions.front().started_at),
              last.ended_at > 0 ? format_time(last.ended_at) : "running or died", keep_text(last),
              tags.empty() ? "-" : tags});
    nlohmann::json ex = nlohmann::json::array();
    for (auto& e : info->executions)
      ex.push_back({{"started_at", e.started_at},
                    {"ended_at", e.ended_at > 0 ? nlohmann::json(e.ended_at) : nlohmann::json(nullptr)},
                    {"nranks", e.nranks},
                    {"hosts", e.hosts},
                    {"executable", e.executable},
                    {"code_version", e.code_version}});
    auto keep = last.config.find("keep_persistent");
    (*jrun)["keep_persistent"] = keep == last.config.end() ? nlohmann::json(nullptr) : nlohmann::json(keep->second);
    (*jrun)["identity"] = {{"application", info->application},
                           {"code_version", info->code_version},
                           {"tags", info->tags},
                           {"executions", ex}};
  } else if (info.error().code() != errc::not_found) {
    (*jrun)["identity_problem"] = info.error().message();
  }
}

}  // namespace

int cmd_ls(const ls_options& o) {
  status st = check_store(o.store);
  if (st && !o.scratch.empty()) st = check_directory(o.scratch, "scratch directory");
  if (!st) {
    print_error(st);
    return exit_code_for(st);
  }
  auto runs = select_runs(o.store, o.scratch, o.run);
  if (!runs) {
    print_error(runs.error());
    return exit_code_for(runs.error());
  }
  storage::storage_env* env = storage::storage_env::posix();
  nlohmann::json jruns = nlohmann::json::array();
  nlohmann::json jversions = nlohmann::json::array();
  // Rows of the versions table; its LAYOUT column is only shown when the store
  // has aggregated versions (docs/format/container.md).
  std::vector<std::vector<std::string>> rows;
  bool any_aggregated = false;
  // KEEP: the retention of the newest execution (its keep_persistent), so
  // that a store growing without bound, or one losing versions, says why.
  table ids({"RUN", "APPLICATION", "CODE_VERSION", "EXECUTIONS", "RANKS", "STARTED", "ENDED", "KEEP", "TAGS"},
            {false, false, false, true, true, false, false, false, false});
  for (const std::string& run : *runs) {
    std::vector<std::string> names = checkpoint_names(o.store, o.scratch, run);
    nlohmann::json jrun = {{"run", run}, {"checkpoints", names}};
    describe_identity(env, o.store, run, &ids, &jrun);
    jruns.push_back(std::move(jrun));
    if (names.empty()) rows.push_back({run, "-", "-", "empty", "-", "-", "-", "-", "-"});
    for (const std::string& name : names) {
      for (int64_t version : version_numbers(o.store, o.scratch, run, name)) {
        version_scan s = scan_version(env, o.store, run, name, version);
        std::optional<uint32_t> nranks = s.nranks;
        uint64_t bytes = s.bytes;
        bool local = false;
        if (!o.scratch.empty()) {
          version_scan l = scan_version(env, o.scratch, run, name, version);
          if (!nranks) nranks = l.nranks;
          if (s.state == version_state::absent) bytes = l.bytes;
          // Complete at the local level: every rank's shard file is there.
          if (nranks && *nranks > 0 && l.shard_ranks.size() >= *nranks) {
            local = true;
            for (uint32_t r = 0; r < *nranks; ++r) local = local && l.shard_ranks[r] == r;
          }
        }
        std::vector<std::string> levels;
        if (local) levels.push_back("local");
        if (s.state == version_state::committed) levels.push_back("persistent");
        std::string levels_text;
        for (auto& l : levels) levels_text += (levels_text.empty() ? "" : ",") + l;

        std::string ranks_text = nranks ? std::to_string(*nranks) : "?";
        std::string state_text;
        switch (s.state) {
          case version_state::committed: state_text = s.damaged ? "damaged" : "committed"; break;
          case version_state::incomplete:
            // An aggregated version's data files say nothing of the ranks until its MANIFEST is written.
            state_text = s.aggregated() ? "incomplete" : "incomplete " + std::to_string(s.shard_ranks.size()) +
                                                            "/" + ranks_text;
            break;
          case version_state::invalid: state_text = "invalid manifest"; break;
          case version_state::absent: state_text = "local only"; break;
        }
        double committed_at = s.manifest ? s.manifest->committed_at : 0;
        const bool aggregated = s.state != version_state::absent && s.aggregated();
        any_aggregated = any_aggregated || aggregated;
        std::string layout_text = "-";
        if (s.state != version_state::absent) layout_text = aggregated ? "aggregated" : "file-per-process";
        rows.push_back({run, name, std::to_string(version), state_text, layout_text, ranks_text, format_bytes(bytes),
                        levels_text.empty() ? "-" : levels_text, format_time(committed_at)});

        nlohmann::json jv = {{"run", run},
                             {"name", name},
                             {"version", version},
                             {"state", s.state == version_state::absent ? "local_only" : state_name(s.state)},
                             {"nranks", nranks ? nlohmann::json(*nranks) : nlohmann::json(nullptr)},
                             {"layout", s.state == version_state::absent ? nlohmann::json(nullptr)
                                                                          : nlohmann::json(layout_name(s))},
                             {"shards_present", s.shard_ranks.size()},
                             {"data_files_present", s.data_files.size()},
                             {"bytes", bytes},
                             {"levels", levels},
                             {"committed_at", s.manifest ? nlohmann::json(committed_at) : nlohmann::json(nullptr)}};
        jv["redundancy"] = redundancy_json(s.manifest ? s.manifest->redundancy : std::nullopt);
        if (s.state == version_state::invalid) jv["problem"] = s.manifest_error.message();
        jv["damaged"] = s.damaged ? nlohmann::json(*s.damaged) : nlohmann::json(nullptr);
        jversions.push_back(std::move(jv));
      }
    }
  }
  std::vector<std::string> headers = {"RUN", "NAME", "VERSION", "STATE", "LAYOUT", "RANKS", "BYTES", "LEVELS",
                                      "COMMITTED"};
  std::vector<bool> right = {false, false, true, false, false, true, true, false, false};
  if (!any_aggregated) {
    headers.erase(headers.begin() + 4);
    right.erase(right.begin() + 4);
    for (auto& r : rows) r.erase(r.begin() + 4);
  }
  table t(headers, right);
  for (auto& r : rows) t.add(std::move(r));
  if (o.json) {
    print_json({{"store", o.store}, {"runs", jruns}, {"versions", jversions}});
  } else if (t.empty()) {
    std::printf("no checkpoints in %s\n", o.store.c_str());
  } else {
    if (!ids.empty()) {
      ids.print(stdout);
      std::printf("\n");
    }
    t.print(stdout);
  }
  return kExitOk;
}

}  // namespace cairn::cli

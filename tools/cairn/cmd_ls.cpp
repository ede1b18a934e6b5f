// cairn ls: runs, checkpoints and versions, from the files.
#include <cstdio>

#include "commands.hpp"
#include "format/layout.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {

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
  table t({"RUN", "NAME", "VERSION", "STATE", "RANKS", "BYTES", "LEVELS", "COMMITTED"},
          {false, false, true, false, true, true, false, false});
  for (const std::string& run : *runs) {
    std::vector<std::string> names = checkpoint_names(o.store, o.scratch, run);
    jruns.push_back({{"run", run}, {"checkpoints", names}});
    if (names.empty()) t.add({run, "-", "-", "empty", "-", "-", "-", "-"});
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
          case version_state::committed: state_text = "committed"; break;
          case version_state::incomplete:
            state_text = "incomplete " + std::to_string(s.shard_ranks.size()) + "/" + ranks_text;
            break;
          case version_state::invalid: state_text = "invalid manifest"; break;
          case version_state::absent: state_text = "local only"; break;
        }
        double committed_at = s.manifest ? s.manifest->committed_at : 0;
        t.add({run, name, std::to_string(version), state_text, ranks_text, format_bytes(bytes),
               levels_text.empty() ? "-" : levels_text, format_time(committed_at)});

        nlohmann::json jv = {{"run", run},
                             {"name", name},
                             {"version", version},
                             {"state", s.state == version_state::absent ? "local_only" : state_name(s.state)},
                             {"nranks", nranks ? nlohmann::json(*nranks) : nlohmann::json(nullptr)},
                             {"shards_present", s.shard_ranks.size()},
                             {"bytes", bytes},
                             {"levels", levels},
                             {"committed_at", s.manifest ? nlohmann::json(committed_at) : nlohmann::json(nullptr)}};
        if (s.state == version_state::invalid) jv["problem"] = s.manifest_error.message();
        jversions.push_back(std::move(jv));
      }
    }
  }
  if (o.json) {
    print_json({{"store", o.store}, {"runs", jruns}, {"versions", jversions}});
  } else if (t.empty()) {
    std::printf("no checkpoints in %s\n", o.store.c_str());
  } else {
    t.print(stdout);
  }
  return kExitOk;
}

}  // namespace cairn::cli

// cairn restartable: which committed versions of a checkpoint a job of a given
// rank count can restore: as written (the same rank count) or redistributed by
// the regions' global layouts (docs/design/reshard.md), and why not otherwise.
// Decided from the MANIFESTs and shard headers; the data's checksums are
// checked by the restart itself (and by `cairn verify`).
#include <algorithm>
#include <cstdio>

#include "commands.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/reshard.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {

int cmd_restartable(const restartable_options& o) {
  if (status st = check_store(o.store); !st) {
    print_error(st);
    return exit_code_for(st);
  }
  auto runs = select_runs(o.store, "", o.run);
  if (!runs) {
    print_error(runs.error());
    return exit_code_for(runs.error());
  }
  storage::storage_env* env = storage::storage_env::posix();
  std::vector<std::string> holders;
  for (auto& r : *runs)
    if (env->exists(format::checkpoint_dir(o.store, r, o.name))) holders.push_back(r);
  if (holders.size() != 1) {
    status st = holders.empty() ? status(errc::not_found, "no checkpoint named '" + o.name + "' in " + o.store)
                                : status(errc::invalid_argument, "checkpoint '" + o.name +
                                                                     "' exists in several runs: choose one with --run");
    print_error(st);
    return exit_code_for(st);
  }
  const std::string run = holders.front();
  table t({"VERSION", "WRITTEN_BY", "RESTARTABLE", "WHY_NOT"}, {true, true, false, false});
  nlohmann::json versions = nlohmann::json::array();
  int usable = 0;
  auto versions_here = format::list_versions(env, o.store, run, o.name);
  for (auto v = versions_here.rbegin(); v != versions_here.rend(); ++v) {
    const std::string mpath = format::manifest_path(o.store, run, o.name, *v);
    if (!env->exists(mpath)) continue;  // not committed: never restored
    std::string how, why;
    uint32_t nranks = 0;
    auto m = format::read_manifest(env, mpath);
    if (!m) {
      how = "no";
      why = m.error().message();
    } else if (auto damaged = damaged_record(env, o.store, run, o.name, *v)) {
      nranks = m->nranks;
      how = "no";
      why = "a restart found every copy damaged: " + *damaged;
    } else {
      nranks = m->nranks;
      if (m->nranks == o.ranks) {
        how = "yes";
      } else {
        auto headers = format::read_version_headers(env, o.store, run, *m);
        auto plan = headers ? format::plan_regions(*headers, o.ranks,
                                                   "'" + o.name + "' version " + std::to_string(*v))
                            : result<std::map<std::string, format::reshard_region>>(headers.error());
        how = plan ? "redistributed" : "no";
        if (!plan) why = plan.error().message();
      }
    }
    usable += how != "no";
    t.add({std::to_string(*v), nranks ? std::to_string(nranks) : "-", how, why.empty() ? "-" : why});
    versions.push_back({{"version", *v}, {"written_by", nranks}, {"restartable", how != "no"},
                        {"redistributed", how == "redistributed"}, {"why_not", why}});
  }
  if (o.json) {
    print_json({{"run", run}, {"name", o.name}, {"ranks", o.ranks}, {"versions", versions}});
  } else {
    std::printf("%s/%s on %u ranks:\n", run.c_str(), o.name.c_str(), o.ranks);
    if (t.empty()) std::printf("no committed version\n");
    else t.print(stdout);
  }
  return usable > 0 ? kExitOk : kExitFailure;
}

}  // namespace cairn::cli

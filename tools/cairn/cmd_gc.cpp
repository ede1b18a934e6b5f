// cairn gc: retention at the persistent level, run by hand.
//
// Per (run, name): the newest --keep committed versions stay; older committed
// versions go, and so do version directories without a valid MANIFEST that are
// older than the newest committed version (debris of crashed runs). Versions
// newer than the newest committed one are never touched: a job may be
// writing them. Deleting removes the MANIFEST first (and syncs the directory),
// so a crash half-way leaves an uncommitted directory, never a committed
// version with missing shards.
#include <cstdio>

#include "commands.hpp"
#include "format/commit.hpp"
#include "format/layout.hpp"
#include "history/catalog.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {
namespace {

struct deletion {
  std::string run;
  std::string name;
  int64_t version = 0;
  std::string state;
  std::string path;
  uint64_t bytes = 0;
};

uint64_t dir_bytes(storage::storage_env* env, const std::string& dir) {
  uint64_t n = 0;
  auto names = env->list(dir);
  if (names)
    for (auto& f : *names) n += file_size_of(storage::join(dir, f));
  return n;
}

// What gc did (or, with --dry-run, would do) to the store's persistent level.
struct gc_result {
  int rc = kExitOk;
  std::vector<deletion> deleted;
  std::vector<std::string> removed_tmp;
  nlohmann::json kept = nlohmann::json::array();
  nlohmann::json left = nlohmann::json::array();
};

// One checkpoint of a run: every committed version but the newest o.keep
// goes, with every uncommitted one older than the newest committed (newer
// ones may still be written); temporaries in kept versions go too.
void gc_checkpoint(const gc_options& o, storage::storage_env* env, const std::string& run, const std::string& name,
                   gc_result* r) {
  const char* verb = o.dry_run ? "would delete" : "deleted";
  const char* verb_tmp = o.dry_run ? "would remove" : "removed";
  std::vector<std::pair<int64_t, version_scan>> scans;
  std::vector<int64_t> committed;
  for (int64_t v : version_numbers(o.store, "", run, name)) {
    scans.emplace_back(v, scan_version(env, o.store, run, name, v));
    if (scans.back().second.state == version_state::committed) committed.push_back(v);
  }
  const int64_t newest_committed = committed.empty() ? INT64_MIN : committed.back();
  const int64_t oldest_kept =
      committed.size() > static_cast<size_t>(o.keep) ? committed[committed.size() - o.keep] : INT64_MIN;
  for (auto& [v, s] : scans) {
    bool remove = false;
    if (s.state == version_state::committed) {
      remove = v < oldest_kept;
    } else if (v < newest_committed) {
      if (s.state == version_state::invalid && s.manifest_error.code() != errc::corruption) {
        // Unreadable for another reason (permissions, I/O): not ours to judge.
        print_warning("left " + s.dir + " alone: " + s.manifest_error.message());
        r->rc = kExitFailure;
        continue;
      }
      remove = true;
    } else {
      r->left.push_back({{"run", run}, {"name", name}, {"version", v}, {"state", state_name(s.state)}});
      continue;
    }
    if (!remove) {
      r->kept.push_back({{"run", run}, {"name", name}, {"version", v}});
      // A committed version is never written again: temporaries in it are debris.
      for (const std::string& tmp : s.tmp_files) {
        const std::string path = storage::join(s.dir, tmp);
        if (!o.dry_run) {
          if (status st = env->remove_file(path); !st) {
            print_error(st);
            r->rc = kExitFailure;
            continue;
          }
        }
        r->removed_tmp.push_back(path);
        if (!o.json) std::printf("%s %s\n", verb_tmp, path.c_str());
      }
      continue;
    }
    deletion d{run, name, v, state_name(s.state), s.dir, dir_bytes(env, s.dir)};
    if (!o.dry_run) {
      if (status st = format::remove_version(env, s.dir); !st) {
        print_error(st.with_context("deleting " + s.dir));
        r->rc = kExitFailure;
        continue;
      }
    }
    if (!o.json) {
      std::printf("%s %s/%s version %lld (%s, %s)\n", verb, run.c_str(), name.c_str(), static_cast<long long>(v),
                  d.state.c_str(), format_bytes(d.bytes).c_str());
    }
    r->deleted.push_back(std::move(d));
  }
}

}  // namespace

int cmd_gc(const gc_options& o) {
  if (status st = check_store(o.store); !st) {
    print_error(st);
    return exit_code_for(st);
  }
  if (o.keep < 1 && o.scratch.empty()) {
    status st(errc::invalid_argument,
              "give --keep N (the persistent level: all but the newest N committed versions go) and/or --scratch "
              "(a node-local directory: what runs that are not running left there)");
    print_error(st);
    return kExitUsage;
  }
  if (o.keep >= 1 && !o.scratch.empty() && o.json) {
    status st(errc::invalid_argument, "--json with both --keep and --scratch: run them as two commands (one JSON "
                                      "document each)");
    print_error(st);
    return kExitUsage;
  }
  if (o.keep < 1) return cmd_gc_scratch(o);
  auto runs = select_runs(o.store, "", o.run);
  if (!runs) {
    print_error(runs.error());
    return exit_code_for(runs.error());
  }
  storage::storage_env* env = storage::storage_env::posix();
  const char* verb = o.dry_run ? "would delete" : "deleted";
  gc_result r;
  for (const std::string& run : *runs)
    for (const std::string& name : checkpoint_names(o.store, "", run)) gc_checkpoint(o, env, run, name, &r);
  int rc = r.rc;
  std::vector<deletion>& deleted = r.deleted;
  const std::vector<std::string>& removed_tmp = r.removed_tmp;
  const nlohmann::json& kept = r.kept;
  const nlohmann::json& left = r.left;

  // The catalog follows the files; it is only updated if the store has one.
  bool catalog_updated = false;
  if (!o.dry_run && !deleted.empty() && env->exists(storage::join(o.store, format::kCatalogName))) {
    auto cat = history::catalog::open(o.store);
    status st = cat ? status() : cat.error();
    for (size_t i = 0; st && i < deleted.size(); ++i)
      st = (*cat)->remove_version(deleted[i].run, deleted[i].name, deleted[i].version);
    if (st) {
      catalog_updated = true;
    } else {
      print_warning("catalog not updated (" + st.message() + "); run `cairn reindex " + o.store + "`");
      rc = kExitFailure;
    }
  }

  uint64_t bytes = 0;
  for (auto& d : deleted) bytes += d.bytes;
  if (o.json) {
    nlohmann::json jd = nlohmann::json::array();
    for (auto& d : deleted) {
      jd.push_back({{"run", d.run},
                    {"name", d.name},
                    {"version", d.version},
                    {"state", d.state},
                    {"path", d.path},
                    {"bytes", d.bytes}});
    }
    print_json({{"store", o.store},
                {"keep", o.keep},
                {"dry_run", o.dry_run},
                {"deleted", jd},
                {"removed_tmp", removed_tmp},
                {"kept", kept},
                {"left_alone", left},
                {"bytes", bytes},
                {"catalog_updated", catalog_updated}});
  } else {
    std::printf("gc%s: %s %zu version%s (%s) and %zu temporary file%s; kept %zu committed; left %zu newer "
                "uncommitted alone\n",
                o.dry_run ? " (dry run)" : "", verb, deleted.size(), deleted.size() == 1 ? "" : "s",
                format_bytes(bytes).c_str(), removed_tmp.size(), removed_tmp.size() == 1 ? "" : "s", kept.size(),
                left.size());
  }
  if (!o.scratch.empty()) {
    const int scratch_rc = cmd_gc_scratch(o);
    if (rc == kExitOk) rc = scratch_rc;
  }
  return rc;
}

}  // namespace cairn::cli

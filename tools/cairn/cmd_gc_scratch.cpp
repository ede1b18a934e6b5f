// cairn gc --scratch: what runs that did not finish normally left in a
// node-local directory (docs/design/run-identity.md, "Node-local leftovers").
//
// A run that finalizes normally gives its node-local level back itself
// (keep_local_after_finalize). A killed one leaves its versions, recycled
// files and routed files behind, in memory when the directory is /dev/shm.
// For each run there, judged against the store that holds it:
// - a run whose lease is live (an execution writes it) is left alone;
// - a run the store does not know (no RUN file), or versions written by
//   executions its RUN does not list (another store's run of the same name
//   sharing the directory), are left alone: not this store's to judge;
// - versions committed at the persistent level go (the store has them), and
//   so do uncommitted ones older than a committed one (never restored);
// - newer versions that are not committed are the only copy of that state,
//   which a restart restores: they stay unless --uncommitted is given;
// - recycled files and file-mode routed files of the run's executions go.
// Run it on each node (its node-local directory), for example with srun.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <set>

#include "client/run_lease.hpp"
#include "commands.hpp"
#include "format/layout.hpp"
#include "format/run_info.hpp"
#include "format/shard.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {
namespace {

struct entry {
  std::string run;
  std::string name;   // empty for a run-wide entry
  int64_t version = -1;
  std::string path;
  std::string why;
  uint64_t bytes = 0;
  nlohmann::json to_json() const {
    nlohmann::json j = {{"run", run}, {"path", path}, {"reason", why}, {"bytes", bytes}};
    if (!name.empty()) j["name"] = name;
    if (version >= 0) j["version"] = version;
    return j;
  }
};

uint64_t tree_bytes(storage::storage_env* env, const std::string& dir) {
  uint64_t n = 0;
  auto names = env->list(dir);
  if (!names) return 0;
  for (const auto& f : *names) {
    const std::string p = storage::join(dir, f);
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) continue;
    n += S_ISDIR(st.st_mode) ? tree_bytes(env, p) : static_cast<uint64_t>(st.st_size);
  }
  return n;
}

bool is_shard_file(const std::string& f) { return f.rfind("shard.", 0) == 0 && f.find(".tmp") == std::string::npos; }

class scratch_gc {
 public:
  explicit scratch_gc(const gc_options& o) : o_(o), env_(storage::storage_env::posix()) {}

  int run() {
    if (!env_->exists(o_.scratch)) {
      status st(errc::not_found, "node-local directory " + o_.scratch + " does not exist");
      print_error(st);
      return exit_code_for(st);
    }
    std::set<std::string> names;
    for (const auto& r : format::list_subdirs(env_, format::runs_dir(o_.scratch))) names.insert(r);
    for (const char* kind : {"recycle", "files"})
      for (const auto& r : format::list_subdirs(env_, storage::join(o_.scratch, kind))) names.insert(r);
    for (const auto& r : names)
      if (o_.run.empty() || r == o_.run) one_run(r);
    report();
    return rc_;
  }

 private:
  void remove(entry e) {
    e.bytes = tree_bytes(env_, e.path);
    if (!o_.dry_run) {
      if (status st = env_->remove_tree(e.path); !st) {
        print_error(st.with_context("removing " + e.path));
        rc_ = kExitFailure;
        return;
      }
    }
    if (!o_.json) {
      std::printf("%s %s (%s): %s\n", o_.dry_run ? "would remove" : "removed", e.path.c_str(),
                  format_bytes(e.bytes).c_str(), e.why.c_str());
    }
    removed_.push_back(std::move(e));
  }

  void keep(entry e, std::vector<entry>* where) {
    e.bytes = tree_bytes(env_, e.path);
    if (!o_.json) std::printf("kept %s (%s): %s\n", e.path.c_str(), format_bytes(e.bytes).c_str(), e.why.c_str());
    where->push_back(std::move(e));
  }

  void one_run(const std::string& run) {
    const std::string run_dir = storage::join(format::runs_dir(o_.scratch), run);
    auto lease = probe_lease(o_.store, run, o_.lease_timeout);
    if (!lease) {
      keep({run, "", -1, run_dir, "its lease cannot be read: " + lease.error().message()}, &left_);
      rc_ = kExitFailure;
      return;
    }
    if (lease->state == lease_state::live) {
      keep({run, "", -1, run_dir, "being written by " + lease->holder.describe()}, &left_);
      return;
    }
    auto info = format::read_run_info(env_, o_.store, run);
    if (!info) {
      keep({run, "", -1, run_dir,
            info.error().code() == errc::not_found
                ? "not a run of " + o_.store + " (no RUN file there): another store's, or written before RUN existed"
                : "its RUN file cannot be read: " + info.error().message()},
           &left_);
      return;
    }
    std::set<uint32_t> attempts;
    for (const auto& x : info->executions) attempts.insert(x.attempt);
    for (const auto& name : format::list_subdirs(env_, run_dir)) {
      // The newest version the store committed: an uncommitted node-local
      // version older than it is never restored.
      int64_t newest_committed = INT64_MIN;
      const auto committed = format::list_versions(env_, o_.store, run, name);
      for (auto v = committed.rbegin(); v != committed.rend(); ++v) {
        if (scan_version(env_, o_.store, run, name, *v).state == version_state::committed) {
          newest_committed = *v;
          break;
        }
      }
      for (int64_t v : format::list_versions(env_, o_.scratch, run, name))
        one_version(run, name, v, attempts, newest_committed);
      if (!o_.dry_run) (void)env_->remove_dir(format::checkpoint_dir(o_.scratch, run, name));
    }
    if (!o_.dry_run) (void)env_->remove_dir(run_dir);
    // Recycled files hold no state: the engine overwrites them in place.
    const std::string bin = storage::join(storage::join(o_.scratch, "recycle"), run);
    if (env_->exists(bin)) remove({run, "", -1, bin, "recycled node-local files of a run that is not running"});
    // File-mode routed files, one directory per execution (its attempt).
    const std::string files = storage::join(storage::join(o_.scratch, "files"), run);
    for (const auto& a : format::list_subdirs(env_, files)) {
      const uint32_t attempt = static_cast<uint32_t>(std::strtoul(a.c_str(), nullptr, 16));
      entry e{run, "", -1, storage::join(files, a), ""};
      if (attempts.count(attempt) != 0 && a.size() == 8) {
        e.why = "routed files of an execution that ended";
        remove(std::move(e));
      } else {
        e.why = "routed files of an execution " + o_.store + "'s RUN does not list";
        keep(std::move(e), &left_);
      }
    }
    if (!o_.dry_run) (void)env_->remove_dir(files);
  }

  void one_version(const std::string& run, const std::string& name, int64_t v, const std::set<uint32_t>& attempts,
                   int64_t newest_committed) {
    entry e{run, name, v, format::version_dir(o_.scratch, run, name, v), ""};
    auto files = env_->list(e.path);
    bool shards = false, foreign = false;
    if (files) {
      for (const auto& f : *files) {
        if (!is_shard_file(f)) continue;
        shards = true;
        auto h = format::read_header(env_, storage::join(e.path, f));
        // An unreadable shard is debris of this run only when the store knows
        // the version; its attempt cannot be told.
        if (h && h->attempt != 0 && attempts.count(h->attempt) == 0) foreign = true;
      }
    }
    if (foreign) {
      e.why = "written by an execution " + o_.store + "'s RUN does not list (another store's run of this name)";
      keep(std::move(e), &left_);
      return;
    }
    if (!shards) {
      e.why = "no shard (debris of an interrupted write)";
      remove(std::move(e));
      return;
    }
    const version_scan s = scan_version(env_, o_.store, run, name, v);
    if (s.state == version_state::committed) {
      e.why = "committed at the persistent level";
      remove(std::move(e));
    } else if (v < newest_committed) {
      e.why = "not committed, and older than committed version " + std::to_string(newest_committed) +
              " (a restart takes the newer one)";
      remove(std::move(e));
    } else if (o_.uncommitted) {
      e.why = "not committed at the persistent level (--uncommitted)";
      remove(std::move(e));
    } else {
      e.why = "not committed at the persistent level: the only copy, which a restart restores (--uncommitted "
              "removes it)";
      keep(std::move(e), &kept_);
    }
  }

  void report() {
    uint64_t bytes = 0;
    for (const auto& e : removed_) bytes += e.bytes;
    if (o_.json) {
      auto list = [](const std::vector<entry>& v) {
        nlohmann::json a = nlohmann::json::array();
        for (const auto& e : v) a.push_back(e.to_json());
        return a;
      };
      print_json({{"store", o_.store},
                  {"scratch", o_.scratch},
                  {"dry_run", o_.dry_run},
                  {"removed", list(removed_)},
                  {"kept_uncommitted", list(kept_)},
                  {"left_alone", list(left_)},
                  {"bytes", bytes}});
      return;
    }
    std::printf("gc --scratch%s: %s %zu item%s (%s); kept %zu uncommitted version%s; left %zu alone\n",
                o_.dry_run ? " (dry run)" : "", o_.dry_run ? "would remove" : "removed", removed_.size(),
                removed_.size() == 1 ? "" : "s", format_bytes(bytes).c_str(), kept_.size(),
                kept_.size() == 1 ? "" : "s", left_.size());
  }

  const gc_options& o_;
  storage::storage_env* env_;
  int rc_ = kExitOk;
  std::vector<entry> removed_, kept_, left_;
};

}  // namespace

int cmd_gc_scratch(const gc_options& o) { return scratch_gc(o).run(); }

}  // namespace cairn::cli

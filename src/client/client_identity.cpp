// The run identity of client_impl (docs/design/run-identity.md): the run's
// lease (one writing execution at a time), RUN with this execution's record
// (written by rank 0 under the lease), tags and code version, the data
// planes' job key, and the committed floor: the newest version earlier
// executions committed, which no checkpoint of this one may replace.
#include "client/client.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "client/batch_job.hpp"
#include "client/run_lease.hpp"
#ifdef CAIRN_HAVE_FABRIC
#include "fabric/mailbox.hpp"
#endif
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/run_info.hpp"
#include "util/contain.hpp"
#include "util/names.hpp"
#include "util/clock.hpp"
#include "util/mutex.hpp"

namespace cairn {

status client_impl::take_lease() {
  if (rank() != 0) return {};
  auto l = run_lease::acquire(cfg_.persistent, cfg_.run, cfg_.lease_timeout);
  if (l) {
    lease_ = std::move(l).value();
    return {};
  }
  status st = l.take_status();
  if (st.code() == errc::busy) return st;
  if (st.code() == errc::no_space) {
    std::fprintf(stderr, "cairn: warning: run '%s' goes without a lease (%s)\n", cfg_.run.c_str(),
                 st.message().c_str());
    return {};
  }
  return store_unwritable(st);
}

status client_impl::store_unwritable(const status& st) const {
  return st.with_context("the persistent level (CAIRN_PERSISTENT=" + cfg_.persistent +
                         ") cannot be written, so no checkpoint could be saved; give a writable directory");
}

status client_impl::start_run_identity() {
  char host[128] = {0};
  std::snprintf(host, 64, "%s", host_.c_str());
  std::snprintf(host + 64, 64, "%s", node_.c_str());
  std::vector<std::byte> all;
  comm_->gather(std::as_bytes(std::span<const char>(host, sizeof host)), &all);
  if (rank() != 0) return {};
  auto prev = format::read_run_info(env_, cfg_.persistent, cfg_.run);
  if (prev) {
    run_info_ = std::move(prev).value();
  } else if (prev.error().code() != errc::not_found) {
    // A damaged RUN file only loses the identity of earlier executions: say so, start afresh.
    std::fprintf(stderr, "cairn: warning: %s; starting a new run identity\n", prev.error().message().c_str());
  }
  run_info_.run = cfg_.run;
  run_info_.application = cfg_.application;
  if (!cfg_.code_version.empty()) run_info_.code_version = cfg_.code_version;
  std::stringstream ss(cfg_.tags);
  std::string kv;
  while (std::getline(ss, kv, ',')) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) run_info_.tags[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  format::execution e;
  e.started_at = util::wall_s();
  e.nranks = static_cast<uint32_t>(size());
  std::set<std::string> hosts, nodes;
  for (int r = 0; r < size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data()) + r * 128;
    hosts.insert(std::string(p, strnlen(p, 63)));
    nodes.insert(std::string(p + 64, strnlen(p + 64, 63)));
  }
  e.hosts.assign(hosts.begin(), hosts.end());
  e.nodes.assign(nodes.begin(), nodes.end());
  e.job = batch::job_id();
  e.executable = program_invocation_short_name ? program_invocation_short_name : "";
  e.code_version = cfg_.code_version;
  e.config = cfg_.values();
  e.attempt = attempt_;
  run_info_.executions.push_back(std::move(e));
  return write_run_identity(true);
}

status client_impl::write_run_identity(bool at_init) {
  if (rank() != 0) return {};
  status st = env_->make_dirs(storage::join(format::runs_dir(cfg_.persistent), cfg_.run));
  if (st) st = env_->write_atomic(format::run_file_path(cfg_.persistent, cfg_.run), format::encode_run_info(run_info_), true);
  if (!st && at_init && st.code() != errc::no_space) {
    // The first write of this execution to the store after the lease: a
    // store that cannot be written (read-only, no permission) would lose
    // every checkpoint.
    return store_unwritable(st);
  }
  if (!st) {
    // The identity is a record, not state: a store that cannot take it (full,
    // read-only) must still restart. Say so and go on.
    std::fprintf(stderr, "cairn: warning: run identity not recorded: %s\n", st.message().c_str());
    return {};
  }
  cairn::lock_guard lk(catalog_mu_);
  if (catalog_) {
    status cs = catalog_->index_run(env_, cfg_.run);
    if (!cs)
      std::fprintf(stderr, "cairn: warning: catalog not updated (%s); run 'cairn reindex %s'\n", cs.to_string().c_str(),
                   cfg_.persistent.c_str());
  }
  return {};
}

status client_impl::set_code_version(const std::string& v) {
  CAIRN_RETURN_IF_ERROR(util::check_text("code version", v));
  if (rank() != 0) return {};
  run_info_.code_version = v;
  if (!run_info_.executions.empty()) run_info_.executions.back().code_version = v;
  return write_run_identity();
}

status client_impl::tag(const std::string& key, const std::string& value) {
  CAIRN_RETURN_IF_ERROR(util::check_name("tag key", key));
  if (key.find_first_of("=,") != std::string::npos)
    return {errc::invalid_argument, "tag key '" + util::escaped(key) + "' must not contain '=' or ','"};
  CAIRN_RETURN_IF_ERROR(util::check_text("tag value", value));
  if (rank() != 0) return {};
  run_info_.tags[key] = value;
  return write_run_identity();
}

#ifdef CAIRN_HAVE_FABRIC
result<std::string> client_impl::plane_key() {
  if (!plane_key_.empty()) return plane_key_;
  std::string key;
  status st;
  if (rank() == 0) {
    auto k = fabric::new_plane_key();
    if (k) key = std::move(k).value();
    else st = k.take_status();
  }
  CAIRN_RETURN_IF_ERROR(agree(st));
  comm_->broadcast(&key, 0);
  plane_key_ = key;
  return key;
}
#else
result<std::string> client_impl::plane_key() {
  return status(errc::not_supported, "this build of cairn has no data plane (libfabric)");
}
#endif

uint32_t client_impl::node_count() const {
  return run_info_.executions.empty() ? 1 : static_cast<uint32_t>(run_info_.executions.back().hosts.size());
}

result<int64_t> client_impl::committed_newest(const std::string& name) {
  CAIRN_RETURN_IF_ERROR(util::check_name("checkpoint", name));
  return floor_of(name).version;
}

const client_impl::committed_floor& client_impl::floor_of(const std::string& name) {
  if (auto it = floors_.find(name); it != floors_.end()) return it->second;
  committed_floor f;
  std::string what;
  // The persistent level: the newest version with a MANIFEST, whoever wrote
  // it. Only committed versions count: what a killed execution left at the
  // node-local level alone (of any rank count) was never committed, and a
  // relaunch that restored an older version writes over it.
  if (rank() == 0) {
    auto vs = format::list_versions(env_, cfg_.persistent, cfg_.run, name);
    const auto& damaged = damaged_[name];
    for (auto v = vs.rbegin(); v != vs.rend(); ++v) {
      std::string mp = format::manifest_path(cfg_.persistent, cfg_.run, name, *v);
      if (damaged.count(*v) || !env_->exists(mp)) continue;
      f.version = *v;
      auto m = format::read_manifest(env_, mp);
      what = "version " + std::to_string(*v) + " committed" +
             (m ? " by " + std::to_string(m->nranks) + " rank(s)" : std::string(" (its MANIFEST is unreadable)"));
      break;
    }
  }
  const int64_t newest = -comm_->min(-f.version);
  const int64_t root = comm_->min(f.version == newest ? rank() : INT64_MAX);
  comm_->broadcast(&what, static_cast<int>(root));
  f.version = newest;
  // What the levels that commit themselves hold (agent memory).
  for (const auto& l : levels_) f.version = l->committed_floor(name, f.version, &what);
  if (f.version >= 0) f.what = what + " from an earlier execution";
  return floors_.emplace(name, std::move(f)).first->second;
}

status client_impl::check_committed_floor(const std::string& name, int64_t version) {
  // Committed data is never replaced: versions grow across the executions of
  // a run, so an execution that starts over (a relaunch on another rank count,
  // an application that starts fresh on any restart error) cannot overwrite
  // what an earlier one committed.
  const committed_floor& floor = floor_of(name);
  if (version > floor.version && damaged_[name].count(version)) {
    // A committed version that restart found damaged on every level is
    // withdrawn (its MANIFEST first) before any rank replaces its shards.
    status w;
    std::string mp = format::manifest_path(cfg_.persistent, cfg_.run, name, version);
    if (rank() == 0 && env_->exists(mp)) {
      std::fprintf(stderr, "cairn: warning: '%s' version %lld was committed but is damaged on every level; "
                           "replacing it\n", name.c_str(), static_cast<long long>(version));
      w = env_->remove_file(mp);
      const std::string marker = format::damaged_path(cfg_.persistent, cfg_.run, name, version);
      if (w && env_->exists(marker)) w = env_->remove_file(marker);
      if (w) w = env_->sync_dir(storage::dirname_of(mp));
    }
    CAIRN_RETURN_IF_ERROR(agree(w));
    damaged_[name].erase(version);
  }
  if (version <= floor.version) {
    return {errc::exists,
            "checkpoint '" + name + "' version " + std::to_string(version) + ": run '" + cfg_.run + "' already has " +
                floor.what + "; a committed version is never replaced. Restart from it (cairn_restart_test), "
                "continue with versions above " + std::to_string(floor.version) +
                ", use another run (CAIRN_RUN), or remove old versions with 'cairn gc'"};
  }
  return {};
}

}  // namespace cairn

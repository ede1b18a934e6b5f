// The commit of client_impl: a version's MANIFEST once every rank's shard is
// durable (rank 0, an engine task), the catalog's records of it, the
// retention of the node-local and persistent levels (keep_local,
// keep_persistent, the levels' own floors) and the node-local versions
// dropped at finalize. Only rank 0 writes the persistent level's MANIFEST
// and catalog; every rank retires its own node-local shards.
#include "client/client.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/commit.hpp"
#include "util/contain.hpp"
#include "util/names.hpp"
#include "format/tree.hpp"
#include "redundancy/parity_file.hpp"
#include "util/clock.hpp"
#include "util/mutex.hpp"

namespace cairn {

void client_impl::index_committed(const std::string& name, int64_t version) {
  cairn::lock_guard lk(catalog_mu_);
  if (!catalog_) return;
  status st = catalog_->index_version(env_, cfg_.run, name, version);
  if (!st) std::fprintf(stderr, "cairn: warning: catalog: %s\n", st.message().c_str());
}

std::vector<std::pair<std::string, int64_t>> client_impl::tracked_versions() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [key, rec] : records_) out.push_back(key);
  return out;
}

void client_impl::on_durable(version_record& rec) {
  rec.shards_durable = true;
  // Every rank's shard is durable: gather their manifest entries (as the
  // commit stage records them), rank 0 commits.
  const auto& job = *rec.job;
  // Without a commit stage the version is durable before every stage ended:
  // the node-local one may still be running beside the persistent one (the
  // node daemon's), and its time is read only once it is over.
  unsigned done = 0, failed = 0;
  bool finished = false;
  engine_->levels(job, &done, &failed, &finished);
  format::part_record mine;
  mine.entry = engine::shard_entry_of(job, host_, finished || ((done | failed) & CAIRN_LEVEL_LOCAL) != 0);
  mine.aggregated = job.plan != nullptr;
  std::vector<std::string> parts;
  comm_->gather_strings(format::encode_part(mine), &parts);
  rec.manifest_state = std::make_shared<std::atomic<int>>(0);
  rec.manifest_error = std::make_shared<status>();
  if (rank() != 0) return;

  format::manifest m = describe_version(job);
  for (int r = 0; r < size(); ++r) {
    auto p = format::decode_part(parts[static_cast<size_t>(r)], "rank " + std::to_string(r) + "'s manifest entry");
    if (!p) {  // cannot happen short of memory corruption: the commit fails, said so
      *rec.manifest_error = p.error();
      rec.manifest_state->store(-1);
      return;
    }
    m.shards.push_back(std::move(p->entry));
  }
  // The time only when it is known now: the manifest is never rewritten.
  if (m.redundancy && (rec.global_done & CAIRN_LEVEL_PROTECTED)) m.redundancy->protected_at = rec.protected_at;
  auto state = rec.manifest_state;
  auto err = rec.manifest_error;
  double local_at = rec.local_done_at;
  // Usually the last rank's commit stage has committed the version already;
  // this commit stands in where it could not (write_commit leaves a MANIFEST
  // with exactly these shards as it is).
  engine_->submit_task([this, m = std::move(m), state, err, local_at]() mutable -> status {
    m.committed_at = util::wall_s();
    status st = util::contained("committing the manifest", [&] {
      auto at = format::write_commit(env_, cfg_.persistent, m);
      if (at) m.committed_at = *at;  // the last writer's, when it committed first
      return at.take_status();
    });
    if (!st) {
      *err = st;
      state->store(-1);
      return st.with_context("committing the manifest");
    }
    state->store(1);
    double first = m.committed_at;
    for (const auto& sh : m.shards) first = std::min(first, sh.captured_at);
    durable_s_->store(m.committed_at - first);
    // The catalog follows the commit when nothing more urgent is ready (the
    // manifest is the truth; `cairn reindex` rebuilds the catalog from it).
    engine_->submit_task(
        [this, run = m.run, name = m.name, version = m.version, local_at]() -> status {
          cairn::lock_guard lk(catalog_mu_);
          if (!catalog_) return {};
          status cs = catalog_->index_version(env_, run, name, version);
          // The persistent event comes from the manifest; the local one only exists here.
          if (cs && local_at > 0) cs = catalog_->record_level(run, name, version, CAIRN_LEVEL_LOCAL, local_at, 0);
          // Retention may have removed the version (keep_persistent) before
          // this task ran: nothing to index, nothing to say.
          if (!cs && cs.code() == errc::not_found &&
              !env_->exists(format::manifest_path(cfg_.persistent, run, name, version)))
            return {};
          if (!cs)
            std::fprintf(stderr, "cairn: warning: catalog not updated (%s); run 'cairn reindex %s'\n",
                         cs.to_string().c_str(), cfg_.persistent.c_str());
          return {};
        },
        engine::task_priority::low);
    return {};
  });
}

format::manifest client_impl::describe_version(const engine::version_job& job) const {
  format::manifest m;
  m.run = cfg_.run;
  m.name = job.header.name;
  m.version = job.header.version;
  m.nranks = static_cast<uint32_t>(size());
  m.executable = program_invocation_short_name ? program_invocation_short_name : "";
  if (!util::valid_utf8(m.executable)) m.executable = util::escaped(m.executable);
  m.mode = cfg_.mode == engine_mode::sync ? "sync" : "thread";
  // The scheme this version was encoded with, whether or not its sets are
  // complete yet (the levels are agreed independently).
  for (const auto& l : levels_) l->describe(job, &m);
  return m;
}

void client_impl::on_level_complete(version_record& rec, unsigned level) {
  rec.global_done |= level;
  count_level(rec, level, false);
  for (const auto& l : levels_) l->on_level_complete(rec, level);
  if (level == CAIRN_LEVEL_PROTECTED) {
    // A level may keep node-local versions until a newer one is protected.
    schedule_retention(rec.name, CAIRN_LEVEL_LOCAL);
    return;
  }
  if (level == CAIRN_LEVEL_LOCAL) {
    rec.local_done_at = util::wall_s();
    // The persistent level finished first and its commit's catalog update
    // went without the local time (on_durable): record it now.
    if (rec.shards_durable) record_runtime_level(rec, CAIRN_LEVEL_LOCAL, rec.local_done_at, 0);
  }
  auto& list = complete_[{rec.name, level}];
  list.push_back(rec.version);
  std::sort(list.begin(), list.end());
  schedule_retention(rec.name, level);
}

void client_impl::record_runtime_level(const version_record& rec, unsigned level, double at, double took) {
  if (rank() != 0) return;
  engine_->submit_task(
      [this, run = cfg_.run, name = rec.name, version = rec.version, level, at, took]() -> status {
        cairn::lock_guard lk(catalog_mu_);
        if (!catalog_) return {};
        if (status cs = catalog_->record_level(run, name, version, level, at, took); !cs)
          std::fprintf(stderr, "cairn: warning: catalog not updated (%s)\n", cs.to_string().c_str());
        return {};
      },
      engine::task_priority::low);
}

void client_impl::schedule_retention(const std::string& name, unsigned level) {
  int keep = level == CAIRN_LEVEL_LOCAL ? cfg_.keep_local : cfg_.keep_persistent;
  auto& list = complete_[{name, level}];
  if (keep <= 0 || list.size() <= static_cast<size_t>(keep)) return;
  // Versions older than the keep-th newest version complete on every rank go.
  int64_t threshold = list[list.size() - static_cast<size_t>(keep)];
  list.erase(list.begin(), list.end() - keep);
  if (level == CAIRN_LEVEL_LOCAL)
    for (const auto& l : levels_) threshold = std::min(threshold, l->keep_local_from(name));
  if (level != CAIRN_LEVEL_LOCAL && rank() != 0) return;  // rank 0 retires the persistent level
  // One queued task per name and level, run before stage work that comes
  // later (retention keeps pace with back-to-back checkpoints instead of
  // waiting for an idle moment), with the newest threshold; one at a time.
  {
    cairn::lock_guard lk(retention_->mu);
    auto [it, fresh] = retention_->pending.emplace(std::make_pair(name, level), threshold);
    if (!fresh) {
      it->second = std::max(it->second, threshold);
      return;
    }
  }
  engine_->submit_task([this, name, level]() -> status {
    cairn::lock_guard run_lk(retention_->run_mu);
    int64_t below;
    {
      cairn::lock_guard lk(retention_->mu);
      auto it = retention_->pending.find({name, level});
      below = it->second;
      retention_->pending.erase(it);
    }
    return level == CAIRN_LEVEL_LOCAL ? remove_local_below(name, below) : remove_persistent_below(name, below);
  });
}

void client_impl::adopt_local_versions(const std::string& name, int64_t restored) {
  if (!cfg_.local_enabled || cfg_.keep_local <= 0) return;
  const uint32_t me = static_cast<uint32_t>(rank());
  auto& list = complete_[{name, CAIRN_LEVEL_LOCAL}];
  for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name)) {
    if (v > restored) break;
    if (std::find(list.begin(), list.end(), v) == list.end() &&
        env_->exists(format::shard_path(cfg_.scratch, cfg_.run, name, v, me)))
      list.push_back(v);
  }
  std::sort(list.begin(), list.end());
  schedule_retention(name, CAIRN_LEVEL_LOCAL);
}

status client_impl::remove_local_below(const std::string& name, int64_t threshold) {
  const uint32_t me = static_cast<uint32_t>(rank());
  for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name)) {
    if (v >= threshold) break;
    std::string dir = format::version_dir(cfg_.scratch, cfg_.run, name, v);
    const std::string shard = storage::join(dir, format::shard_file_name(me));
    CAIRN_RETURN_IF_ERROR(recycler_ ? recycler_->retire(shard) : env_->remove_file(shard));
    CAIRN_RETURN_IF_ERROR(env_->remove_file(storage::join(dir, format::tree_file_name(me))));
    CAIRN_RETURN_IF_ERROR(env_->remove_file(storage::join(dir, redundancy::parity_file_name(me))));
    (void)env_->remove_dir(dir);  // fails while other ranks' shards remain
  }
  return {};
}

status client_impl::remove_persistent_below(const std::string& name, int64_t threshold) {
  const std::string& root = cfg_.persistent;
  for (int64_t v : format::list_versions(env_, root, cfg_.run, name)) {
    if (v >= threshold) break;
    // The commit withdrawn first, so no reader ever sees a manifest without its shards.
    CAIRN_RETURN_IF_ERROR(format::remove_version(env_, format::version_dir(root, cfg_.run, name, v)));
    cairn::lock_guard lk(catalog_mu_);
    if (catalog_) (void)catalog_->remove_version(cfg_.run, name, v);
  }
  return {};
}

void client_impl::drop_local_versions() {
  if (!cfg_.local_enabled || cfg_.keep_local_after_finalize) return;
  const uint32_t me = static_cast<uint32_t>(rank());
  const std::string run_dir = storage::join(format::runs_dir(cfg_.scratch), cfg_.run);
  const std::vector<std::string> names = format::list_subdirs(env_, run_dir);
  // Only when the node-local level holds no version the persistent level
  // lacks: every checkpoint's newest node-local version of every rank is
  // committed (older ones are older than a committed one).
  int ok = 1;
  for (const auto& name : names) {
    auto versions = format::list_versions(env_, cfg_.scratch, cfg_.run, name);
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      if (!env_->exists(format::shard_path(cfg_.scratch, cfg_.run, name, *v, me))) continue;
      if (!env_->exists(format::manifest_path(cfg_.persistent, cfg_.run, name, *v))) ok = 0;
      break;
    }
  }
  if (comm_->min(ok) == 0) return;
  // This rank's files of every version (shard, hash tree, parity: each
  // named <kind>.<rank:06>), and its recycled files.
  const std::string mine = format::shard_file_name(me).substr(format::shard_file_name(me).find('.'));
  for (const auto& name : names)
    for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name)) {
      const std::string dir = format::version_dir(cfg_.scratch, cfg_.run, name, v);
      auto files = env_->list(dir);
      if (!files) continue;
      for (const auto& f : *files)
        if (f.size() > mine.size() && f.compare(f.size() - mine.size(), mine.size(), mine) == 0)
          (void)env_->remove_file(storage::join(dir, f));
    }
  if (recycler_) (void)recycler_->clear();
  (void)comm_->min(0);  // every rank removed its files: the directories can go
  for (const auto& name : names) {
    for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name))
      (void)env_->remove_dir(format::version_dir(cfg_.scratch, cfg_.run, name, v));
    (void)env_->remove_dir(format::checkpoint_dir(cfg_.scratch, cfg_.run, name));
  }
  (void)env_->remove_dir(run_dir);
  const std::string bin = storage::join(cfg_.scratch, "recycle");
  (void)env_->remove_dir(storage::join(bin, cfg_.run));
  (void)env_->remove_dir(bin);
}

}  // namespace cairn

// The agreement protocol of client_impl (docs/design/core.md):
// the one collective round per cairn call that agrees on every rank's
// latched error, free staging slot, pending versions' level states, the
// online comparison's first divergence and the batch job's deadline, and
// what every rank does with the result (a level completed or failed on some
// rank, a level's own step, a version's shards durable everywhere). Every
// function here is collective: the ranks call them in the same order with
// state that only their results change.
#include "client/client.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "client/batch_job.hpp"
#include "format/manifest.hpp"
#include "format/commit.hpp"

namespace cairn {

status client_impl::agree(status mine) {
  int64_t code = comm_->min(static_cast<int64_t>(mine.code()));
  if (code == 0) return {};
  return agreed_failure(code, mine);
}

status client_impl::agreed_failure(int64_t code, const status& mine) {
  int64_t root = comm_->min(static_cast<int64_t>(mine.code()) == code ? rank() : INT64_MAX);
  std::string msg = mine.message();
  comm_->broadcast(&msg, static_cast<int>(root));
  if (root != rank()) msg = "rank " + std::to_string(root) + ": " + msg;
  return {static_cast<errc>(code), msg};
}

std::string client_impl::exchange_message(bool failing, const std::string& mine) {
  int64_t root = comm_->min(failing ? rank() : INT64_MAX);
  if (root == INT64_MAX) return "unknown failure";
  std::string msg = mine;
  comm_->broadcast(&msg, static_cast<int>(root));
  return "rank " + std::to_string(root) + ": " + msg;
}

// Longer than 120 lines for a reason: the layout of the round's vector and
// the reading of its result stay side by side, so they cannot drift apart.
status client_impl::progress(bool consume_error, bool* all_have_slot, const status* mine, const plan_record* record,
                             std::vector<plan_record>* records) {
  // Layout (identical on every rank, because it depends only on state that
  // changes through this function's collective results):
  //   [0] latched error code, [1] free-slot flag, [2] first divergent
  //   version, [3] the caller's status code (capture's planning), then per
  //   pending version the open entries: local, shards durable, manifest
  //   committed.
  std::vector<int64_t> v;
  v.push_back(engine_->has_error() ? -1 : 0);
  v.push_back(all_have_slot == nullptr || cfg_.staging_policy == staging_policy::block || pool_.has_free() ? 1 : 0);
  int64_t my_first = INT64_MAX;
  if (online_) {
    my_first = online_->first_version();
    if (online_->claim_retry()) {
      auto st = online_;
      uint32_t me = static_cast<uint32_t>(rank());
      engine_->submit_task([st, me] { return st->retry(me); });
    }
  }
  v.push_back(my_first);
  v.push_back(mine ? static_cast<int64_t>(mine->code()) : 0);
  // Batch jobs: 0 when this rank was warned since its last capture; minus
  // its measured time to durable (us: the minimum is the largest); the time
  // it has left (ms, INT64_MAX unknown).
  v.push_back(batch::warnings_received() > warnings_at_capture_ ? 0 : 1);
  v.push_back(-static_cast<int64_t>(durable_s_->load() * 1e6));
  {
    const double left = time_left();
    v.push_back(std::isfinite(left) ? static_cast<int64_t>(std::max(-1e15, std::min(1e15, left * 1000.0))) : INT64_MAX);
  }
  enum class entry_kind { level, step, durable, manifest };
  struct entry {
    version_record* rec;
    entry_kind kind;
    unsigned level = 0;  // entry_kind::level: LOCAL or PROTECTED
    class level* by = nullptr;  // entry_kind::step: the level whose step it is
  };
  std::vector<entry> entries;
  for (version_record* rec : pending_) {
    auto& job = *rec->job;
    for (unsigned level : {CAIRN_LEVEL_LOCAL, CAIRN_LEVEL_PROTECTED}) {
      if ((rec->wanted & level) && !((rec->global_done | rec->global_failed) & level)) {
        entries.push_back({rec, entry_kind::level, level});
        v.push_back(level_state(*engine_, job, level));
      }
    }
    if ((rec->wanted & CAIRN_LEVEL_PERSISTENT) &&
        !((rec->global_done | rec->global_failed) & CAIRN_LEVEL_PERSISTENT)) {
      for (const auto& l : levels_) {
        // A level's own step (mpiio's collective write): ready on every rank?
        if (auto state = l->step_state(*rec)) {
          entries.push_back({rec, entry_kind::step, 0, l.get()});
          v.push_back(*state);
        }
      }
      if (!rec->shards_durable) {
        entries.push_back({rec, entry_kind::durable});
        unsigned done = 0, failed = 0;
        bool finished = false;
        engine_->levels(job, &done, &failed, &finished);
        // Durable, and with a commit stage every stage ended (it runs last):
        // rank 0's agreed commit then finds the version committed by its
        // last writer (or stands in for it) with every rank's times.
        const bool durable = (done & CAIRN_LEVEL_PERSISTENT) && (finished || !commit_stage_);
        v.push_back(durable ? 1 : (failed & CAIRN_LEVEL_PERSISTENT) ? -1 : 0);
      } else {
        entries.push_back({rec, entry_kind::manifest});
        v.push_back(rank() == 0 ? rec->manifest_state->load() : 1);
      }
    }
  }
  constexpr size_t kFixed = 7;
  if (record) {
    // The same minimum, through an allgather that also carries every rank's
    // plan record: still one collective.
    const size_t row = v.size() * sizeof(int64_t) + sizeof(plan_record);
    std::vector<std::byte> mine(row), all;
    std::memcpy(mine.data(), v.data(), v.size() * sizeof(int64_t));
    std::memcpy(mine.data() + v.size() * sizeof(int64_t), record, sizeof(plan_record));
    comm_->allgather(mine, &all);
    records->resize(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      const std::byte* p = all.data() + static_cast<size_t>(r) * row;
      for (size_t i = 0; i < v.size(); ++i) {
        int64_t x;
        std::memcpy(&x, p + i * sizeof(int64_t), sizeof x);
        v[i] = std::min(v[i], x);
      }
      std::memcpy(&(*records)[static_cast<size_t>(r)], p + v.size() * sizeof(int64_t), sizeof(plan_record));
    }
  } else {
    comm_->allreduce_min(v);
  }
  error_agreed_ = v[0] < 0;
  if (online_) progress_divergence(v[2]);
  agreed_warned_ = v[4] == 0;
  agreed_durable_s_ = static_cast<double>(-v[5]) / 1e6;
  agreed_left_s_ = v[6] == INT64_MAX ? HUGE_VAL : static_cast<double>(v[6]) / 1000.0;

  for (size_t i = 0; i < entries.size(); ++i) {
    version_record& rec = *entries[i].rec;
    int64_t s = v[kFixed + i];
    if (s == 0) continue;
    switch (entries[i].kind) {
      case entry_kind::level:
        if (s > 0) on_level_complete(rec, entries[i].level);
        else agree_level_failure(rec, entries[i].level);
        break;
      case entry_kind::step:
        entries[i].by->step(rec, s);
        break;
      case entry_kind::durable:
        if (s > 0) on_durable(rec);
        else agree_level_failure(rec, CAIRN_LEVEL_PERSISTENT);
        break;
      case entry_kind::manifest:
        if (s > 0) {
          on_level_complete(rec, CAIRN_LEVEL_PERSISTENT);
        } else {
          rec.global_failed |= CAIRN_LEVEL_PERSISTENT;
          count_level(rec, CAIRN_LEVEL_PERSISTENT, true);
          std::string msg = rank() == 0 ? rec.manifest_error->message() : std::string();
          int64_t code = comm_->min(rank() == 0 ? static_cast<int64_t>(rec.manifest_error->code()) : 0);
          comm_->broadcast(&msg, 0);
          rec.level_error[CAIRN_LEVEL_PERSISTENT] =
              status(code < 0 ? static_cast<errc>(code) : errc::io_error, "rank 0: " + msg);
        }
        break;
    }
  }
  std::erase_if(pending_, [](version_record* r) { return r->resolved(); });
  if (stats_dirty_) write_metrics();
  if (all_have_slot) *all_have_slot = v[1] > 0;
  if (v[3] < 0) return agreed_failure(v[3], mine ? *mine : status());

  if (v[0] < 0 && consume_error) {
    // Some rank has a latched background error: every rank returns it.
    status mine = engine_->has_error() ? engine_->take_error() : status();
    return agree(mine);
  }
  return {};
}

void client_impl::agree_level_failure(version_record& rec, unsigned level) {
  rec.global_failed |= level;
  count_level(rec, level, true);
  if (level == CAIRN_LEVEL_PERSISTENT) rec.job->cancelled = true;  // ranks waiting for others stop
  bool mine = level_state(*engine_, *rec.job, level) < 0;
  status e, soft;
  unsigned done, failed;
  bool finished;
  engine_->levels(*rec.job, &done, &failed, &finished, &e, &soft);
  if (e.is_ok()) e = soft;  // a stage that does not latch (agents)
  // The cause, not its consequences: a rank that gave up because another
  // failed (cancelled) reports only when no rank has a cause of its own.
  const bool consequence = mine && e.code() == errc::cancelled;
  int64_t codes[2] = {mine && !consequence ? static_cast<int64_t>(e.code()) : 0,
                      mine ? static_cast<int64_t>(e.code()) : 0};
  comm_->allreduce_min(codes);
  const int64_t code = codes[0] < 0 ? codes[0] : codes[1];
  rec.level_error[level] = status(code < 0 ? static_cast<errc>(code) : errc::io_error,
                                  exchange_message(codes[0] < 0 ? mine && !consequence : mine, e.message()));
}

void client_impl::progress_divergence(int64_t global_first) {
  if (global_first == INT64_MAX || (divergence_ && divergence_->version <= global_first)) return;
  const analytics::online_divergence mine = online_->state().first;
  int64_t root = comm_->min(mine.version == global_first ? rank() : INT64_MAX);
  nlohmann::json j = {{"version", mine.version}, {"rank", mine.rank}, {"name", mine.name}, {"region", mine.region},
                      {"index", mine.index}, {"value", mine.value}, {"reference", mine.reference}, {"kind", mine.kind}};
  std::string text = j.dump();
  comm_->broadcast(&text, static_cast<int>(root));
  auto g = nlohmann::json::parse(text);
  analytics::online_divergence d;
  d.version = g["version"];
  d.rank = g["rank"];
  d.name = g["name"];
  d.region = g["region"];
  d.index = g["index"];
  d.value = g["value"];
  d.reference = g["reference"];
  d.kind = g["kind"];
  divergence_ = d;
  if (rank() == 0) {
    std::fprintf(stderr, "cairn: run '%s' diverged from '%s' at '%s' version %lld, rank %u, region '%s'[%llu]: %s vs %s%s\n",
                 cfg_.run.c_str(), cfg_.reference_run.c_str(), d.name.c_str(), static_cast<long long>(d.version), d.rank,
                 d.region.c_str(), static_cast<unsigned long long>(d.index), d.value.c_str(), d.reference.c_str(),
                 cfg_.on_divergence == divergence_action::stop ? " (stopping: on_divergence = stop)" : "");
  }
}

status client_impl::divergence(cairn_divergence_t* info) {
  if (size() == 1 && !finalized_) CAIRN_RETURN_IF_ERROR(progress(false));
  std::memset(info, 0, sizeof *info);
  info->version = -1;
  if (!online_) return {errc::invalid_argument, "cairn_divergence: no reference_run is configured"};
  const auto state = online_->state();
  info->compared = state.compared;
  info->pending = state.pending;
  if (!divergence_) return {};
  const auto& d = *divergence_;
  info->diverged = 1;
  info->version = d.version;
  info->rank = static_cast<int>(d.rank);
  std::snprintf(info->name, sizeof info->name, "%s", d.name.c_str());
  std::snprintf(info->region, sizeof info->region, "%s", d.region.c_str());
  info->index = d.index;
  std::snprintf(info->value, sizeof info->value, "%s", d.value.c_str());
  std::snprintf(info->reference, sizeof info->reference, "%s", d.reference.c_str());
  info->structural = d.kind == "structural" ? 1 : 0;
  return {};
}

status client_impl::report_earlier_failure(const std::string& name, int64_t version) {
  // Every rank is here (the flag was agreed): the failure of some rank,
  // once, with the lowest failing rank's message.
  status mine = engine_->has_error() ? engine_->take_error() : status();
  status earlier = agree(mine);
  if (earlier.is_ok()) return {};  // the failing rank's error was taken by an earlier call
  for (auto& [key, r] : records_)
    if (r->global_failed) r->failure_reported = true;
  return {errc::earlier_failed, "checkpoint '" + name + "' version " + std::to_string(version) +
                                    " was taken; an earlier version failed (" +
                                    std::string(errc_name(earlier.code())) + "): " + earlier.message() +
                                    " (cairn_test or cairn_wait on that version returns its error)"};

}

}  // namespace cairn

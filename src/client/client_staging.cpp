// Staging of client_impl (docs/design/core.md): the shard layout
// of a capture, how many staging slots staging_limit allows, and the slots
// made ahead of the first checkpoint by a low-priority engine task (where a
// restart may come, after it or after kRestartGrace).
#include "client/client.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "format/layout.hpp"
#include "util/mutex.hpp"

namespace cairn {

result<format::shard_header> client_impl::plan_header(const std::string& name, int64_t version,
                                                      const std::vector<region>& regs) const {
  format::shard_header h;
  h.run = cfg_.run;
  h.name = name;
  h.version = version;
  h.rank = static_cast<uint32_t>(rank());
  h.nranks = static_cast<uint32_t>(size());
  h.attempt = attempt_;
  for (auto& r : regs) {
    format::region_desc d;
    d.name = r.name;
    d.type = r.type;
    d.flags = r.column_major ? format::kColumnMajor : 0;
    d.dims = r.dims;
    d.count = r.count;
    if (!r.global.empty()) {
      d.flags |= format::kHasLayout;
      d.global = r.global;
      d.start = r.start;
    }
    h.regions.push_back(std::move(d));
  }
  CAIRN_RETURN_IF_ERROR(format::plan_layout(h));
  return h;
}

result<int> client_impl::staging_slots(const std::string& name, uint64_t file_size) const {
  if (cfg_.staging_limit == 0) return cfg_.staging_slots;
  int slots = static_cast<int>(std::min<uint64_t>(cfg_.staging_limit / file_size, 64));
  if (slots < 1)
    return status(errc::invalid_argument, "staging_limit (" + std::to_string(cfg_.staging_limit) +
                                              " bytes) is smaller than one checkpoint of '" + name + "' (" +
                                              std::to_string(file_size) + " bytes); raise CAIRN_STAGING_LIMIT");
  return slots;
}

bool client_impl::restart_may_come() {
  auto has_versions = [&](const std::string& root) {
    for (const std::string& name : format::list_subdirs(env_, storage::join(format::runs_dir(root), cfg_.run)))
      if (!format::list_versions(env_, root, cfg_.run, name).empty()) return true;
    return false;
  };
  // The shared level is listed once (rank 0), not by every rank.
  const bool mine = !cfg_.agents.empty() || (rank() == 0 && has_versions(cfg_.persistent)) ||
                    has_versions(cfg_.scratch);
  return comm_->min(mine ? -1 : 0) < 0;  // any rank's finding counts for all
}

void client_impl::restart_phase_over() {
  pool_.defer_until({});
  prepare_staging();
}

void client_impl::prepare_staging() {
  if (cfg_.mode != engine_mode::thread || !engine_ || regions_.empty()) return;
  std::vector<region> regs;
  for (auto& [n, r] : regions_) regs.push_back(r);
  // A checkpoint name of up to a page more header than an empty one.
  auto h = plan_header("", 0, regs);
  if (!h) return;
  const uint64_t need = h->file_size;
  auto slots = staging_slots("", need + 4096);
  if (!slots || (need <= pool_.slot_bytes() && pool_.slots() >= *slots)) return;
  {
    // Protects in a row leave one task, which reserves for the newest layout.
    cairn::lock_guard lk(staging_mu_);
    staging_wanted_ = {need, *slots};
    if (std::exchange(staging_queued_, true)) return;
  }
  engine_->submit_task([this]() -> status {
    std::pair<uint64_t, int> w;
    {
      cairn::lock_guard lk(staging_mu_);
      w = staging_wanted_;
      staging_queued_ = false;
    }
    (void)pool_.try_reserve(w.first, w.first + 4096, w.second);  // best effort: the capture reserves what it needs
    return {};
  }, engine::task_priority::low);
}

status client_impl::reserve_staging(const std::string& name, int64_t version, const std::vector<region>& regs,
                                    bool lend, bool may_cow, format::shard_header* out) {
  status st;
  format::shard_header& h = *out;
  if (auto planned = plan_header(name, version, regs); planned) h = std::move(planned).value();
  else st = planned.take_status();
  if (st) {
    auto slots = staging_slots(name, h.file_size);
    if (!slots) st = slots.take_status();
    if (st && (h.file_size > pool_.slot_bytes() || pool_.slots() < *slots)) {
      if (pool_.slots() > 0 && h.file_size > pool_.slot_bytes()) engine_->wait_idle();  // slots are replaced
      // Thread mode: this checkpoint needs one slot; the others are made by
      // an engine task, off the application's call (on this VM faulting in
      // a 512 MiB slot costs 0.7-1.4 s).
      const int now = cfg_.mode == engine_mode::thread ? 1 : *slots;
      st = pool_.reserve(h.file_size, now, true, !use_cow(h.file_size, lend, may_cow));
      if (st && now < *slots && !more_slots_queued_.exchange(true)) {
        engine_->submit_task([this, size = pool_.slot_bytes(), n = *slots]() -> status {
          (void)pool_.try_reserve(size, size, n);  // best effort: a later capture reserves what it needs
          more_slots_queued_ = false;
          return {};
        }, engine::task_priority::low);
      }
    }
  }
  return st;
}

}  // namespace cairn

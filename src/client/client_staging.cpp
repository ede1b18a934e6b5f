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

namespace {

// The shard's description of a protected region (before plan_layout).
format::region_desc describe(const region& r) {
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
  return d;
}

}  // namespace

result<format::shard_header> client_impl::plan_header(const std::string& name, int64_t version,
                                                      const std::vector<region>& regs) const {
  format::shard_header h;
  h.run = cfg_.run;
  h.name = name;
  h.version = version;
  h.rank = static_cast<uint32_t>(rank());
  h.nranks = static_cast<uint32_t>(size());
  h.attempt = attempt_;
  for (auto& r : regs) h.regions.push_back(describe(r));
  CAIRN_RETURN_IF_ERROR(format::plan_layout(h));
  return h;
}

void client_impl::count_for_staging(const region& r, bool add) {
  const uint64_t header = format::region_header_bytes(describe(r));
  const uint64_t data = format::align_up(r.count * format::type_size(r.type));
  if (add) {
    staged_header_bytes_ += header;
    staged_data_bytes_ += data;
  } else {
    staged_header_bytes_ -= header;
    staged_data_bytes_ -= data;
  }
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
  // The image of the regions protected now, with an empty checkpoint name
  // (a name takes up to a page more): plan_header's file_size, from the sums
  // protect and unprotect keep, so that n protects cost O(n), not O(n^2).
  const uint64_t need =
      format::align_up(format::header_base_bytes(cfg_.run, "") + staged_header_bytes_) + staged_data_bytes_;
  auto slots = staging_slots("", need + 4096);
  if (!slots || (need <= pool_.slot_bytes() && pool_.slots() >= *slots)) return;
  {
    // Protects in a row leave one task, which reserves for the newest layout.
    cairn::lock_guard lk(staging_mu_);
    staging_wanted_ = {need, *slots};
    if (std::exchange(staging_queued_, true)) return;
  }
  engine_->submit_task([this]() -> status {
    // The layout is read once the slots may be made: protects meanwhile
    // (kProtectSettle apart) change what this task makes, not add tasks.
    if (!pool_.wait_ahead()) return {};
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
                                    bool lend, bool may_cow, format::shard_header* out, bool* cow) {
  status st;
  format::shard_header& h = *out;
  *cow = false;
  if (auto planned = plan_header(name, version, regs); planned) h = std::move(planned).value();
  else st = planned.take_status();
  if (st) {
    auto slots = staging_slots(name, h.file_size);
    if (!slots) st = slots.take_status();
    const bool ready = h.file_size <= pool_.slot_bytes() && pool_.slots() > 0;
    *cow = st && use_cow(h.file_size, lend, may_cow, ready);
    if (st && (h.file_size > pool_.slot_bytes() || pool_.slots() < *slots)) {
      // Larger slots replace the pool's once no version holds one: wait for
      // the engine only when a version does. A task still making a slot
      // ahead for the layout before the last protect is no reason to wait.
      if (h.file_size > pool_.slot_bytes() && pool_.in_use()) engine_->wait_idle();
      // Thread mode: this checkpoint needs one slot; the others are made by
      // an engine task, off the application's call (on this VM faulting in
      // a 512 MiB slot costs 0.7-1.4 s).
      const int now = cfg_.mode == engine_mode::thread ? 1 : *slots;
      st = pool_.reserve(h.file_size, now, true, !*cow && !shares_copy(h.file_size, lend));
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

// client_impl's metrics (docs/design/metrics.md): per-rank counters updated
// by the progress rounds, written to the rank's textfile by an engine task
// (the newest copy only; at finalize by the application thread).
#include "client/client.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "client/batch_job.hpp"
#include "util/mutex.hpp"

namespace cairn {

void client_impl::count_level(version_record& rec, unsigned level, bool failed) {
  const char* name = level == CAIRN_LEVEL_LOCAL ? "local" : level == CAIRN_LEVEL_PERSISTENT ? "persistent" : nullptr;
  if (name == nullptr) return;
  stats_dirty_ = true;
  auto& c = stats_.levels[name];
  if (failed) {
    ++c.errors;
    return;
  }
  // The stages of this rank finished before the level was agreed complete.
  const auto& job = *rec.job;
  ++c.versions;
  c.bytes += job.header.file_size;
  stats_.stage_seconds[name] += level == CAIRN_LEVEL_LOCAL ? job.local_s : job.persistent_s;
  if (!rec.counted_checksum) {
    // The capture's seconds with the checksum's: a copy-on-write capture's
    // are known only once its background copy ended (the manifest's too).
    rec.counted_checksum = true;
    stats_.stage_seconds["capture"] += job.capture_s;
    stats_.stage_seconds["checksum"] += job.checksum_s;
  }
}

void client_impl::write_metrics() {
  stats_dirty_ = false;
  if (cfg_.metrics_dir.empty()) return;
  stats_.run = cfg_.run;
  stats_.rank = static_cast<uint32_t>(rank());
  stats_.time_to_durable_s = agreed_durable_s_;
  stats_.warning_signals = batch::warnings_received();
  stats_.staging_bytes = pool_.slot_bytes() * static_cast<uint64_t>(pool_.slots());
  if (cow_) {
    stats_.capture_write_faults = cow_faults_.load();
    stats_.cow_captures = cow_captures_;
  }
  // One file per rank (run and rank in the name: the node exporter reads
  // every *.prom of the directory), replaced atomically; not synced, since a
  // metric is an observation, not state.
  std::string path = storage::join(cfg_.metrics_dir, "cairn_" + cfg_.run + "_" + std::to_string(rank()) + ".prom");
  bool submit = false;
  {
    cairn::lock_guard lk(textfile_->mu);
    textfile_->latest = stats_;
    submit = !textfile_->queued && !metrics_inline_;
    textfile_->queued = textfile_->queued || submit;
  }
  if (metrics_inline_) {
    textfile_->flush(env_, cfg_.metrics_dir, path, rank());
  } else if (submit) {
    // Never a failing status: a metric that cannot be written must not fail
    // a checkpoint (the engine would latch it); flush reports it once.
    engine_->submit_task([tf = textfile_, env = env_, dir = cfg_.metrics_dir, path = std::move(path), r = rank()] {
      tf->flush(env, dir, path, r);
      return status();
    });
  }
}

void client_impl::metrics_textfile::flush(storage::storage_env* env, const std::string& dir, const std::string& path,
                                          int rank) {
  cairn::lock_guard wl(write_mu);
  std::optional<metrics::rank_metrics> m;
  {
    cairn::lock_guard lk(mu);
    m.swap(latest);
    queued = false;
  }
  if (!m) return;  // a later flush wrote it already
  status st = dir_made ? status() : env->make_dirs(dir);
  dir_made = st.is_ok();
  if (st) st = env->write_atomic(path, metrics::to_openmetrics({*m}), false);
  if (!st && !warned) {
    warned = true;
    std::fprintf(stderr, "cairn: rank %d: warning: metrics not written (%s); checkpoints go on\n", rank,
                 st.message().c_str());
  }
}

}  // namespace cairn

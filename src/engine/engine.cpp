#include "engine/engine.hpp"

#include "cairn.h"
#include "util/cpu.hpp"

namespace cairn::engine {

engine::engine(engine_mode mode, int threads, util::thread_setup setup, std::vector<std::unique_ptr<stage>> stages)
    : mode_(mode), stages_(std::move(stages)), stage_next_(stages_.size(), 0) {
  if (mode_ == engine_mode::thread) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this, setup] { worker_main(setup); });
  }
}

engine::~engine() { shutdown(false); }

void engine::submit(std::shared_ptr<version_job> job) {
  {
    std::lock_guard lk(mu_);
    job->seq = next_seq_++;
  }
  if (mode_ == engine_mode::sync) {
    run_job(*job);
    return;
  }
  {
    std::lock_guard lk(mu_);
    queue_.push_back({std::move(job), {}});
  }
  cv_.notify_all();
}

void engine::submit_task(std::function<status()> task) {
  if (mode_ == engine_mode::sync) {
    run_task(task);
    return;
  }
  {
    std::lock_guard lk(mu_);
    queue_.push_back({nullptr, std::move(task)});
  }
  cv_.notify_all();
}

void engine::latch(const status& st) {
  // Caller holds mu_. Keep the first error until it is taken.
  if (error_.is_ok()) error_ = st;
}

void engine::run_task(const std::function<status()>& task) {
  status st = task();
  if (!st) {
    std::lock_guard lk(mu_);
    latch(st);
  }
}

void engine::run_job(version_job& job) {
  bool abandoned = false;
  for (size_t i = 0; i < stages_.size(); ++i) {
    stage& s = *stages_[i];
    {
      // Enter stages in submission order.
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stage_next_[i] == job.seq; });
    }
    status st;
    bool ran = false;
    if (!abandoned && s.applies(job)) {
      st = s.run(job);
      ran = true;
    }
    {
      std::lock_guard lk(mu_);
      stage_next_[i] = job.seq + 1;
      if (ran && st.is_ok()) job.done |= s.completes(job);
      if ((ran && !st.is_ok()) || (abandoned && (job.wanted & s.level()))) {
        job.failed |= s.level();
        if (ran) {
          status e = st.with_context(std::string("checkpoint '") + job.header.name + "' version " +
                                     std::to_string(job.header.version) + ", stage " + s.name());
          // `cancelled`: the stage gave up because of another rank's failure
          // (which that rank reports): the level is failed, nothing new to report.
          if (s.latches() && st.code() != errc::cancelled) {
            if (job.error.is_ok()) job.error = e;
            latch(e);
          } else if (job.soft_error.is_ok()) {
            job.soft_error = e;
          }
          if (s.essential()) {
            abandoned = true;
            job.failed |= job.wanted & ~job.done;
          }
        }
      }
    }
    cv_.notify_all();
  }
  if (job.pool && job.image) {
    job.pool->release(job.image);
    job.image = nullptr;
  }
  {
    std::lock_guard lk(mu_);
    job.finished = true;
  }
  cv_.notify_all();
}

void engine::worker_main(const util::thread_setup& setup) {
  (void)util::setup_this_thread(setup);  // best effort: placement and priority are hints
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    item it = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lk.unlock();
    if (it.job) run_job(*it.job);
    else run_task(it.task);
    lk.lock();
    --running_;
    cv_.notify_all();
  }
}

void engine::levels(const version_job& job, unsigned* done, unsigned* failed, bool* finished, status* error,
                    status* soft_error) {
  std::lock_guard lk(mu_);
  *done = job.done;
  *failed = job.failed;
  *finished = job.finished;
  if (error) *error = job.error;
  if (soft_error) *soft_error = job.soft_error;
}

void engine::wait_levels(const version_job& job, unsigned mask) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return job.finished || ((job.done | job.failed) & mask & job.wanted) == (mask & job.wanted); });
}

void engine::wait_idle() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return queue_.empty() && running_ == 0; });
}

status engine::take_error() {
  std::lock_guard lk(mu_);
  return std::exchange(error_, status());
}

bool engine::has_error() {
  std::lock_guard lk(mu_);
  return !error_.is_ok();
}

void engine::shutdown(bool drain) {
  std::vector<std::shared_ptr<version_job>> dropped;
  {
    std::lock_guard lk(mu_);
    if (workers_.empty()) return;
    if (!drain) {
      for (auto& it : queue_) {
        if (!it.job) continue;
        dropped.push_back(it.job);
      }
      // Drop everything queued; jobs already in a stage finish normally.
      std::erase_if(queue_, [](const item&) { return true; });
    }
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& d : dropped) {
    // A dropped job still has to pass the stage-order counters so later jobs
    // (none are queued, but running ones may wait) are not blocked.
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < stages_.size(); ++i)
      if (stage_next_[i] == d->seq) stage_next_[i] = d->seq + 1;
    d->failed |= d->wanted & ~d->done;
    if (d->error.is_ok()) d->error = status(errc::cancelled, "cancelled by cairn_finalize without waiting");
    d->finished = true;
    if (d->pool && d->image) {
      d->pool->release(d->image);
      d->image = nullptr;
    }
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

}  // namespace cairn::engine

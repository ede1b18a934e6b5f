#include "engine/engine.hpp"

#include <algorithm>

#include "util/contain.hpp"
#include "util/cpu.hpp"
#include "util/process.hpp"

namespace cairn::engine {

size_t stage_graph::add(std::unique_ptr<stage> s) {
  std::vector<size_t> after;
  if (!stages_.empty()) after.push_back(stages_.size() - 1);
  return add(std::move(s), std::move(after));
}

size_t stage_graph::add(std::unique_ptr<stage> s, std::vector<size_t> after) {
  for (size_t a : after) {
    // Only stages added before: the order of addition stays topological.
    if (a >= stages_.size()) std::abort();
  }
  stages_.push_back(std::move(s));
  after_.push_back(std::move(after));
  return stages_.size() - 1;
}

namespace {
stage_graph chain(std::vector<std::unique_ptr<stage>> stages) {
  stage_graph g;
  for (auto& s : stages) g.add(std::move(s));
  return g;
}
}  // namespace

engine::engine(engine_mode mode, int threads, util::thread_setup setup, std::vector<std::unique_ptr<stage>> stages)
    : engine(mode, threads, std::move(setup), chain(std::move(stages))) {}

engine::engine(engine_mode mode, int threads, util::thread_setup setup, stage_graph graph)
    : mode_(mode), stages_(std::move(graph.stages_)), after_(std::move(graph.after_)), stage_next_(stages_.size(), 0) {
  if (mode_ == engine_mode::thread) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this, setup] { worker_main(setup); });
  }
}

engine::~engine() { shutdown(false); }

void engine::submit(std::shared_ptr<version_job> job, bool capturing) {
  capturing &= mode_ == engine_mode::thread;
  if (capturing) {
    job->capture.start();
  } else {
    job->capture.publish(job->header.file_size);
    job->capture.end();
  }
  cairn::unique_lock lk(mu_);
  job->seq = next_seq_++;
  job->stage_state.assign(stages_.size(), 0);
  job->stages_left = stages_.size();
  job->capturing = capturing;
  active_.push_back(job);
  if (mode_ == engine_mode::thread) {
    auto finished = schedule();
    const bool wake = claim_wake();
    lk.unlock();
    if (wake) work_cv_.notify_one();
    release_slots(std::move(finished));  // a job none of whose stages applies
    return;
  }
  // Sync mode: earlier jobs are finished, so every ready stage is this job's;
  // run them in order until it is done.
  for (;;) {
    auto finished = schedule();
    if (!finished.empty() || ready_.empty()) {
      lk.unlock();
      release_slots(std::move(finished));
      return;
    }
    ready_stage r = std::move(ready_.front());
    ready_.pop_front();
    lk.unlock();
    run_stage(*r.job, r.stage);
    lk.lock();
  }
}

void engine::captured(version_job& job, status error) {
  // Before the end: a stage that follows the capture reads the error once
  // the capture has ended (byte_progress orders the two).
  if (job.capture.ended()) return;
  job.capture_error = error;
  if (error.is_ok()) job.capture.publish(job.header.file_size);
  job.capture.end();
  bool wake = false;
  std::vector<std::shared_ptr<version_job>> finished;
  {
    cairn::lock_guard lk(mu_);
    if (!job.capturing) return;
    job.capturing = false;
    if (error.is_ok() && job.lent.empty()) job.done |= kLevelCaptured;
    finished = schedule();
    wake = claim_wake();
  }
  state_cv_.notify_all();  // a wait for kLevelCaptured
  if (wake) work_cv_.notify_one();
  release_slots(std::move(finished));
}

void engine::submit_task(std::function<status()> task, task_priority priority) {
  if (mode_ == engine_mode::sync) {
    run_task(task);
    return;
  }
  bool wake = false;
  {
    cairn::lock_guard lk(mu_);
    (priority == task_priority::low ? low_tasks_ : tasks_).push_back(std::move(task));
    wake = claim_wake();
  }
  if (wake) work_cv_.notify_one();
}

bool engine::claim_wake() {
  // One wake-up in flight at a time, not one per queued item: on a core
  // shared with the application thread, two threads woken at once (or back
  // to back, before the first ran) make the kernel switch to one of them
  // inside the application's call (measured: 3-9 ms more blocked time per
  // checkpoint); one does not. The woken worker wakes the next one when it
  // leaves work queued (worker_main).
  if (wake_pending_ || idle_ == 0 || !has_work()) return false;
  wake_pending_ = true;
  return true;
}

void engine::latch(const status& st) {
  // Keep the first error until it is taken.
  if (error_.is_ok()) error_ = st;
}

void engine::run_task(const std::function<status()>& task) {
  status st = util::contained("background task", task);
  if (!st) {
    cairn::lock_guard lk(mu_);
    latch(st);
  }
}

std::vector<std::shared_ptr<version_job>> engine::schedule() {
  std::vector<std::shared_ptr<version_job>> finished;
  bool progress = true;
  while (progress) {
    progress = false;
    for (auto& job : active_) {
      for (size_t i = 0; i < stages_.size(); ++i) {
        if (job->stage_state[i] != 0 || stage_next_[i] != job->seq) continue;
        if (job->capturing && !(job->capture_streams && stages_[i]->follows_capture())) continue;
        if (!std::all_of(after_[i].begin(), after_[i].end(), [&](size_t a) { return job->stage_state[a] == 2; }))
          continue;
        if (!job->abandoned && stages_[i]->applies(*job)) {
          job->stage_state[i] = 1;
          ready_.push_back({job, i});
        } else {
          end_stage(*job, i, false, {});
          progress = true;  // the next version, or this one's next stage, may start
        }
      }
    }
  }
  while (!active_.empty() && active_.front()->stages_left == 0) {
    finished.push_back(std::move(active_.front()));
    active_.pop_front();
  }
  // A job that ended before an older one (a shorter graph path) leaves too.
  for (auto it = active_.begin(); it != active_.end();) {
    if ((*it)->stages_left == 0) {
      finished.push_back(std::move(*it));
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  return finished;
}

void engine::end_stage(version_job& job, size_t i, bool ran, const status& st) {
  const stage& s = *stages_[i];
  job.stage_state[i] = 2;
  --job.stages_left;
  stage_next_[i] = job.seq + 1;
  if (ran && st.is_ok()) job.done |= s.completes(job);
  if (!ran) {
    if (job.abandoned && (job.wanted & s.level())) job.failed |= s.level();
    return;
  }
  if (st.is_ok()) return;
  job.failed |= s.level();
  status e = st.with_context(std::string("checkpoint '") + job.header.name + "' version " +
                             std::to_string(job.header.version) + ", stage " + s.name());
  // `cancelled`: the stage gave up because of another rank's failure (which
  // that rank reports): the level is failed, nothing new to report.
  if (s.latches() && st.code() != errc::cancelled) {
    if (job.error.is_ok()) job.error = e;
    latch(e);
  } else if (job.soft_error.is_ok()) {
    job.soft_error = e;
  }
  if (s.essential()) {
    job.abandoned = true;
    job.failed |= job.wanted & ~job.done;
  }
}

void engine::run_stage(version_job& job, size_t i) {
  status st = util::contained("stage", [&] { return stages_[i]->run(job); });
  std::vector<std::shared_ptr<version_job>> finished;
  bool wake = false;
  {
    cairn::lock_guard lk(mu_);
    end_stage(job, i, true, st);
    finished = schedule();
    wake = mode_ == engine_mode::thread && claim_wake();
  }
  state_cv_.notify_all();
  if (wake) work_cv_.notify_one();
  release_slots(std::move(finished));
}

void engine::release_slots(std::vector<std::shared_ptr<version_job>> finished) {
  if (finished.empty()) return;
  // The slot goes back before the job reads as finished: whoever waits for
  // that may take the slot at once.
  for (auto& job : finished) {
    job->carry.reset();  // an unfinished temporary file goes with it
    if (job->pool && job->image) job->pool->release(job->image);
    job->image = nullptr;
  }
  {
    cairn::lock_guard lk(mu_);
    for (auto& job : finished) job->finished = true;
  }
  state_cv_.notify_all();
}

void engine::worker_main(const util::thread_setup& setup) {
  util::name_this_thread("cairn-engine");
  (void)util::setup_this_thread(setup);  // best effort: placement and priority are hints
  cairn::unique_lock lk(mu_);
  for (;;) {
    ++idle_;
    work_cv_.wait(lk, [&]() CAIRN_REQUIRES(mu_) { return has_work() || (stopping_ && running_ == 0); });
    --idle_;
    wake_pending_ = false;
    if (!has_work()) return;  // stopping and drained
    ++running_;
    if (!tasks_.empty() || (ready_.empty() && !low_tasks_.empty())) {
      auto& q = !tasks_.empty() ? tasks_ : low_tasks_;
      std::function<status()> task = std::move(q.front());
      q.pop_front();
      const bool wake = claim_wake();  // more queued: the next worker
      lk.unlock();
      if (wake) work_cv_.notify_one();
      run_task(task);
    } else {
      ready_stage r = std::move(ready_.front());
      ready_.pop_front();
      const bool wake = claim_wake();  // more queued: the next worker
      lk.unlock();
      if (wake) work_cv_.notify_one();
      run_stage(*r.job, r.stage);
    }
    lk.lock();
    --running_;
    state_cv_.notify_all();                          // wait_idle
    if (stopping_ && running_ == 0) work_cv_.notify_all();  // the others may leave now
  }
}

void engine::levels(const version_job& job, unsigned* done, unsigned* failed, bool* finished, status* error,
                    status* soft_error) {
  cairn::lock_guard lk(mu_);
  *done = job.done;
  *failed = job.failed;
  *finished = job.finished;
  if (error) *error = job.error;
  if (soft_error) *soft_error = job.soft_error;
}

void engine::wait_levels(const version_job& job, unsigned mask) {
  cairn::unique_lock lk(mu_);
  state_cv_.wait(lk, [&]() CAIRN_REQUIRES(mu_) { return job.finished || ((job.done | job.failed) & mask & job.wanted) == (mask & job.wanted); });
}

void engine::wait_idle() {
  cairn::unique_lock lk(mu_);
  state_cv_.wait(lk, [&]() CAIRN_REQUIRES(mu_) {
    return tasks_.empty() && ready_.empty() && low_tasks_.empty() && active_.empty() && running_ == 0;
  });
}

status engine::take_error() {
  cairn::lock_guard lk(mu_);
  return std::exchange(error_, status());
}

bool engine::has_error() {
  cairn::lock_guard lk(mu_);
  return !error_.is_ok();
}

void engine::shutdown(bool drain) {
  std::vector<std::shared_ptr<version_job>> finished;
  {
    cairn::lock_guard lk(mu_);
    if (workers_.empty()) return;
    if (!drain) {
      // Drop everything not started; stages already running finish normally
      // and the rest of their versions is skipped.
      for (auto& r : ready_) r.job->stage_state[r.stage] = 0;
      ready_.clear();
      tasks_.clear();
      low_tasks_.clear();
      for (auto& job : active_) {
        bool pending = std::find(job->stage_state.begin(), job->stage_state.end(), 0) != job->stage_state.end();
        if (!pending) continue;
        job->abandoned = true;
        if (job->error.is_ok() && (job->wanted & ~job->done))
          job->error = status(errc::cancelled, "cancelled by cairn_finalize without waiting");
      }
      finished = schedule();
    }
    stopping_ = true;
  }
  work_cv_.notify_all();
  state_cv_.notify_all();
  release_slots(std::move(finished));
  for (auto& w : workers_) w.join();
  workers_.clear();
  // Whatever was still running when the workers were told to stop has ended.
  cairn::lock_guard lk(mu_);
  for (auto& job : active_) job->finished = true;
}

}  // namespace cairn::engine

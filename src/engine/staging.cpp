#include "engine/staging.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include "util/mutex.hpp"

namespace cairn::engine {

status staging_pool::try_reserve(size_t need_bytes, size_t slot_bytes, int slots) {
  {
    cairn::lock_guard lk(mu_);
    if (need_bytes <= slot_bytes_) {
      if (static_cast<int>(all_.size()) >= slots) return {};
      slot_bytes = slot_bytes_;  // the slots there serve: more of their size, not a replacement
    }
  }
  return make(slot_bytes, slots, false, true, true);
}

void staging_pool::pause() {
  cairn::lock_guard lk(mu_);
  ++paused_;
}

void staging_pool::resume() {
  {
    cairn::lock_guard lk(mu_);
    --paused_;
  }
  cv_.notify_all();
}

void staging_pool::defer_until(std::chrono::steady_clock::time_point until) {
  {
    cairn::lock_guard lk(mu_);
    deferred_until_ = until;
  }
  cv_.notify_all();
}

void staging_pool::stop_ahead() {
  {
    cairn::lock_guard lk(mu_);
    ahead_stopped_ = true;
  }
  cv_.notify_all();
}

bool staging_pool::wait_ahead() {
  cairn::unique_lock lk(mu_);
  for (;;) {
    if (ahead_stopped_) return false;
    const auto now = std::chrono::steady_clock::now();
    if (waiting_ > 0 || (paused_ == 0 && now >= deferred_until_)) return true;
    if (paused_ > 0) cv_.wait(lk);
    else cv_.wait_for(lk, deferred_until_ - now);
  }
}

void staging_pool::set_on_drop(std::function<void(uint64_t id)> f) {
  cairn::lock_guard lk(mu_);
  on_drop_ = std::move(f);
}

void staging_pool::set_shared(bool shared) {
  cairn::lock_guard lk(mu_);
  shared_ = shared;
}

size_t staging_pool::slot_bytes() const {
  cairn::lock_guard lk(mu_);
  return slot_bytes_;
}

status staging_pool::reserve(size_t slot_bytes, int slots, bool wait, bool touch) {
  return make(slot_bytes, slots, wait, false, touch);
}

status staging_pool::make(size_t slot_bytes, int slots, bool wait, bool ahead, bool touch) {
  // Buffers are mapped and faulted in outside the lock: acquire, release and
  // has_free stay quick meanwhile (an engine task may be the one reserving).
  constexpr size_t piece = size_t{2} << 20;  // faulted in between two looks at pause and hurry
  cairn::unique_lock lk(mu_);
  for (;;) {
    if (ahead && ahead_stopped_) return {};
    const bool replace = slot_bytes > slot_bytes_;
    const size_t size = replace ? slot_bytes : slot_bytes_;
    const size_t have = replace ? 0 : all_.size();
    if (static_cast<int>(have) >= slots) return {};
    if (replace && free_.size() != all_.size()) {
      if (!wait) return {};
      cv_.wait(lk, [&]() CAIRN_REQUIRES(mu_) { return free_.size() == all_.size(); });
      continue;
    }
    // Slots being made at least this large serve too (one made larger
    // replaces the others when it is done): wait for them.
    const auto coming = std::count_if(making_.begin(), making_.end(), [&](size_t m) { return m >= slot_bytes; });
    if (coming > 0 && static_cast<int>(have + static_cast<size_t>(coming)) >= slots) {
      if (!wait) return {};
      ++waiting_;
      if (!touch) ++hurried_;
      cv_.notify_all();  // a paused maker goes on for a waiting reserve
      cv_.wait(lk);
      --waiting_;
      if (!touch) --hurried_;
      continue;
    }
    // One slot at a time, each usable as soon as it is made: a capture
    // needing its first slot can use one an engine task made while the task
    // makes the next. Of two reservers' slots, those beyond `slots` go.
    const bool shared = shared_;
    making_.push_back(size);
    lk.unlock();
    const bool touch_now = touch && !ahead;
    auto buf = shared ? aligned_buffer::allocate_shared(size, touch_now) : aligned_buffer::allocate(size, touch_now);
    bool stopped = false, hurry = false;
    for (size_t off = 0; buf && ahead && off < size && !stopped && !hurry; off += piece) {
      lk.lock();
      for (;;) {
        stopped = ahead_stopped_;
        hurry = hurried_ > 0;  // handed out now: its copy faults in the rest
        if (stopped || hurry || waiting_ > 0) break;
        const auto now = std::chrono::steady_clock::now();
        if (paused_ == 0 && now >= deferred_until_) break;
        if (paused_ > 0) cv_.wait(lk);
        else cv_.wait_for(lk, deferred_until_ - now);
      }
      lk.unlock();
      if (!stopped && !hurry) buf->touch(off, off + piece);
    }
    lk.lock();
    making_.erase(std::find(making_.begin(), making_.end(), size));
    cv_.notify_all();  // waiters look once this holder of mu_ lets go
    if (stopped) return {};  // the buffer goes with it
    if (!buf) return buf.take_status();
    // Another reserve may have changed the pool meanwhile: then look again.
    if (replace ? (slot_bytes_ >= slot_bytes || free_.size() != all_.size()) : (slot_bytes_ != size))
      continue;
    if (replace) {
      if (on_drop_)
        for (const auto& b : all_) on_drop_(b->id());
      all_.clear();
      free_.clear();
      slot_bytes_ = size;
    }
    if (static_cast<int>(all_.size()) < slots) {
      auto made = std::make_unique<aligned_buffer>(std::move(buf).value());
      free_.push_back(made.get());
      all_.push_back(std::move(made));
    }
  }
}

bool staging_pool::adopt(aligned_buffer buf, int slots) {
  {
    cairn::lock_guard lk(mu_);
    if (shared_ || buf.size() == 0 || static_cast<int>(all_.size()) >= slots) return false;
    if (all_.empty()) slot_bytes_ = buf.size();
    else if (buf.size() < slot_bytes_) return false;
    auto slot = std::make_unique<aligned_buffer>(std::move(buf));
    free_.push_back(slot.get());
    all_.push_back(std::move(slot));
  }
  cv_.notify_all();
  return true;
}

aligned_buffer* staging_pool::acquire(bool wait) {
  cairn::unique_lock lk(mu_);
  if (free_.empty()) {
    if (!wait) return nullptr;
    cv_.wait(lk, [&]() CAIRN_REQUIRES(mu_) { return !free_.empty(); });
  }
  aligned_buffer* b = free_.back();
  free_.pop_back();
  return b;
}

void staging_pool::release(aligned_buffer* slot) {
  {
    cairn::lock_guard lk(mu_);
    free_.push_back(slot);
  }
  cv_.notify_all();
}

bool staging_pool::has_free() {
  cairn::lock_guard lk(mu_);
  return !free_.empty();
}

bool staging_pool::in_use() const {
  cairn::lock_guard lk(mu_);
  return free_.size() != all_.size();
}

int staging_pool::slots() const {
  cairn::lock_guard lk(mu_);
  return static_cast<int>(all_.size());
}

}  // namespace cairn::engine

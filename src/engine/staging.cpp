#include "engine/staging.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace cairn::engine {

status staging_pool::reserve(size_t slot_bytes, int slots) {
  std::unique_lock lk(mu_);
  if (slot_bytes > slot_bytes_) {
    // Every slot must be free here: the caller drained the engine.
    cv_.wait(lk, [&] { return free_.size() == all_.size(); });
    all_.clear();
    free_.clear();
    slot_bytes_ = slot_bytes;
  }
  while (static_cast<int>(all_.size()) < slots) {
    auto buf = aligned_buffer::allocate(slot_bytes_);
    if (!buf) return buf.take_status();
    all_.push_back(std::make_unique<aligned_buffer>(std::move(buf).value()));
    free_.push_back(all_.back().get());
  }
  return {};
}

aligned_buffer* staging_pool::acquire(bool wait) {
  std::unique_lock lk(mu_);
  if (free_.empty()) {
    if (!wait) return nullptr;
    cv_.wait(lk, [&] { return !free_.empty(); });
  }
  aligned_buffer* b = free_.back();
  free_.pop_back();
  return b;
}

void staging_pool::release(aligned_buffer* slot) {
  {
    std::lock_guard lk(mu_);
    free_.push_back(slot);
  }
  cv_.notify_all();
}

bool staging_pool::has_free() {
  std::lock_guard lk(mu_);
  return !free_.empty();
}

int staging_pool::slots() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(all_.size());
}

}  // namespace cairn::engine

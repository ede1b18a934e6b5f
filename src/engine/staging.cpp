#include "engine/staging.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace cairn::engine {

result<aligned_buffer> aligned_buffer::allocate(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size = (size + page - 1) / page * page;
  if (size == 0) size = page;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return status(errc::no_space, "cannot map " + std::to_string(size) + " bytes of staging memory: " +
                                      std::strerror(errno) + " (lower staging_limit or the checkpoint size)");
  }
  // Transparent huge pages cut TLB misses during capture; advisory only.
  (void)madvise(p, size, MADV_HUGEPAGE);
  // Touch every page now, so that captures never pay for page faults.
  auto* b = static_cast<volatile char*>(p);
  for (size_t off = 0; off < size; off += page) b[off] = 0;
  aligned_buffer buf;
  buf.data_ = static_cast<std::byte*>(p);
  buf.size_ = size;
  return buf;
}

aligned_buffer::~aligned_buffer() {
  if (data_) munmap(data_, size_);
}

aligned_buffer& aligned_buffer::operator=(aligned_buffer&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

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

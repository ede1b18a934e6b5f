#include "util/aligned_buffer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace cairn::util {

result<aligned_buffer> aligned_buffer::allocate(size_t size, bool touch) {
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
  if (touch) {
    auto* b = static_cast<volatile char*>(p);
    for (size_t off = 0; off < size; off += page) b[off] = 0;
  }
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

}  // namespace cairn::util

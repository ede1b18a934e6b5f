#include "util/aligned_buffer.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "util/clock.hpp"

namespace cairn::util {

namespace {

std::atomic<uint64_t> next_id{1};
std::atomic<bool> huge_pays{true};

size_t round_to_pages(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size = (size + page - 1) / page * page;
  return size == 0 ? page : size;
}

status no_memory(size_t size) {
  return status(errc::no_space, "cannot map " + std::to_string(size) + " bytes of staging memory: " +
                                    std::strerror(errno) + " (lower staging_limit or the checkpoint size)");
}

// Seconds to fault in `bytes` of fresh anonymous memory, with or without
// huge pages (a mapping aligned to them); -1 if it cannot be mapped.
double fault_in_s(size_t bytes, bool huge) {
  constexpr size_t kHuge = size_t{2} << 20;
  void* m = mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return -1;
  auto* p = reinterpret_cast<volatile char*>((reinterpret_cast<uintptr_t>(m) + kHuge - 1) / kHuge * kHuge);
  (void)madvise(const_cast<char*>(p), bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const double t0 = now_s();
  for (size_t off = 0; off < bytes; off += page) p[off] = 1;
  const double s = now_s() - t0;
  munmap(m, bytes + kHuge);
  return s;
}

}  // namespace

void learn_page_cost() {
  static std::once_flag once;
  std::call_once(once, [] {
    constexpr size_t kProbe = size_t{4} << 20;
    const double small = fault_in_s(kProbe, false), huge = fault_in_s(kProbe, true);
    // Twice the small pages' cost still counts as paying: the TLB gains.
    if (small > 0 && huge > 0 && huge > 2 * small) huge_pays = false;
  });
}

bool huge_pages_pay() { return huge_pays.load(std::memory_order_relaxed); }

void fresh_pages_written(std::byte* p, size_t bytes, double seconds, std::byte* end) {
  // Small pages fault in at 0.1-0.4 ms per MiB; huge ones at well under
  // that, except where the host backs each again (1.2-2.4 ms per MiB).
  constexpr double kSlowPerMiB = 1e-3;
  if (bytes < (size_t{256} << 10) || seconds * double(1 << 20) <= kSlowPerMiB * double(bytes) ||
      !huge_pays.exchange(false, std::memory_order_relaxed))
    return;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t from = (reinterpret_cast<uintptr_t>(p + bytes) + kHuge - 1) / kHuge * kHuge;
  if (from < reinterpret_cast<uintptr_t>(end))
    (void)madvise(reinterpret_cast<void*>(from), reinterpret_cast<uintptr_t>(end) - from, MADV_NOHUGEPAGE);
}

result<aligned_buffer> aligned_buffer::allocate_shared(size_t size, bool touch) {
  size = round_to_pages(size);
  int fd = memfd_create("cairn-staging", MFD_CLOEXEC);
  if (fd < 0) return no_memory(size);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return no_memory(size);
  }
  auto buf = map_shared(fd, size);
  if (buf && touch) buf->touch(0, size);
  return buf;
}

result<aligned_buffer> aligned_buffer::map_shared(int fd, size_t size) {
  // A mapping beyond the file's end would fault (SIGBUS) at the first touch:
  // the descriptor must be a file of at least that size.
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || size == 0 || static_cast<uint64_t>(st.st_size) < size) {
    close(fd);
    return status(errc::invalid_argument, "shared memory of " + std::to_string(size) +
                                              " bytes: the descriptor is not a file of that size");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    errno = e;
    return no_memory(size);
  }
  // Huge pages for shared memory where the node allows it
  // (transparent_hugepage/shmem_enabled = advise) and they pay; advisory only.
  if (huge_pages_pay()) (void)madvise(p, size, MADV_HUGEPAGE);
  aligned_buffer buf;
  buf.data_ = static_cast<std::byte*>(p);
  buf.size_ = size;
  buf.fd_ = fd;
  buf.id_ = next_id.fetch_add(1);
  return buf;
}

result<aligned_buffer> aligned_buffer::allocate(size_t size, bool touch) {
  size = round_to_pages(size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return no_memory(size);
  // Transparent huge pages cut TLB misses and faults where they pay; advisory only.
  if (huge_pages_pay()) (void)madvise(p, size, MADV_HUGEPAGE);
  aligned_buffer buf;
  buf.data_ = static_cast<std::byte*>(p);
  buf.size_ = size;
  buf.id_ = next_id.fetch_add(1);
  // Touch every page now, so that captures never pay for page faults.
  if (touch) buf.touch(0, size);
  return buf;
}

void aligned_buffer::touch(size_t from, size_t to) const {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  constexpr size_t kPiece = size_t{2} << 20;  // timed apart (fresh_pages_written)
  auto* b = reinterpret_cast<volatile char*>(data_);
  to = std::min(to, size_);
  for (size_t at = from / page * page; at < to;) {
    const size_t end = std::min(to, at + kPiece);
    const double t0 = now_s();
    for (size_t off = at; off < end; off += page) b[off] = 0;
    fresh_pages_written(data_ + at, end - at, now_s() - t0, data_ + size_);
    at = end;
  }
}

aligned_buffer::~aligned_buffer() {
  if (data_) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

aligned_buffer& aligned_buffer::operator=(aligned_buffer&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, size_);
    if (fd_ >= 0) close(fd_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    fd_ = std::exchange(o.fd_, -1);
    id_ = std::exchange(o.id_, 0);
  }
  return *this;
}

}  // namespace cairn::util

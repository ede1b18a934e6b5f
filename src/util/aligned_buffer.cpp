#include "util/aligned_buffer.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace cairn::util {

namespace {

std::atomic<uint64_t> next_id{1};

size_t round_to_pages(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size = (size + page - 1) / page * page;
  return size == 0 ? page : size;
}

status no_memory(size_t size) {
  return status(errc::no_space, "cannot map " + std::to_string(size) + " bytes of staging memory: " +
                                    std::strerror(errno) + " (lower staging_limit or the checkpoint size)");
}

}  // namespace

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
  // (transparent_hugepage/shmem_enabled = advise); advisory only.
  (void)madvise(p, size, MADV_HUGEPAGE);
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
  // Transparent huge pages cut TLB misses during capture; advisory only.
  (void)madvise(p, size, MADV_HUGEPAGE);
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
  auto* b = reinterpret_cast<volatile char*>(data_);
  for (size_t off = from / page * page; off < std::min(to, size_); off += page) b[off] = 0;
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

// Page-aligned memory for shard images: staging slots (engine), images read
// back from shard files (format), images an agent holds. Aligned so that the
// image can be written or read with O_DIRECT. A shared buffer is a memfd
// mapping that another process (the node daemon, cairnd) maps too.
#ifndef CAIRN_UTIL_ALIGNED_BUFFER_HPP
#define CAIRN_UTIL_ALIGNED_BUFFER_HPP

#include <cstddef>
#include <cstdint>
#include <span>

#include "cairn/status.hpp"

namespace cairn::util {

// A page-aligned anonymous mapping (move-only).
class aligned_buffer {
 public:
  aligned_buffer() = default;
  // Maps `size` bytes (rounded to pages, zero-filled) and, with `touch`,
  // touches every page so later copies do not fault (without it, only the
  // pages written use memory). no_space when the memory cannot be mapped.
  static result<aligned_buffer> allocate(size_t size, bool touch = true);
  // The same in shared memory (memfd_create): fd() can be handed to another
  // process, which maps the same pages with map_shared().
  static result<aligned_buffer> allocate_shared(size_t size, bool touch = true);
  // Maps `size` bytes of the shared memory file `fd` (taken over: closed with
  // the buffer).
  static result<aligned_buffer> map_shared(int fd, size_t size);
  ~aligned_buffer();
  aligned_buffer(aligned_buffer&& o) noexcept { *this = std::move(o); }
  aligned_buffer& operator=(aligned_buffer&& o) noexcept;
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }
  // Faults in every page of [from, to) by writing a zero to its first byte:
  // allocate's `touch`, for a caller that does it in pieces. Only for memory
  // not yet written.
  void touch(size_t from, size_t to) const;
  // The shared memory file, -1 for a private buffer.
  int fd() const { return fd_; }
  // Unique within the process for the buffer's lifetime (never reused), so
  // a peer can tell buffers apart where addresses are reused.
  uint64_t id() const { return id_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  uint64_t id_ = 0;
};

}  // namespace cairn::util

#endif

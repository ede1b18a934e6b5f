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

// Whether buffers ask for transparent huge pages (madvise MADV_HUGEPAGE):
// only where a fresh huge page costs this node no more than the small pages
// it replaces. On bare metal it costs less (one fault instead of 512); on a
// virtual machine whose host takes back free huge-page-sized blocks, each one
// is backed again by the host at first touch (on the development VM, 2.4-4.7
// ms per 2 MiB against 0.7 ms for 512 small pages, while a copy into either
// runs at the same speed). Learnt from the memory cairn faults in:
// learn_page_cost() compares both once (4 MiB each; the client runs it on an
// engine thread at init), and fresh_pages_written() hears how long the first
// writes into fresh memory took; huge pages that turned out slower stay off
// for the rest of that memory and for every buffer mapped later.
void learn_page_cost();
bool huge_pages_pay();
// `seconds` were spent writing [p, p + bytes) for the first time (faulting it
// in), in memory that ends at `end`. Lock-free and allocation-free (the
// copy-on-write thread calls it).
void fresh_pages_written(std::byte* p, size_t bytes, double seconds, std::byte* end);

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

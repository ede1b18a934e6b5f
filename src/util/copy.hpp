// Copies of large buffers at the memory's speed.
#ifndef CAIRN_UTIL_COPY_HPP
#define CAIRN_UTIL_COPY_HPP

#include <cstddef>
#include <cstdint>

namespace cairn::util {

// memcpy for large copies whose destination is not read again soon (a
// staging slot, a restored region): non-temporal stores, which skip the
// read-for-ownership of each destination line and do not evict the cache.
// glibc's memcpy switches to them only above a threshold tied to the shared
// cache (between 64 and 256 MiB on this EPYC), so below it moves a third
// more memory traffic: 512 MiB in 40 against 26 ms here (docs/benchmarks.md,
// "Issue 11, session 7").
// Below 1 MiB, and on CPUs without SSE2, it is memcpy. The regions must not
// overlap.
void stream_copy(void* dst, const void* src, size_t len);

// stream_copy at any size: for one piece of a large copy made in pieces (a
// region restored through a cache-sized buffer), whose destination as a
// whole is not read again soon.
void stream_copy_piece(void* dst, const void* src, size_t len);

// Whether the kernel's copy into `dst` of bytes that lie at `src_offset`
// modulo a page (read(2) from the page cache, process_vm_readv) is slow:
// its `rep movsb` runs 2-3.5x slower when the destination is 1 to 63 bytes
// past the source modulo 4096 (the CPU compares only the addresses' low 12
// bits), which is where malloc's and numpy's large blocks start (16 bytes
// past a page) against data that starts on one. Measured on this EPYC,
// `pread` of 64 MiB from tmpfs: 33-40 ms at 1-31 bytes past, 15-18 ms at
// every other distance (docs/design/verified-restart.md).
inline bool kernel_copy_slow(const void* dst, uint64_t src_offset) {
  const uint64_t distance = (reinterpret_cast<uintptr_t>(dst) - src_offset) % 4096;
  return distance >= 1 && distance <= 63;
}

}  // namespace cairn::util

#endif

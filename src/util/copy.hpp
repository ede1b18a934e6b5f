// Copies of large buffers at the memory's speed.
#ifndef CAIRN_UTIL_COPY_HPP
#define CAIRN_UTIL_COPY_HPP

#include <cstddef>

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

}  // namespace cairn::util

#endif

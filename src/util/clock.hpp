#ifndef CAIRN_UTIL_CLOCK_HPP
#define CAIRN_UTIL_CLOCK_HPP

#include <chrono>
#include <cstdint>

namespace cairn::util {

// Seconds on a monotonic clock (durations).
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// Seconds since the Unix epoch (timestamps recorded on disk).
inline double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace cairn::util

#endif

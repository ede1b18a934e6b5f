// How far one thread has made a buffer ready, for threads that follow it.
#ifndef CAIRN_UTIL_PROGRESS_HPP
#define CAIRN_UTIL_PROGRESS_HPP

#include <algorithm>
#include <cstdint>
#include "util/mutex.hpp"

namespace cairn::util {

// Bytes [0, n) of a buffer are ready, n growing: the application thread
// copying a checkpoint image (the persistent write follows it), a reader
// filling a restart image (the verification follows it). Starts ended with
// nothing ready.
class byte_progress {
 public:
  void start() {
    cairn::lock_guard lk(mu_);
    bytes_ = 0;
    ended_ = false;
  }
  // Never moves back: a late publish of less (engine::captured's of the
  // file size after the capture published its own end) changes nothing.
  void publish(uint64_t bytes) {
    {
      cairn::lock_guard lk(mu_);
      bytes_ = std::max(bytes_, bytes);
    }
    cv_.notify_one();
  }
  // No more will be ready than is now (complete, or stopped by an error).
  void end() {
    {
      cairn::lock_guard lk(mu_);
      ended_ = true;
    }
    cv_.notify_all();
  }
  bool ended() {
    cairn::lock_guard lk(mu_);
    return ended_;
  }
  // Blocks until more than `past` bytes are ready or it ended; returns the
  // bytes ready (not more than `past` only when it ended there).
  uint64_t wait_past(uint64_t past) {
    cairn::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return ended_ || bytes_ > past; });
    return bytes_;
  }

 private:
  cairn::mutex mu_;
  cairn::condition_variable cv_;
  uint64_t bytes_ = 0;
  bool ended_ = true;
};

}  // namespace cairn::util

#endif

// Staging memory (level L0): page-aligned, pre-faulted buffers reused across
// versions. A slot holds one shard image laid out exactly as the shard file, so
// capture is one memcpy per region and every level writes the slot as is.
// Thread-safety: all methods may be called from any thread.
#ifndef CAIRN_ENGINE_STAGING_HPP
#define CAIRN_ENGINE_STAGING_HPP

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "cairn/status.hpp"
#include "util/aligned_buffer.hpp"

namespace cairn::engine {

// A page-aligned anonymous mapping (move-only); see util/aligned_buffer.hpp.
using aligned_buffer = util::aligned_buffer;

class staging_pool {
 public:
  // Slots of at least slot_bytes each; `slots` of them.
  staging_pool() = default;

  // Slots allocated from now on are shared memory (aligned_buffer::
  // allocate_shared) that the node daemon maps. Call before the first reserve.
  void set_shared(bool shared);

  // (Re)sizes the pool: frees slots smaller than slot_bytes (only when free:
  // waits for them, or with `wait` false returns without change) and
  // allocates up to `slots` slots. Fails with no_space when memory cannot be
  // mapped. The client calls it for a larger layout only with the engine
  // idle, so that no slot it waits for belongs to a job still queued.
  status reserve(size_t slot_bytes, int slots, bool wait = true);
  // reserve() ahead of need (from an engine task): does nothing when slots of
  // need_bytes are there already, or when it would have to wait for a slot in
  // use; else reserves slots of slot_bytes (>= need_bytes, with room to spare).
  status try_reserve(size_t need_bytes, size_t slot_bytes, int slots);

  // Returns a free slot; blocks when `wait` is true, else returns nullptr.
  aligned_buffer* acquire(bool wait);
  void release(aligned_buffer* slot);
  bool has_free();
  size_t slot_bytes() const;
  int slots() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<aligned_buffer>> all_;  // GUARDED_BY(mu_)
  std::vector<aligned_buffer*> free_;                 // GUARDED_BY(mu_)
  size_t slot_bytes_ = 0;                             // GUARDED_BY(mu_)
  bool shared_ = false;                               // GUARDED_BY(mu_)
};

}  // namespace cairn::engine

#endif

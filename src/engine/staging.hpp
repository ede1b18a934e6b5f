// Staging memory (level L0): page-aligned, pre-faulted buffers reused across
// versions. A slot holds one shard image laid out exactly as the shard file, so
// capture is one memcpy per region and every level writes the slot as is.
// Thread-safety: all methods may be called from any thread.
#ifndef CAIRN_ENGINE_STAGING_HPP
#define CAIRN_ENGINE_STAGING_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cairn/status.hpp"
#include "util/aligned_buffer.hpp"
#include "util/mutex.hpp"

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
  // Called with a slot's id when the pool drops it (a larger slot replaced
  // it), under the pool's lock: the node daemon unmaps its copy.
  void set_on_drop(std::function<void(uint64_t id)> f);

  // (Re)sizes the pool: frees slots smaller than slot_bytes (only when free:
  // waits for them, or with `wait` false returns without change) and
  // allocates up to `slots` slots. Fails with no_space when memory cannot be
  // mapped. The client calls it for a larger layout only with the engine
  // idle when a slot is in use, so that no slot it waits for belongs to a
  // job still queued.
  // With `touch` false the slots may be handed out before their memory is
  // faulted in (a copy-on-write capture, whose background copy faults it
  // in): they are mapped only, and a slot being made ahead stops touching.
  status reserve(size_t slot_bytes, int slots, bool wait = true, bool touch = true);
  // A reserve finds slots that another reserve is making and that would
  // serve it: it waits for them (or, with `wait` false, returns) rather than
  // make more.
  // reserve() ahead of need (from an engine task): does nothing when slots of
  // need_bytes are there already, or when it would have to wait for a slot in
  // use; else reserves slots of slot_bytes (>= need_bytes, with room to
  // spare), or more slots of the pool's size when those hold need_bytes.
  // It faults the memory in by pieces and stops between them while paused.
  status try_reserve(size_t need_bytes, size_t slot_bytes, int slots);
  // While paused (counted: each pause needs a resume), slots made ahead of
  // need stop growing, unless a reserve is waiting for them: a restart wants
  // the memory bandwidth and the CPU they would take.
  void pause();
  void resume();
  // Slots made ahead of need do not start (their memory is not touched)
  // before `until`, unless a reserve is waiting for them; a later call
  // moves the time (a past one lets them go at once). The client leaves a
  // restart that may come the memory first: the images it reads and the
  // application's regions it fills then take the pages the slots would.
  void defer_until(std::chrono::steady_clock::time_point until);
  // Slots being made ahead of need are dropped at their next piece, and no
  // more are made ahead (finalize: nothing will use them).
  void stop_ahead();
  // Waits until slots may be made ahead: the time defer_until set has passed
  // (moved by later calls while it waits) and the pool is not paused. Returns
  // at once while a reserve waits for slots; false once stop_ahead was
  // called. The maker learns how large a slot to make after it.
  bool wait_ahead();

  // Takes `buf`, memory already faulted in that its owner is done with (a
  // restart's image), as a free slot when the pool has fewer than `slots`
  // slots and buf is at least as large as theirs (any size when the pool is
  // empty): the next capture finds its slot made. Returns whether it took it
  // (never for a shared pool: the daemon maps only slots it was told of).
  bool adopt(aligned_buffer buf, int slots);
  // Returns a free slot; blocks when `wait` is true, else returns nullptr.
  aligned_buffer* acquire(bool wait);
  void release(aligned_buffer* slot);
  bool has_free();
  // Whether a slot is acquired and not released yet (a version holds it).
  bool in_use() const;
  size_t slot_bytes() const;
  int slots() const;

 private:
  mutable cairn::mutex mu_;
  cairn::condition_variable cv_;
  std::vector<std::unique_ptr<aligned_buffer>> all_ CAIRN_GUARDED_BY(mu_);
  std::vector<aligned_buffer*> free_ CAIRN_GUARDED_BY(mu_);
  status make(size_t slot_bytes, int slots, bool wait, bool ahead, bool touch);

  size_t slot_bytes_ CAIRN_GUARDED_BY(mu_) = 0;
  bool shared_ CAIRN_GUARDED_BY(mu_) = false;
  std::function<void(uint64_t)> on_drop_ CAIRN_GUARDED_BY(mu_);
  std::vector<size_t> making_ CAIRN_GUARDED_BY(mu_);  // sizes of the slots being made
  int waiting_ CAIRN_GUARDED_BY(mu_) = 0;  // reserves waiting for them
  int hurried_ CAIRN_GUARDED_BY(mu_) = 0;  // those of them that need no touched memory
  int paused_ CAIRN_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point deferred_until_ CAIRN_GUARDED_BY(mu_);
  bool ahead_stopped_ CAIRN_GUARDED_BY(mu_) = false;
};

// staging_pool::pause for the lifetime of the object.
class staging_pause {
 public:
  explicit staging_pause(staging_pool& pool) : pool_(pool) { pool_.pause(); }
  ~staging_pause() { pool_.resume(); }
  staging_pause(const staging_pause&) = delete;
  staging_pause& operator=(const staging_pause&) = delete;

 private:
  staging_pool& pool_;
};

}  // namespace cairn::engine

#endif

// A mutex, its scoped locks and a condition variable that clang's thread-safety
// analysis understands (-Wthread-safety, an error in clang builds). Fields a mutex
// guards say so with CAIRN_GUARDED_BY(mu_); functions that expect it held say
// CAIRN_REQUIRES(mu_), functions that take it themselves CAIRN_EXCLUDES(mu_). The
// annotations compile to nothing under GCC. std::mutex carries no annotations in
// libstdc++, hence the wrappers; they add no state and no call.
//
// A predicate given to condition_variable::wait runs with the lock held; a lambda
// that reads guarded fields says so: [&]() CAIRN_REQUIRES(mu_) { return ready_; }.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define CAIRN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CAIRN_THREAD_ANNOTATION(x)
#endif

#define CAIRN_CAPABILITY(x) CAIRN_THREAD_ANNOTATION(capability(x))
#define CAIRN_SCOPED_CAPABILITY CAIRN_THREAD_ANNOTATION(scoped_lockable)
#define CAIRN_GUARDED_BY(x) CAIRN_THREAD_ANNOTATION(guarded_by(x))
#define CAIRN_PT_GUARDED_BY(x) CAIRN_THREAD_ANNOTATION(pt_guarded_by(x))
#define CAIRN_REQUIRES(...) CAIRN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define CAIRN_EXCLUDES(...) CAIRN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define CAIRN_ACQUIRE(...) CAIRN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define CAIRN_RELEASE(...) CAIRN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define CAIRN_RETURN_CAPABILITY(x) CAIRN_THREAD_ANNOTATION(lock_returned(x))
// For the few functions the analysis cannot follow; say why next to each use.
#define CAIRN_NO_THREAD_SAFETY_ANALYSIS CAIRN_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace cairn {

class CAIRN_CAPABILITY("mutex") mutex {
 public:
  void lock() CAIRN_ACQUIRE() { m_.lock(); }
  void unlock() CAIRN_RELEASE() { m_.unlock(); }
  std::mutex& native() { return m_; }

 private:
  std::mutex m_;
};

// Holds the mutex for its scope (std::lock_guard).
class CAIRN_SCOPED_CAPABILITY lock_guard {
 public:
  explicit lock_guard(mutex& m) CAIRN_ACQUIRE(m) : m_(m) { m_.lock(); }
  ~lock_guard() CAIRN_RELEASE() { m_.unlock(); }
  lock_guard(const lock_guard&) = delete;
  lock_guard& operator=(const lock_guard&) = delete;

 private:
  mutex& m_;
};

// Holds the mutex from construction; unlock()/lock() in between, and waits on a
// condition_variable (std::unique_lock).
class CAIRN_SCOPED_CAPABILITY unique_lock {
 public:
  explicit unique_lock(mutex& m) CAIRN_ACQUIRE(m) : lk_(m.native()) {}
  ~unique_lock() CAIRN_RELEASE() {}
  void lock() CAIRN_ACQUIRE() { lk_.lock(); }
  void unlock() CAIRN_RELEASE() { lk_.unlock(); }
  std::unique_lock<std::mutex>& native() { return lk_; }

 private:
  std::unique_lock<std::mutex> lk_;
};

// std::condition_variable over a cairn::unique_lock. The waits release and retake
// the lock inside, which the analysis does not see: it is held before and after.
class condition_variable {
 public:
  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }
  void wait(unique_lock& lk) { cv_.wait(lk.native()); }
  // The predicate is called with the lock held (annotated on the lambda), which
  // the analysis cannot tie to `lk` inside this template.
  template <class Pred>
  void wait(unique_lock& lk, Pred pred) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    cv_.wait(lk.native(), std::move(pred));
  }
  template <class Rep, class Period>
  std::cv_status wait_for(unique_lock& lk, const std::chrono::duration<Rep, Period>& d) {
    return cv_.wait_for(lk.native(), d);
  }
  template <class Rep, class Period, class Pred>
  bool wait_for(unique_lock& lk, const std::chrono::duration<Rep, Period>& d, Pred pred)
      CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_for(lk.native(), d, std::move(pred));
  }

 private:
  std::condition_variable cv_;
};

}  // namespace cairn

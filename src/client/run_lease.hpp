// One writer per run (docs/design/run-identity.md, "The lease"): the file
// runs/<run>/RUN.lease at the persistent level names the execution that
// writes the run. Rank 0 takes it at init and a thread of its renews it; a
// second execution of the run is refused (CAIRN_EBUSY) while the holder
// lives. Raw POSIX calls on the store's path: the lease is the store's
// metadata, not data that passes through the levels' envs.
// Thread-safety: acquire and release on one thread; the renewal thread is
// internal.
#ifndef CAIRN_CLIENT_RUN_LEASE_HPP
#define CAIRN_CLIENT_RUN_LEASE_HPP

#include <memory>
#include <string>
#include <thread>

#include "cairn/status.hpp"
#include "util/mutex.hpp"

namespace cairn {

inline constexpr const char* kLeaseFileName = "RUN.lease";

// Who holds a lease (its JSON content).
struct lease_holder {
  std::string id;       // unique per execution
  std::string host;
  int pid = 0;
  std::string job, step;  // Slurm's, empty outside a job
  std::string program;
  double started_at = 0;
  std::string describe() const;
};

// What a run's lease says, judged at once (no waiting): free (no lease),
// live (a holder alive on this host, or one elsewhere that renewed it within
// timeout_s), abandoned (known dead, or not renewed for timeout_s). For tools
// that clean up after runs (cairn gc --scratch).
enum class lease_state { free, live, abandoned };
struct lease_probe {
  lease_state state = lease_state::free;
  lease_holder holder;  // when not free
  double silent_s = 0;  // since its last renewal, as seen here
};
result<lease_probe> probe_lease(const std::string& store, const std::string& run, double timeout_s);

class run_lease {
 public:
  // Takes `store`/runs/<run>/RUN.lease: at once when free, after moving aside
  // a holder that is dead (on this host with its pid gone, or of this job and
  // step) or silent for `timeout_s`; busy (naming the holder) while the
  // holder renews it. Prints on stderr while it waits.
  static result<std::unique_ptr<run_lease>> acquire(const std::string& store, const std::string& run,
                                                    double timeout_s);
  ~run_lease();  // stops renewing; call release() to give the run back
  run_lease(const run_lease&) = delete;
  run_lease& operator=(const run_lease&) = delete;
  // Removes the lease when it still names this execution.
  void release();
  const std::string& path() const { return path_; }

 private:
  run_lease(std::string path, lease_holder me, double timeout_s);
  void renew_loop();

  std::string path_;
  lease_holder me_;
  double timeout_s_;
  cairn::mutex mu_;
  cairn::condition_variable cv_;
  bool stop_ CAIRN_GUARDED_BY(mu_) = false;
  std::thread renewer_;
};

}  // namespace cairn

#endif

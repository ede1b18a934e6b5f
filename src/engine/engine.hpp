// The engine: runs every captured version through a graph of stages
// (checksum and hash trees -> {local, persistent}, and whatever the configuration
// adds), on worker threads ("thread" mode) or inline ("sync" mode), plus small
// tasks (manifest commit, catalog, retention) handed to it by the client.
//
// The graph: each stage runs once the stages it names as predecessors are done
// for that version, so the levels that only read the finished staging image
// (node-local write, persistent write) run concurrently when there are workers
// for them. Ordering: a stage processes versions in submission order (version
// n+1 enters a stage only after version n left it), so with several workers
// the stages also form a pipeline across versions. A stage item is queued only
// once it may run: no worker ever waits for a turn.
// Scheduling: normal tasks (the manifest commit) first, then ready stages,
// oldest version first, then low-priority tasks (catalog, retention), which
// run when nothing else is ready.
// Errors: a failing stage marks its level failed for the version, keeps the
// first error in the job, and latches it in the engine (take_error), unless it
// is `cancelled` (a consequence of another rank's failure, which that rank
// reports); an `essential` stage's failure skips the rest of the version.
// No engine thread calls MPI.
#ifndef CAIRN_ENGINE_ENGINE_HPP
#define CAIRN_ENGINE_ENGINE_HPP

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "aggregate/plan.hpp"
#include "cairn/status.hpp"
#include "engine/staging.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "util/config.hpp"
#include "util/cpu.hpp"
#include "util/mutex.hpp"
#include "util/progress.hpp"

namespace cairn::engine {

// The levels a version reaches, as bits (the values of cairn.h's
// CAIRN_LEVEL_*, which the C API checks they are).
inline constexpr unsigned kLevelCaptured = 0x1;    // in staging memory
inline constexpr unsigned kLevelLocal = 0x2;       // node-local directory
inline constexpr unsigned kLevelProtected = 0x4;   // survives the loss of nodes
inline constexpr unsigned kLevelPersistent = 0x8;  // shared directory, committed

// State a stage leaves for a later stage of the same version (the
// persistent write begun during the capture, finished after the checksum).
// Dropped when the job finishes, and with it what it still holds (an
// unfinished temporary file), e.g. when an essential stage failed.
struct stage_carry {
  virtual ~stage_carry() = default;
};

// One rank's part of one version as it moves through the stages.
struct version_job {
  format::shard_header header;     // layout; checksums filled by the checksum stage
  aligned_buffer* image = nullptr; // staging slot holding the shard image
  staging_pool* pool = nullptr;    // where the slot goes back when the job ends
  unsigned wanted = 0;             // kLevel* bits scheduled for this version
  uint64_t seq = 0;                // submission order (set by the engine)
  uint64_t daemon_id = 0;          // engine_host = daemon: its id on the rank's connection (0: not handed over)

  std::string tree_image;          // encoded hash trees (checksum stage), written beside the shard
  // The application thread's copy (bytes of the image captured, in order),
  // for stages that follow it (stage::follows_capture); complete unless the
  // job was submitted with capturing = true.
  util::byte_progress capture;
  // The capture publishes its progress in image order as it goes (the
  // application thread's copy), so stages that follow it start with it; a
  // capture that ends all at once (capture = cow) leaves it false.
  bool capture_streams = false;
  // Why a capture that ended in the background (capture = cow) is not
  // complete: the checksum stage fails the version with it. Written by
  // engine::captured before the capture ends.
  status capture_error;
  std::unique_ptr<stage_carry> carry;  // see stage_carry
  // agents_lend: per region (header.regions order), the application memory
  // that holds its bytes, lent until the version reaches kLevelCaptured
  // (the agents hold it, or lend_stage copied it into the image); null: the
  // region is in the image. Empty: every region is.
  std::vector<const std::byte*> lent;
  // Where region i's bytes are now.
  const std::byte* region_data(size_t i) const {
    return !lent.empty() && lent[i] ? lent[i] : image->data() + header.regions[i].offset;
  }

  // persistent_layout = aggregated: the version's plan (the same on every
  // rank), and where the stage put this rank's image (checksummed extents).
  std::shared_ptr<const aggregate::plan> plan;
  std::vector<format::image_extent> extents;
  // Set by the client when the version failed on some rank: a stage waiting
  // for other ranks (the leaders' exchange) gives up.
  std::atomic<bool> cancelled{false};
  // aggregate_strategy = mpiio: the write is a collective MPI-IO call, made on
  // the application thread (engine threads never call MPI). The stage sets 1
  // once the image is ready and waits; the client, in a later cairn call,
  // once every rank is ready, writes and sets 2, or -1 with collective_error
  // (written before the store).
  std::atomic<int> collective{0};
  status collective_error;

  // Timings (seconds; *_at are wall-clock timestamps).
  double captured_at = 0, capture_s = 0, checksum_s = 0, hash_s = 0, local_s = 0, persistent_s = 0,
         persistent_at = 0;
  double protected_at = 0;  // redundancy: when this rank's set was complete

  // The engine's own bookkeeping, guarded by engine::mu_ (not annotated: a job
  // does not know its engine, so the analysis cannot name that mutex): per stage,
  // 0 waiting, 1 queued or running, 2 ended; stages not yet ended; whether an
  // essential stage failed.
  std::vector<uint8_t> stage_state;
  size_t stages_left = 0;
  bool abandoned = false;
  bool capturing = false;  // only stages that follow the capture may start

  // Written by stages, read through engine::levels().
  unsigned done = 0;    // engine::mu_
  unsigned failed = 0;  // engine::mu_
  bool finished = false;  // engine::mu_: all stages ran or were skipped
  status error;         // engine::mu_: first failure of a latching stage
  status soft_error;    // engine::mu_: first failure of a stage that does not latch
};

class stage {
 public:
  virtual ~stage() = default;
  virtual const char* name() const = 0;
  // The kLevel* bit this stage completes, or 0.
  virtual unsigned level() const { return 0; }
  // The bits a successful run sets for `job`: level(), and for a stage that
  // ends a loan (agents_lend) also kLevelCaptured. A failure marks
  // only level() failed.
  virtual unsigned completes(const version_job& job) const {
    (void)job;
    return level();
  }
  // A failure of an essential stage abandons the version.
  virtual bool essential() const { return false; }
  // Whether a failure is latched (returned by the application's next call).
  // A stage whose failure only means "this level was not reached" (and a
  // later stage makes up for it) says no; the level is still marked failed.
  virtual bool latches() const { return true; }
  // Whether the job needs this stage (e.g. only every k-th version persistent).
  virtual bool applies(const version_job& job) const { return level() == 0 || (job.wanted & level()); }
  // Whether it may start while the application thread is still capturing
  // the image (engine::submit(job, true) of a job whose capture streams):
  // it reads only what job.capture says is captured.
  virtual bool follows_capture() const { return false; }
  virtual status run(version_job& job) = 0;
};

// The stages and who waits for whom. Stages are added in an order that is
// already topological: a stage can only wait for stages added before it.
class stage_graph {
 public:
  // Adds a stage that runs after the stage added last (a chain), or first.
  size_t add(std::unique_ptr<stage> s);
  // Adds a stage that runs once every stage in `after` is done (none: first).
  size_t add(std::unique_ptr<stage> s, std::vector<size_t> after);
  size_t size() const { return stages_.size(); }

 private:
  friend class engine;
  std::vector<std::unique_ptr<stage>> stages_;
  std::vector<std::vector<size_t>> after_;
};

enum class task_priority {
  normal,  // before stage work that is ready later (the manifest commit)
  low,     // when no stage work is ready (catalog, retention)
};

class engine {
 public:
  // setup: where worker threads may run and how they are scheduled (best
  // effort: a refused setting leaves the thread as it was).
  engine(engine_mode mode, int threads, util::thread_setup setup, stage_graph graph);
  // A chain of stages, each after the one before.
  engine(engine_mode mode, int threads, util::thread_setup setup, std::vector<std::unique_ptr<stage>> stages);
  ~engine();  // shutdown(false)
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Queues a captured job (thread mode) or runs it to the end (sync mode).
  // The job's image slot returns to job->pool when the job finishes.
  // capturing (thread mode only): the caller is still copying the image and
  // publishes its progress in job->capture; only stages that follow the
  // capture start before captured(job).
  void submit(std::shared_ptr<version_job> job, bool capturing = false);
  // The capture of a job submitted with capturing = true is over: complete
  // (kLevelCaptured done, unless regions are lent), or failed with `error`
  // (the version fails at its checksum stage). Any thread.
  void captured(version_job& job, status error = {});
  // Queues a task (thread mode; tasks of one priority run in submission
  // order) or runs it now (sync mode). A failing task's status is latched.
  void submit_task(std::function<status()> task, task_priority priority = task_priority::normal);

  // Levels done / failed so far for a job, and whether all its stages ended.
  void levels(const version_job& job, unsigned* done, unsigned* failed, bool* finished, status* error = nullptr,
              status* soft_error = nullptr);
  // Blocks until the job has resolved (done or failed) every bit of `mask` that
  // it wants, or finished.
  void wait_levels(const version_job& job, unsigned mask);
  // Blocks until no job or task is queued or running.
  void wait_idle();

  // The latched background error (and clears it), ok if none.
  status take_error();
  bool has_error();

  // Stops the workers. drain = finish everything queued; otherwise queued jobs
  // are dropped (marked failed with cancelled) and running ones finish.
  void shutdown(bool drain);

 private:
  struct ready_stage {
    std::shared_ptr<version_job> job;
    size_t stage;
  };
  void worker_main(const util::thread_setup& setup);
  // Marks every stage of the active jobs that may start now: queued in ready_
  // (or, for a stage that does not apply, ended at once). Returns the jobs that
  // finished (their slots are released by the caller, outside mu_).
  std::vector<std::shared_ptr<version_job>> schedule() CAIRN_REQUIRES(mu_);
  // Ends stage i of the job: records the outcome.
  void end_stage(version_job& job, size_t i, bool ran, const status& st) CAIRN_REQUIRES(mu_);
  void run_stage(version_job& job, size_t i) CAIRN_EXCLUDES(mu_);  // runs it, then ends it
  void run_task(const std::function<status()>& task) CAIRN_EXCLUDES(mu_);
  void release_slots(std::vector<std::shared_ptr<version_job>> finished) CAIRN_EXCLUDES(mu_);
  // Whether the caller should wake a worker (notify_one after releasing mu_):
  // work is queued, a worker is idle, and no wake-up is in flight already.
  bool claim_wake() CAIRN_REQUIRES(mu_);
  bool has_work() const CAIRN_REQUIRES(mu_) { return !tasks_.empty() || !ready_.empty() || !low_tasks_.empty(); }
  void latch(const status& st) CAIRN_REQUIRES(mu_);

  const engine_mode mode_;
  std::vector<std::unique_ptr<stage>> stages_;
  std::vector<std::vector<size_t>> after_;

  cairn::mutex mu_;
  cairn::condition_variable work_cv_;   // workers: something was queued (or stopping)
  cairn::condition_variable state_cv_;  // waiters: a stage, job or worker ended
  std::deque<std::shared_ptr<version_job>> active_ CAIRN_GUARDED_BY(mu_);  // submitted, not finished, by seq
  std::deque<ready_stage> ready_ CAIRN_GUARDED_BY(mu_);                    // may run now
  std::deque<std::function<status()>> tasks_ CAIRN_GUARDED_BY(mu_), low_tasks_ CAIRN_GUARDED_BY(mu_);
  std::vector<uint64_t> stage_next_ CAIRN_GUARDED_BY(mu_);  // next seq allowed into stage i
  uint64_t next_seq_ CAIRN_GUARDED_BY(mu_) = 0;
  int running_ CAIRN_GUARDED_BY(mu_) = 0;
  int idle_ CAIRN_GUARDED_BY(mu_) = 0;                 // workers waiting for work
  bool wake_pending_ CAIRN_GUARDED_BY(mu_) = false;    // a worker was notified and has not woken yet
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  status error_ CAIRN_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace cairn::engine

#endif

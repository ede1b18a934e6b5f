// client_impl: the application side of cairn (region registry, capture,
// progress protocol, restart, file mode). One per cairn handle; used by one
// application thread at a time. See docs/design/core.md.
#ifndef CAIRN_CLIENT_CLIENT_HPP
#define CAIRN_CLIENT_CLIENT_HPP

#include <atomic>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analytics/online_stage.hpp"
#include "client/levels.hpp"
#include "client/version_record.hpp"
#include "cairn.h"
#include "cairn/status.hpp"
#include "comm/comm.hpp"
#include "engine/cow.hpp"
#include "engine/engine.hpp"
#include "engine/recycler.hpp"
#include "engine/staging.hpp"
#include "engine/stages.hpp"
#include "format/manifest.hpp"
#include "format/run_info.hpp"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "history/catalog.hpp"
#include "history/metrics.hpp"
#include "storage/storage_env.hpp"
#include "util/config.hpp"
#include "util/mutex.hpp"

namespace cairn {

struct region {
  std::string name;
  void* ptr = nullptr;
  uint64_t count = 0;
  uint8_t type = 0;
  std::vector<uint64_t> dims;
  bool column_major = false;
  // Global layout (cairn_protect_block): empty unless declared.
  std::vector<uint64_t> global, start;
  // Memory selection: the buffer has shape mem_shape and the block starts at
  // mem_start in it (halos around it are not state). Empty = contiguous block.
  std::vector<uint64_t> mem_shape, mem_start;
};

// Copies a block of `dims` elements between a contiguous buffer and a larger
// buffer of shape mem_shape at mem_start (row-major; the caller reverses the
// vectors for column-major data). to_contiguous selects the direction.
void copy_block(std::byte* contiguous, std::byte* memory, size_t elem, const std::vector<uint64_t>& dims,
                const std::vector<uint64_t>& mem_shape, const std::vector<uint64_t>& mem_start, bool to_contiguous);

class run_lease;

// A region's block shape in row-major order (reversed for column-major regions).
std::vector<uint64_t> row_major_dims(const region& r);

// Checks a region or checkpoint name (1..255 bytes, no '/').
status check_name(const std::string& what, const std::string& name);

// The client is the host of its levels (level.hpp): they reach it through
// level_host alone.
class client_impl final : private level_host {
 public:
  // Takes ownership of comm. Collective.
  static result<std::unique_ptr<client_impl>> create(std::unique_ptr<comm::communicator> comm,
                                                     const std::string& config_path);
  ~client_impl();

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  const config& cfg() const override { return cfg_; }

  status protect(region r);
  status unprotect(const std::string& name);
  status checkpoint(const std::string& name, int64_t version);
  result<unsigned> test(const std::string& name, int64_t version);
  status wait(const std::string& name, int64_t version, unsigned level);
  // max_version >= 0: the newest restartable version at or below it.
  result<int64_t> restart_test(const std::string& name, int64_t max_version = -1);
  status restart(const std::string& name, int64_t version);
  // Collective: floor_of(name) (-1: none).
  result<int64_t> committed_newest(const std::string& name);
  status restore(const std::string& name, int64_t version);  // restart, without preparing staging
  status finalize(bool wait_for_pending);

  // Remote checkpoint agents: applies the controller's pending change of this
  // application's agents; returns CAIRN_AGENTS_*. Collective.
  result<int> probe();

  // Online comparison: what every rank agreed on at the last collective call.
  status divergence(cairn_divergence_t* info);

  // Batch jobs (docs/design/core.md, "Batch jobs"). Collective: true on every
  // rank when some rank received a warning signal since the last checkpoint,
  // or the agreed time left is below the time to reach the persistent level
  // (deadline_factor x the last measured, plus deadline_margin) and no
  // checkpoint was taken since that became true. One progress round.
  result<bool> should_checkpoint();
  // Local: seconds until the job's end (deadline or SLURM_JOB_END_TIME);
  // HUGE_VAL when unknown.
  double time_left() const;
  // The last measured time from capture to the commit of a version at the
  // persistent level, as agreed at the last collective call (0: none yet).
  double time_to_durable() const { return agreed_durable_s_; }

  // cairn_advice (docs/design/advise.md): Daly's and Young's intervals from
  // this rank's measured cost per finished checkpoint and cfg().mtbf. Local.
  result<cairn_advice_t> advice();

  // Run identity (RUN file, written by rank 0).
  status set_code_version(const std::string& v);
  status tag(const std::string& key, const std::string& value);

  status checkpoint_begin(const std::string& name, int64_t version);
  result<std::string> route_file(const std::string& file);
  status checkpoint_end(bool success);
  status restart_begin(const std::string& name, int64_t version);
  status restart_end(bool success);
  // Local, inside a restart_begin/end sequence: bytes of `region` in the version being restored.
  result<uint64_t> restart_region_size(const std::string& region) const;

 private:
  // level_host (level.hpp).
  comm::communicator& comm() override { return *comm_; }
  storage::storage_env* env() override { return env_; }
  engine::engine& engine() override { return *engine_; }
  status progress_round() override { return progress(true); }
  status wait_level(version_record& rec, unsigned level) override { return wait_record(rec, level); }
  void index_committed(const std::string& name, int64_t version) override;
  const std::map<std::string, int64_t>& newest_versions() const override { return last_version_; }
  std::vector<std::pair<std::string, int64_t>> tracked_versions() const override;
  uint32_t node_count() const override;
  const std::string& node() const override { return node_; }
  engine::staging_pool& staging() override { return pool_; }
  const std::deque<version_record*>& pending() const override { return pending_; }
  uint32_t attempt() const override { return attempt_; }
  // The levels this client's configuration registers (levels.cpp), in order.
  std::vector<std::unique_ptr<level>> levels_;
  // Whether some level commits the persistent level itself (level::commits_persistent).
  bool level_commits_persistent_ = false;
  // Drops the restart image (a mapped one is unmapped by an engine task; one
  // rebuilt from redundancy is stored at the node-local level by one first).
  void release_restart_image();
  // Collective, after `version` was restored: when it was never committed
  // (its job died first; restored from the node-local level), an engine task
  // writes the restored image to the persistent level and records this
  // rank's part (the last commits it); the task takes the image (and stores
  // a rebuilt one at the node-local level first). Returns whether it did.
  bool commit_restored(const std::string& name, int64_t version);
  // Writes an image rebuilt from redundancy to its node-local shard file
  // (engine task); a failure is reported and left: a later restart rebuilds.
  status store_rebuilt(const format::shard_image& img);
  client_impl(std::unique_ptr<comm::communicator> comm, config cfg);
  status start();
  // Collective at start: gathers the hosts; rank 0 appends this execution to RUN.
  // Rank 0 takes the run's lease (run_lease.hpp): busy while another
  // execution holds it.
  status take_lease();
  // `st` (a write to the persistent level failed at init) as the error that
  // says the store is unusable and what to do.
  status store_unwritable(const status& st) const;
  // File mode: where this execution's routed files are written and restored.
  std::string files_dir() const;
  // redundancy_required = false: a job that cannot hold the scheme runs
  // without it (cfg_.redundancy = none), said once by rank 0. Collective.
  void settle_redundancy();
  status start_run_identity();
  // Rank 0: rewrites RUN from run_info_ (a failure is a warning on stderr,
  // except at init, where a store that cannot be written is an error; a full
  // one still lets the job restart).
  status write_run_identity(bool at_init = false);

  // Captures `regions` as (name, version) and submits the job. Collective.
  // may_cow: the regions stay mapped after the call (not file mode's mappings).
  status capture(const std::string& name, int64_t version, const std::vector<region>& regions,
                 bool may_cow = true);
  // capture = cow: the version's contiguous regions write-protected and
  // copied in the background (engine::cow_capture), the rest copied here;
  // the job was submitted capturing, and engine::captured ends it.
  void capture_cow(const std::shared_ptr<engine::version_job>& job, const std::vector<region>& regions);
  // Whether this capture of `bytes` goes copy-on-write; slot_ready: a
  // staging slot that holds it is made (copy_or_cow copies into it).
  bool use_cow(uint64_t bytes, bool lend, bool may_cow, bool slot_ready) const;
  // capture = auto and copy_or_cow: the smallest image captured
  // copy-on-write (below it, protecting costs about what copying does).
  static constexpr uint64_t kCowMinBytes = uint64_t{8} << 20;
  // Copies region r into its place d in the image.
  static void copy_region(std::byte* img, const format::region_desc& d, const region& r);
  // Makes cow_ where capture asks for it and it applies (init); says once why not for capture = cow.
  void start_cow();
  // Waits until no capture copies in the background (the regions may then
  // be freed, moved or overwritten by a restart).
  void drain_capture() {
    if (cow_) cow_->drain();
  }
  // Local: plans the shard header of a capture of `regs` into *h and makes
  // sure staging can hold it (the status is agreed by the capture's round);
  // *cow: whether the capture goes copy-on-write (use_cow). A slot for a
  // copy-on-write capture is handed out mapped but not faulted in: the
  // background copy faults it in, not cairn_checkpoint.
  status reserve_staging(const std::string& name, int64_t version, const std::vector<region>& regs, bool lend,
                         bool may_cow, format::shard_header* h, bool* cow);
  // Collective: invalid unless `version` is above every version of `name`
  // that earlier executions committed (a damaged one is withdrawn first).
  status check_committed_floor(const std::string& name, int64_t version);
  // Local: copies (or lends) the regions into job's image; with `stream`
  // the persistent write follows the copy piece by piece; else, where
  // shares_copy says so, an idle engine thread copies pieces beside the
  // application thread.
  void copy_image(engine::version_job& job, const std::vector<region>& regs, bool lend, bool stream);
  // Whether a copy of an image of `bytes` is shared with an engine thread
  // (copy_image): where one can run on another CPU (copy_helper_), not
  // streamed, and large enough for the second thread to pay. Its slot may be
  // handed out not yet faulted in: two threads fault it in in half the time.
  bool shares_copy(uint64_t bytes, bool lend) const {
    return copy_helper_ && !lend && !follow_capture_ && bytes >= kSharedCopyBytes;
  }
  static constexpr uint64_t kSharedCopyBytes = uint64_t{32} << 20;
  // Records a captured version as pending (old resolved records are forgotten).
  version_record* track(const std::string& name, int64_t version, std::shared_ptr<engine::version_job> job);
  // Collective, when the capture's round saw a latched error on some rank:
  // earlier_failed with the lowest failing rank's message, once.
  status report_earlier_failure(const std::string& name, int64_t version);
  // The shard header (layout planned) of a capture of `regions`.
  result<format::shard_header> plan_header(const std::string& name, int64_t version,
                                           const std::vector<region>& regions) const;
  // How many staging slots of `file_size` bytes staging_limit allows.
  result<int> staging_slots(const std::string& name, uint64_t file_size) const;
  // Thread mode: an engine task (low priority) allocates and faults in the
  // staging slots the protected regions will need, so the first checkpoint
  // does not pay for it. Best effort: the capture makes sure. Called by
  // protect, and by restart_phase_over. Where a restart may come, the slots
  // wait for it (kRestartGrace): a restart's own buffers need the memory and
  // its bandwidth first. The task pauses while a restart call runs; an image
  // the restart read into memory becomes a slot (release_restart_image).
  void prepare_staging();
  // Keeps the sums prepare_staging sizes the image from: a region protected
  // (add) or no longer (its header entry and its data, padded).
  void count_for_staging(const region& r, bool add);
  uint64_t staged_header_bytes_ = 0, staged_data_bytes_ = 0;
  // restart_test found nothing, or restart or restart_end returned: the
  // slots no longer wait (staging_pool::defer_until) and are made for the
  // regions protected now.
  void restart_phase_over();
  // How long after a protect the slots of a run with versions wait for a
  // restart call (applications ask right after protecting; the slots must
  // still be ready for a first checkpoint a few seconds later).
  static constexpr std::chrono::seconds kRestartGrace{1};
  // How long after a protect the slots wait for the next one: a burst of
  // protects (StateSaver.save protects every tensor, then checkpoints) makes
  // no slot for a layout the next protect outgrows, which the capture would
  // then unmap on the application's call.
  static constexpr std::chrono::milliseconds kProtectSettle{100};
  // Whether this execution may restart: the run has versions on the
  // persistent level or on some rank's node-local level, or agents may hold
  // some. Collective; called at init.
  bool restart_may_come();
  bool error_agreed_ = false;   // the last progress round saw a latched error on some rank
  bool commit_stage_ = false;   // the graph has a commit stage (not agents, not the daemon)
  bool restart_first_ = false;  // restart_may_come() at init
  bool restart_asked_ = false;  // restart_test was called
  // The progress protocol (docs/design/core.md): one allreduce over the latched
  // error, the slot flag and every pending version's level states. Collective.
  // Returns the latched error of some rank (consumed) when consume_error.
  // `mine` (may be null): a status of the caller's that every rank agrees on
  // in the same round; its failure (the lowest rank's message) is returned.
  // `record`: this rank's plan record, carried by the same collective (an
  // allgather instead of the allreduce); `records` receives every rank's.
  status progress(bool consume_error, bool* all_have_slot = nullptr, const status* mine = nullptr,
                  const plan_record* record = nullptr, std::vector<plan_record>* records = nullptr);
  // Exchanges the message of the lowest rank with `failing` set. Collective.
  std::string exchange_message(bool failing, const std::string& mine) override;
  void on_durable(version_record& rec);
  // A version's manifest without its shards (what the commit stage and
  // on_durable fill in). Thread-safe: reads what start() set.
  format::manifest describe_version(const engine::version_job& job) const;
  // A level of rec failed on some rank: every rank records the failing rank's
  // code and message. Collective.
  void agree_level_failure(version_record& rec, unsigned level);
  void on_level_complete(version_record& rec, unsigned level);
  // Rank 0: the catalog's runtime event of a version reaching `level` at
  // `at` (seconds since its capture: `took`), for a level that completes
  // after the manifest commit started (redundancy sets; the local level,
  // which runs beside the persistent one and may finish after it).
  void record_runtime_level(const version_record& rec, unsigned level, double at, double took) override;
  // After a restart of `name` from `restored`: the node-local versions up to
  // it that an earlier execution left on this rank count for keep_local as
  // this execution's own (retention holds across a restart).
  void adopt_local_versions(const std::string& name, int64_t restored);
  void schedule_retention(const std::string& name, unsigned level);
  // Rank 0, engine task: deletes the persistent versions of `name` below `threshold`.
  status remove_persistent_below(const std::string& name, int64_t threshold) override;
  // Engine task: this rank's node-local shards of `name` below `threshold` retired.
  status remove_local_below(const std::string& name, int64_t threshold);
  // Retention tasks: one queued per (name, level) with the newest threshold;
  // one runs at a time.
  struct retention_queue {
    cairn::mutex mu;
    std::map<std::pair<std::string, unsigned>, int64_t> pending CAIRN_GUARDED_BY(mu);
    cairn::mutex run_mu;  // held by the running task
  };
  std::shared_ptr<retention_queue> retention_ = std::make_shared<retention_queue>();
  // Blocks until this rank can contribute a final state for rec's level.
  void wait_local(version_record& rec, unsigned level);
  status wait_record(version_record& rec, unsigned level);
  version_record* find(const std::string& name, int64_t version);

  // Restart: loads and verifies this rank's shard of (name, version) into
  // restart_ from the fastest intact level (a node-local shard verified where
  // it lies, mapped, not copied). Local.
  // local / others: which levels to try (redundancy tries the node-local
  // shard first, then rebuilds, then the rest).
  // defer (restart_verify = while): a committed node-local shard, or a
  // level's copy of it (agent memory, level::open_unverified), is only
  // opened and its header checked; restart_unverified_ holds it and restore
  // verifies its data while reading them into the regions.
  status load_shard(const std::string& name, int64_t version, bool local = true, bool others = true,
                    bool defer = false);
  // restore of a deferred shard (restart_unverified_): each
  // region read into the protected memory and verified as it arrives; on a
  // mismatch, this rank's shard is loaded from the next level and copied
  // over. The reader stays until the image is released, so that a
  // restart_begin/end sequence may restore again. Local.
  status restore_unverified(const std::string& name, int64_t version);
  // A committed version that a restart found damaged at every level:
  // recorded beside its MANIFEST (rank 0, durable), so that no later
  // restart_test offers it (marked_damaged, collective) until a checkpoint
  // replaces it (check_committed_floor).
  void mark_damaged(const std::string& name, int64_t version, const std::string& why);
  bool marked_damaged(const std::string& name, int64_t version);
  // Whether restart defers the node-local level's verification to restore
  // (restart_verify = while).
  bool defer_verification() const;
  // Copies restart_ (verified) into the protected regions.
  void copy_restart_image();
  // The image a level rebuilt for this rank (level::rebuild), checked as a
  // node-local shard is (identity, the MANIFEST's entry, the regions, this
  // store's executions), becomes restart_. Local.
  status take_rebuilt(const std::string& name, int64_t version, format::shard_image image);
  // The MANIFEST of a committed version of this job's rank count, if any.
  std::optional<format::manifest> committed_manifest(const std::string& name, int64_t version);
  // unusable when an uncommitted shard's execution is not one this store's
  // RUN lists (another store's run of the same name shares the node-local
  // directory); `where` names it.
  status written_by_this_store(const format::shard_header& h, const std::string& where) const;
  // Collective: agree on the newest version all ranks can load intact.
  result<int64_t> agree_restartable(const std::string& name, int64_t max_version);
  std::vector<int64_t> local_candidates(const std::string& name);
  // Collective: restart_test's answer when no version can be restored:
  // not_found when none exists, unusable when some exist that this job
  // cannot use (another rank count, damaged copies), with what to do.
  status nothing_restartable(const std::string& name, const std::vector<int64_t>& cands, const status& newest_failure);
  // Restart on another rank count (restart.cpp, docs/design/reshard.md).
  // The version's MANIFEST when it was written by another rank count, else nullopt.
  std::optional<format::manifest> other_rank_count(const std::string& name, int64_t version);
  // Collective: reads every writing rank's header (rank 0 reads, broadcasts),
  // checks them against the MANIFEST and that every region can be
  // redistributed (a global layout, or the same bytes on every rank); sets
  // reshard_. unusable, saying which region and why, otherwise.
  status plan_reshard(const std::string& name, int64_t version, format::manifest m);
  // Local: the protected regions against reshard_'s plan (EINVAL, buffers untouched).
  status check_reshard_regions(const std::string& name, int64_t version);
  // Local: reads and verifies, for every protected region, the bytes of the
  // old blocks that overlap this rank's block into reshard_->staged.
  status reshard_read(const std::string& name, int64_t version);
  // Collective: cairn_restart of a version planned by plan_reshard.
  status restart_resharded(const std::string& name, int64_t version);
  // restart_region_size of a version planned by plan_reshard: nullopt when
  // the region is not in the plan.
  std::optional<result<uint64_t>> resharded_region_size(const std::string& region) const;
  // Collective: every rank's status combined; the lowest failing rank's message wins.
  status agree(status mine) override;
  // Collective: the second half of agree() once the ranks agreed on `code` (< 0).
  status agreed_failure(int64_t code, const status& mine);

  std::unique_ptr<comm::communicator> comm_;
  config cfg_;
  storage::storage_env* env_;
  std::unique_ptr<storage::storage_env> fault_env_;
  std::unique_ptr<storage::storage_env> rate_env_;  // io_rate_limit: the persistent stages write through it
  std::string host_;
  // Batch jobs: the job's end (Unix seconds) if known; the warning counter
  // at the last capture; what the last progress round agreed.
  std::optional<double> job_end_;
  bool warning_handler_ = false;
  uint64_t warnings_at_capture_ = 0;
  bool agreed_warned_ = false;
  double agreed_left_s_ = HUGE_VAL;  // HUGE_VAL when no rank knows the end
  double agreed_durable_s_ = 0;
  bool deadline_checkpointed_ = false;  // a checkpoint was taken once the deadline was near
  bool near_deadline() const;
  // Rank 0: capture to MANIFEST commit of the newest committed version, set
  // by the commit task (engine thread), read by the application thread.
  std::shared_ptr<std::atomic<double>> durable_s_ = std::make_shared<std::atomic<double>>(0.0);
  // Metrics (docs/design/metrics.md): this rank's counters, written to its
  // textfile in metrics_dir after a progress round that changed them: the
  // application thread copies them, an engine task renders and writes the
  // newest copy (rounds that change them faster than the engine writes are
  // coalesced into one write).
  metrics::rank_metrics stats_;
  bool stats_dirty_ = false;
  struct metrics_textfile {
    cairn::mutex mu;
    std::optional<metrics::rank_metrics> latest CAIRN_GUARDED_BY(mu);  // a copy not written yet
    bool queued CAIRN_GUARDED_BY(mu) = false;  // an engine task will write `latest`
    cairn::mutex write_mu;  // one writer at a time
    bool dir_made CAIRN_GUARDED_BY(write_mu) = false;  // metrics_dir exists: not looked up again on every write
    bool warned CAIRN_GUARDED_BY(write_mu) = false;    // a failed write was reported once
    // Writes `latest` if any (the engine task; at finalize the application thread).
    void flush(storage::storage_env* env, const std::string& dir, const std::string& path, int rank);
  };
  std::shared_ptr<metrics_textfile> textfile_ = std::make_shared<metrics_textfile>();
  bool metrics_inline_ = false;  // finalizing: the engine is stopping, the application thread writes
  void count_level(version_record& rec, unsigned level, bool failed);
  void write_metrics();
  // finalize after every version was waited for: removes this rank's
  // node-local versions of the run when every checkpoint's newest one is
  // committed at the persistent level (keep_local_after_finalize = false).
  // Collective.
  void drop_local_versions();
  // Collective: persistent_layout = auto becomes aggregated on CephFS and
  // Lustre (rank 0 detects), file per process elsewhere; invalid_argument on
  // every rank when ranks would lay the level out differently.
  status resolve_layout();
  std::string node_;  // this rank's node (failure domain, leader spread)
  // Collective at its first call (init): the key that seals this job's
  // data-plane messages (fabric/mailbox.hpp), drawn by rank 0 and broadcast
  // over the job's communicator. libfabric builds.
  result<std::string> plane_key() override;
  std::string plane_key_;
  engine::staging_pool pool_;
  cairn::mutex staging_mu_;
  std::pair<uint64_t, int> staging_wanted_ CAIRN_GUARDED_BY(staging_mu_);  // prepare_staging's newest layout
  bool staging_queued_ CAIRN_GUARDED_BY(staging_mu_) = false;
  std::shared_ptr<engine::local_recycler> recycler_;  // local level on: retired node-local shards reused
  std::unique_ptr<engine::engine> engine_;
  // capture = cow or auto where userfaultfd serves (null otherwise). After
  // engine_: its last capture ends (engine::captured) before the engine goes.
  std::unique_ptr<engine::cow_capture> cow_;
  std::set<int> cow_refused_;                 // errnos already explained once (copied regions)
  std::atomic<uint64_t> cow_faults_{0};       // writes that waited for their block, all captures
  uint64_t cow_captures_ = 0;                 // captures made copy-on-write
  cairn::mutex catalog_mu_;
  std::unique_ptr<history::catalog> catalog_ CAIRN_GUARDED_BY(catalog_mu_);  // rank 0 only

  std::map<std::string, region> regions_;
  std::map<std::string, int64_t> last_version_;     // per checkpoint name
  std::map<std::string, int64_t> count_;            // checkpoints per name (persistent_interval)
  // The newest version of a checkpoint name that earlier executions of the
  // run committed (persistent MANIFEST) or left complete in agent memory; this
  // execution's versions must be larger. Computed at the first capture of the
  // name, the same on every rank.
  struct committed_floor {
    int64_t version = -1;
    std::string what;  // for the error message
  };
  std::map<std::string, committed_floor> floors_;
  // Committed versions restart_test rejected as damaged on every level: the
  // next checkpoint of the same version withdraws and replaces them.
  std::map<std::string, std::set<int64_t>> damaged_;
  // Collective on the first call for a name.
  const committed_floor& floor_of(const std::string& name);
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<version_record>> records_;
  std::deque<version_record*> pending_;             // unresolved, in checkpoint order
  std::map<std::pair<std::string, unsigned>, std::vector<int64_t>> complete_;  // per name, level

  // Restart cache.
  std::string restart_name_;
  int64_t restart_version_ = -1;
  format::shard_image restart_;  // the verified image of restart_version_
  // Set with restart_verify = while: the node-local shard of restart_version_
  // (or an agent's copy of it), whose header (restart_.header) is checked
  // and whose data are not yet.
  std::unique_ptr<format::shard_reader> restart_unverified_;
  bool restart_rebuilt_ = false;  // restart_ was rebuilt from redundancy: not at the node-local level yet
  // Set instead of restart_ when restart_version_ was written by another rank count.
  struct reshard_state;
  std::shared_ptr<reshard_state> reshard_;

  // File mode.
  struct file_mode {
    bool restarting = false;
    std::string name;
    int64_t version = 0;
    std::string dir;
    std::vector<std::string> files;  // base names routed so far
  };
  std::optional<file_mode> files_;
  std::shared_ptr<analytics::online_tracker> online_;  // shared with the compare stage; null when off
  std::optional<analytics::online_divergence> divergence_;  // agreed by all ranks
  // Collective part of progress for the online comparison.
  void progress_divergence(int64_t global_first);
  bool finalized_ = false;
  bool follow_capture_ = false;  // the checksum and persistent data write follow the copy (engine::submit(job, true))
  bool copy_helper_ = false;     // an engine thread may run on another CPU than the application's (shares_copy)
  std::atomic<bool> more_slots_queued_{false};  // an engine task makes the staging slots a capture did not
  // This execution's shard attempt tag (format::shard_header::attempt), the
  // same on every rank.
  uint32_t attempt_ = 0;
  // The attempts of the run's executions in this store (RUN), on every rank;
  // empty when an execution predates the record (no check then).
  std::set<uint32_t> store_attempts_;
  format::run_info run_info_;  // rank 0 only
  std::unique_ptr<run_lease> lease_;  // rank 0 only
  int64_t kill_capture_version_ = -1;  // test hook (fault_inject level=capture)
};

}  // namespace cairn

#endif

// level: one way a version leaves the process, behind one interface
// (docs/design/levels.md). The client captures, agrees and commits; each
// level adds its stages to the graph at init and answers the client at fixed
// points of capture, test, wait, restart and finalize. Every hook has a
// default that does nothing, so a level implements only what it changes.
// A level is created by its registration in levels.cpp and lives as long as
// its client; hooks run on the application thread (the stages it adds run on
// the engine's), in the same order on every rank where they are collective.
#ifndef CAIRN_CLIENT_LEVEL_HPP
#define CAIRN_CLIENT_LEVEL_HPP

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cairn.h"
#include "aggregate/plan.hpp"
#include "cairn/status.hpp"
#include "comm/comm.hpp"
#include "engine/engine.hpp"
#include "engine/recycler.hpp"
#include "engine/staging.hpp"
#include "engine/stages.hpp"
#include "format/manifest.hpp"
#include "format/shard_io.hpp"
#include "storage/storage_env.hpp"
#include "util/config.hpp"

namespace cairn {

struct version_record;

// What a rank contributes to the plan of an aggregated version (src/aggregate/plan.hpp).
struct plan_record {
  uint64_t bytes = 0;  // image size
  uint64_t node = 0;   // hash of the node's name
  double load = 0;     // util::node_load()
};

// -1 failed, 0 in flight, 1 done: this rank's state of one level of a job.
int64_t level_state(engine::engine& eng, const engine::version_job& job, unsigned level);

// What a level may use of its client.
class level_host {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual comm::communicator& comm() = 0;
  virtual const config& cfg() const = 0;
  virtual storage::storage_env* env() = 0;
  virtual engine::engine& engine() = 0;
  // Collective: every rank's status combined; the lowest failing rank's message wins.
  virtual status agree(status mine) = 0;
  // Collective: the message of the lowest rank with `failing` set.
  virtual std::string exchange_message(bool failing, const std::string& mine) = 0;
  // Collective: one progress round; returns a background error of some rank.
  virtual status progress_round() = 0;
  // Collective: until every rank agreed that rec reached `level` (or failed there).
  virtual status wait_level(version_record& rec, unsigned level) = 0;
  // Rank 0, from an engine task: deletes the persistent versions of `name` below `threshold`.
  virtual status remove_persistent_below(const std::string& name, int64_t threshold) = 0;
  // Rank 0: the catalog learns of a version committed by someone else.
  virtual void index_committed(const std::string& name, int64_t version) = 0;
  // The newest version this execution took, per checkpoint name.
  virtual const std::map<std::string, int64_t>& newest_versions() const = 0;
  // The versions this execution took that the client still tracks.
  virtual std::vector<std::pair<std::string, int64_t>> tracked_versions() const = 0;
  // Rank 0: the hosts of this execution (RUN); 1 elsewhere.
  virtual uint32_t node_count() const = 0;
  // This rank's node (failure domain; ranks_per_node emulates nodes).
  virtual const std::string& node() const = 0;
  // Collective at its first call (init): the key that seals this job's
  // data-plane messages (fabric/mailbox.hpp). libfabric builds.
  virtual result<std::string> plane_key() = 0;
  // Staging memory (the daemon makes it shared).
  virtual engine::staging_pool& staging() = 0;
  // The versions not resolved yet, in checkpoint order.
  virtual const std::deque<version_record*>& pending() const = 0;
  // This execution's shard attempt tag, the same on every rank (set before level::start).
  virtual uint32_t attempt() const = 0;
  // Rank 0: the catalog's event of rec reaching `level` at `at`, `took`
  // seconds after its capture (an engine task).
  virtual void record_runtime_level(const version_record& rec, unsigned level, double at, double took) = 0;

 protected:
  ~level_host() = default;
};

// Where a level's stages attach in the graph (level::add_stages).
struct graph_points {
  engine::stage_graph* graph = nullptr;
  size_t image_done = 0;  // the checksum pass: the image is complete
  size_t local = 0;       // the node-local level's stage (image_done when it is off)
  engine::level_paths paths;
  storage::storage_env* flush_env = nullptr;  // the persistent level's writers write through it (io_rate_limit)
  std::shared_ptr<engine::local_recycler> recycler;  // the node-local level's reused files (may be null)
  // The checksum pass and the persistent data write start with the
  // application thread's copy (write_during_capture; client::start decides).
  bool follow_capture = false;
};

class level {
 public:
  virtual ~level() = default;

  // ---- init (collective, in registration order) --------------------------
  // Whether this level writes the persistent level and commits it itself:
  // the client then adds neither the persistent writers nor the commit stage.
  virtual bool commits_persistent() const { return false; }
  // Whether this level's stages write the persistent level's data (the
  // client's commit stage commits it): the client adds no file-per-process
  // writers.
  virtual bool writes_persistent_data() const { return false; }
  // Whether its stages may read a node-local shard after the version retired
  // (retired node-local files are then removed, never recycled in place).
  virtual bool reads_retired_local() const { return false; }
  // Whether this level runs every stage elsewhere (the node daemon): the
  // client then builds no graph; the level adds its proxies in start.
  virtual bool runs_stages() const { return false; }
  // Adds this level's stages to the graph.
  virtual status add_stages(graph_points&) { return {}; }
  // Once the run's identity is known (RUN written, attempt drawn); the graph
  // is still open (a level that runs the stages adds them here).
  virtual status start(graph_points&) { return {}; }

  // ---- capture -----------------------------------------------------------
  // The protected regions changed (moved, resized or removed).
  virtual void regions_changed() {}
  // Collective, before the capture's progress round: `grows` when the
  // staging slots will be replaced (the engine must go idle first).
  virtual status before_capture(bool grows) {
    (void)grows;
    return {};
  }
  // Whether a version that goes to the persistent level is planned from
  // every rank's plan_record (carried by the capture's progress round).
  virtual bool plans() const { return false; }
  // The plan from every rank's record: a pure function of them (the same on
  // every rank, or the same error).
  virtual result<std::shared_ptr<const aggregate::plan>> plan(const std::vector<plan_record>& records) {
    (void)records;
    return status(errc::internal, "this level plans nothing");
  }
  // Collective, at the first capture of `name`: the newest version above
  // `floor` that this level holds for every rank from one execution (a
  // version the next checkpoint must not replace), with `what` describing it.
  virtual int64_t committed_floor(const std::string& name, int64_t floor, std::string* what) {
    (void)name, (void)what;
    return floor;
  }
  // The levels a version (the count-th of its name) wants of this level.
  virtual unsigned wants(uint64_t count) const {
    (void)count;
    return 0;
  }
  // Whether contiguous regions may be lent (read in place by the level).
  virtual bool lends() { return false; }
  // The image is complete, before the engine gets the version: what must
  // hold the version before cairn_checkpoint returns takes it here.
  virtual void captured(version_record&) {}
  // Whether captured() needs the whole image before cairn_checkpoint
  // returns: copy-on-write capture (which completes it later) does not apply.
  virtual bool takes_capture() const { return false; }
  // The version was submitted to the engine (before cairn_checkpoint returns).
  virtual void submitted(version_record&) {}
  // The manifest's part of this level for a version (an engine thread: reads
  // only what init set).
  virtual void describe(const engine::version_job& job, format::manifest* m) const { (void)job, (void)m; }
  // Collective (the progress round's result): every rank's rec reached `level`.
  virtual void on_level_complete(version_record& rec, unsigned level) { (void)rec, (void)level; }
  // Node-local retention keeps every version of `name` at or above this one.
  virtual int64_t keep_local_from(const std::string& name) const {
    (void)name;
    return INT64_MAX;
  }

  // ---- progress ----------------------------------------------------------
  // A step of this level's own for rec that every rank must be ready for and
  // that only the application thread makes (mpiio's collective write): this
  // rank's state (-1 failed, 0 not ready, 1 ready), carried by the progress
  // round; nullopt when rec has none pending.
  virtual std::optional<int64_t> step_state(version_record& rec) {
    (void)rec;
    return std::nullopt;
  }
  // Collective: the ranks agreed on `state` (1: every rank is ready, make the
  // step; -1: some rank cannot, nobody does).
  virtual void step(version_record& rec, int64_t state) { (void)rec, (void)state; }
  // Whether some pending version waits for such a step.
  virtual bool awaits_step() const { return false; }

  // ---- test and wait -----------------------------------------------------
  // Local: blocks until this rank can contribute a final state for rec's
  // `level`; false to leave it to the client.
  virtual bool wait_local(version_record& rec, unsigned level) {
    (void)rec, (void)level;
    return false;
  }
  // Levels rec reached that this level learns of outside the progress rounds.
  virtual unsigned reached(version_record&) { return 0; }
  // Collective: this level's own wait for `level`; nullopt: the client's.
  virtual std::optional<status> wait(version_record&, unsigned level) {
    (void)level;
    return std::nullopt;
  }

  // ---- restart -----------------------------------------------------------
  // Collective: versions of `name` this level may restore on this rank.
  virtual void candidates(const std::string& name, std::set<int64_t>* out) { (void)name, (void)out; }
  // Collective, once candidates are known: unusable when restarting now
  // would silently skip versions this level may hold.
  virtual status restart_allowed(const std::string& name) {
    (void)name;
    return {};
  }
  // Local: loads and verifies this rank's shard of (name, version) into
  // *out; not_found when this level has none; `why` gathers the failures.
  virtual status load(const std::string& name, int64_t version, format::shard_image* out, std::string* why) {
    (void)name, (void)version, (void)out, (void)why;
    return {errc::not_found, "not held"};
  }
  // Local, restart_verify = while: a reader of this level's copy of this
  // rank's shard of (name, version) with its header read and nothing else:
  // cairn_restart reads the regions straight into the application's memory
  // and verifies them as they arrive (format::shard_reader::read_region).
  // not_found when this level has no copy it can lend that way.
  virtual result<std::unique_ptr<format::shard_reader>> open_unverified(const std::string& name, int64_t version) {
    (void)name, (void)version;
    return status(errc::not_found, "not held");
  }
  // Whether rebuild can restore lost node-local shards.
  virtual bool rebuilds() const { return false; }
  // Collective, when some rank's node-local shard of (name, version) is
  // missing or corrupt: `mine` is this rank's verified image, or null; a
  // rank without rebuilds its shard from the survivors into *rebuilt,
  // verified (the client restores from it, then stores it at the node-local
  // level). Returns this rank's outcome.
  virtual status rebuild(const std::string& name, int64_t version, const format::shard_image* mine,
                         format::shard_image* rebuilt) {
    (void)name, (void)version, (void)rebuilt;
    return mine ? status() : status(errc::not_supported, "no rebuild");
  }
  // Where restart looked, for messages ("" : nowhere beyond the stores).
  virtual std::string where() const { return {}; }
  // Whether versions restored from this level's copies are kept by it (the
  // client then does not commit a restored, uncommitted version itself).
  virtual bool keeps_restored() const { return false; }

  // ---- finalize ----------------------------------------------------------
  // Local: the application abandons its pending versions (finalize without
  // waiting, or the handle destroyed), before the engine stops.
  virtual void abandon() {}
  // Collective, after the engine stopped: `waited` is false when the
  // application abandoned its versions.
  virtual status finish(bool waited) {
    (void)waited;
    return {};
  }
  // Local, from the handle's destructor (after finish, or without it when
  // init failed or the application never finalized): let go of what the
  // level holds. No collective.
  virtual void close() {}
  // Collective (cairn_probe): CAIRN_AGENTS_*.
  virtual result<int> probe() { return CAIRN_AGENTS_UNCHANGED; }
};

}  // namespace cairn

#endif

// Runtime configuration: TOML file plus CAIRN_<KEY> environment overrides.
// The keys are listed in docs/design/core.md; unknown keys are errors.
#ifndef CAIRN_UTIL_CONFIG_HPP
#define CAIRN_UTIL_CONFIG_HPP

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cairn/status.hpp"

namespace cairn {

enum class engine_mode { thread, sync };
// Where the engine's stages run: threads of the application process, or the
// node daemon cairnd (docs/design/daemon.md), which survives the application.
enum class engine_host { thread, daemon };
enum class placement { none, core, socket, node };
// Whether the persistent write may start while the application thread still
// copies the image (write_during_capture): automatic = only when the engine
// threads are placed on other CPUs than the application thread.
enum class capture_overlap { automatic, on, off };
// How cairn_checkpoint captures the regions (docs/design/cow-capture.md):
// copy = into staging before it returns; cow = write-protect them and copy in
// the background, a write to a page not copied yet copying its block first
// (userfaultfd; copy where it is unavailable or does not apply); automatic =
// cow where it is available, for captures of at least kCowMinBytes;
// copy_or_cow = copy into a staging slot that is ready, cow (as automatic) for
// a capture that would first have to make its slot (fresh memory).
enum class capture_method { copy, cow, automatic, copy_or_cow };
// When a restart from the node-local level verifies the data
// (docs/design/verified-restart.md): before = cairn_restart_test verifies the
// whole shard and cairn_restart copies it; during = cairn_restart_test checks
// the header and cairn_restart verifies each region as it reads it into the
// protected memory, restoring from the next level if a checksum differs.
enum class restart_verification { before, during };
// Scheduling of engine threads (issue 11): normal (inherit), batch
// (SCHED_BATCH: never preempts the application on wakeup), idle (SCHED_IDLE:
// runs only on otherwise idle CPUs).
enum class thread_priority { normal, batch, idle };
enum class staging_policy { block, eagain };
enum class divergence_action { cont, stop };
enum class agents_transfer { pull, push };
// automatic: aggregated on file systems where it pays (CephFS, Lustre),
// file per process elsewhere (docs/benchmarks.md, "Aggregation").
enum class persistent_layout { file_per_process, aggregated, automatic };
// docs/design/aggregation.md: paper 004's two baselines (2.1 unaligned and
// padded to stripes), its collective MPI-IO baseline (2.2), its leaders (3).
enum class aggregate_strategy { posix_shared, aligned, mpiio, leaders };

struct config {
  // run id; default (docs/design/run-identity.md): <program>-<digest of its
  // path and the working directory>[-<job>.<step> under Slurm, run_scope = job]
  std::string run;
  bool run_set = false;     // run was configured (else every rank takes rank 0's default)
  bool run_scope_job = true;  // run_scope: job (the default run names the job and step) or program
  // A run's lease (RUN.lease) is judged abandoned when its holder has not
  // renewed it for this long (seconds) and is not known to be dead sooner.
  double lease_timeout = 30;
  std::string application;  // default: the program's name (the script's, for an interpreter)
  std::string code_version; // free text (e.g. a git commit)
  std::string tags;         // "key=value,key2=value2"
  std::string scratch;      // node-local level directory
  std::string persistent = "./cairn-store";
  engine_mode mode = engine_mode::thread;
  int io_threads = 2;  // the local and persistent levels side by side
  cairn::engine_host engine_host = engine_host::thread;
  // The cairnd program; empty: next to libcairn (<prefix>/bin/cairnd, or the
  // build tree's tools/cairnd/cairnd), else `cairnd` on PATH.
  std::string daemon_program;
  // cairnd after SIGTERM (Slurm's time limit, scancel): it stops taking new
  // connections, finishes and commits what it holds, and exits at the latest
  // this many seconds later (Slurm's KillWait is 30 s by default).
  double daemon_drain_s = 20;
  cairn::placement placement = placement::none;
  cairn::capture_overlap write_during_capture = capture_overlap::automatic;
  cairn::capture_method capture = capture_method::copy;
  cairn::restart_verification restart_verify = restart_verification::before;
  cairn::thread_priority engine_priority = thread_priority::batch;
  int engine_nice = 0;  // added to engine threads' nice value (0..19)
  int keep_local = 2;       // 0 = keep all
  // Bounded by default (a checkpoint-only run needs the newest few); history
  // runs ask for every version with 0.
  int keep_persistent = 3;  // 0 = keep all
  int persistent_interval = 1;
  uint64_t staging_limit = 0;  // bytes; 0 = staging_slots slots
  int staging_slots = 2;        // slots when staging_limit is 0
  uint64_t io_rate_limit = 0;  // bytes/s per rank written to the persistent level; 0 = no cap
  cairn::staging_policy staging_policy = staging_policy::block;
  bool direct_io = true;
  // The persistent level's layout (docs/design/aggregation.md).
  cairn::persistent_layout persistent_layout = persistent_layout::automatic;
  // M data files per version; 0 = auto: leaders one per node up to the
  // storage targets (stripe count), the baselines one shared file.
  uint32_t aggregate_files = 0;
  cairn::aggregate_strategy aggregate_strategy = aggregate_strategy::leaders;
  uint64_t stripe_size = 0;        // 0: detected from the persistent directory
  uint32_t stripe_count = 0;       // 0: detected
  // This rank's node (failure domain, leader spread): empty = the host name.
  // ranks_per_node > 0 emulates nodes of that many consecutive ranks.
  std::string node_id;
  int ranks_per_node = 0;
  bool local_enabled = true;
  // A run that finished normally (cairn_finalize, everything committed at
  // the persistent level) leaves its node-local versions (false, the
  // default: they are removed, giving back e.g. /dev/shm) or keeps them.
  bool keep_local_after_finalize = false;
  // Node-loss redundancy (docs/design/redundancy.md): none, partner, xor or
  // rs over sets of ranks on distinct nodes, every redundancy_interval-th version.
  std::string redundancy = "none";
  int redundancy_set = 8;
  int rs_parity = 2;
  int redundancy_interval = 1;
  // false: a job that cannot hold the scheme (its nodes cannot form the sets,
  // no libfabric, no node-local level, agents hold L2) runs without it, and
  // rank 0 says why at init; true: that is an error. The drop-ins set false
  // (SCR's and VELOC's default schemes are requests that hold where they can).
  bool redundancy_required = true;
  bool hash_trees = true;         // hash trees in the checksum's pass (history comparisons)
  uint64_t hash_chunk = 64 << 10; // bytes per tree leaf
  double hash_abs = 0;            // quantum of tolerant leaves; 0 = exact leaves only
  // Online comparison with a reference run (empty = off).
  std::string reference_run;
  std::string reference_store;    // default: the persistent level
  divergence_action on_divergence = divergence_action::cont;
  double compare_abs = 0, compare_rel = 0;
  uint64_t compare_ulps = 0;
  // Remote checkpoint agents (docs/design/agents.md; empty agents = off).
  std::string agents;              // controller host:port
  std::string agents_secret_file;  // deployment secret (CAIRN_AGENTS_SECRET_FILE)
  agents_transfer agents_mode = agents_transfer::pull;
  bool agents_blocking = false;    // cairn_checkpoint returns when the agents hold the version
  bool agents_lend = false;        // agents pull straight from the protected regions (zero copy)
  bool agents_persist = true;      // IC_PERSIST: at finalize the agents keep and write what they hold
  std::string agents_provider = "tcp;ofi_rxm";
  std::string agents_bind = "auto";  // auto: the address this host reaches the controller from
  double agents_timeout = 30;      // seconds for an agent's reply
  double agents_wait = 10;         // seconds init/probe wait for assigned agents to come up
  double agents_restart_wait = 60;   // seconds a restart keeps asking agents that do not answer
  bool agents_allow_missing = false;  // restart may ignore agents that do not answer
  double agents_interval = 0;      // hints for the controller
  uint64_t agents_checkpoints = 0;
  // Batch jobs (docs/design/core.md, "Batch jobs"): the signals that warn of
  // the job's end, and the end itself (empty: SLURM_JOB_END_TIME if set).
  std::string warning_signals = "auto";
  std::string deadline;          // Unix seconds, or "+S" seconds after init
  double deadline_margin = 10;   // seconds added to the time to durable
  double deadline_factor = 2;    // times the measured time to durable
  // The job's mean time between failures, seconds (cairn_advice,
  // docs/design/advise.md); 0 = unknown.
  double mtbf = 0;
  // Metrics (docs/design/metrics.md): directory of each rank's OpenMetrics
  // textfile; empty = off.
  std::string metrics_dir;
  // Test hook (not documented for users): "level:kind[:after=N]", see fault_env.
  std::string fault_inject;

  // Rebuilds a configuration from values() (what the node daemon gets from a
  // rank): every key set as given, nothing read from the environment.
  static result<config> from_values(const std::map<std::string, std::string>& values);
  // Loads defaults, then the TOML file (if path is non-empty), then environment.
  static result<config> load(const std::string& path);
  // Same, with an explicit environment (for tests).
  static result<config> load(const std::string& path, const std::map<std::string, std::string>& env);

  // key = value lines, for logs and the catalog.
  std::string describe() const;
  // Every key and its value (the run identity records it).
  std::map<std::string, std::string> values() const;
  // persistent_layout with `auto` resolved for a persistent level on the
  // file system `fs` (storage::detect_geometry's name): aggregated on CephFS
  // and Lustre without agents, else a file per process.
  cairn::persistent_layout resolved_layout(const std::string& fs) const;
};

// Parses "64M", "1G", "4096" (K/M/G/T are powers of 1024).
result<uint64_t> parse_size(const std::string& text);

}  // namespace cairn

#endif

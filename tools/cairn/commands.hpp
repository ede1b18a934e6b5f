// Subcommands of the cairn CLI. Each returns the process exit status
// (kExitOk, kExitFailure, kExitUsage; see store_scan.hpp), prints its result
// on stdout (JSON when `json`), and errors and progress on stderr. None throws.
#ifndef CAIRN_TOOLS_CAIRN_COMMANDS_HPP
#define CAIRN_TOOLS_CAIRN_COMMANDS_HPP

#include <cstdint>
#include <string>
#include <vector>

namespace cairn::cli {

struct ls_options {
  std::string store;
  std::string run;      // empty = every run
  std::string scratch;  // empty = do not look at the local level
  bool json = false;
};
int cmd_ls(const ls_options& o);

struct show_options {
  std::string store;
  std::string name;
  int64_t version = 0;
  std::string run;  // empty = the only run that has `name`
  bool json = false;
};
int cmd_show(const show_options& o);

struct verify_options {
  std::string store;
  std::string run;
  // Node-local level directories (several: one per node, or emulated node):
  // their shards are verified, and their parity files re-encoded from the
  // data shards found in any of them.
  std::vector<std::string> scratch;
  bool json = false;
};
int cmd_verify(const verify_options& o);

// cairn restartable STORE NAME --ranks N [--run RUN] [--json]: the committed
// versions of NAME and whether a job of N ranks can restore each (as written,
// or redistributed by the regions' global layouts), and why not. Exit 1 when
// none can.
struct restartable_options {
  std::string store;
  std::string name;
  uint32_t ranks = 1;
  std::string run;
  bool json = false;
};
int cmd_restartable(const restartable_options& o);

struct reindex_options {
  std::string store;
  bool json = false;
};
int cmd_reindex(const reindex_options& o);

struct stats_options {
  std::string store;
  std::string run;
  bool json = false;
};
int cmd_stats(const stats_options& o);

// cairn geometry DIR [--stripe-unit B --stripe-count N --object-size B] [--json]:
// the stripe geometry new files in DIR get (what aggregation aligns to), and
// on CephFS sets the directory's layout first when asked.
struct geometry_options {
  std::string dir;
  uint64_t stripe_unit = 0, object_size = 0;
  uint32_t stripe_count = 0;
  bool json = false;
};
int cmd_geometry(const geometry_options& o);

struct gc_options {
  std::string store;
  int64_t keep = 0;     // >= 1; 0: the persistent level is not collected
  std::string scratch;  // a node-local directory to collect (cmd_gc_scratch); empty: none
  bool uncommitted = false;  // --scratch: also versions the store has not committed
  double lease_timeout = 30;  // --scratch: a lease not renewed for this long is abandoned
  std::string run;
  bool dry_run = false;
  bool json = false;
};
int cmd_gc(const gc_options& o);
int cmd_gc_scratch(const gc_options& o);

struct diff_options {
  std::string store;
  std::string run_a;
  std::string run_b;
  std::string name;                  // empty = every checkpoint name
  double abs = 0;                    // tolerances (compare.hpp)
  double rel = 0;
  uint64_t ulps = 0;
  std::vector<std::string> regions;  // empty = every region
  bool mismatches_only = false;
  std::string scratch_a;             // local level of run A (empty = none)
  std::string scratch_b;
  bool json = false;
};
// Exit: 0 no mismatch and no structural difference; 1 otherwise (or nothing
// in common); 2 bad arguments, unknown store, run, checkpoint or region.
int cmd_diff(const diff_options& o);

// cairn advise [STORE] [--run RUN] [--mtbf S | --node-mtbf S --nodes N | --mtbf-from-run] ...:
// paper 001's overhead model (docs/design/advise.md): measures B_M and each
// level's B_IO, predicts the synchronous and asynchronous cost per
// checkpoint, recommends the interval (Young, Daly) and persistent_interval;
// with --run, puts the prediction beside the run's measured stage costs.
struct advise_options {
  std::string store;        // persistent level (default: the configuration's)
  std::string scratch;      // local level (default: the configuration's)
  std::string config_file;  // configuration the job will use (default: the run's, else env)
  std::string run;          // compare with this run's measured costs
  std::string bytes;        // per rank, K/M/G suffixes (default: the run's, else 64M)
  int ranks_per_node = 0;   // 0: the run's, else 1
  double mtbf = 0, node_mtbf = 0;
  int64_t nodes = 0;
  bool mtbf_from_run = false;
  bool mtbf_given = false, node_mtbf_given = false;  // given at all (0 or negative is an error)
  double crash_fraction = 0.85;
  int reps = 3;
  std::string memory_bandwidth, checksum_bandwidth, local_bandwidth, persistent_bandwidth;  // given: not measured
  double commit_s = 0;  // with persistent_bandwidth: one small durable write's seconds (0: commit not modelled)
  bool json = false;
};
int cmd_advise(const advise_options& o);

// ---- agents control plane (src/agents; docs/design/agents.md) ----
struct controller_cli_options {
  std::string listen = "127.0.0.1:7420";
  std::string secret_file;  // else $CAIRN_AGENTS_SECRET_FILE
  std::string service_secret_file;  // else $CAIRN_AGENTS_SERVICE_SECRET_FILE; refused without one
  bool shared_secret = false;       // unless this: the deployment secret serves for both
  std::string journal;
  std::string strategy = "bandwidth";
  std::string distribution = "round_robin";
  uint32_t block_size = 2;
  uint32_t capacity = 4;            // agents per node when its manager gives none
  double heartbeat_interval = 1.0;  // seconds
  double heartbeat_timeout = 5.0;
  std::string agent_bandwidth = "1G";  // bytes/s per agent (model), K/M/G suffixes
  uint32_t max_agents = 16;
  uint32_t nodes_per_agent = 1;
  double transfer_fraction = 0.1;
  double probe_cost = 2.5;
  std::string metrics_listen;  // empty: no /metrics endpoint
  bool verbose = false;
};
// Runs until SIGTERM/SIGINT. Exit 2 without a secret or journal, 1 on failure.
int cmd_controller(const controller_cli_options& o);

struct manager_cli_options {
  std::string controller = "127.0.0.1:7420";
  std::string listen = "127.0.0.1:0";
  std::string secret_file;
  std::string service_secret_file;  // else $CAIRN_AGENTS_SERVICE_SECRET_FILE; refused without one
  bool shared_secret = false;       // unless this: the deployment secret serves for both
  std::string node_id;
  uint32_t capacity = 0;  // 0 = the controller's default
  std::string agent_program;
  std::vector<std::string> agent_args;
  std::string run_dir;
  double nominal_power = 200;
  double stop_grace = 3;
  std::string metrics_listen;  // empty: no /metrics endpoint
  bool verbose = false;
};
int cmd_manager(const manager_cli_options& o);

struct agents_cli_options {
  std::string action;  // status, register, unregister, resize, migrate
  std::string controller = "127.0.0.1:7420";
  std::string secret_file;
  std::string service_secret_file;  // else $CAIRN_AGENTS_SERVICE_SECRET_FILE; used instead when set
  double timeout = 5;
  bool json = false;
  // register
  std::string name;
  uint32_t ranks = 0, nodes = 0;
  std::string checkpoint_bytes = "0";
  double interval = 0;
  uint64_t checkpoints = 0;
  std::string store;  // the application's persistent level (its agents write there)
  std::string key_file;  // where register keeps the application's key
  std::string strategy, distribution;
  uint32_t block_size = 0;
  // unregister, resize, migrate
  uint64_t app = 0;
  uint32_t agents = 0;
  bool force = false;
  uint64_t agent = 0;
  std::string to;
};
// Exit 1 also when a resize is refused by the break-even rule.
int cmd_agents(const agents_cli_options& o);
// ---- end of agents control plane ----

}  // namespace cairn::cli

#endif

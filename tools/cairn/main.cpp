// cairn: command-line tool over a checkpoint store (no MPI needed).
//
//   cairn ls STORE [--run R] [--scratch DIR] [--json]
//   cairn show STORE [RUN] NAME VERSION [--run R] [--json]
//   cairn verify STORE [--run R] [--scratch DIR]... [--json]
//   cairn reindex STORE [--json]
//   cairn stats STORE RUN [--json]
//   cairn gc STORE [--keep N] [--scratch [DIR] [--uncommitted]] [--run R] [--dry-run] [--json]
//   cairn diff STORE RUN_A RUN_B [--name N] [--abs E] [--rel E] [--ulps N]
//              [--region R ...] [--mismatches-only] [--scratch-a DIR] [--scratch-b DIR] [--json]
//   cairn advise [STORE] [--run RUN] [--mtbf S | --node-mtbf S --nodes N | --mtbf-from-run]
//                [--scratch DIR] [--config F] [--bytes B] [--ranks-per-node N] [--json] ...
//   cairn controller --journal F [--listen ADDR:PORT] [--secret-file F] [--strategy S] [--distribution D] ...
//   cairn manager --node-id NAME [--controller ADDR:PORT] [--listen ADDR:PORT] [--secret-file F] [--capacity N] ...
//     (controller and manager: [--metrics-listen ADDR:PORT] serves GET /metrics)
//   cairn agents status|register|unregister|resize|migrate [--controller ADDR:PORT] [--secret-file F] [--json]
//
// Exit status: 0 success; 1 failure (verify: a problem was found; diff: the
// runs differ); 2 bad arguments (including a store, run, checkpoint or version
// that does not exist).
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "cairn.h"
#include "commands.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "history/catalog.hpp"
#include "util/config.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace {

std::string version_text() {
  return "cairn " + std::to_string(CAIRN_VERSION_MAJOR) + "." + std::to_string(CAIRN_VERSION_MINOR) + "." +
         std::to_string(CAIRN_VERSION_PATCH) + " (shard format " +
         std::to_string(cairn::format::kShardFormatVersion) + ", manifest format " +
         std::to_string(cairn::format::kManifestFormatVersion) + ", catalog schema " +
         std::to_string(cairn::history::kCatalogSchemaVersion) + ")";
}

// cairn show's positional arguments: STORE NAME VERSION or STORE RUN NAME
// VERSION. A VERSION that is not a number is most often the arguments in
// another order: the message gives the order.
cairn::status parse_show_args(const std::vector<std::string>& args, cairn::cli::show_options* o) {
  using cairn::errc;
  const std::string usage =
      "the arguments are STORE [RUN] NAME VERSION, in the order `cairn ls` prints run, checkpoint and version "
      "(e.g. cairn show cairn-store myrun heat2d 100)";
  if (args.size() != 3 && args.size() != 4)
    return {errc::invalid_argument, "cairn show: " + std::to_string(args.size()) + " arguments given; " + usage};
  o->store = args[0];
  const std::string& version = args.back();
  o->name = args[args.size() - 2];
  if (args.size() == 4) {
    if (!o->run.empty() && o->run != args[1])
      return {errc::invalid_argument,
              "cairn show: RUN '" + args[1] + "' and --run '" + o->run + "' disagree: give the run once"};
    o->run = args[1];
  }
  int64_t v = -1;
  auto [end, ec] = std::from_chars(version.data(), version.data() + version.size(), v);
  if (ec != std::errc() || end != version.data() + version.size() || v < 0)
    return {errc::invalid_argument, "cairn show: VERSION '" + version + "' is not a version number; " + usage};
  o->version = v;
  return {};
}

// Longer than 120 lines for a reason: the command line's table (every
// subcommand with its options and help) and the dispatch, in one place.
int run_cli(int argc, char** argv) {
  using namespace cairn::cli;
  CLI::App app{"cairn: inspect and maintain a cairn checkpoint store", "cairn"};
  app.set_version_flag("--version", version_text(), "Print the version and exit");
  app.require_subcommand(1, 1);
  app.footer(
      "Exit status: 0 success; 1 failure (verify: damage found; diff: the runs differ); 2 bad arguments\n"
      "or a store, run, checkpoint or version that does not exist. Run `cairn COMMAND --help` for a\n"
      "command's options.");

  ls_options ls;
  CLI::App* ls_cmd = app.add_subcommand("ls", "List runs, checkpoints and versions with their state and levels");
  ls_cmd->add_option("STORE", ls.store, "Store directory (the persistent level)")->required();
  ls_cmd->add_option("--run", ls.run, "Only this run");
  ls_cmd->add_option("--scratch", ls.scratch, "Node-local level directory: report the local level too");
  ls_cmd->add_flag("--json", ls.json, "Machine-readable JSON on stdout");

  show_options show;
  CLI::App* show_cmd = app.add_subcommand("show", "Show one version: regions per rank and timings");
  // STORE [RUN] NAME VERSION: RUN NAME VERSION is the order `cairn ls` prints.
  std::vector<std::string> show_args;
  show_cmd
      ->add_option("STORE [RUN] NAME VERSION", show_args,
                   "Store directory, run (optional: needed when several runs have a checkpoint NAME), "
                   "checkpoint name and version number, in the order `cairn ls` prints them")
      ->required()
      ->expected(3, 4);
  show_cmd->add_option("--run", show.run, "Run (the same as the optional RUN argument)");
  show_cmd->add_flag("--json", show.json, "Machine-readable JSON on stdout");

  verify_options verify;
  CLI::App* verify_cmd =
      app.add_subcommand("verify", "Re-read every shard and check every checksum; exit 1 if anything is damaged");
  verify_cmd->add_option("STORE", verify.store, "Store directory")->required();
  verify_cmd->add_option("--run", verify.run, "Only this run");
  verify_cmd
      ->add_option("--scratch", verify.scratch,
                   "Node-local level directory: verify its shards and redundancy parity files too (repeat it for "
                   "the directories of several nodes)")
      ->allow_extra_args(false);
  verify_cmd->add_flag("--json", verify.json, "Machine-readable JSON on stdout (no progress on stderr)");

  restartable_options restartable;
  CLI::App* restartable_cmd = app.add_subcommand(
      "restartable", "Which committed versions a job of N ranks can restart from (redistributed when the rank "
                     "count differs), and why not");
  restartable_cmd->add_option("STORE", restartable.store, "Store directory")->required();
  restartable_cmd->add_option("NAME", restartable.name, "Checkpoint name")->required();
  restartable_cmd->add_option("--ranks", restartable.ranks, "Rank count of the job that would restart")
      ->required()
      ->check(CLI::Range(1u, 1u << 30));
  restartable_cmd->add_option("--run", restartable.run, "Run (needed when several runs have a checkpoint NAME)");
  restartable_cmd->add_flag("--json", restartable.json, "Machine-readable JSON on stdout");

  reindex_options reindex;
  CLI::App* reindex_cmd = app.add_subcommand("reindex", "Rebuild the catalog (catalog.sqlite) from the manifests");
  reindex_cmd->add_option("STORE", reindex.store, "Store directory")->required();
  reindex_cmd->add_flag("--json", reindex.json, "Machine-readable JSON on stdout");

  stats_options stats;
  CLI::App* stats_cmd = app.add_subcommand(
      "stats", "A run's checkpoint metrics from the catalog, in the OpenMetrics text format (docs/design/metrics.md)");
  stats_cmd->add_option("STORE", stats.store, "Store directory")->required();
  stats_cmd->add_option("RUN", stats.run, "Run")->required();
  stats_cmd->add_flag("--json", stats.json, "Machine-readable JSON on stdout");

  gc_options gc;
  CLI::App* gc_cmd = app.add_subcommand(
      "gc", "Delete all but the newest N committed versions per checkpoint, and debris of crashed runs (--keep); "
            "remove what killed runs left in a node-local directory (--scratch)");
  gc_cmd->add_option("STORE", gc.store, "Store directory")->required();
  gc_cmd->add_option("--keep", gc.keep, "Committed versions to keep per checkpoint (at least 1)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            int64_t n = 0;
            auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
            if (ec == std::errc() && end == text.data() + text.size() && n >= 1) return {};
            return "must be a whole number of at least 1, not '" + text + "'";
          },
          "N>=1"));
  CLI::Option* gc_scratch =
      gc_cmd->add_option("--scratch", gc.scratch,
                         "Node-local directory (CAIRN_SCRATCH; without a value: the configured one, by default "
                         "/dev/shm/cairn-<uid>): remove the versions, recycled and routed files that runs of STORE "
                         "which are not running left there; versions not committed in STORE stay")
          ->expected(0, 1);
  gc_cmd->add_flag("--uncommitted", gc.uncommitted,
                   "With --scratch: also remove node-local versions STORE has not committed (a restart could have "
                   "restored them)");
  gc_cmd->add_option("--lease-timeout", gc.lease_timeout,
                     "With --scratch: seconds without renewal after which a run's lease is abandoned (default 30, "
                     "as lease_timeout)");
  gc_cmd->add_option("--run", gc.run, "Only this run");
  gc_cmd->add_flag("--dry-run", gc.dry_run, "Print what would be deleted, delete nothing");
  gc_cmd->add_flag("--json", gc.json, "Machine-readable JSON on stdout");

  geometry_options geo;
  CLI::App* geo_cmd = app.add_subcommand(
      "geometry", "The stripe geometry new files in a directory get (CephFS layouts can be set with the options)");
  geo_cmd->add_option("DIR", geo.dir, "Directory (e.g. the persistent level)")->required();
  geo_cmd->add_option("--stripe-unit", geo.stripe_unit, "CephFS: set the stripe unit first (bytes, multiple of 64 KiB)");
  geo_cmd->add_option("--stripe-count", geo.stripe_count, "CephFS: set the stripe count first");
  geo_cmd->add_option("--object-size", geo.object_size, "CephFS: set the object size first (multiple of the unit)");
  geo_cmd->add_flag("--json", geo.json, "Machine-readable JSON on stdout");

  diff_options diff;
  CLI::App* diff_cmd = app.add_subcommand(
      "diff", "Compare two runs version by version, region by region (exact, approximate, mismatching elements)");
  diff_cmd->add_option("STORE", diff.store, "Store directory")->required();
  diff_cmd->add_option("RUN_A", diff.run_a, "First run")->required();
  diff_cmd->add_option("RUN_B", diff.run_b, "Second run")->required();
  diff_cmd->add_option("--name", diff.name, "Only this checkpoint name (default: every name of either run)");
  diff_cmd->add_option("--abs", diff.abs, "Absolute tolerance for floats: |a-b| <= E is approximate (default 0)")
      ->check(CLI::NonNegativeNumber);
  diff_cmd->add_option("--rel", diff.rel, "Relative tolerance for floats: |a-b| <= E*max(|a|,|b|) (default 0)")
      ->check(CLI::NonNegativeNumber);
  diff_cmd->add_option("--ulps", diff.ulps, "Tolerance in units in the last place for floats (default 0)");
  diff_cmd->add_option("--region", diff.regions, "Only this region (repeat, or separate with commas)")
      ->delimiter(',');
  diff_cmd->add_flag("--mismatches-only", diff.mismatches_only,
                     "Only find mismatches: exact and approximate are reported together as 'within', and equal "
                     "tolerant tree leaves may skip reading (when the tolerance provably covers the tree quantum)");
  diff_cmd->add_option("--scratch-a", diff.scratch_a, "Node-local level of RUN_A: its shard copies are read first");
  diff_cmd->add_option("--scratch-b", diff.scratch_b, "Node-local level of RUN_B: its shard copies are read first");
  diff_cmd->add_flag("--json", diff.json, "Machine-readable JSON on stdout");
  diff_cmd->footer(
      "Floats: bitwise equal or both NaN = exact; within any given tolerance = approximate; else mismatch\n"
      "(NaN against a number and infinities against anything else are mismatches). Integers compare exactly.\n"
      "Regions with a global layout are assembled by global index (runs may differ in rank count); other\n"
      "regions compare rank by rank and only when the rank counts agree. Only committed versions (with a\n"
      "valid MANIFEST) present in both runs are compared; versions in one run only are listed.\n"
      "Exit status: 0 no mismatch and no structural difference; 1 mismatches, structural differences,\n"
      "regions that cannot be compared, unreadable shards, or no version in common; 2 bad arguments or an\n"
      "unknown store, run, checkpoint or region (the message lists those that exist).");

  advise_options adv;
  CLI::App* adv_cmd = app.add_subcommand(
      "advise", "Measure memory and I/O bandwidth, predict the cost per checkpoint (paper 001's model) and "
                "recommend the checkpoint interval (Young, Daly); with --run, compare with the run's measured costs");
  adv_cmd->add_option("STORE", adv.store, "Store directory: the persistent level (default: the configuration's)");
  adv_cmd->add_option("--run", adv.run, "Compare with this run's measured stage costs (catalog) and use its configuration");
  adv_cmd->add_option("--scratch", adv.scratch, "Node-local level directory (default: the configuration's)");
  adv_cmd->add_option("--config", adv.config_file, "Configuration file the job will use (default: the run's, else CAIRN_* and defaults)");
  adv_cmd->add_option("--bytes", adv.bytes, "Checkpoint bytes per rank, K/M/G suffixes (default: the run's mean shard, else 64M)");
  adv_cmd->add_option("--ranks-per-node", adv.ranks_per_node, "Ranks per node that will checkpoint at once (default: the run's, else 1)")
      ->check(CLI::Range(1, 1024));
  auto* mtbf_opt = adv_cmd->add_option("--mtbf", adv.mtbf, "The job's mean time between failures, seconds");
  auto* node_mtbf_opt = adv_cmd->add_option("--node-mtbf", adv.node_mtbf, "One node's mean time between failures, seconds (with --nodes)");
  adv_cmd->add_option("--nodes", adv.nodes, "The job's node count (with --node-mtbf)");
  adv_cmd->add_flag("--mtbf-from-run", adv.mtbf_from_run, "The run's own failure rate: its wall time over its restarts (needs --run)");
  adv_cmd->add_option("--crash-fraction", adv.crash_fraction,
                      "Share of failures the local level survives (process crashes), for the levels' frequencies")
      ->capture_default_str();
  adv_cmd->add_option("--reps", adv.reps, "Measurement rounds (best of)")->capture_default_str()->check(CLI::Range(1, 100));
  adv_cmd->add_option("--memory-bandwidth", adv.memory_bandwidth, "B_M in bytes/s of memory traffic (skips its measurement)");
  adv_cmd->add_option("--checksum-bandwidth", adv.checksum_bandwidth,
                      "B_H in bytes/s hashed by the checksum pass (with --memory-bandwidth; default: one read at B_M)");
  adv_cmd->add_option("--local-bandwidth", adv.local_bandwidth, "B_IO of the local level in bytes/s (skips its measurement)");
  adv_cmd->add_option("--persistent-bandwidth", adv.persistent_bandwidth, "B_IO of the persistent level in bytes/s (skips its measurement)");
  adv_cmd->add_option("--commit-seconds", adv.commit_s,
                      "With --persistent-bandwidth: seconds of one small durable write there (the commit; default 0)");
  adv_cmd->add_flag("--json", adv.json, "Machine-readable JSON on stdout (progress stays on stderr)");

  // ---- agents control plane ----
  controller_cli_options ctl;
  CLI::App* ctl_cmd = app.add_subcommand("controller", "Run the agents controller (one per deployment)");
  ctl_cmd->add_option("--listen", ctl.listen, "Address to serve on, HOST:PORT")->capture_default_str();
  ctl_cmd->add_option("--secret-file", ctl.secret_file,
                      "Deployment secret (default: $CAIRN_AGENTS_SECRET_FILE); refused without one");
  ctl_cmd->add_option("--service-secret-file", ctl.service_secret_file,
                      "Service secret that managers prove and applications do not hold (default: "
                      "$CAIRN_AGENTS_SERVICE_SECRET_FILE); refused without one unless --shared-secret");
  ctl_cmd->add_flag("--shared-secret", ctl.shared_secret,
                    "Run without a service secret: any holder of the deployment secret may then register as a "
                    "manager and be sent other applications' keys (only where all applications trust each other)");
  ctl_cmd->add_option("--journal", ctl.journal, "Journal file of the controller's state (replayed at restart)")
      ->required();
  ctl_cmd->add_option("--strategy", ctl.strategy, "Agent node choice: bandwidth, memory, activity, power")
      ->capture_default_str();
  ctl_cmd->add_option("--distribution", ctl.distribution, "Agent spreading: block, round_robin, fill")
      ->capture_default_str();
  ctl_cmd->add_option("--block-size", ctl.block_size, "Agents per node and pass for --distribution block")
      ->capture_default_str()->check(CLI::Range(1, 65536));
  ctl_cmd->add_option("--capacity", ctl.capacity, "Agents per node when its manager gives no --capacity")
      ->capture_default_str()->check(CLI::Range(1, 65536));
  ctl_cmd->add_option("--heartbeat-interval", ctl.heartbeat_interval, "Seconds between manager heartbeats")
      ->capture_default_str()->check(CLI::Range(0.01, 3600.0));
  ctl_cmd->add_option("--heartbeat-timeout", ctl.heartbeat_timeout,
                      "Seconds without a heartbeat after which a node is lost and its agents are reassigned")
      ->capture_default_str()->check(CLI::Range(0.05, 86400.0));
  ctl_cmd->add_option("--agent-bandwidth", ctl.agent_bandwidth,
                      "Bytes per second one agent moves (model for the agent count and break-even rule)")
      ->capture_default_str();
  ctl_cmd->add_option("--max-agents", ctl.max_agents, "Most agents one application gets")
      ->capture_default_str()->check(CLI::Range(1, 65536));
  ctl_cmd->add_option("--nodes-per-agent", ctl.nodes_per_agent, "One agent per this many application nodes")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  ctl_cmd->add_option("--transfer-fraction", ctl.transfer_fraction,
                      "A checkpoint should move within this share of its interval (agent count)")
      ->capture_default_str()->check(CLI::Range(0.0001, 1.0));
  ctl_cmd->add_option("--probe-cost", ctl.probe_cost,
                      "Seconds an agent change costs the application until it reports its own (t_probe)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  ctl_cmd->add_option("--metrics-listen", ctl.metrics_listen,
                      "Serve GET /metrics (OpenMetrics text) on HOST:PORT (port 0: any); default: no endpoint");
  ctl_cmd->add_flag("--verbose", ctl.verbose, "Log connections too");

  manager_cli_options mgr;
  CLI::App* mgr_cmd = app.add_subcommand("manager", "Run the agents manager of this agent node");
  mgr_cmd->add_option("--controller", mgr.controller, "The controller, HOST:PORT")->capture_default_str();
  mgr_cmd->add_option("--listen", mgr.listen, "Address to serve on, HOST:PORT (port 0: any)")->capture_default_str();
  mgr_cmd->add_option("--secret-file", mgr.secret_file, "Deployment secret (default: $CAIRN_AGENTS_SECRET_FILE)");
  mgr_cmd->add_option("--service-secret-file", mgr.service_secret_file,
                      "Service secret it proves to the controller (default: $CAIRN_AGENTS_SERVICE_SECRET_FILE); "
                      "refused without one unless --shared-secret");
  mgr_cmd->add_flag("--shared-secret", mgr.shared_secret,
                    "Prove the deployment secret instead (a controller started with --shared-secret)");
  mgr_cmd->add_option("--node-id", mgr.node_id, "Name of this agent node")->required();
  mgr_cmd->add_option("--capacity", mgr.capacity, "Agents this node takes (default: the controller's)")
      ->check(CLI::Range(1, 65536));
  mgr_cmd->add_option("--agent-program", mgr.agent_program,
                      "Agent executable to start per agent (none: agents are recorded, not launched)");
  mgr_cmd->add_option("--agent-arg", mgr.agent_args,
                      "Argument of the agent program (repeat; {agent} {app} {app_name} {node} {controller} "
                      "{reserve} {run_dir} {stats_file} {secret_file} {store} are replaced; without it the agent gets "
                      "--agent-id --app-id --app --node --controller --stats-file [--persistent {store}])")
      ->allow_extra_args(false);
  mgr_cmd->add_option("--run-dir", mgr.run_dir, "Directory of the agents' stats and logs (default $TMPDIR/cairn-manager-NODE)");
  mgr_cmd->add_option("--nominal-power", mgr.nominal_power,
                      "Watts of the node at full load, for the power estimate where RAPL is not readable")
      ->capture_default_str()->check(CLI::Range(1.0, 1e6));
  mgr_cmd->add_option("--stop-grace", mgr.stop_grace, "Seconds between SIGTERM and SIGKILL of an agent")
      ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  mgr_cmd->add_option("--metrics-listen", mgr.metrics_listen,
                      "Serve GET /metrics (OpenMetrics text) on HOST:PORT (port 0: any); default: no endpoint");
  mgr_cmd->add_flag("--verbose", mgr.verbose, "Log connections too");

  agents_cli_options ag;
  CLI::App* ag_cmd = app.add_subcommand("agents", "Ask the agents controller: status, register, resize, migrate ...");
  ag_cmd->require_subcommand(1, 1);
  auto common = [&ag](CLI::App* c) {
    c->add_option("--controller", ag.controller, "The controller, HOST:PORT")->capture_default_str();
    c->add_option("--secret-file", ag.secret_file, "Deployment secret (default: $CAIRN_AGENTS_SECRET_FILE)");
    c->add_option("--service-secret-file", ag.service_secret_file,
                  "Service secret, used instead when given (default: $CAIRN_AGENTS_SERVICE_SECRET_FILE): what "
                  "unregister, resize and migrate need in a deployment that has one");
    c->add_option("--timeout", ag.timeout, "Seconds to wait for the answer")->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
    c->add_flag("--json", ag.json, "Machine-readable JSON on stdout");
  };
  CLI::App* ag_status = ag_cmd->add_subcommand("status", "Nodes, agents per application, memory, bandwidth, strategy");
  common(ag_status);
  CLI::App* ag_reg = ag_cmd->add_subcommand(
      "register", "Register an application by hand (what the client library does at init); prints its id");
  common(ag_reg);
  ag_reg->add_option("--name", ag.name, "Application name")->required();
  ag_reg->add_option("--ranks", ag.ranks, "Hint: ranks");
  ag_reg->add_option("--nodes", ag.nodes, "Hint: nodes");
  ag_reg->add_option("--checkpoint-bytes", ag.checkpoint_bytes, "Hint: bytes per checkpoint (K/M/G suffixes)");
  ag_reg->add_option("--interval", ag.interval, "Hint: seconds between checkpoints")->check(CLI::NonNegativeNumber);
  ag_reg->add_option("--checkpoints", ag.checkpoints, "Hint: checkpoints the whole run takes");
  ag_reg->add_option("--store", ag.store,
                     "The application's persistent level: its agents write there (default: none, memory only)");
  ag_reg->add_option("--key-file", ag.key_file,
                     "Where to keep the application's key (hex, mode 600), which its job needs to take this "
                     "registration over (default: <store>/runs/<name>/agents.key with --store, else not kept)");
  ag_reg->add_option("--strategy", ag.strategy, "Override: bandwidth, memory, activity, power");
  ag_reg->add_option("--distribution", ag.distribution, "Override: block, round_robin, fill");
  ag_reg->add_option("--block-size", ag.block_size, "Override: block size");
  CLI::App* ag_unreg = ag_cmd->add_subcommand("unregister", "Release an application's agents");
  common(ag_unreg);
  ag_unreg->add_option("--app", ag.app, "Application id")->required();
  CLI::App* ag_resize = ag_cmd->add_subcommand(
      "resize", "Change an application's agent count (expansion only where the break-even rule says it pays off)");
  common(ag_resize);
  ag_resize->add_option("--app", ag.app, "Application id")->required();
  ag_resize->add_option("--agents", ag.agents, "New agent count")->required()->check(CLI::Range(1, 65536));
  ag_resize->add_flag("--force", ag.force, "Expand even when the break-even rule says it does not pay off");
  CLI::App* ag_migrate = ag_cmd->add_subcommand("migrate", "Move an agent to another node");
  common(ag_migrate);
  ag_migrate->add_option("--agent", ag.agent, "Agent id")->required();
  ag_migrate->add_option("--to", ag.to, "Node (default: the best other node by the application's strategy)");
  // ---- end of agents control plane ----

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version come here too, with exit code 0.
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (*ls_cmd) return cmd_ls(ls);
  if (*show_cmd) {
    if (cairn::status st = parse_show_args(show_args, &show); !st) {
      print_error(st);
      return kExitUsage;
    }
    return cmd_show(show);
  }
  if (*verify_cmd) return cmd_verify(verify);
  if (*restartable_cmd) return cmd_restartable(restartable);
  if (*reindex_cmd) return cmd_reindex(reindex);
  if (*stats_cmd) return cmd_stats(stats);
  if (*gc_cmd) {
    if (gc_scratch->count() > 0 && gc.scratch.empty()) {
      // The configured node-local directory (CAIRN_CONFIG, CAIRN_SCRATCH, the default).
      const char* file = std::getenv("CAIRN_CONFIG");
      auto cfg = cairn::config::load(file ? file : "");
      if (!cfg) {
        print_error(cfg.error().with_context("the configured node-local directory"));
        return exit_code_for(cfg.error());
      }
      gc.scratch = cfg->scratch;
    }
    return cmd_gc(gc);
  }
  if (*diff_cmd) return cmd_diff(diff);
  if (*geo_cmd) return cmd_geometry(geo);
  if (*adv_cmd) {
    adv.mtbf_given = mtbf_opt->count() > 0;
    adv.node_mtbf_given = node_mtbf_opt->count() > 0;
    return cmd_advise(adv);
  }
  if (*ctl_cmd) return cmd_controller(ctl);
  if (*mgr_cmd) return cmd_manager(mgr);
  if (*ag_cmd) {
    for (CLI::App* sub : {ag_status, ag_reg, ag_unreg, ag_resize, ag_migrate}) {
      if (*sub) ag.action = sub->get_name();
    }
    return cmd_agents(ag);
  }
  return kExitUsage;  // unreachable: require_subcommand(1, 1)
}

}  // namespace

int main(int argc, char** argv) {
  // Nothing may escape as an exception (CLI11 and nlohmann throw; so can
  // allocation): report it and fail.
  try {
    return run_cli(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cairn: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "cairn: internal error: unknown exception\n");
  }
  return cairn::cli::kExitFailure;
}

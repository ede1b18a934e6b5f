// cairn: command-line tool over a checkpoint store (no MPI needed).
//
//   cairn ls STORE [--run R] [--scratch DIR] [--json]
//   cairn show STORE NAME VERSION [--run R] [--json]
//   cairn verify STORE [--run R] [--scratch DIR] [--json]
//   cairn reindex STORE [--json]
//   cairn gc STORE --keep N [--run R] [--dry-run] [--json]
//   cairn diff STORE RUN_A RUN_B [--name N] [--abs E] [--rel E] [--ulps N]
//              [--region R ...] [--mismatches-only] [--scratch-a DIR] [--scratch-b DIR] [--json]
//
// Exit status: 0 success; 1 failure (verify: a problem was found; diff: the
// runs differ); 2 bad arguments (including a store, run, checkpoint or version
// that does not exist).
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "cairn.h"
#include "commands.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "history/catalog.hpp"
#include "store_scan.hpp"

namespace {

std::string version_text() {
  return "cairn " + std::to_string(CAIRN_VERSION_MAJOR) + "." + std::to_string(CAIRN_VERSION_MINOR) + "." +
         std::to_string(CAIRN_VERSION_PATCH) + " (shard format " +
         std::to_string(cairn::format::kShardFormatVersion) + ", manifest format " +
         std::to_string(cairn::format::kManifestFormatVersion) + ", catalog schema " +
         std::to_string(cairn::history::kCatalogSchemaVersion) + ")";
}

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
  show_cmd->add_option("STORE", show.store, "Store directory")->required();
  show_cmd->add_option("NAME", show.name, "Checkpoint name")->required();
  show_cmd->add_option("VERSION", show.version, "Version number")->required();
  show_cmd->add_option("--run", show.run, "Run (needed when several runs have a checkpoint NAME)");
  show_cmd->add_flag("--json", show.json, "Machine-readable JSON on stdout");

  verify_options verify;
  CLI::App* verify_cmd =
      app.add_subcommand("verify", "Re-read every shard and check every checksum; exit 1 if anything is damaged");
  verify_cmd->add_option("STORE", verify.store, "Store directory")->required();
  verify_cmd->add_option("--run", verify.run, "Only this run");
  verify_cmd->add_option("--scratch", verify.scratch, "Node-local level directory: verify its shards too");
  verify_cmd->add_flag("--json", verify.json, "Machine-readable JSON on stdout (no progress on stderr)");

  reindex_options reindex;
  CLI::App* reindex_cmd = app.add_subcommand("reindex", "Rebuild the catalog (catalog.sqlite) from the manifests");
  reindex_cmd->add_option("STORE", reindex.store, "Store directory")->required();
  reindex_cmd->add_flag("--json", reindex.json, "Machine-readable JSON on stdout");

  gc_options gc;
  CLI::App* gc_cmd = app.add_subcommand(
      "gc", "Delete all but the newest N committed versions per checkpoint, and debris of crashed runs");
  gc_cmd->add_option("STORE", gc.store, "Store directory")->required();
  gc_cmd->add_option("--keep", gc.keep, "Committed versions to keep per checkpoint (at least 1)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            int64_t n = 0;
            auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
            if (ec == std::errc() && end == text.data() + text.size() && n >= 1) return {};
            return "must be a whole number of at least 1, not '" + text + "'";
          },
          "N>=1"));
  gc_cmd->add_option("--run", gc.run, "Only this run");
  gc_cmd->add_flag("--dry-run", gc.dry_run, "Print what would be deleted, delete nothing");
  gc_cmd->add_flag("--json", gc.json, "Machine-readable JSON on stdout");

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version come here too, with exit code 0.
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (*ls_cmd) return cmd_ls(ls);
  if (*show_cmd) return cmd_show(show);
  if (*verify_cmd) return cmd_verify(verify);
  if (*reindex_cmd) return cmd_reindex(reindex);
  if (*gc_cmd) return cmd_gc(gc);
  if (*diff_cmd) return cmd_diff(diff);
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

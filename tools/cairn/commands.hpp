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
  std::string scratch;
  bool json = false;
};
int cmd_verify(const verify_options& o);

struct reindex_options {
  std::string store;
  bool json = false;
};
int cmd_reindex(const reindex_options& o);

struct gc_options {
  std::string store;
  int64_t keep = 0;  // >= 1
  std::string run;
  bool dry_run = false;
  bool json = false;
};
int cmd_gc(const gc_options& o);

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

}  // namespace cairn::cli

#endif

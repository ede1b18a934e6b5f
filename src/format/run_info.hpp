// Run identity file <store>/runs/<run>/RUN (docs/format/run.md): who produced a
// run's history. Rewritten atomically by rank 0 when an execution starts, when
// the application changes its identity, and when the execution ends.
#ifndef CAIRN_FORMAT_RUN_INFO_HPP
#define CAIRN_FORMAT_RUN_INFO_HPP

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

inline constexpr int kRunFormatVersion = 1;
inline constexpr const char* kRunFileName = "RUN";

struct execution {
  double started_at = 0;
  double ended_at = 0;  // 0 while running (or if it died)
  uint32_t nranks = 0;
  std::vector<std::string> hosts;  // distinct, sorted
  std::vector<std::string> nodes;  // distinct node identities (node_id, SLURMD_NODENAME), sorted
  std::string job;                 // batch job id (SLURM_JOB_ID), empty outside a job
  std::string executable;
  std::string code_version;
  std::map<std::string, std::string> config;  // key -> value as configured
  // The attempt tag of its shards (format::shard_header::attempt; 0 in RUN
  // files of earlier cairn versions): which node-local shards this store's
  // run wrote, as opposed to another store's run of the same name that shares
  // the node-local directory.
  uint32_t attempt = 0;
};

struct run_info {
  std::string run;
  std::string application;
  std::string code_version;                 // of the newest execution
  std::map<std::string, std::string> tags;  // merged over executions
  std::vector<execution> executions;        // oldest first
};

std::string run_file_path(const std::string& root, const std::string& run);
std::string encode_run_info(const run_info& r);
result<run_info> decode_run_info(const std::string& text, const std::string& where);
result<run_info> read_run_info(storage::storage_env* env, const std::string& root, const std::string& run);

// JSON body + "xxh3 <hex>\n" trailer, the framing shared by MANIFEST and RUN.
std::string seal_json(const std::string& body);
// `kind` names the file in messages ("manifest", "RUN file").
result<std::string> unseal_json(const std::string& text, const std::string& where, const std::string& kind);

}  // namespace cairn::format

#endif

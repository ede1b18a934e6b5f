// cairn-agent's core: one endpoint that application ranks notify, served by
// one thread that answers the quick messages (QUERY, RELEASE, push targets)
// at once and queues the transfers for a pool of workers, each with lanes of
// its own that pull images (or verify pushes, or serve restores); the last K
// versions of every (run, name, rank) kept in memory; a background writer
// that puts held versions into a store in cairn's shard format. A rank that
// makes no progress for the liveness timeout is gone: its incarnation's
// queued and running transfers are cancelled (and so they are when the run's
// next incarnation asks what the agent holds); held versions stay.
//
// The protocol is in src/agents/data_protocol.hpp; the design in
// docs/design/agents_data_plane.md.
#ifndef CAIRN_TOOLS_AGENT_AGENT_SERVER_HPP
#define CAIRN_TOOLS_AGENT_AGENT_SERVER_HPP

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "cairn/status.hpp"
#include "fabric/fabric.hpp"

namespace cairn::agents {

struct agent_config {
  // The agent's endpoint (the one applications notify).
  fabric::fabric_options fabric;
  int threads = 2;             // transfer lanes of one transfer
  int workers = 4;             // transfers served at once (each with its own lanes)
  // Seconds a transfer may make no progress before its rank counts as gone
  // (its incarnation's other transfers are then cancelled).
  double liveness_timeout_s = 5;
  uint64_t memory_budget = 0;  // bytes of images the agent may hold; 0: no limit
  uint64_t piece_bytes = 4ull << 20;
  double max_bytes_per_s = 0;  // cap on one transfer (0: none)
  int keep = 2;                // versions kept in memory per (run, name, rank)
  std::string persistent;      // store the writer fills; empty: memory only
  bool direct_io = true;       // O_DIRECT for shard files where the file system allows
  // zstd level of the shards the writer puts in `persistent` (format 3,
  // docs/format/shard.md); 0 writes them uncompressed. Default: level 1
  // (format::kDefaultCompressLevel), measured in docs/benchmarks.md.
  int compress_level = 1;
  int compress_threads = 0;    // zstd worker threads per region; 0: the writer thread alone
  double push_timeout_s = 60;  // a push or a restore by read must finish within this
  // Counters for the manager (src/agents/manager.hpp launch contract): JSON
  // {bytes_in, bytes_out, checkpoints, memory_held, memory_budget, endpoint,
  // pulls, pull_bytes, pull_seconds, pull_failures, pushes, push_bytes,
  // push_seconds, push_failures, ...}, replaced
  // atomically after every request and once a second. Empty: none.
  std::string stats_file;
  // The application's key (fabric::kPlaneKeyBytes, agents/data_protocol.hpp
  // "the seal"): every message must be sealed with it, and every reply is.
  // Empty: unsealed messages only (an agent started by hand).
  std::string key;
};

// Thread-safety: run() on one thread; request_stop() from any thread or a
// signal handler (it only sets a flag).
class agent_server {
 public:
  static result<std::unique_ptr<agent_server>> create(const agent_config& config);
  ~agent_server();

  // The endpoint name applications need (raw bytes; to_hex for files).
  const std::string& name() const;
  const fabric::fabric_properties& properties() const;

  // Serves until `stop` becomes true, then waits for the background writer to
  // finish what it has. Returns the writer's first error, if any (latched:
  // serving goes on after it).
  status run(const std::atomic<bool>& stop);

 private:
  struct impl;
  explicit agent_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace cairn::agents

#endif

// The redundancy level's data plane and engine stage (libfabric builds;
// docs/design/redundancy.md). The stage runs after the local level on an
// engine thread: it exposes the staging image to the other members of the
// rank's set, pulls the data blocks of the stripes it holds parity for,
// encodes them (codec.hpp) and writes its parity file beside its node-local
// shard; CAIRN_LEVEL_PROTECTED once every member reported its parity written.
// No MPI: READY/HELD messages (agents/data_protocol.hpp) over this plane's own
// endpoint, so they never mix with the aggregated flush's.
#ifndef CAIRN_REDUNDANCY_STAGE_HPP
#define CAIRN_REDUNDANCY_STAGE_HPP

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "agents/data_protocol.hpp"
#include "engine/engine.hpp"
#include "engine/stages.hpp"
#include "fabric/fabric.hpp"
#include "fabric/transfer.hpp"
#include "redundancy/sets.hpp"

namespace cairn::redundancy {

struct plane_options {
  std::string provider = "tcp;ofi_rxm";
  std::string bind;           // local address; empty: the provider's default
  int lanes = 2;              // pulling threads
  double timeout_s = 120;     // no message and no completion for this long: the peer is gone
  uint64_t window = 8 << 20;  // bytes of each data block pulled and encoded at a time
};

// This rank's endpoint of the redundancy data plane. Create at init, give
// name() to every rank (the client does it with its communicator), then
// set_peers with every rank's name in rank order. Used by one thread at a
// time: the stage (engine) or the rebuild (application thread, at restart).
class plane {
 public:
  static result<std::shared_ptr<plane>> create(const plane_options& o);
  const std::string& name() const { return ctx_->name(); }
  void set_peers(std::vector<std::string> names);
  const plane_options& options() const { return opts_; }
  fabric::fabric_context& context() { return *ctx_; }

  status send(uint32_t rank, const agents::data_message& m);
  // The next READY or HELD of (name, version) from `from`; gives up when
  // `cancelled` becomes true or nothing arrives for timeout_s.
  result<agents::data_message> await(agents::data_msg want, const std::string& name, int64_t version, uint32_t from,
                                     const std::atomic<bool>& cancelled);
  // Reads [addr, addr+len) of `rank`'s registered buffer `key` into local.
  status pull(uint32_t rank, uint64_t addr, uint64_t key, std::byte* local, uint64_t len);

 private:
  result<fabric::fabric_addr> peer(uint32_t rank);
  plane_options opts_;
  std::unique_ptr<fabric::fabric_context> ctx_;
  std::unique_ptr<fabric::transfer_engine> lanes_;
  std::vector<std::string> peers_;
  std::vector<fabric::fabric_addr> addrs_;
  std::vector<bool> inserted_;
  uint64_t next_request_ = 1;
  std::map<std::tuple<std::string, int64_t, uint32_t>, agents::data_message> ready_, held_;
};

// Test hook (fault_inject level=redundancy): SIGKILL this rank in the
// middle of encoding `version`, after `after` windows.
struct stage_kill {
  int64_t version = -1;
  int after = 0;
};

std::unique_ptr<engine::stage> make_stage(storage::storage_env* env, engine::level_paths paths, set_info set,
                                          std::shared_ptr<plane> p, stage_kill kill);

}  // namespace cairn::redundancy

#endif

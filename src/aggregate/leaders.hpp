// aggregate_strategy = leaders (paper 004, section 3; docs/design/aggregation.md):
// every rank announces its checksummed image to the leaders the plan gives
// its bytes to; each leader pulls those bytes by RMA read over the inter-rank
// data plane (src/fabric: its lanes), writes them with its own into the
// extents it alone owns, and syncs. No MPI: the messages (READY, HELD of the
// agents' protocol, agents/data_protocol.hpp) go over the same endpoints.
// Built with libfabric only.
#ifndef CAIRN_AGGREGATE_LEADERS_HPP
#define CAIRN_AGGREGATE_LEADERS_HPP

#include <memory>
#include <string>
#include <vector>

#include "aggregate/stage.hpp"
#include "cairn/status.hpp"

namespace cairn::aggregate {

struct data_plane_options {
  std::string provider = "tcp;ofi_rxm";
  std::string bind;          // local address; empty: the provider's default
  int lanes = 2;             // threads pulling in parallel on a leader
  double timeout_s = 120;    // no message and no completion for this long: the peer is gone
  uint64_t window = 16 << 20;  // each of a leader's two bounce buffers (one pulled while the other is written), reused
};

// This rank's end of the aggregation data plane. Create at init (no
// collective), give name() to every rank, then set_peers with every rank's
// name in rank order (the client does both through its communicator).
class data_plane;
result<std::shared_ptr<data_plane>> make_data_plane(const data_plane_options& o);
const std::string& data_plane_name(const data_plane& d);
status set_data_plane_peers(data_plane& d, std::vector<std::string> names);

std::unique_ptr<engine::stage> make_leaders_stage(storage::storage_env* env, engine::level_paths paths,
                                                  stage_options options, std::shared_ptr<data_plane> plane);

}  // namespace cairn::aggregate

#endif

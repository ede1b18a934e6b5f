// aggregate_strategy = leaders (paper 004, section 3; docs/design/aggregation.md):
// every rank announces its checksummed image to the leaders the plan gives
// its bytes to; each leader pulls those bytes by RMA read over the inter-rank
// data plane (src/fabric: its lanes), writes them with its own into the
// extents it alone owns, and syncs. No MPI: the messages (READY, HELD,
// sealed with the job's key) go over the same endpoints.
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
};

// Each of a leader's two bounce buffers (one pulled while the other is written), reused.
inline constexpr uint64_t kWindow = 16 << 20;

// This rank's end of the aggregation data plane (a mailbox of its own,
// fabric/mailbox.hpp). Create at init (no collective), give its address to
// every rank, then join with every rank's address in rank order and the job's key
// (the client does both through its communicator).
class data_plane;
result<std::shared_ptr<data_plane>> make_data_plane(const data_plane_options& o);
const std::string& data_plane_address(const data_plane& d);
status join_data_plane(data_plane& d, uint32_t self, const std::vector<std::string>& addresses, std::string key);

std::unique_ptr<engine::stage> make_leaders_stage(storage::storage_env* env, engine::level_paths paths,
                                                  stage_options options, std::shared_ptr<data_plane> plane);

}  // namespace cairn::aggregate

#endif

// The registration of the levels (level.hpp, docs/design/levels.md): the one
// place that knows which levels exist and in which order they are asked.
#include "client/levels.hpp"

#include "client/aggregate_level.hpp"
#include "client/agents_level.hpp"
#include "client/daemon_level.hpp"
#include "client/redundancy_level.hpp"

namespace cairn {

result<std::vector<std::unique_ptr<level>>> make_levels(level_host* host) {
  std::vector<std::unique_ptr<level>> out;
  CAIRN_ASSIGN_OR_RETURN(auto redundancy, redundancy_level::create(host));
  redundancy_level* sets = redundancy.get();
  if (redundancy) out.push_back(std::move(redundancy));
  // The aggregated persistent level's writers follow redundancy's encoder.
  CAIRN_ASSIGN_OR_RETURN(auto aggregated, aggregate_level::create(host));
  if (aggregated) out.push_back(std::move(aggregated));
  CAIRN_ASSIGN_OR_RETURN(auto agents, agents_level::create(host));
  if (agents) out.push_back(std::move(agents));
  // The node daemon encodes the redundancy sets in the daemons.
  CAIRN_ASSIGN_OR_RETURN(auto daemon, daemon_level::create(host, sets));
  if (daemon) out.push_back(std::move(daemon));
  return out;
}

}  // namespace cairn

// cairn controller: the agents controller service (src/agents/controller.hpp).
#include <algorithm>

#include "agents/auth.hpp"
#include "agents/controller.hpp"
#include "agents/log.hpp"
#include "commands.hpp"
#include "output.hpp"
#include "service.hpp"
#include "util/config.hpp"

namespace cairn::cli {

int cmd_controller(const controller_cli_options& o) {
  agents::set_log_name("controller");
  if (o.verbose) agents::set_log_level(agents::log_level::debug);
  service_secrets secrets;
  if (!load_service_secrets(o.secret_file, o.service_secret_file, o.shared_secret, &secrets)) return kExitUsage;
  auto listen = agents::parse_address(o.listen);
  if (!listen) {
    print_error(listen.error());
    return kExitUsage;
  }
  auto strat = agents::parse_strategy(o.strategy);
  auto dist = agents::parse_distribution(o.distribution);
  if (!strat || !dist) {
    print_error(status(errc::invalid_argument, "unknown --strategy '" + o.strategy + "' or --distribution '" +
                                                   o.distribution +
                                                   "' (bandwidth|memory|activity|power; block|round_robin|fill)"));
    return kExitUsage;
  }
  auto bw = parse_size(o.agent_bandwidth);
  if (!bw || *bw == 0) {
    print_error(status(errc::invalid_argument, "bad --agent-bandwidth '" + o.agent_bandwidth + "'"));
    return kExitUsage;
  }
  if (o.heartbeat_timeout <= o.heartbeat_interval) {
    print_error(status(errc::invalid_argument, "--heartbeat-timeout must be longer than --heartbeat-interval"));
    return kExitUsage;
  }
  agents::controller_options co;
  if (!o.metrics_listen.empty()) {
    auto ml = agents::parse_address(o.metrics_listen);
    if (!ml) {
      print_error(ml.error().with_context("--metrics-listen"));
      return kExitUsage;
    }
    co.metrics_listen = *ml;
  }
  co.listen = *listen;
  co.secret = std::move(secrets.secret);
  co.service_secret = std::move(secrets.service);
  co.journal_path = o.journal;
  co.policy.strat = *strat;
  co.policy.dist = *dist;
  co.policy.block_size = o.block_size;
  co.policy.default_capacity = o.capacity;
  co.policy.heartbeat_interval_s = o.heartbeat_interval;
  co.policy.heartbeat_timeout_s = o.heartbeat_timeout;
  co.policy.probe_cost_s = o.probe_cost;
  co.policy.count.agent_bandwidth = static_cast<double>(*bw);
  co.policy.count.max_agents = o.max_agents;
  co.policy.count.nodes_per_agent = o.nodes_per_agent;
  co.policy.count.transfer_fraction = o.transfer_fraction;
  // Managers heartbeat every interval; a connection silent for several
  // timeouts is dead even if TCP has not noticed.
  co.limits.idle_timeout_s = std::max(60.0, 4 * o.heartbeat_timeout);

  return run_service(agents::controller_service::open(std::move(co)));
}

}  // namespace cairn::cli

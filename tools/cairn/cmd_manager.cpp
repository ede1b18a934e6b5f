// cairn manager: the agents manager of one agent node (src/agents/manager.hpp).
#include "agents/auth.hpp"
#include "agents/log.hpp"
#include "agents/manager.hpp"
#include "commands.hpp"
#include "output.hpp"
#include "service.hpp"

namespace cairn::cli {

int cmd_manager(const manager_cli_options& o) {
  agents::set_log_name("manager " + o.node_id);
  if (o.verbose) agents::set_log_level(agents::log_level::debug);
  std::string warning, secret_path;
  auto secret = agents::load_deployment_secret(o.secret_file, &warning, &secret_path);
  if (!secret) {
    print_error(secret.error());
    return kExitUsage;
  }
  if (!warning.empty()) agents::log_warn(warning);
  warning.clear();
  auto service = agents::load_service_secret(o.service_secret_file, &warning);
  if (!service) {
    print_error(service.error());
    return kExitUsage;
  }
  if (!warning.empty()) agents::log_warn(warning);
  auto ctl = agents::parse_address(o.controller);
  auto listen = agents::parse_address(o.listen);
  if (!ctl || !listen) {
    print_error(!ctl ? ctl.error() : listen.error());
    return kExitUsage;
  }
  agents::manager_options mo;
  if (!o.metrics_listen.empty()) {
    auto ml = agents::parse_address(o.metrics_listen);
    if (!ml) {
      print_error(ml.error().with_context("--metrics-listen"));
      return kExitUsage;
    }
    mo.metrics_listen = *ml;
  }
  mo.controller = *ctl;
  mo.listen = *listen;
  mo.secret = std::move(*secret);
  mo.secret_file = secret_path;
  mo.service_secret = std::move(*service);
  mo.node_id = o.node_id;
  mo.capacity = o.capacity;
  mo.agent_program = o.agent_program;
  mo.agent_args = o.agent_args;
  mo.run_dir = o.run_dir;
  mo.nominal_power_w = o.nominal_power;
  mo.stop_grace_s = o.stop_grace;

  return run_service(agents::manager_service::open(std::move(mo)));
}

}  // namespace cairn::cli

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
  service_secrets secrets;
  if (!load_service_secrets(o.secret_file, o.service_secret_file, o.shared_secret, &secrets)) return kExitUsage;
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
  mo.secret = std::move(secrets.secret);
  mo.secret_file = std::move(secrets.secret_path);
  mo.service_secret = std::move(secrets.service);
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

// cairn manager: the agents manager of one agent node (src/agents/manager.hpp).
#include <signal.h>

#include <atomic>

#include "agents/auth.hpp"
#include "agents/log.hpp"
#include "agents/manager.hpp"
#include "commands.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop.store(true); }

}  // namespace

int cmd_manager(const manager_cli_options& o) {
  agents::set_log_name("manager " + o.node_id);
  if (o.verbose) agents::set_log_level(agents::log_level::debug);
  auto secret_path = agents::secret_file_from(o.secret_file);
  if (!secret_path) {
    print_error(secret_path.error());
    return kExitUsage;
  }
  std::string warning;
  auto secret = agents::load_secret(*secret_path, &warning);
  if (!secret) {
    print_error(secret.error());
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
  mo.controller = *ctl;
  mo.listen = *listen;
  mo.secret = std::move(*secret);
  mo.secret_file = *secret_path;
  mo.node_id = o.node_id;
  mo.capacity = o.capacity;
  mo.agent_program = o.agent_program;
  mo.agent_args = o.agent_args;
  mo.run_dir = o.run_dir;
  mo.nominal_power_w = o.nominal_power;
  mo.stop_grace_s = o.stop_grace;

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto m = agents::manager_service::open(std::move(mo));
  if (!m) {
    print_error(m.error());
    return exit_code_for(m.error());
  }
  status st = (*m)->run(&g_stop);
  if (!st) {
    print_error(st);
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace cairn::cli

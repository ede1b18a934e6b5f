// What `cairn controller` and `cairn manager` share: running a service until
// SIGTERM/SIGINT (agents::install_stop_signals).
#ifndef CAIRN_TOOLS_CAIRN_SERVICE_HPP
#define CAIRN_TOOLS_CAIRN_SERVICE_HPP

#include <atomic>

#include "agents/net.hpp"
#include "commands.hpp"
#include "output.hpp"
#include "store_scan.hpp"  // the exit statuses

namespace cairn::cli {

// `service` is the result of a service's open(): runs it until a stop signal
// and returns the command's exit status.
template <typename Opened>
int run_service(Opened service) {
  if (!service) {
    print_error(service.error());
    return exit_code_for(service.error());
  }
  status st = (*service)->run(agents::install_stop_signals());
  if (!st) {
    print_error(st);
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace cairn::cli

#endif

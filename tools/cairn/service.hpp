// What `cairn controller` and `cairn manager` share: a stop flag set by
// SIGTERM/SIGINT, and running a service until it is set.
#ifndef CAIRN_TOOLS_CAIRN_SERVICE_HPP
#define CAIRN_TOOLS_CAIRN_SERVICE_HPP

#include <atomic>

#include "commands.hpp"
#include "output.hpp"
#include "store_scan.hpp"  // the exit statuses

namespace cairn::cli {

// SIGTERM and SIGINT set the returned flag (SIGPIPE is ignored: a peer that
// goes away is an error of that connection, not of the service).
const std::atomic<bool>* install_stop_signals();

// `service` is the result of a service's open(): runs it until a stop signal
// and returns the command's exit status.
template <typename Opened>
int run_service(Opened service) {
  if (!service) {
    print_error(service.error());
    return exit_code_for(service.error());
  }
  status st = (*service)->run(install_stop_signals());
  if (!st) {
    print_error(st);
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace cairn::cli

#endif

// What `cairn controller` and `cairn manager` share: running a service until
// SIGTERM/SIGINT (agents::install_stop_signals).
#ifndef CAIRN_TOOLS_CAIRN_SERVICE_HPP
#define CAIRN_TOOLS_CAIRN_SERVICE_HPP

#include <atomic>
#include <string>

#include "agents/auth.hpp"
#include "agents/log.hpp"
#include "agents/net.hpp"
#include "commands.hpp"
#include "output.hpp"
#include "store_scan.hpp"  // the exit statuses

namespace cairn::cli {

// A service's two secrets (agents/auth.hpp): the deployment secret of
// `secret_file` (its path in *secret_path when given) and the service secret
// of `service_file`, which must be configured and differ from the deployment
// secret unless `shared` (--shared-secret: it is then empty or the same).
// Warnings are logged; on an error it is printed and false returned (exit
// kExitUsage).
struct service_secrets {
  std::string secret, secret_path, service;
};
inline bool load_service_secrets(const std::string& secret_file, const std::string& service_file, bool shared,
                                 service_secrets* out) {
  std::string warning;
  auto secret = agents::load_deployment_secret(secret_file, &warning, &out->secret_path);
  if (secret && !warning.empty()) agents::log_warn(warning);
  warning.clear();
  auto service = secret ? agents::load_service_secret(service_file, &warning) : secret;
  if (service && !shared && (service->empty() || *service == *secret)) {
    service = status(errc::invalid_argument,
                     std::string(service->empty() ? "no service secret" : "the service secret is the deployment secret") +
                         ": give --service-secret-file V (or set CAIRN_AGENTS_SERVICE_SECRET_FILE) with a secret that "
                         "the controller and the managers hold and the applications do not (e.g. `openssl rand -hex "
                         "32 > V; chmod 600 V`); without one any application could register as a manager and be "
                         "sent other applications' keys. --shared-secret runs without one, where every application "
                         "of the deployment trusts every other");
  }
  if (!service) {
    print_error(service.error());
    return false;
  }
  if (!warning.empty()) agents::log_warn(warning);
  out->secret = std::move(*secret);
  out->service = std::move(*service);
  return true;
}

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

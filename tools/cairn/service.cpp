#include "service.hpp"

#include <signal.h>

namespace cairn::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop.store(true); }

}  // namespace

const std::atomic<bool>* install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return &g_stop;
}

}  // namespace cairn::cli

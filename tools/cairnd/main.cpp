// cairnd: the node daemon of engine_host = daemon (docs/design/daemon.md).
// Started by the first rank of a job on each node; not meant to be started by
// hand. Exits once the job's ranks on the node are gone and their work is done.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "daemon/server.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cairnd: the node daemon that runs cairn's engine stages for a job's ranks on this node"};
  cairn::daemon::server_options o;
  app.add_option("--socket", o.socket, "abstract socket name to listen on")->required();
  app.add_option("--ranks", o.ranks, "ranks of the job on this node")->required()->check(CLI::PositiveNumber);
  app.add_option("--connect-timeout", o.connect_timeout, "seconds to wait for the ranks to connect");
  app.add_option("--drain-s", o.drain_s, "seconds to go on after SIGTERM, finishing and committing what the job left");
  CLI11_PARSE(app, argc, argv);
  // The application's terminal or launcher may be gone long before the work
  // is: a write to a closed pipe must not end the daemon.
  signal(SIGPIPE, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  // SIGTERM (a batch system's time limit or cancel, sent to every process of
  // the job step) starts the drain instead of ending the daemon mid-flush.
  cairn::daemon::install_drain_handler();
  return cairn::daemon::run_server(o);
}

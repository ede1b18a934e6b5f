// cairnd: the node daemon of engine_host = daemon (docs/design/daemon.md).
// Started by the first rank of a job on each node; not meant to be started by
// hand. Exits once the job's ranks on the node are gone and their work is done.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>

#include "daemon/protocol.hpp"
#include "daemon/server.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cairnd: the node daemon that runs cairn's engine stages for a job's ranks on this node"};
  cairn::daemon::server_options o;
  app.add_option("--socket", o.socket, "abstract socket name to listen on")->required();
  app.add_option("--ranks", o.ranks, "ranks of the job on this node")->required()->check(CLI::PositiveNumber);
  app.add_option("--connect-timeout", o.connect_timeout, "seconds to wait for the ranks to connect");
  app.add_option("--drain-s", o.drain_s, "seconds to go on after SIGTERM, finishing and committing what the job left");
  int token_fd = -1;
  app.add_option("--token-fd", token_fd,
                 "descriptor to read the execution's token from (the rank that starts cairnd passes a pipe)")
      ->required();
  CLI11_PARSE(app, argc, argv);
  char buf[cairn::daemon::kTokenBytes];
  size_t have = 0;
  while (have < sizeof buf) {
    ssize_t n = read(token_fd, buf + have, sizeof buf - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
  }
  close(token_fd);
  if (have != sizeof buf) {
    std::fprintf(stderr, "cairnd: no token of %zu bytes on descriptor %d: cairnd is started by the job's rank "
                         "(engine_host = daemon), not by hand\n", sizeof buf, token_fd);
    return 2;
  }
  o.token.assign(buf, sizeof buf);
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

// cairnd, the node daemon (engine_host = daemon, docs/design/daemon.md): one
// per node and job, started by the job's first rank on the node, listening on
// an abstract socket named after the job (its attempt tag, run and node), so
// that no two jobs ever share one. Each rank connects once (a session): it
// hands over its staging slots (shared memory) and every captured version;
// the session runs the version through the same engine stages a rank would
// (checksum, hash trees, node-local level, persistent level) and reports each
// stage back.
//
// When a rank's connection ends without its goodbye (the application died),
// the session still finishes every version it was given, then commits each
// one it wrote to the persistent level that the application had not
// committed: format::commit_if_complete, so the last writer of a version
// (this daemon or another node's) writes its MANIFEST once every rank's shard
// is there. The daemon exits once all its sessions have ended and their work
// is done, or when no rank connects in time.
//
// SIGTERM (install_drain_handler) starts a drain: no new connection is
// taken; sessions go on (their ranks usually die of the same signal, and each
// session then finishes and commits as above); drain_s seconds later the
// connections still open are closed as if their ranks had died, queued work
// is dropped, what is durable is committed, and the daemon exits.
#ifndef CAIRN_DAEMON_SERVER_HPP
#define CAIRN_DAEMON_SERVER_HPP

#include <string>

namespace cairn::daemon {

struct server_options {
  std::string socket;          // abstract socket name (protocol.hpp socket_name)
  int ranks = 1;               // ranks of the job on this node
  double connect_timeout = 60;  // seconds to wait for them to connect
  double drain_s = 20;          // after SIGTERM (config daemon_drain_s)
  // The execution's token (protocol.hpp kTokenBytes), handed over by the rank
  // that started the daemon through an inherited descriptor: a connection
  // whose hello does not carry it is refused and does not count as a rank.
  std::string token;
};

// SIGTERM starts the drain of run_server (async-signal-safe handler).
void install_drain_handler();

// Runs the daemon until it is done; returns the process exit code.
int run_server(const server_options& o);

}  // namespace cairn::daemon

#endif

// engine_host = daemon as a level (docs/design/daemon.md,
// docs/design/levels.md): the lowest rank of each node starts cairnd, every
// rank connects, staging becomes shared memory, and the levels become
// proxies of the daemon's stages (run here if the daemon dies). The daemon
// gets each version before cairn_checkpoint returns, learns of its commit,
// and is told goodbye (or that the versions are abandoned) at finalize.
#ifndef CAIRN_CLIENT_DAEMON_LEVEL_HPP
#define CAIRN_CLIENT_DAEMON_LEVEL_HPP

#include <sys/types.h>

#include <memory>

#include "client/level.hpp"

namespace cairn {

namespace daemon {
class link;
}
class redundancy_level;

class daemon_level final : public level {
 public:
  // Local: invalid_argument for what the daemon does not run. Null unless
  // engine_host = daemon. `redundancy` (may be null): the job's sets, which
  // the daemons encode.
  static result<std::unique_ptr<daemon_level>> create(level_host* host, redundancy_level* redundancy);
  ~daemon_level() override;

  bool runs_stages() const override { return true; }
  // Collective: starts and connects to the node's daemon; adds the proxies.
  status start(graph_points& g) override;
  void captured(version_record& rec) override;
  // The daemon holds the version when cairn_checkpoint returns, so that it
  // survives the application dying right after.
  bool takes_capture() const override { return true; }
  void on_level_complete(version_record& rec, unsigned level) override;
  void abandon() override;
  status finish(bool waited) override;
  void close() override;

 private:
  daemon_level(level_host* host, redundancy_level* redundancy) : host_(host), redundancy_(redundancy) {}

  level_host* host_;
  const config& cfg_ = host_->cfg();
  redundancy_level* redundancy_;
  std::shared_ptr<daemon::link> link_;
  pid_t pid_ = 0;  // the node's first rank: the daemon it started
};

}  // namespace cairn

#endif

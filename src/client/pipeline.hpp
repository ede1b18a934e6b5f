// pipeline: the stage graph a client's engine runs, assembled from the
// configuration and the levels (docs/design/levels.md). The checksum pass
// comes first (it completes the image); then the node-local level, the
// levels' stages, the persistent writers of file per process and the commit
// stage, unless a level writes or commits the persistent level itself; the
// online comparison hangs off the checksum pass. Runs once, at init, on the
// application thread; it adds stages and creates no threads.
#ifndef CAIRN_CLIENT_PIPELINE_HPP
#define CAIRN_CLIENT_PIPELINE_HPP

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analytics/online_stage.hpp"
#include "client/level.hpp"

namespace cairn {

// What the assembly decided, for the client.
struct pipeline_shape {
  bool commit_stage = false;    // the graph ends in the client's commit stage
  std::shared_ptr<analytics::online_tracker> online;  // the compare stage's tracker; null without reference_run
};

// Adds the stages to g.graph (the levels' through level::add_stages) and
// fills g's attachment points. `describe` is this rank's manifest of a job
// (the commit stage's), `host` its host name. invalid_argument for a
// reference_run that is the run itself.
result<pipeline_shape> build_pipeline(const config& cfg, storage::storage_env* env,
                                      const std::vector<std::unique_ptr<level>>& levels, graph_points& g,
                                      std::function<format::manifest(const engine::version_job&)> describe,
                                      const std::string& host);

}  // namespace cairn

#endif

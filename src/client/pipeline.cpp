#include "client/pipeline.hpp"

#include <numeric>

#include "engine/stages.hpp"

namespace cairn {

result<pipeline_shape> build_pipeline(const config& cfg, storage::storage_env* env,
                                      const std::vector<std::unique_ptr<level>>& levels, graph_points& g,
                                      std::function<format::manifest(const engine::version_job&)> describe,
                                      const std::string& host) {
  pipeline_shape shape;
  bool commits_persistent = false, writes_data = false;
  for (const auto& l : levels) {
    commits_persistent |= l->commits_persistent();
    writes_data |= l->writes_persistent_data();
  }
  engine::stage_graph& stages = *g.graph;
  // Checksum and hash trees first, in one pass (they finish the image); then
  // the levels, each of which only reads the image, run side by side.
  g.image_done = g.local =
      stages.add(engine::make_checksum_stage(cfg.hash_trees, cfg.hash_chunk, cfg.hash_abs, g.follow_capture));
  if (commits_persistent) {
    for (const auto& l : levels) CAIRN_RETURN_IF_ERROR(l->add_stages(g));
  } else {
    if (cfg.local_enabled) g.local = stages.add(engine::make_local_stage(env, g.paths, g.recycler), {g.image_done});
    for (const auto& l : levels) CAIRN_RETURN_IF_ERROR(l->add_stages(g));
    if (!writes_data) {
      // The data part is written as the application captures it, the header
      // once the checksum pass has filled it in.
      const size_t data =
          stages.add(engine::make_persistent_data_stage(g.flush_env, g.paths, cfg.direct_io, g.follow_capture), {});
      stages.add(engine::make_persistent_stage(g.flush_env, g.paths, cfg.direct_io), {g.image_done, data});
    }
    // The last rank to make its part durable commits the version, after
    // every level of it ended (the manifest records their times). With
    // mpiio that is after the collective write, which the application
    // thread makes in a cairn call.
    std::vector<size_t> ended(stages.size());
    std::iota(ended.begin(), ended.end(), size_t{0});
    shape.commit_stage = true;
    stages.add(engine::make_commit_stage(env, cfg.persistent, std::move(describe), host), std::move(ended));
  }
  if (!cfg.reference_run.empty()) {
    if (cfg.reference_run == cfg.run)
      return status{errc::invalid_argument, "reference_run '" + cfg.reference_run + "' is this run itself; set CAIRN_RUN"};
    analytics::online_reference ref;
    ref.run = cfg.reference_run;
    ref.store = cfg.reference_store.empty() ? cfg.persistent : cfg.reference_store;
    ref.scratch = cfg.reference_store.empty() ? cfg.scratch : "";
    ref.tol = {cfg.compare_abs, cfg.compare_rel, cfg.compare_ulps};
    shape.online = std::make_shared<analytics::online_tracker>(env, std::move(ref), cfg.persistent,
                                                               cfg.local_enabled ? cfg.scratch : "", cfg.run);
    stages.add(analytics::make_compare_stage(shape.online), {g.image_done});
  }
  return shape;
}

}  // namespace cairn

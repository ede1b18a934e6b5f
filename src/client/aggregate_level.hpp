// The aggregated persistent level as a level (docs/design/aggregation.md,
// docs/design/levels.md): the geometry agreed at init and the leaders' data
// plane, the stage that writes the container (aligned, posix_shared,
// leaders or mpiio), the plan of each version from the records the capture's
// collective carried, the container section of the MANIFEST, and mpiio's
// collective write, which only the application thread may make. The stages
// that move and write the data are src/aggregate/.
#ifndef CAIRN_CLIENT_AGGREGATE_LEVEL_HPP
#define CAIRN_CLIENT_AGGREGATE_LEVEL_HPP

#include <memory>
#include <string>

#include "aggregate/stage.hpp"
#include "client/level.hpp"

namespace cairn {

namespace aggregate {
class data_plane;
}

class aggregate_level final : public level {
 public:
  // Local: null unless persistent_layout (resolved) is aggregated.
  static result<std::unique_ptr<aggregate_level>> create(level_host* host);

  bool writes_persistent_data() const override { return true; }
  bool reads_retired_local() const override { return strategy_ == aggregate_strategy::leaders; }
  status add_stages(graph_points& g) override;
  // Collective: every rank plans with rank 0's geometry; the leaders' plane joined.
  status start(graph_points& g) override;

  status before_capture(bool grows) override;
  bool plans() const override { return true; }
  result<std::shared_ptr<const aggregate::plan>> plan(const std::vector<plan_record>& records) override;
  void describe(const engine::version_job& job, format::manifest* m) const override;

  std::optional<int64_t> step_state(version_record& rec) override;
  void step(version_record& rec, int64_t state) override;
  bool awaits_step() const override;
  bool wait_local(version_record& rec, unsigned level) override;

 private:
  explicit aggregate_level(level_host* host) : host_(host) {}
  // mpiio: whether rec still waits for its collective write.
  bool awaits_collective(const version_record& rec) const;

  level_host* host_;
  const config& cfg_ = host_->cfg();
  const aggregate_strategy strategy_ = cfg_.aggregate_strategy;
  uint64_t stripe_ = 0;
  uint32_t stripe_count_ = 1;
  std::string fs_name_;
  uint32_t files_ = 1;  // data files per version (M); 0: one per node up to the storage targets
  std::shared_ptr<aggregate::data_plane> plane_;  // leaders (libfabric builds)
  aggregate::transfer_kill kill_;                 // test hook (fault_inject level=transfer)
};

}  // namespace cairn

#endif

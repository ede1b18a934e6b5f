// The remote checkpoint agents as a level (docs/design/agents.md, "Client";
// docs/design/levels.md): registration at init, the agents' stages (the
// agents take the image; a rank whose agent does not writes the persistent
// level itself), the committed floor and restart from agent memory,
// cairn_probe, and the release or persist at finalize. Rank 0 alone talks
// to the controller and broadcasts what it learnt; every rank talks to its
// agent (agents_link.hpp).
#ifndef CAIRN_CLIENT_AGENTS_LEVEL_HPP
#define CAIRN_CLIENT_AGENTS_LEVEL_HPP

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "client/agents_link.hpp"
#include "client/level.hpp"

namespace cairn {

class agents_level final : public level {
 public:
  // Local: the agents' part of the configuration checked (what they do not
  // combine with), their data plane made. Null when 'agents' is empty.
  static result<std::unique_ptr<agents_level>> create(level_host* host);

  bool commits_persistent() const override { return true; }
  status add_stages(graph_points& g) override;
  status start(graph_points& g) override;

  void regions_changed() override;
  int64_t committed_floor(const std::string& name, int64_t floor, std::string* what) override;
  unsigned wants(uint64_t count) const override;
  bool lends() override;
  void submitted(version_record& rec) override;

  unsigned reached(version_record& rec) override;
  std::optional<status> wait(version_record& rec, unsigned level) override;

  void candidates(const std::string& name, std::set<int64_t>* out) override;
  status restart_allowed(const std::string& name) override;
  status load(const std::string& name, int64_t version, format::shard_image* out, std::string* why) override;
  result<std::unique_ptr<format::shard_reader>> open_unverified(const std::string& name, int64_t version) override;
  std::string where() const override { return "the agents' memory"; }
  bool keeps_restored() const override { return true; }

  status finish(bool waited) override;
  result<int> probe() override;

 private:
  agents_level(level_host* host, std::unique_ptr<agents_data> data) : host_(host), data_(std::move(data)) {}
  bool committed(const std::string& name, int64_t version);
  // Whether this rank's part of (name, version) left the process: held by
  // its agent or written by this rank (the fallback), or not pending.
  bool handed_over(const std::string& name, int64_t version);
  // Collective: rank 0 reports progress (checkpoints, checkpoint size,
  // measured transfer and reconfiguration times) so that the controller's
  // decisions use them, and gets the application's agents back (rank 0's
  // result; the other ranks get their current view).
  result<agents_view> report_progress();
  // Collective, when some rank's agents did not answer a restart: true when
  // the controller no longer lists any of them where this job knew them
  // (their node is gone: their memory with it), after a warning; false when
  // some may still come back (or the controller cannot say).
  bool forget_lost(const std::string& name);
  // keep_persistent applied to what the agents committed so far (rank 0, an engine task).
  void schedule_retention(const std::string& name);

  level_host* host_;
  const config& cfg_ = host_->cfg();
  std::unique_ptr<agents_data> data_;
  std::optional<agents_control> control_;  // rank 0 only
  agents_view view_;                       // the same on every rank
  // Restart: versions the agents hold for this rank, per checkpoint name.
  std::map<std::string, agents_holdings> holdings_;
  uint64_t checkpoints_taken_ = 0;
  uint64_t last_image_bytes_ = 0;  // this rank's last shard image
  double last_probe_s_ = 0;        // duration of the last probe that changed the agents
};

}  // namespace cairn

#endif

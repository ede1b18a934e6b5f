// Node-loss redundancy as a level (docs/design/redundancy.md,
// docs/design/levels.md): the sets formed at init and the data plane
// introduced with MPI (the stage that encodes is src/redundancy/stage.cpp, on
// engine threads, without MPI), the manifest's record, node-local retention
// that keeps the newest protected version, and the rebuild of lost
// node-local shards at restart, on the application thread.
#ifndef CAIRN_CLIENT_REDUNDANCY_LEVEL_HPP
#define CAIRN_CLIENT_REDUNDANCY_LEVEL_HPP

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/level.hpp"
#include "fabric/mailbox.hpp"
#include "format/manifest.hpp"
#include "redundancy/parity_file.hpp"
#include "redundancy/sets.hpp"
#include "util/aligned_buffer.hpp"

namespace cairn {

class redundancy_level final : public level {
 public:
  // Local: the scheme parsed and checked against the rest of the
  // configuration. Null when redundancy = none.
  static result<std::unique_ptr<redundancy_level>> create(level_host* host);

  // Forms the sets and adds the encoding stage after the node-local level.
  status add_stages(graph_points& g) override;
  unsigned wants(uint64_t count) const override;
  void describe(const engine::version_job& job, format::manifest* m) const override;
  void on_level_complete(version_record& rec, unsigned level) override;
  int64_t keep_local_from(const std::string& name) const override;
  void candidates(const std::string& name, std::set<int64_t>* out) override;
  bool rebuilds() const override { return true; }
  status rebuild(const std::string& name, int64_t version, const format::shard_image* mine,
                 format::shard_image* rebuilt) override;

  // engine_host = daemon (the daemons encode). Collective: forms this rank's
  // set and joins the plane (the rebuild at restart uses it), then returns
  // what the node daemon needs to encode: the set, the daemons' endpoints
  // (`peers`, hex, in rank order), the plane's key and the manifests' record.
  result<nlohmann::json> for_daemon(const std::vector<std::string>& peers);

 private:
  redundancy_level(level_host* host, redundancy::scheme kind) : host_(host), kind_(kind) {}
  // Collective: makes and joins the plane, forms the sets; *mine is this rank's.
  status form_set(redundancy::set_info* mine);
  // A set with a lost member as its survivors' parity files describe it
  // (the rebuild's exchange, `all`), or nullopt when no parity file covers `me`.
  struct set_record {
    const nlohmann::json* desc = nullptr;  // the survivor's entry in `all` that describes it
    redundancy::geometry g;
    uint32_t pos = 0;  // this rank's position
    std::vector<uint32_t> ranks;
    std::vector<uint64_t> sizes, hcs;  // each member's image: size, header checksum
    std::vector<std::string> nodes;
    std::vector<bool> intact;  // each member's shard exposed and the image the set protected
  };
  static std::optional<set_record> set_of(const std::vector<nlohmann::json>& all, uint32_t me);
  // Rebuild, local: this rank's lost image decoded from what every rank
  // exposed (`all`, gathered by rebuild) into rebuilt->image, verified
  // against the header checksum its set recorded (rebuilt->header); `lost`
  // names the lost members for messages.
  status decode_lost(const std::vector<nlohmann::json>& all, const set_record& rec, const std::string& name,
                     int64_t version, format::shard_image* rebuilt, std::string* lost);
  // Whether some lost rank's parity needs another lost member's data (the
  // same answer on every rank: a pure function of `all`).
  static bool parity_needs_rebuilt(const std::vector<nlohmann::json>& all);
  // Rebuild, local: the parity blocks this lost rank held, encoded again
  // from the survivors' shards and, where a contributor was lost too, its
  // image rebuilt now (`again`: every rank's second exchange, or empty).
  status encode_lost_parity(const std::vector<nlohmann::json>& all, const std::vector<nlohmann::json>& again,
                            const set_record& rec, const std::string& name, int64_t version,
                            redundancy::parity_header* ph, std::vector<util::aligned_buffer>* parity);

  level_host* host_;
  const config& cfg_ = host_->cfg();
  redundancy::scheme kind_;
  std::shared_ptr<fabric::mailbox> plane_;
  format::redundancy_info record_;             // what protected versions' manifests record
  std::map<std::string, int64_t> newest_protected_;  // per name: local retention keeps it and above
  // redundancy_required = false and the job's data plane could not be made:
  // the level protects nothing (said once at init; client settle_redundancy
  // turns the scheme off before the levels exist for the other reasons).
  bool off_ = false;
  // Test hooks (fault_inject level=redundancy): this rank dies in the middle
  // of encoding `version`, after `after` windows; with role=rebuild, in the
  // rebuild of `version` at restart, once every rank has exposed what it
  // serves (a survivor while lost ranks pull from it, a lost rank mid-pull).
  int64_t kill_version_ = -1;
  int kill_after_ = 0;
  int64_t kill_rebuild_version_ = -1;
};

}  // namespace cairn

#endif

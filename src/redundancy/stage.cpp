#include "redundancy/stage.hpp"

#include <csignal>

#include "format/layout.hpp"
#include "redundancy/parity_file.hpp"
#include "util/clock.hpp"
#include "util/hash.hpp"

namespace cairn::redundancy {

using fabric::data_message;
using fabric::data_msg;

namespace {

class redundancy_stage final : public engine::stage {
 public:
  redundancy_stage(storage::storage_env* env, engine::level_paths paths, set_info set, std::shared_ptr<plane> p,
                   stage_kill kill)
      : env_(env), paths_(std::move(paths)), set_(std::move(set)), plane_(std::move(p)), kill_(kill) {}
  const char* name() const override { return "redundancy"; }
  unsigned level() const override { return engine::kLevelProtected; }

  status run(engine::version_job& job) override {
    const auto& h = job.header;
    const uint32_t me = h.rank;
    const uint32_t k = set_.geo.k;
    fabric::memory_region mr;
    {
      auto r = plane_->context().register_memory(job.image->data(), h.file_size, fabric::kRemoteRead);
      if (!r) return r.take_status().with_context("redundancy: exposing the image");
      mr = std::move(r).value();
    }
    data_message ready;
    ready.type = data_msg::ready;
    ready.run = h.run;
    ready.name = h.name;
    ready.version = h.version;
    ready.rank = me;
    ready.nranks = h.nranks;
    ready.addr = mr.remote_address();
    ready.key = mr.key();
    ready.length = h.file_size;
    ready.text = util::hex64(h.header_checksum);
    status st;
    for (uint32_t r : set_.members)
      if (r != me && st) st = plane_->send(r, ready).with_context("redundancy: READY to rank " + std::to_string(r));
    // Every member's image: where, how long, which.
    std::vector<data_message> img(k);
    img[set_.position] = ready;
    for (uint32_t p = 0; p < k && st; ++p) {
      if (p == set_.position) continue;
      auto m = plane_->await(data_msg::ready, h.name, h.version, set_.members[p], job.cancelled);
      if (!m) st = m.take_status();
      else img[p] = std::move(*m);
    }
    if (st) st = encode(job, img);
    // HELD to every member: this rank's parity is on disk (or why not).
    data_message held;
    held.type = data_msg::held;
    held.name = h.name;
    held.version = h.version;
    held.rank = me;
    if (!st) {
      held.code = static_cast<int32_t>(st.code());
      held.text = st.message();
    }
    for (uint32_t r : set_.members)
      if (r != me) (void)plane_->send(r, held);
    if (!st) return st;
    // Complete once every member's parity is written: only then may a node go.
    for (uint32_t r : set_.members) {
      if (r == me) continue;
      auto m = plane_->await(data_msg::held, h.name, h.version, r, job.cancelled);
      if (!m) return m.take_status();
      if (status s = fabric::data_message_status(*m); !s)
        return status(errc::cancelled, "rank " + std::to_string(r) + " could not write its parity: " + s.message());
    }
    job.protected_at = util::wall_s();
    return {};
  }

 private:
  status encode(engine::version_job& job, const std::vector<data_message>& img) {
    const auto& h = job.header;
    parity_header ph;
    ph.run = h.run;
    ph.name = h.name;
    ph.version = h.version;
    ph.nranks = h.nranks;
    ph.geo = set_.geo;
    ph.position = set_.position;
    std::vector<exposed_image> exposed;
    for (uint32_t p = 0; p < set_.geo.k; ++p) {
      member x;
      x.rank = set_.members[p];
      x.node = set_.nodes[p];
      x.size = img[p].length;
      if (!util::parse_hex64(img[p].text, &x.header_checksum))
        return status(errc::internal, "redundancy: bad READY from rank " + std::to_string(x.rank));
      ph.set.push_back(std::move(x));
      exposed.push_back({set_.members[p], img[p].addr, img[p].key, img[p].length});
    }
    std::vector<util::aligned_buffer> parity;
    int windows = 0;
    CAIRN_RETURN_IF_ERROR(encode_held(*plane_, set_.geo, set_.position, exposed, &ph.blocks, &parity, [&] {
      if (kill_.version == h.version && ++windows > kill_.after) ::raise(SIGKILL);  // test hook: mid-encoding
    }).with_context("redundancy"));
    if (kill_.version == h.version) ::raise(SIGKILL);  // test hook: before the parity file
    ph.written_at = util::wall_s();
    return write_parity_file(env_, format::version_dir(paths_.scratch, h.run, h.name, h.version), h.rank, &ph, parity)
        .with_context("redundancy");
  }

  storage::storage_env* env_;
  engine::level_paths paths_;
  set_info set_;
  std::shared_ptr<plane> plane_;
  stage_kill kill_;
};

}  // namespace

std::unique_ptr<engine::stage> make_stage(storage::storage_env* env, engine::level_paths paths, set_info set,
                                          std::shared_ptr<plane> p, stage_kill kill) {
  return std::make_unique<redundancy_stage>(env, std::move(paths), std::move(set), std::move(p), kill);
}

}  // namespace cairn::redundancy

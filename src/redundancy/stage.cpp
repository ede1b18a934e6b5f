#include "redundancy/stage.hpp"

#include <algorithm>
#include <csignal>
#include <cstring>

#include "format/layout.hpp"
#include "redundancy/codec.hpp"
#include "redundancy/parity_file.hpp"
#include "util/aligned_buffer.hpp"
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
      : env_(env), paths_(std::move(paths)), set_(std::move(set)), plane_(std::move(p)), kill_(kill),
        codec_(set_.geo) {}
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
    const geometry& g = set_.geo;
    parity_header ph;
    ph.run = h.run;
    ph.name = h.name;
    ph.version = h.version;
    ph.nranks = h.nranks;
    ph.geo = g;
    ph.position = set_.position;
    for (uint32_t p = 0; p < g.k; ++p) {
      member x;
      x.rank = set_.members[p];
      x.node = set_.nodes[p];
      x.size = img[p].length;
      if (!util::parse_hex64(img[p].text, &x.header_checksum))
        return status(errc::internal, "redundancy: bad READY from rank " + std::to_string(x.rank));
      ph.set.push_back(std::move(x));
    }
    const uint64_t window = kWindow;
    const uint32_t d = g.d();
    std::vector<util::aligned_buffer> in(d);
    std::vector<util::aligned_buffer> parity;
    int windows = 0;
    for (uint32_t s : g.held_stripes(set_.position)) {
      const auto holders = g.holders(s);
      const uint32_t row = static_cast<uint32_t>(std::find(holders.begin(), holders.end(), set_.position) - holders.begin());
      const auto contrib = g.contributors(s);
      uint64_t len = 0;
      for (uint32_t c : contrib) len = std::max(len, g.chunk_bytes(img[c].length));
      auto out = util::aligned_buffer::allocate(len);
      if (!out) return out.take_status();
      for (uint64_t at = 0; at < len; at += window) {
        const uint64_t n = std::min(window, len - at);
        std::vector<const unsigned char*> src(d);
        for (uint32_t t = 0; t < d; ++t) {
          if (in[t].size() < n) {
            auto b = util::aligned_buffer::allocate(window);
            if (!b) return b.take_status();
            in[t] = std::move(b).value();
          }
          const uint32_t c = contrib[t];
          const uint64_t cb = g.chunk_bytes(img[c].length);
          const uint64_t from = static_cast<uint64_t>(g.chunk_of(c, s)) * cb + at;  // in c's image
          const uint64_t end = std::min<uint64_t>(img[c].length, std::min(from + n, from - at + cb));
          const uint64_t got = end > from ? end - from : 0;
          if (got) {
            CAIRN_RETURN_IF_ERROR(plane_->pull(set_.members[c], img[c].addr + from, img[c].key, in[t].data(), got)
                                      .with_context("redundancy: reading rank " + std::to_string(set_.members[c]) +
                                                    "'s image"));
          }
          if (got < n) std::memset(in[t].data() + got, 0, n - got);
          src[t] = reinterpret_cast<const unsigned char*>(in[t].data());
        }
        codec_.encode(row, src.data(), reinterpret_cast<unsigned char*>(out->data() + at), n);
        if (kill_.version == h.version && ++windows > kill_.after) ::raise(SIGKILL);  // test hook: mid-encoding
      }
      block b;
      b.stripe = s;
      b.row = row;
      b.length = len;
      b.checksum = util::xxh3(out->data(), len);
      ph.blocks.push_back(b);
      parity.push_back(std::move(out).value());
    }
    if (kill_.version == h.version) ::raise(SIGKILL);  // test hook: before the parity file
    ph.written_at = util::wall_s();
    const std::string head = encode_parity_header(&ph);
    const std::string dir = format::version_dir(paths_.scratch, h.run, h.name, h.version);
    const std::string path = storage::join(dir, parity_file_name(h.rank));
    CAIRN_RETURN_IF_ERROR(env_->make_dirs(dir));
    auto f = env_->create(path + ".tmp", false);
    if (!f) return f.take_status().with_context("redundancy: parity file");
    status st = (*f)->write_at(0, head.data(), head.size());
    for (size_t i = 0; st && i < ph.blocks.size(); ++i)
      st = (*f)->write_at(ph.blocks[i].offset, parity[i].data(), ph.blocks[i].length);
    if (st) st = (*f)->close();
    if (st) st = env_->rename(path + ".tmp", path);
    if (!st) (void)env_->remove_file(path + ".tmp");
    return st.with_context("redundancy: writing " + path);
  }

  storage::storage_env* env_;
  engine::level_paths paths_;
  set_info set_;
  std::shared_ptr<plane> plane_;
  stage_kill kill_;
  codec codec_;
};

}  // namespace

std::unique_ptr<engine::stage> make_stage(storage::storage_env* env, engine::level_paths paths, set_info set,
                                          std::shared_ptr<plane> p, stage_kill kill) {
  return std::make_unique<redundancy_stage>(env, std::move(paths), std::move(set), std::move(p), kill);
}

}  // namespace cairn::redundancy

#include "redundancy/coding.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "redundancy/codec.hpp"
#include "util/hash.hpp"
#include "util/process.hpp"

namespace cairn::redundancy {

status pull_windows(plane& p, std::vector<window_reads>& windows, uint32_t d, window_buffers* bufs,
                    const std::function<status(size_t, const unsigned char* const*)>& use) {
  if (windows.empty()) return {};
  uint64_t most = 0;
  for (const auto& w : windows) most = std::max(most, w.n);
  auto& in = bufs->set;
  for (auto& set : in) {
    set.resize(d);
    for (auto& b : set)
      if (b.size() < most) {
        auto made = util::aligned_buffer::allocate(most);
        if (!made) return made.take_status();
        b = std::move(made).value();
      }
  }
  auto pull = [&](size_t k) {
    for (uint32_t i = 0; i < d; ++i) windows[k].reads[i].local = in[k % 2][i].data();
    return p.pull(windows[k].reads);
  };
  status next = pull(0);
  std::vector<const unsigned char*> src(d);
  for (size_t k = 0; k < windows.size(); ++k) {
    CAIRN_RETURN_IF_ERROR(next);
    std::thread ahead;
    if (k + 1 < windows.size())
      ahead = std::thread([&, k] {
        util::name_this_thread("cairn-pull");
        next = pull(k + 1);
      });
    const window_reads& w = windows[k];
    for (uint32_t i = 0; i < d; ++i) {
      if (w.reads[i].len < w.n) std::memset(in[k % 2][i].data() + w.reads[i].len, 0, w.n - w.reads[i].len);
      src[i] = reinterpret_cast<const unsigned char*>(in[k % 2][i].data());
    }
    status st = use(k, src.data());
    if (ahead.joinable()) ahead.join();
    CAIRN_RETURN_IF_ERROR(st);
  }
  return {};
}

status encode_held(plane& p, const geometry& g, uint32_t pos, const std::vector<exposed_image>& img,
                   std::vector<block>* blocks, std::vector<util::aligned_buffer>* out,
                   const std::function<void()>& per_window) {
  const codec c(g);
  const uint32_t d = g.d();
  window_buffers bufs;  // shared by the stripes
  for (uint32_t s : g.held_stripes(pos)) {
    const auto holders = g.holders(s);
    const uint32_t row = static_cast<uint32_t>(std::find(holders.begin(), holders.end(), pos) - holders.begin());
    const auto contrib = g.contributors(s);
    uint64_t len = 0;
    for (uint32_t t : contrib) len = std::max(len, g.chunk_bytes(img[t].length));
    auto buf = util::aligned_buffer::allocate(len);
    if (!buf) return buf.take_status();
    std::vector<window_reads> windows;
    for (uint64_t at = 0; at < len; at += kWindow) {
      window_reads w;
      w.n = std::min(kWindow, len - at);
      for (uint32_t t : contrib) {
        // This window of the contributor's chunk, within its image.
        const uint64_t cb = g.chunk_bytes(img[t].length);
        const uint64_t from = static_cast<uint64_t>(g.chunk_of(t, s)) * cb + at;
        const uint64_t end = std::min<uint64_t>(img[t].length, std::min(from + w.n, from - at + cb));
        w.reads.push_back({img[t].rank, img[t].addr + from, img[t].key, nullptr, end > from ? end - from : 0});
      }
      windows.push_back(std::move(w));
    }
    std::byte* parity = buf->data();
    CAIRN_RETURN_IF_ERROR(pull_windows(p, windows, d, &bufs, [&](size_t k, const unsigned char* const* src) {
      c.encode(row, src, reinterpret_cast<unsigned char*>(parity + k * kWindow), windows[k].n);
      if (per_window) per_window();
      return status();
    }).with_context("reading the data blocks of stripe " + std::to_string(s)));
    block b;
    b.stripe = s;
    b.row = row;
    b.length = len;
    b.checksum = util::xxh3(parity, len);
    blocks->push_back(b);
    out->push_back(std::move(buf).value());
  }
  return {};
}

}  // namespace cairn::redundancy

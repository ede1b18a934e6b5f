// agents_rma_bench: the agent's pull bandwidth against a raw libfabric RMA
// read loop of the same size on the same provider, in one run.
//
//   raw        fi_read on one endpoint, one operation in flight, each as large
//              as the provider allows (ep_attr max_msg_size), busy-polling
//              the CQ: the plain libfabric reference;
//   transfer   transfer_engine::pull of the whole image with 1, 2, 4 lanes
//              (threads, an endpoint each), the agent's data path;
//   agent      pull_image with the same lanes: header first, then the regions,
//              then every xxh3 checksum verified: what `held` costs.
//
// The application side is one endpoint with a progress thread, as in
// agent_client. Each size is a valid shard image (one region). Prints, per
// size and configuration, the median and best of --reps runs in GB/s
// (10^9 bytes per second) and the ratio of the medians to raw. The
// configurations take turns within each rep (a busy machine's load changes
// hit all of them alike).
//
// usage: agents_rma_bench [--provider P] [--node ADDR] [--sizes 64M,512M]
//                         [--threads 1,2,4] [--reps 5] [--chunk BYTES] [--piece BYTES]
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cairn.h"
#include "engine/staging.hpp"
#include "fabric/fabric.hpp"
#include "fabric/transfer.hpp"
#include "format/shard.hpp"
#include "util/hash.hpp"

namespace {

using namespace cairn;
using clock_type = std::chrono::steady_clock;

uint64_t parse_bytes(std::string s) {
  uint64_t mult = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mult = 1ull << 10;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mult = 1ull << 20;
  if (!s.empty() && (s.back() == 'G' || s.back() == 'g')) mult = 1ull << 30;
  if (mult != 1) s.pop_back();
  return std::stoull(s) * mult;
}

template <typename T, typename F>
std::vector<T> parse_list(const std::string& s, F f) {
  std::vector<T> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) out.push_back(f(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "agents_rma_bench: %s\n", what.c_str());
  std::exit(1);
}

struct stats {
  double median = 0, best = 0;
};

stats summarize(std::vector<double> gbps) {
  std::sort(gbps.begin(), gbps.end());
  return {gbps[gbps.size() / 2], gbps.back()};
}

// The raw reference: fi_read of at most max_msg_size bytes, one at a time,
// polling the CQ directly (no wrapper, no threads).
double raw_read_gbps(fabric::fabric_context& ctx, fabric::fabric_addr peer, std::byte* local,
                     const fabric::memory_region* lmr, uint64_t size, uint64_t raddr, uint64_t key) {
  fid_ep* ep = ctx.raw_endpoint();
  fid_cq* cq = ctx.raw_cq();
  const uint64_t max_op = ctx.properties().max_msg_size;
  fi_context2 fctx{};
  void* desc = lmr != nullptr ? lmr->descriptor() : nullptr;
  const fi_addr_t dest = ctx.raw_address(peer);
  auto t0 = clock_type::now();
  for (uint64_t off = 0; off < size;) {
    const uint64_t len = std::min(max_op, size - off);
    ssize_t ret;
    while ((ret = fi_read(ep, local + off, len, desc, dest, raddr + off, key, &fctx)) == -FI_EAGAIN) {
      fi_cq_msg_entry e;
      (void)fi_cq_read(cq, &e, 0);  // progress
    }
    if (ret != 0) die(std::string("fi_read: ") + fi_strerror(static_cast<int>(-ret)));
    while (true) {
      fi_cq_msg_entry e;
      ssize_t n = fi_cq_read(cq, &e, 1);
      if (n == 1 && e.op_context == &fctx) break;
      if (n == -FI_EAGAIN || n == 1) continue;
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        (void)fi_cq_readerr(cq, &err, 0);
        die(std::string("fi_read completion: ") + fi_strerror(err.err));
      }
      die("fi_cq_read: " + std::to_string(n));
    }
    off += len;
  }
  double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  return size / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  fabric::fabric_options fo;
  std::string sizes_arg = "64M,512M", threads_arg = "1,2,4";
  int reps = 5;
  uint64_t chunk = 0, piece = 4ull << 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--provider") fo.provider = next();
    else if (a == "--node") fo.node = next();
    else if (a == "--sizes") sizes_arg = next();
    else if (a == "--threads") threads_arg = next();
    else if (a == "--reps") reps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--chunk") chunk = parse_bytes(next());
    else if (a == "--piece") piece = parse_bytes(next());
    else if (a == "--help" || a == "-h") {
      std::printf("usage: agents_rma_bench [--provider P] [--node ADDR] [--sizes 64M,512M] [--threads 1,2,4]\n"
                  "                        [--reps N] [--chunk BYTES] [--piece BYTES]\n");
      return 0;
    } else {
      die("unknown argument " + a);
    }
  }
  const auto sizes = parse_list<uint64_t>(sizes_arg, parse_bytes);
  const auto thread_counts = parse_list<int>(threads_arg, [](const std::string& s) { return std::stoi(s); });
  fo.timeout_s = 120;

  fabric::fabric_options app_opts = fo;
  app_opts.progress_thread = true;
  auto app = fabric::fabric_context::create(app_opts);
  if (!app) die(app.error().to_string());
  auto raw = fabric::fabric_context::create(fo);
  if (!raw) die(raw.error().to_string());
  const fabric::fabric_properties& pr = (*raw)->properties();
  std::printf("provider %s, fabric %s, domain %s, mr_mode %s, max_msg_size %llu, %s data progress%s\n",
              pr.provider.c_str(), pr.fabric.c_str(), pr.domain.c_str(), pr.mr_mode_text.c_str(),
              static_cast<unsigned long long>(pr.max_msg_size), pr.manual_progress ? "manual" : "auto",
              pr.delivery_complete ? ", delivery-complete writes" : "");
  std::printf("lanes: chunk %s, piece %llu bytes; %d reps, median and best in GB/s (1e9 B/s)\n\n",
              chunk == 0 ? "max_msg_size" : std::to_string(chunk).c_str(), static_cast<unsigned long long>(piece),
              reps);
  auto peer = (*raw)->insert_peer((*app)->name());
  if (!peer) die(peer.error().to_string());

  std::vector<std::unique_ptr<fabric::transfer_engine>> engines;
  for (int t : thread_counts) {
    fabric::transfer_options to;
    to.fabric = fo;
    to.fabric.max_chunk = chunk;
    to.threads = t;
    to.piece_bytes = piece;
    auto e = fabric::transfer_engine::create(to);
    if (!e) die(e.error().to_string());
    engines.push_back(std::move(e).value());
  }

  std::printf("%-8s %-14s %8s %8s %8s\n", "size", "path", "median", "best", "ratio");
  for (uint64_t size : sizes) {
    // The application's staging slot: a valid image of one region.
    format::shard_header h;
    h.run = "bench";
    h.name = "rma";
    h.version = 1;
    format::region_desc r;
    r.name = "data";
    r.type = CAIRN_UINT8;
    r.count = size - format::kAlign;
    h.regions.push_back(r);
    if (status st = format::plan_layout(h); !st) die(st.to_string());
    if (h.file_size != size) die("size must be a multiple of 4096 and at least 8192");
    auto slot = engine::aligned_buffer::allocate(size);
    if (!slot) die(slot.error().to_string());
    uint64_t seed = size;
    auto* words = reinterpret_cast<uint64_t*>(slot->data() + h.regions[0].offset);
    for (uint64_t i = 0; i < h.regions[0].length / 8; ++i) words[i] = (seed = seed * 6364136223846793005ULL + 1);
    h.regions[0].checksum = util::xxh3(slot->data() + h.regions[0].offset, h.regions[0].length);
    format::encode_header(h, slot->span());
    auto smr = (*app)->register_memory(slot->data(), size, fabric::kRemoteRead);
    if (!smr) die(smr.error().to_string());
    fabric::remote_buffer rb{(*app)->name(), smr->remote_address(), smr->key(), size};

    auto held = engine::aligned_buffer::allocate(size);
    if (!held) die(held.error().to_string());
    auto lmr = (*raw)->register_memory(held->data(), size, fabric::kLocal);
    if (!lmr) die(lmr.error().to_string());

    const std::string label = std::to_string(size >> 20) + " MiB";
    // Configurations interleaved rep by rep, so that load changes on a busy
    // machine hit all of them alike: 0 = raw, then transfer xN, then agent xN.
    const size_t nconf = 1 + 2 * engines.size();
    std::vector<std::vector<double>> g(nconf);
    fabric::extent whole{0, size};
    for (int i = 0; i < reps; ++i) {
      for (size_t c = 0; c < nconf; ++c) {
        std::memset(held->data(), 0, 4096);
        auto t0 = clock_type::now();
        if (c == 0) {
          g[c].push_back(raw_read_gbps(**raw, *peer, held->data(), &*lmr, size, rb.addr, rb.key));
          continue;
        }
        fabric::transfer_engine& e = *engines[(c - 1) % engines.size()];
        if (c <= engines.size()) {
          status st = e.pull(rb, held->span(), std::span<const fabric::extent>(&whole, 1));
          if (!st) die(st.to_string());
        } else {
          auto got = fabric::pull_image(e, rb, held->span(), &h);
          if (!got) die(got.error().to_string());
        }
        double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
        g[c].push_back(size / secs / 1e9);
      }
      if (std::memcmp(held->data(), slot->data(), size) != 0) die("pulled data differs");
    }
    const stats base = summarize(g[0]);
    std::printf("%-8s %-14s %8.2f %8.2f %8.2f\n", label.c_str(), "raw fi_read", base.median, base.best, 1.0);
    for (size_t c = 1; c < nconf; ++c) {
      stats st = summarize(g[c]);
      const size_t k = (c - 1) % engines.size();
      std::string path = std::string(c <= engines.size() ? "transfer x" : "agent x") + std::to_string(thread_counts[k]);
      std::printf("%-8s %-14s %8.2f %8.2f %8.2f\n", label.c_str(), path.c_str(), st.median, st.best,
                  st.median / base.median);
    }
    std::fflush(stdout);
  }
  std::printf("\nratio = median / median of raw fi_read; agent = pull_image (header, regions, xxh3 verify)\n");
  return 0;
}

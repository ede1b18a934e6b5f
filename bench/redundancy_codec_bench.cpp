// redundancy_codec_bench: what encoding costs one rank of a set (ISA-L,
// src/redundancy/codec.cpp) against memcpy of the same bytes, in one process.
// For an image of S bytes per rank and a set of k ranks, a rank encodes the
// stripes it holds: partner copies S bytes; xor reads d = k-1 chunks of
// S/(k-1) and writes one; rs(m) reads, for each of its m stripes, d = k-m
// chunks of S/d and writes one parity row. Reported per scheme: seconds per
// rank and version (median of --reps), GB/s of the rank's S, and the ratio
// to memcpy of S bytes. Output: one JSON line per (S, scheme).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "redundancy/codec.hpp"
#include "util/aligned_buffer.hpp"

using namespace cairn;

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
static double median_of(int reps, F f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = now();
    f();
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes = {64ull << 20};
  int k = 8, m = 2, reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      sizes.clear();
      std::string list = argv[++i];
      for (size_t p = 0; p <= list.size();) {
        size_t q = list.find(',', p);
        if (q == std::string::npos) q = list.size();
        sizes.push_back(std::stoull(list.substr(p, q - p)) << 20);
        p = q + 1;
      }
    } else if (a == "--k" && i + 1 < argc) k = std::atoi(argv[++i]);
    else if (a == "--m" && i + 1 < argc) m = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
  }
  for (uint64_t S : sizes) {
    auto src = util::aligned_buffer::allocate(S);
    auto dst = util::aligned_buffer::allocate(S);
    if (!src || !dst) return 1;
    for (uint64_t i = 0; i < S; i += 8) {
      uint64_t v = i * 0x9E3779B97F4A7C15ull;
      std::memcpy(src->data() + i, &v, 8);
    }
    const double t_memcpy = median_of(reps, [&] { std::memcpy(dst->data(), src->data(), S); });
    std::printf("{\"bytes\": %llu, \"scheme\": \"memcpy\", \"s\": %.6f, \"gbps\": %.3f, \"vs_memcpy\": 1.0}\n",
                static_cast<unsigned long long>(S), t_memcpy, S / t_memcpy / 1e9);
    struct c { redundancy::scheme kind; uint32_t m; };
    for (c sc : {c{redundancy::scheme::partner, 1}, c{redundancy::scheme::xor_parity, 1},
                 c{redundancy::scheme::rs, static_cast<uint32_t>(m)}}) {
      redundancy::geometry g;
      g.kind = sc.kind;
      g.k = static_cast<uint32_t>(k);
      g.m = sc.m;
      redundancy::codec codec(g);
      const uint32_t d = g.d();
      const uint64_t cb = g.chunk_bytes(S);
      // d data chunks taken from the source image (wrapping: the content does not matter), one parity out.
      std::vector<const unsigned char*> in(d);
      for (uint32_t t = 0; t < d; ++t)
        in[t] = reinterpret_cast<const unsigned char*>(src->data()) + (static_cast<uint64_t>(t) * cb) % (S - cb + 1);
      const double t_enc = median_of(reps, [&] {
        for (uint32_t r = 0; r < g.m; ++r) codec.encode(r, in.data(), reinterpret_cast<unsigned char*>(dst->data()), cb);
      });
      std::printf("{\"bytes\": %llu, \"scheme\": \"%s\", \"k\": %d, \"m\": %u, \"s\": %.6f, \"gbps\": %.3f, "
                  "\"vs_memcpy\": %.3f, \"capacity\": %.3f}\n",
                  static_cast<unsigned long long>(S), g.describe().c_str(), k, g.m, t_enc, S / t_enc / 1e9,
                  t_memcpy / t_enc, static_cast<double>(g.m) * cb / S);
    }
  }
  return 0;
}

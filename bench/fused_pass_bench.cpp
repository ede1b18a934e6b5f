// fused_pass_bench: what the engine's one pass over a version's data costs
// (issue 11, item 3), against the two passes it replaced and against fusing
// it with the capture copy itself.
//
// One float64 region of --size bytes (a smooth field), copied into a
// pre-faulted buffer as capture does, then:
//   memcpy         the capture copy alone (the reference)
//   separate       xxh3 of the region, then format::build_tree: two passes,
//                  what the engine did before
//   fused          format::checksum_and_tree: one pass, the checksum and the
//                  tree's leaves hashed from each chunk while it is in cache
//   copy+fused     capture and hashing in one pass: each chunk copied, then
//                  hashed from cache for the checksum and its leaf
// Each is timed in wall and thread CPU seconds, median of --reps; the results
// of every variant are checked against each other (bit-identical).
//
// usage: fused_pass_bench [--size BYTES] [--chunk BYTES] [--quantum Q] [--reps N]
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cairn.h"
#include "format/shard.hpp"
#include "format/tree.hpp"
#include "util/hash.hpp"

using namespace cairn;

namespace {

double clock_s(clockid_t c) {
  timespec ts{};
  clock_gettime(c, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

uint64_t parse_bytes(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<uint64_t>(v);
}

struct sample {
  double wall = 0, cpu = 0;
};

template <typename F>
sample median_of(int reps, F&& f) {
  std::vector<double> w, c;
  for (int i = 0; i < reps; ++i) {
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    f();
    c.push_back(clock_s(CLOCK_THREAD_CPUTIME_ID) - c0);
    w.push_back(clock_s(CLOCK_MONOTONIC) - w0);
  }
  std::sort(w.begin(), w.end());
  std::sort(c.begin(), c.end());
  return {w[w.size() / 2], c[c.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = 512ull << 20, chunk = 64 << 10;
  double quantum = 0;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--size") size = parse_bytes(argv[i + 1]);
    else if (a == "--chunk") chunk = parse_bytes(argv[i + 1]);
    else if (a == "--quantum") quantum = std::atof(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: fused_pass_bench [--size BYTES] [--chunk BYTES] [--quantum Q] [--reps N]\n");
      return 2;
    }
  }
  const uint64_t count = size / 8;
  size = count * 8;
  std::vector<double> src(count);
  for (uint64_t i = 0; i < count; ++i) src[i] = std::sin(static_cast<double>(i) * 1e-3) * 100;
  std::vector<std::byte> dst(size, std::byte{1});  // pre-faulted, as a staging slot

  format::shard_header h;
  h.regions.resize(1);
  h.regions[0].name = "field";
  h.regions[0].type = CAIRN_FLOAT64;
  h.regions[0].count = count;
  h.regions[0].length = size;
  const std::byte* regions[1] = {dst.data()};

  uint64_t sum_separate = 0, sum_fused = 0, sum_copy_fused = 0;
  std::string tree_separate, tree_fused, tree_copy_fused;
  sample copy = median_of(reps, [&] { std::memcpy(dst.data(), src.data(), size); });
  sample separate = median_of(reps, [&] {
    sum_separate = util::xxh3(dst.data(), size);
    tree_separate = format::encode_tree(format::build_tree(h, regions, chunk, quantum));
  });
  sample fused = median_of(reps, [&] {
    format::tree_file t;
    format::checksum_and_tree(&h, regions, chunk, quantum, &t);
    sum_fused = h.regions[0].checksum;
    tree_fused = format::encode_tree(t);
  });
  sample copy_fused = median_of(reps, [&] {
    // Capture and hashing in one pass: copy a chunk, hash it from cache.
    util::xxh3_stream s;
    format::region_tree rt;
    rt.name = "field";
    rt.type = CAIRN_FLOAT64;
    rt.count = count;
    rt.has_tolerant = quantum > 0;
    const uint64_t per = format::elements_per_chunk(chunk, CAIRN_FLOAT64);
    for (uint64_t first = 0; first < count; first += per) {
      const uint64_t n = std::min(per, count - first);
      std::byte* p = dst.data() + first * 8;
      std::memcpy(p, src.data() + first, n * 8);
      s.update(p, n * 8);
      rt.exact.push_back(format::exact_leaf(p, n, CAIRN_FLOAT64));
      if (rt.has_tolerant) rt.tolerant.push_back(format::tolerant_leaf(p, n, CAIRN_FLOAT64, quantum));
    }
    rt.exact_root = format::merkle_root(rt.exact);
    rt.tolerant_root = rt.has_tolerant ? format::merkle_root(rt.tolerant) : 0;
    format::tree_file t;
    t.chunk_bytes = chunk;
    t.quantum = quantum;
    t.regions.push_back(std::move(rt));
    sum_copy_fused = s.digest();
    tree_copy_fused = format::encode_tree(t);
  });
  const bool same = sum_separate == sum_fused && sum_fused == sum_copy_fused && tree_separate == tree_fused &&
                    tree_fused == tree_copy_fused;

  const double gib = static_cast<double>(size) / (1 << 30);
  std::printf("fused_pass_bench: %.0f MiB float64, chunk %llu, quantum %g, median of %d\n", gib * 1024,
              static_cast<unsigned long long>(chunk), quantum, reps);
  std::printf("%-28s %10s %10s %10s\n", "", "wall s", "cpu s", "x memcpy");
  auto row = [&](const char* name, sample s) {
    std::printf("%-28s %10.4f %10.4f %10.2f\n", name, s.wall, s.cpu, s.cpu / copy.cpu);
  };
  row("memcpy (capture)", copy);
  row("separate: checksum + tree", separate);
  row("fused: one pass", fused);
  row("memcpy + fused (two passes)", {copy.wall + fused.wall, copy.cpu + fused.cpu});
  row("copy+fused (capture fused)", copy_fused);
  std::printf("results identical: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}

// aggregate_plan_bench: the aggregation plan (src/aggregate/plan) at a scale
// this machine cannot run: --nodes x --ranks-per-node ranks with skewed image
// sizes. Prints the time to compute the plan (every rank computes it), the
// time to check every invariant, the bytes moved between nodes against the
// naive prefix-sum assignment, and the leaders' balance. --json for one line.
//
// usage: aggregate_plan_bench [--nodes 10000] [--ranks-per-node 128] [--leaders M]
//                             [--stripe BYTES] [--layout file|striped] [--seed S] [--reps R] [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "aggregate/plan.hpp"

using namespace cairn::aggregate;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "aggregate_plan_bench: %s\nusage: aggregate_plan_bench [--nodes N] [--ranks-per-node R] "
                       "[--leaders M] [--stripe BYTES] [--layout file|striped] [--seed S] [--reps R] [--json]\n", why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t nodes = 10000, per_node = 128, leaders = 0, stripe = 1 << 20, seed = 1, reps = 3;
  layout kind = layout::file_per_leader;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> uint64_t {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (a == "--nodes") nodes = next();
    else if (a == "--ranks-per-node") per_node = next();
    else if (a == "--leaders") leaders = next();
    else if (a == "--stripe") stripe = next();
    else if (a == "--seed") seed = next();
    else if (a == "--reps") reps = std::max<uint64_t>(1, next());
    else if (a == "--layout") {
      if (i + 1 >= argc) usage("missing value after --layout");
      std::string v = argv[++i];
      if (v == "file") kind = layout::file_per_leader;
      else if (v == "striped") kind = layout::shared_striped;
      else usage("--layout is file or striped");
    } else if (a == "--json") json = true;
    else usage(("unknown option " + a).c_str());
  }
  const uint64_t n = nodes * per_node;
  if (n == 0 || n > UINT32_MAX) usage("ranks must be 1 .. 2^32-1");
  if (leaders == 0) leaders = std::max<uint64_t>(1, nodes / 10);  // e.g. one per OST, 1 OST per 10 nodes

  // Skewed sizes: most ranks 16-48 MiB, one in ten 4x that, one in a hundred
  // nearly nothing; loads random; a node's ranks contiguous.
  std::mt19937_64 rng(seed);
  std::vector<rank_input> ranks(n);
  uint64_t total = 0;
  for (uint64_t r = 0; r < n; ++r) {
    uint64_t b = (16ull << 20) + rng() % (32ull << 20);
    const uint64_t k = rng() % 100;
    if (k < 10) b *= 4;
    else if (k == 99) b = rng() % 4096;
    ranks[r] = {b, static_cast<uint32_t>(r / per_node), static_cast<double>(rng() % 1000) / 1000.0};
    total += b;
  }

  plan_options o;
  o.leaders = static_cast<uint32_t>(leaders);
  o.stripe = stripe;
  o.kind = kind;
  std::vector<double> times;
  cairn::result<plan> p = cairn::status(cairn::errc::internal, "not run");
  for (uint64_t i = 0; i < reps; ++i) {
    const double t0 = now_s();
    p = make_plan(ranks, o);
    times.push_back(now_s() - t0);
    if (!p) {
      std::fprintf(stderr, "aggregate_plan_bench: %s\n", p.error().to_string().c_str());
      return 1;
    }
  }
  std::sort(times.begin(), times.end());
  const double plan_s = times[times.size() / 2];
  double t0 = now_s();
  cairn::status ok = check_plan(ranks, o, *p);
  const double check_s = now_s() - t0;
  o.naive = true;
  t0 = now_s();
  auto naive = make_plan(ranks, o);
  const double naive_s = now_s() - t0;
  if (!naive) {
    std::fprintf(stderr, "aggregate_plan_bench: naive: %s\n", naive.error().to_string().c_str());
    return 1;
  }
  const uint64_t max_used = *std::max_element(p->used.begin(), p->used.end());
  const double mean_used = static_cast<double>(total) / static_cast<double>(leaders);
  std::vector<uint32_t> per_node_leaders(nodes, 0);
  for (uint32_t l : p->leaders) ++per_node_leaders[ranks[l].node];
  const uint32_t max_leaders_per_node = *std::max_element(per_node_leaders.begin(), per_node_leaders.end());
  // A lower bound on what must cross nodes: the data of nodes without a leader.
  uint64_t leaderless = 0;
  for (const auto& r : ranks)
    if (per_node_leaders[r.node] == 0) leaderless += r.bytes;
  const double gib = 1024.0 * 1024 * 1024;
  if (json) {
    std::printf("{\"nodes\": %llu, \"ranks\": %llu, \"leaders\": %llu, \"stripe\": %llu, \"layout\": \"%s\", "
                "\"total_bytes\": %llu, \"plan_s\": %.6f, \"check_s\": %.6f, \"naive_plan_s\": %.6f, "
                "\"invariants_ok\": %s, \"pieces\": %zu, \"between_nodes_bytes\": %llu, "
                "\"naive_between_nodes_bytes\": %llu, \"within_nodes_bytes\": %llu, \"max_leader_bytes\": %llu, "
                "\"mean_leader_bytes\": %.0f, \"max_leaders_per_node\": %u, \"leaderless_node_bytes\": %llu}\n",
                (unsigned long long)nodes, (unsigned long long)n, (unsigned long long)leaders,
                (unsigned long long)stripe, kind == layout::file_per_leader ? "file" : "striped",
                (unsigned long long)total, plan_s, check_s, naive_s, ok ? "true" : "false", p->pieces.size(),
                (unsigned long long)p->bytes_between_nodes, (unsigned long long)naive->bytes_between_nodes,
                (unsigned long long)p->bytes_within_nodes, (unsigned long long)max_used, mean_used,
                max_leaders_per_node, (unsigned long long)leaderless);
  } else {
    std::printf("aggregation plan: %llu nodes x %llu ranks = %llu ranks, %.1f TiB, M = %llu leaders, stripe %llu, %s\n",
                (unsigned long long)nodes, (unsigned long long)per_node, (unsigned long long)n,
                static_cast<double>(total) / gib / 1024, (unsigned long long)leaders, (unsigned long long)stripe,
                kind == layout::file_per_leader ? "one file per leader" : "one striped file");
    std::printf("  plan                 %8.3f s (median of %llu; every rank computes it)\n", plan_s,
                (unsigned long long)reps);
    std::printf("  check every invariant %7.3f s: %s\n", check_s, ok ? "ok" : ok.message().c_str());
    std::printf("  pieces               %8zu (%.2f per rank)\n", p->pieces.size(),
                static_cast<double>(p->pieces.size()) / static_cast<double>(n));
    std::printf("  moved between nodes  %8.1f TiB = %.3f of the data (naive prefix sum: %.1f TiB = %.3f; "
                "lower bound, the data of nodes without a leader: %.3f); within nodes %.1f TiB\n",
                static_cast<double>(p->bytes_between_nodes) / gib / 1024,
                static_cast<double>(p->bytes_between_nodes) / static_cast<double>(total),
                static_cast<double>(naive->bytes_between_nodes) / gib / 1024,
                static_cast<double>(naive->bytes_between_nodes) / static_cast<double>(total),
                static_cast<double>(leaderless) / static_cast<double>(total),
                static_cast<double>(p->bytes_within_nodes) / gib / 1024);
    std::printf("  leader balance       max %.1f GiB / mean %.1f GiB = %.3f; at most %u leader(s) per node\n",
                static_cast<double>(max_used) / gib, mean_used / gib, static_cast<double>(max_used) / mean_used,
                max_leaders_per_node);
  }
  return ok ? 0 : 1;
}

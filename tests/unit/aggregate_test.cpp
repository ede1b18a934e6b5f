// The aggregation plan (src/aggregate/plan): property tests over random sizes,
// skew, node counts, leader counts and both layouts, plus the cases that must
// be refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>

#include "aggregate/plan.hpp"

namespace cairn::aggregate {
namespace {

std::vector<rank_input> random_ranks(std::mt19937_64& rng, uint32_t n, uint32_t nodes) {
  std::vector<rank_input> out(n);
  std::uniform_int_distribution<int> kind(0, 9);
  for (uint32_t r = 0; r < n; ++r) {
    uint64_t bytes;
    switch (kind(rng)) {
      case 0: bytes = 0; break;                                   // a rank with nothing
      case 1: bytes = rng() % (64ull << 20); break;               // big
      case 2: bytes = 1 + rng() % 4096; break;                    // tiny
      default: bytes = (1ull << 20) + rng() % (4ull << 20); break;
    }
    out[r] = {bytes, static_cast<uint32_t>(r % nodes), static_cast<double>(rng() % 100) / 100.0};
  }
  return out;
}

TEST(AggregatePlan, EveryInvariantHoldsOnRandomInputs) {
  std::mt19937_64 rng(20261124);
  for (int trial = 0; trial < 400; ++trial) {
    const uint32_t n = 1 + static_cast<uint32_t>(rng() % 64);
    const uint32_t nodes = 1 + static_cast<uint32_t>(rng() % 8);
    auto ranks = random_ranks(rng, n, nodes);
    plan_options o;
    o.leaders = 1 + static_cast<uint32_t>(rng() % n);
    o.stripe = (1 + rng() % 16) * 65536;
    o.kind = rng() % 2 ? layout::shared_striped : layout::file_per_leader;
    o.naive = rng() % 4 == 0;
    auto p = make_plan(ranks, o);
    ASSERT_TRUE(p) << p.error().to_string();
    status st = check_plan(ranks, o, *p);
    ASSERT_TRUE(st) << "trial " << trial << ": " << st.to_string();
    // Located bytes never collide: every byte of the output has one writer,
    // and a stripe never has two.
    std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint32_t>> runs;  // file, begin, end, leader
    uint64_t located = 0;
    for (const auto& x : p->pieces)
      for (const auto& run : locate(*p, x)) {
        ASSERT_LE(run.offset + run.length, p->file_bytes[run.file]) << "trial " << trial;
        runs.emplace_back(run.file, run.offset, run.offset + run.length, x.leader);
        located += run.length;
      }
    std::sort(runs.begin(), runs.end());
    for (size_t i = 1; i < runs.size(); ++i) {
      const auto& [f0, b0, e0, l0] = runs[i - 1];
      const auto& [f1, b1, e1, l1] = runs[i];
      if (f0 != f1) continue;
      ASSERT_LE(e0, b1) << "trial " << trial << ": overlapping writes";
      if (l0 != l1) {
        ASSERT_NE((e0 - 1) / o.stripe, b1 / o.stripe) << "trial " << trial << ": a stripe, two writers";
      }
    }
    uint64_t total = 0;
    for (const auto& r : ranks) total += r.bytes;
    EXPECT_EQ(located, total);
  }
}

TEST(AggregatePlan, SameInputSamePlan) {
  std::mt19937_64 rng(7);
  auto ranks = random_ranks(rng, 50, 5);
  plan_options o;
  o.leaders = 6;
  auto a = make_plan(ranks, o), b = make_plan(ranks, o);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->leaders, b->leaders);
  ASSERT_EQ(a->pieces.size(), b->pieces.size());
  for (size_t i = 0; i < a->pieces.size(); ++i) {
    EXPECT_EQ(a->pieces[i].leader, b->pieces[i].leader);
    EXPECT_EQ(a->pieces[i].stream, b->pieces[i].stream);
  }
}

TEST(AggregatePlan, LeadersSpreadOverNodesAndPreferBigLowLoadRanks) {
  // 4 nodes x 4 ranks; rank 5 is the biggest on node 1, rank 10 ties with 14
  // on node 2 but has the lower load.
  std::vector<rank_input> ranks(16);
  for (uint32_t r = 0; r < 16; ++r) ranks[r] = {1u << 20, r / 4, 0.5};
  ranks[5].bytes = 8u << 20;
  ranks[10].bytes = ranks[11].bytes = 2u << 20;
  ranks[10].load = 0.1;
  plan_options o;
  o.leaders = 4;
  auto p = make_plan(ranks, o);
  ASSERT_TRUE(p);
  std::set<uint32_t> nodes;
  for (uint32_t l : p->leaders) nodes.insert(ranks[l].node);
  EXPECT_EQ(nodes.size(), 4u) << "one leader per node";
  EXPECT_NE(std::find(p->leaders.begin(), p->leaders.end(), 5u), p->leaders.end());
  EXPECT_NE(std::find(p->leaders.begin(), p->leaders.end(), 10u), p->leaders.end());
  // A leader keeps its own data.
  for (const auto& x : p->pieces) {
    if (x.rank == 5) {
      EXPECT_EQ(p->leaders[x.leader], 5u);
    }
  }
}

TEST(AggregatePlan, MovesLessBetweenNodesThanAPrefixSum) {
  std::mt19937_64 rng(3);
  auto ranks = random_ranks(rng, 256, 16);
  plan_options o;
  o.leaders = 16;
  auto smart = make_plan(ranks, o);
  o.naive = true;
  auto naive = make_plan(ranks, o);
  ASSERT_TRUE(smart && naive);
  EXPECT_LT(smart->bytes_between_nodes, naive->bytes_between_nodes);
}

TEST(AggregatePlan, BadOptionsAreRefused) {
  std::vector<rank_input> ranks(4, {1 << 20, 0, 0});
  plan_options o;
  o.leaders = 5;
  auto p = make_plan(ranks, o);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code(), errc::invalid_argument);
  EXPECT_NE(p.error().message().find("must be 1 to the 4 ranks"), std::string::npos) << p.error().message();
  o.leaders = 0;
  EXPECT_FALSE(make_plan(ranks, o));
  o.leaders = 2;
  o.stripe = 1000;
  p = make_plan(ranks, o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message().find("multiple of 4096"), std::string::npos);
  EXPECT_FALSE(make_plan({}, plan_options{}));
}

TEST(AggregatePlan, CheckPlanCatchesABrokenPlan) {
  std::vector<rank_input> ranks(8, {3 << 20, 0, 0});
  for (uint32_t r = 0; r < 8; ++r) ranks[r].node = r / 2;
  plan_options o;
  o.leaders = 2;
  auto p = make_plan(ranks, o);
  ASSERT_TRUE(p);
  ASSERT_TRUE(check_plan(ranks, o, *p));
  auto twice = *p;
  twice.pieces[1].src -= 1;  // one byte assigned twice
  EXPECT_FALSE(check_plan(ranks, o, twice));
  auto over = *p;
  over.capacity[0] = 4096;
  EXPECT_FALSE(check_plan(ranks, o, over));
  auto shared = *p;
  shared.owned[1].file = shared.owned[0].file;
  EXPECT_FALSE(check_plan(ranks, o, shared));
}

}  // namespace
}  // namespace cairn::aggregate

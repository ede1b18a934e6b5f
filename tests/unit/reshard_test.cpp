// Unit tests of src/format/reshard: the byte runs a new block needs from an
// old one (checked element by element against a brute-force mapping), and
// which regions can be redistributed.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cairn.h"
#include "format/reshard.hpp"

namespace cairn {
namespace {

using format::copy_run;

// Splits n into `parts` uneven pieces; piece i's start and size.
void split(uint64_t n, uint64_t parts, uint64_t i, uint64_t* start, uint64_t* count) {
  uint64_t base = n / parts, extra = n % parts;
  *count = base + (i < extra);
  *start = i * base + (i < extra ? i : extra);
}

TEST(ReshardRuns, AssembleEveryNewBlockFromTheOldOnesElementByElement) {
  // Global arrays of element index values; every old decomposition into
  // every new one, 1-D to 3-D.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t nd = 1 + trial % 3;
    std::vector<uint64_t> g(nd);
    for (auto& x : g) x = 3 + rng() % 9;
    auto blocks = [&](std::vector<uint64_t> parts) {
      std::vector<std::pair<std::vector<uint64_t>, std::vector<uint64_t>>> out;
      std::vector<uint64_t> idx(nd, 0);
      for (;;) {
        std::vector<uint64_t> s(nd), c(nd);
        for (size_t d = 0; d < nd; ++d) split(g[d], parts[d], idx[d], &s[d], &c[d]);
        out.push_back({s, c});
        size_t d = nd;
        while (d-- > 0 && ++idx[d] == parts[d]) idx[d] = 0;
        if (d == SIZE_MAX) break;
      }
      return out;
    };
    std::vector<uint64_t> po(nd), pn(nd);
    for (size_t d = 0; d < nd; ++d) po[d] = 1 + rng() % 3, pn[d] = 1 + rng() % 3;
    auto olds = blocks(po), news = blocks(pn);
    auto linear = [&](const std::vector<uint64_t>& i, const std::vector<uint64_t>& dims) {
      uint64_t l = 0;
      for (size_t d = 0; d < nd; ++d) l = l * dims[d] + i[d];
      return l;
    };
    // Old blocks' data: each element holds its global linear index.
    std::vector<std::vector<uint32_t>> old_data;
    for (auto& [s, c] : olds) {
      uint64_t n = 1;
      for (auto x : c) n *= x;
      std::vector<uint32_t> v(n);
      for (uint64_t e = 0; e < n; ++e) {
        std::vector<uint64_t> i(nd);
        uint64_t r = e;
        for (size_t d = nd; d-- > 0;) i[d] = s[d] + r % c[d], r /= c[d];
        v[e] = static_cast<uint32_t>(linear(i, g));
      }
      old_data.push_back(std::move(v));
    }
    for (auto& [s, c] : news) {
      uint64_t n = 1;
      for (auto x : c) n *= x;
      std::vector<uint32_t> got(n, UINT32_MAX);
      uint64_t covered = 0;
      for (size_t k = 0; k < olds.size(); ++k) {
        std::vector<copy_run> runs;
        covered += format::overlap_runs(olds[k].first, olds[k].second, s, c, 4, &runs);
        for (size_t i = 1; i < runs.size(); ++i) ASSERT_GT(runs[i].src, runs[i - 1].src);
        for (auto& r : runs)
          std::memcpy(reinterpret_cast<char*>(got.data()) + r.dst,
                      reinterpret_cast<const char*>(old_data[k].data()) + r.src, r.len);
      }
      ASSERT_EQ(covered, n);
      for (uint64_t e = 0; e < n; ++e) {
        std::vector<uint64_t> i(nd);
        uint64_t r = e;
        for (size_t d = nd; d-- > 0;) i[d] = s[d] + r % c[d], r /= c[d];
        ASSERT_EQ(got[e], linear(i, g)) << "trial " << trial << " element " << e;
      }
    }
  }
}

TEST(ReshardRuns, FullRowsMergeIntoOneRun) {
  std::vector<copy_run> runs;
  // Old block rows 0..9 of a 10 x 8 array; new block rows 4..9: one run.
  EXPECT_EQ(format::overlap_runs({0, 0}, {10, 8}, {4, 0}, {6, 8}, 8, &runs), 48u);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].src, 4u * 8 * 8);
  EXPECT_EQ(runs[0].dst, 0u);
  EXPECT_EQ(runs[0].len, 48u * 8);
  runs.clear();
  EXPECT_EQ(format::overlap_runs({0, 0}, {10, 4}, {0, 4}, {10, 4}, 8, &runs), 0u);  // disjoint
  EXPECT_TRUE(runs.empty());
}

format::region_desc block(const std::string& name, std::vector<uint64_t> global, std::vector<uint64_t> start,
                          std::vector<uint64_t> dims) {
  format::region_desc d;
  d.name = name;
  d.type = CAIRN_FLOAT64;
  d.flags = format::kHasLayout;
  d.global = std::move(global);
  d.start = std::move(start);
  d.count = 1;
  for (auto x : dims) d.count *= x;
  d.dims = std::move(dims);
  return d;
}

format::region_desc plain(const std::string& name, uint64_t count, uint64_t checksum) {
  format::region_desc d;
  d.name = name;
  d.type = CAIRN_INT64;
  d.count = count;
  d.checksum = checksum;
  return d;
}

TEST(ReshardPlan, BlocksAndReplicatedRegionsCanBeRedistributed) {
  std::vector<format::shard_header> old(2);
  old[0].regions = {block("u", {4, 6}, {0, 0}, {2, 6}), plain("step", 1, 42)};
  old[1].regions = {plain("step", 1, 42), block("u", {4, 6}, {2, 0}, {2, 6})};
  auto plan = format::plan_regions(old, 3, "'grid' version 6");
  ASSERT_TRUE(plan) << plan.error().message();
  EXPECT_TRUE(plan->at("u").block);
  EXPECT_EQ(plan->at("u").global, (std::vector<uint64_t>{4, 6}));
  EXPECT_FALSE(plan->at("step").block);
  EXPECT_EQ(plan->at("step").count, 1u);
}

TEST(ReshardPlan, ARegionWithoutLayoutThatDiffersIsUnusableWithWhatToDo) {
  std::vector<format::shard_header> old(2);
  old[0].regions = {plain("u", 10, 1)};
  old[1].regions = {plain("u", 10, 2)};
  auto plan = format::plan_regions(old, 3, "'grid' version 6");
  ASSERT_FALSE(plan);
  EXPECT_EQ(plan.error().code(), errc::unusable);
  const std::string& m = plan.error().message();
  EXPECT_NE(m.find("'grid' version 6 was written by 2 ranks; this job has 3"), std::string::npos) << m;
  EXPECT_NE(m.find("region 'u' has no global layout"), std::string::npos) << m;
  EXPECT_NE(m.find("Relaunch with 2 ranks"), std::string::npos) << m;
}

TEST(ReshardPlan, BlocksWithAGapOrAnotherGlobalShapeAreUnusable) {
  std::vector<format::shard_header> old(2);
  old[0].regions = {block("u", {4, 6}, {0, 0}, {2, 6})};
  old[1].regions = {block("u", {4, 6}, {2, 0}, {1, 6})};
  auto gap = format::plan_regions(old, 1, "v");
  ASSERT_FALSE(gap);
  EXPECT_NE(gap.error().message().find("hold 18 elements, not the 24"), std::string::npos) << gap.error().message();
  old[1].regions = {block("u", {5, 6}, {2, 0}, {2, 6})};
  auto other = format::plan_regions(old, 1, "v");
  ASSERT_FALSE(other);
  EXPECT_NE(other.error().message().find("different types or global layouts"), std::string::npos);
  old[1].regions = {block("w", {4, 6}, {2, 0}, {2, 6})};
  auto missing = format::plan_regions(old, 1, "v");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("not in rank 1's"), std::string::npos);
}

}  // namespace
}  // namespace cairn

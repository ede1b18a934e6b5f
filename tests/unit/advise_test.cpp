// Paper 001's overhead model and the checkpoint intervals (src/advise/model),
// and the bandwidth measurements on real files (src/advise/measure).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "advise/measure.hpp"
#include "advise/model.hpp"
#include "storage/storage_env.hpp"

namespace cairn::advise {
namespace {

TEST(Young, IsSqrtOfTwoCostTimesMtbf) {
  auto t = young_interval(60, 86400);
  ASSERT_TRUE(t.is_ok()) << t.error().to_string();
  EXPECT_NEAR(*t, 3219.937887599697, 1e-9);  // sqrt(2 * 60 * 86400)
  EXPECT_NEAR(*young_interval(600, 3600), 2078.460969082653, 1e-9);
}

TEST(Daly, HigherOrderEstimate) {
  // sqrt(2CM)(1 + sqrt(C/2M)/3 + (C/2M)/9) - C
  EXPECT_NEAR(*daly_interval(60, 86400), 3180.0621135984475, 1e-9);
  EXPECT_NEAR(*daly_interval(600, 3600), 1697.7059780556401, 1e-9);
  // A checkpoint longer than twice the MTBF: checkpoint every MTBF.
  EXPECT_DOUBLE_EQ(*daly_interval(200, 100), 100.0);
  EXPECT_DOUBLE_EQ(*daly_interval(200, 99), 99.0);
}

TEST(Intervals, RejectMissingOrNonPositiveInputs) {
  for (double bad : {0.0, -1.0}) {
    auto y = young_interval(10, bad);
    ASSERT_FALSE(y.is_ok());
    EXPECT_EQ(y.error().code(), errc::invalid_argument);
    EXPECT_NE(y.error().message().find("MTBF must be a positive number"), std::string::npos) << y.error().message();
    auto d = daly_interval(bad, 100);
    ASSERT_FALSE(d.is_ok());
    EXPECT_NE(d.error().message().find("checkpoint cost must be a positive number"), std::string::npos);
  }
  EXPECT_EQ(job_mtbf(3600, 0).error().code(), errc::invalid_argument);
  EXPECT_EQ(job_mtbf(-5, 4).error().code(), errc::invalid_argument);
  EXPECT_DOUBLE_EQ(*job_mtbf(86400.0 * 365, 1000), 31536.0);
}

TEST(Passes, MFollowsTheConfiguration) {
  engine_shape s;  // defaults: checksum, hash trees, local, O_DIRECT persistent
  EXPECT_DOUBLE_EQ(passes_m(memory_passes(s)), 6.0);
  EXPECT_DOUBLE_EQ(passes_m(memory_passes(s), true), 5.0);
  s.hash_trees = false;  // the trees are hashed in the checksum's pass: no traffic of their own
  EXPECT_DOUBLE_EQ(passes_m(memory_passes(s)), 6.0);
  s.local = false;
  EXPECT_DOUBLE_EQ(passes_m(memory_passes(s)), 4.0);
  s.direct_io = false;  // buffered persistent write: a CPU copy
  EXPECT_DOUBLE_EQ(passes_m(memory_passes(s)), 5.0);
  EXPECT_DOUBLE_EQ(passes_m(memory_passes(s), true), 5.0);
}

TEST(Shape, FromConfigurationValues) {
  auto s = shape_from_config({{"mode", "sync"}, {"hash_trees", "false"}, {"persistent_interval", "4"},
                              {"scratch", "/ignored"}, {"some_future_key", "x"}});
  ASSERT_TRUE(s.is_ok()) << s.error().to_string();
  EXPECT_TRUE(s->sync);
  EXPECT_FALSE(s->hash_trees);
  EXPECT_TRUE(s->local);
  EXPECT_TRUE(s->direct_io);
  EXPECT_EQ(s->persistent_interval, 4);
  EXPECT_TRUE(s->recycled_local);
  // The local level's files are recycled except in daemon mode and with the
  // leaders' aggregation (persistent_layout = auto aggregates on CephFS).
  EXPECT_FALSE(shape_from_config({{"engine_host", "daemon"}})->recycled_local);
  EXPECT_FALSE(shape_from_config({}, "cephfs")->recycled_local);
  EXPECT_TRUE(shape_from_config({}, "ext4")->recycled_local);
  EXPECT_TRUE(shape_from_config({{"agents", "host:1"}}, "cephfs")->recycled_local);
  EXPECT_TRUE(shape_from_config({{"aggregate_strategy", "aligned"}}, "cephfs")->recycled_local);
  EXPECT_FALSE(shape_from_config({{"persistent_layout", "aggregated"}})->recycled_local);
  auto bad = shape_from_config({{"mode", "fast"}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.error().code(), errc::invalid_argument);
  EXPECT_NE(bad.error().message().find("'mode'"), std::string::npos) << bad.error().message();
}

TEST(Predict, PerStageAndPaperCosts) {
  engine_shape s;
  workload w{64ull << 20, 2};  // S_node = 128 MiB
  bandwidths b{10e9, 10e9, 5e9, 1e9};
  auto p = predict(s, w, b);
  ASSERT_TRUE(p.is_ok()) << p.error().to_string();
  ASSERT_EQ(p->stages.size(), 4u);
  EXPECT_EQ(p->stages[0].stage, "capture");
  EXPECT_NEAR(p->stages[0].seconds, 0.0268435456, 1e-12);  // 2 * S_node / B_M
  EXPECT_EQ(p->stages[1].stage, "checksum");               // with the hash trees, one pass
  EXPECT_NEAR(p->stages[1].seconds, 0.0134217728, 1e-12);
  EXPECT_EQ(p->stages[2].bound, "io");
  EXPECT_NEAR(p->stages[2].seconds, 0.0268435456, 1e-12);  // S_node / B_IO,local
  EXPECT_NEAR(p->stages[3].seconds, 0.134217728, 1e-12);   // S_node / B_IO,persistent
  EXPECT_NEAR(p->sync_s, 0.201326592, 1e-12);
  EXPECT_NEAR(p->sync_io_only_s, 0.134217728, 1e-12);
  EXPECT_NEAR(p->async_s, 0.067108864, 1e-12);         // m_cpu = 5
  EXPECT_NEAR(p->async_paper_s, 0.0805306368, 1e-12);  // m = 6
  EXPECT_NEAR(p->blocked_async_s, 0.0268435456, 1e-12);
  // Every 4th version persistent: a sync checkpoint pays a quarter of it on average.
  s.sync = true;
  s.persistent_interval = 4;
  EXPECT_NEAR(predict(s, w, b)->sync_s, 0.201326592 - 0.134217728 * 0.75, 1e-12);
}

TEST(Predict, TmpfsLocalLevelAndCommit) {
  engine_shape s;
  workload w{64ull << 20, 2};
  bandwidths b{10e9, 10e9, 5e9, 1e9};
  b.local_in_memory = true;  // the local write is CPU at B_IO,local, not 2 passes at B_M
  b.commit_s = 0.005;
  auto p = predict(s, w, b);
  ASSERT_TRUE(p.is_ok());
  ASSERT_EQ(p->stages.size(), 5u);
  EXPECT_EQ(p->stages[4].stage, "commit");
  EXPECT_NEAR(p->stages[4].seconds, 0.01, 1e-12);  // MANIFEST + catalog: two small durable writes
  EXPECT_NEAR(p->sync_s, 0.201326592 + 0.01, 1e-12);
  EXPECT_NEAR(p->async_s, 3 * 0.0134217728 + 0.0268435456, 1e-12);
  s.sync = true;
  s.persistent_interval = 2;  // the commit too comes with every 2nd version only
  EXPECT_NEAR(predict(s, w, b)->sync_s, 0.201326592 - 0.134217728 / 2 + 0.005, 1e-12);
}

TEST(Predict, ChecksumPassAtItsMeasuredRate) {
  engine_shape s;
  workload w{64ull << 20, 2};
  bandwidths b{10e9, 10e9, 5e9, 1e9};
  b.checksum_cpu = 2e9;  // hashing bounds it, not the memory: slower than one read at B_M
  auto p = predict(s, w, b);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->stages[1].stage, "checksum");
  EXPECT_EQ(p->stages[1].bound, "cpu");
  EXPECT_NEAR(p->stages[1].seconds, 0.067108864, 1e-12);  // S_node / 2 GB/s
  EXPECT_NEAR(p->async_s, 0.067108864 - 0.0134217728 + 0.067108864, 1e-12);
  EXPECT_NEAR(p->async_paper_s, 0.0805306368, 1e-12);  // the paper's m S / B_M is unchanged
}

TEST(Predict, MissingBandwidthIsAnError) {
  engine_shape s;
  auto p = predict(s, {1 << 20, 1}, {10e9, 0, 0, 1e9});
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.error().message().find("local level's write bandwidth"), std::string::npos) << p.error().message();
  EXPECT_EQ(predict(s, {0, 1}, {1, 1, 1, 1}).error().code(), errc::invalid_argument);
}

TEST(Advice, LevelsFrequencies) {
  // Local: Daly(1 s, 3600 s) = 84.19 s; persistent only for the 10 % of
  // failures the local level does not survive: Daly(10 s, 36000 s) = 841.9 s.
  auto a = advise_interval(1, 3600, 1, 10, 0, 0.9);
  ASSERT_TRUE(a.is_ok()) << a.error().to_string();
  EXPECT_NEAR(a->daly_s, 84.18745653272124, 1e-9);
  EXPECT_NEAR(a->local_interval_s, 84.18745653272124, 1e-9);
  EXPECT_NEAR(a->persistent_interval_s, 841.8745653272124, 1e-9);
  EXPECT_EQ(a->persistent_interval, 10);
  EXPECT_NEAR(a->expected_overhead, 0.023709845276448434, 1e-12);
  // Thread mode with O_DIRECT: the persistent write costs the application
  // nothing, but it takes 200 s: not more often than every 3rd checkpoint.
  auto t = advise_interval(1, 3600, 1, 0, 200, 0.9);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->persistent_interval, 3);
  // Without a local level every checkpoint is persistent.
  EXPECT_EQ(advise_interval(5, 3600, 0, 5, 5, 0.85)->persistent_interval, 1);
  EXPECT_EQ(advise_interval(1, 3600, 1, 1, 0, 1.0).error().code(), errc::invalid_argument);
}

class Measure : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/advise_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(Measure, MemoryAndIoBandwidthsArePositiveAndLeaveNothingBehind) {
  measure_options o;
  o.bytes_per_rank = 4 << 20;
  o.ranks = 2;
  o.reps = 2;
  int steps = 0;
  o.progress = [&](const std::string&) { ++steps; };
  auto m = measure_memory(o);
  ASSERT_TRUE(m.is_ok()) << m.error().to_string();
  EXPECT_GT(m->bandwidth, 0);
  EXPECT_GT(m->bandwidth_cpu, 0);
  EXPECT_EQ(steps, 6);  // 2 allocations, 2 copy rounds, 2 checksum rounds
  EXPECT_GT(m->checksum, 0);
  EXPECT_GT(m->checksum_cpu, 0);
  for (bool durable : {false, true}) {
    for (bool recycled : {false, true}) {
      auto io = measure_io(storage::storage_env::posix(), dir_, durable, durable, recycled, o);
      ASSERT_TRUE(io.is_ok()) << io.error().to_string();
      EXPECT_GT(io->bandwidth, 0);
      EXPECT_EQ(io->durable, durable);
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_));  // the temporary files and directory are gone
  auto missing = measure_io(storage::storage_env::posix(), dir_ + "/nope", false, false, true, o);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.error().code(), errc::not_found);
  o.ranks = 0;
  EXPECT_EQ(measure_memory(o).error().code(), errc::invalid_argument);
}

}  // namespace
}  // namespace cairn::advise

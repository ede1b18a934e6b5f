// Batch jobs (docs/design/core.md, "Batch jobs"): warning signals, chaining of
// the application's handlers, the deadline, node identity, and
// cairn_should_checkpoint / cairn_time_left on a single-process handle.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <numeric>
#include <vector>

#include "cairn.h"
#include "cairn/cairn.hpp"
#include "client/batch_job.hpp"
#include "client/client.hpp"
#include "format/run_info.hpp"
#include "storage/storage_env.hpp"

namespace cairn {
namespace {

std::atomic<int> g_app_calls{0};
void app_handler(int) { g_app_calls.fetch_add(1); }

TEST(batch_signals, parse_names_numbers_and_none) {
  auto s = batch::parse_signals("USR1,SIGTERM,usr2,10");
  ASSERT_TRUE(s) << s.error().to_string();
  EXPECT_EQ(*s, (std::vector<int>{SIGUSR1, SIGTERM, SIGUSR2, 10}));
  EXPECT_TRUE(batch::parse_signals("none")->empty());
  EXPECT_EQ(*batch::parse_signals("auto", true), (std::vector<int>{SIGUSR1, SIGTERM}));
  EXPECT_EQ(*batch::parse_signals("auto", false), (std::vector<int>{SIGUSR1}));
  EXPECT_TRUE(batch::parse_signals("")->empty());
  auto bad = batch::parse_signals("USR1,KILL");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), errc::invalid_argument);
  EXPECT_NE(bad.error().message().find("'KILL'"), std::string::npos);
  EXPECT_FALSE(batch::parse_signals("9"));  // SIGKILL cannot be caught
}

TEST(batch_signals, the_application_handler_is_chained_and_restored) {
  struct sigaction app {};
  app.sa_handler = app_handler;
  sigemptyset(&app.sa_mask);
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGUSR2, &app, &before), 0);
  g_app_calls = 0;
  const uint64_t w0 = batch::warnings_received();
  ASSERT_TRUE(batch::install_warning_handler({SIGUSR2}));
  ASSERT_TRUE(batch::install_warning_handler({SIGUSR2}));  // a second handle: counted, not installed twice
  raise(SIGUSR2);
  EXPECT_EQ(batch::warnings_received(), w0 + 1);
  EXPECT_EQ(g_app_calls.load(), 1);
  batch::release_warning_handler();
  raise(SIGUSR2);  // still cairn's (one handle left), still chained
  EXPECT_EQ(batch::warnings_received(), w0 + 2);
  EXPECT_EQ(g_app_calls.load(), 2);
  batch::release_warning_handler();
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGUSR2, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, app_handler);  // the application's handler is back
  raise(SIGUSR2);
  EXPECT_EQ(batch::warnings_received(), w0 + 2);
  EXPECT_EQ(g_app_calls.load(), 3);
  sigaction(SIGUSR2, &before, nullptr);
}

TEST(batch_job, deadline_and_slurm_end_time) {
  unsetenv("SLURM_JOB_END_TIME");
  EXPECT_FALSE(batch::job_end_time("", 100.0)->has_value());
  EXPECT_DOUBLE_EQ(**batch::job_end_time("+30", 100.0), 130.0);
  EXPECT_DOUBLE_EQ(**batch::job_end_time("2000000000", 100.0), 2e9);
  setenv("SLURM_JOB_END_TIME", "1800000000", 1);
  EXPECT_DOUBLE_EQ(**batch::job_end_time("", 100.0), 1.8e9);
  EXPECT_DOUBLE_EQ(**batch::job_end_time("+5", 100.0), 105.0);  // the configured deadline wins
  unsetenv("SLURM_JOB_END_TIME");
  auto bad = batch::job_end_time("soon", 0);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("'deadline'"), std::string::npos);
}

TEST(batch_job, node_identity_prefers_configuration_then_slurm) {
  unsetenv("SLURMD_NODENAME");
  unsetenv("SLURM_NODEID");
  EXPECT_EQ(batch::node_identity("", "hostA"), "hostA");
  setenv("SLURM_NODEID", "3", 1);
  EXPECT_EQ(batch::node_identity("", "hostA"), "node3");
  setenv("SLURMD_NODENAME", "n7", 1);
  EXPECT_EQ(batch::node_identity("", "hostA"), "n7");
  EXPECT_EQ(batch::node_identity("rack1", "hostA"), "rack1");
  unsetenv("SLURMD_NODENAME");
  unsetenv("SLURM_NODEID");
}

class should_checkpoint_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cairn-batch-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    setenv("CAIRN_PERSISTENT", (dir_ + "/store").c_str(), 1);
    setenv("CAIRN_SCRATCH", (dir_ + "/scratch").c_str(), 1);
    setenv("CAIRN_RUN", "batch", 1);
    setenv("CAIRN_WARNING_SIGNALS", "USR1", 1);
  }
  void TearDown() override {
    for (const char* k : {"CAIRN_PERSISTENT", "CAIRN_SCRATCH", "CAIRN_RUN", "CAIRN_WARNING_SIGNALS", "CAIRN_DEADLINE",
                          "CAIRN_DEADLINE_MARGIN", "SLURM_JOB_ID", "SLURMD_NODENAME"})
      unsetenv(k);
    ASSERT_TRUE(storage::storage_env::posix()->remove_tree(dir_));
  }
  std::string dir_;
};

TEST_F(should_checkpoint_test, a_warning_signal_asks_for_one_checkpoint) {
  auto c = client::create();
  ASSERT_TRUE(c) << c.error().to_string();
  std::vector<double> a(1000);
  std::iota(a.begin(), a.end(), 1.0);
  ASSERT_TRUE(c->protect("a", std::span<double>(a)));
  EXPECT_FALSE(*c->should_checkpoint());
  EXPECT_TRUE(std::isinf(*c->time_left()));  // no deadline, no SLURM_JOB_END_TIME
  raise(SIGUSR1);  // the process survives: cairn's handler counts it
  EXPECT_TRUE(*c->should_checkpoint());
  EXPECT_TRUE(*c->should_checkpoint());  // until a checkpoint answers it
  ASSERT_TRUE(c->checkpoint("ck", 1));
  EXPECT_FALSE(*c->should_checkpoint());
  ASSERT_TRUE(c->finalize(true));
  // After finalize the default action is back (checked without dying: the disposition).
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGUSR1, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

TEST_F(should_checkpoint_test, a_near_deadline_asks_once_and_the_time_to_durable_is_measured) {
  setenv("CAIRN_DEADLINE", "+1000", 1);
  setenv("CAIRN_DEADLINE_MARGIN", "999", 1);  // 1000 s left: not yet near
  std::vector<int32_t> a(1000, 7);
  {
    auto c = client::create();
    ASSERT_TRUE(c) << c.error().to_string();
    ASSERT_TRUE(c->protect("a", std::span<int32_t>(a)));
    double left = *c->time_left();
    EXPECT_GT(left, 990.0);
    EXPECT_LE(left, 1000.0);
    EXPECT_FALSE(*c->should_checkpoint());
    ASSERT_TRUE(c->finalize(true));
  }
  setenv("CAIRN_DEADLINE_MARGIN", "2000", 1);  // now the end is within the margin
  auto c = client::create();
  ASSERT_TRUE(c) << c.error().to_string();
  ASSERT_TRUE(c->protect("a", std::span<int32_t>(a)));
  EXPECT_TRUE(*c->should_checkpoint());
  ASSERT_TRUE(c->checkpoint("ck", 1));
  ASSERT_TRUE(c->wait("ck", 1, CAIRN_LEVEL_PERSISTENT));
  EXPECT_FALSE(*c->should_checkpoint());  // taken since the deadline came near: not asked again
  EXPECT_GT(c->impl()->time_to_durable(), 0.0);
  ASSERT_TRUE(c->finalize(true));
}

TEST_F(should_checkpoint_test, slurm_job_and_node_enter_the_run_identity) {
  unsetenv("CAIRN_RUN");
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_STEP_ID", "3", 1);
  setenv("SLURMD_NODENAME", "n9", 1);
  auto c = client::create();
  ASSERT_TRUE(c) << c.error().to_string();
  // <program>-<digest of its path and directory>-<job>.<step>
  const std::string run = c->impl()->cfg().run;
  unsetenv("SLURM_STEP_ID");
  ASSERT_TRUE(c->finalize(true));
  const std::string prefix = std::string(program_invocation_short_name) + "-";
  ASSERT_EQ(run.rfind(prefix, 0), 0u) << run;
  ASSERT_EQ(run.size(), prefix.size() + 8 + std::string("-4242.3").size()) << run;
  EXPECT_EQ(run.substr(run.size() - 7), "-4242.3") << run;
  auto info = format::read_run_info(storage::storage_env::posix(), dir_ + "/store", run);
  ASSERT_TRUE(info) << info.error().to_string();
  ASSERT_EQ(info->executions.size(), 1u);
  EXPECT_EQ(info->executions[0].job, "4242");
  EXPECT_EQ(info->executions[0].nodes, std::vector<std::string>{"n9"});
}

TEST_F(should_checkpoint_test, a_warning_signal_never_ends_the_process_and_none_keeps_the_default) {
  // The action before cairn_init is the default one (a library loaded with
  // libcairn may have installed its own: libinfinipath does, and exits; that
  // one would be chained).
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &before), 0);
  signal(SIGTERM, SIG_DFL);
  setenv("CAIRN_WARNING_SIGNALS", "USR1,TERM", 1);
  {
    auto c = client::create();
    ASSERT_TRUE(c) << c.error().to_string();
    raise(SIGTERM);  // before any cairn_should_checkpoint: counted, the process goes on
    EXPECT_TRUE(*c->should_checkpoint());
    ASSERT_TRUE(c->finalize(true));
  }
  sigaction(SIGTERM, &before, nullptr);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  setenv("CAIRN_WARNING_SIGNALS", "none", 1);
  EXPECT_EXIT(
      {
        signal(SIGTERM, SIG_DFL);
        auto c = client::create();
        if (!c) _exit(3);
        raise(SIGTERM);
        _exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

TEST_F(should_checkpoint_test, bad_signal_configuration_is_refused_at_init) {
  setenv("CAIRN_WARNING_SIGNALS", "USR1,BOGUS", 1);
  auto c = client::create();
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), errc::invalid_argument);
  EXPECT_NE(c.error().message().find("'BOGUS'"), std::string::npos);
}

}  // namespace
}  // namespace cairn

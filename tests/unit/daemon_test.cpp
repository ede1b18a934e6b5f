// The node daemon (engine_host = daemon, docs/design/daemon.md) seen from one
// process: checkpoints whose image grows (the daemon maps larger staging slots
// and unmaps the ones dropped), taken to the persistent level and committed
// through cairnd, then restored bit for bit. The sanitized builds run it with a
// cairnd of their own build (scripts/sanitize.sh): the client's link and the
// daemon's sessions are both under ASan or TSan, and the daemon must exit 0,
// which it does not after a sanitizer report.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <vector>

#include "cairn.h"
#include "cairn/cairn.hpp"
#include "format/layout.hpp"
#include "storage/storage_env.hpp"

namespace cairn {
namespace {

class daemon_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cairn-daemon-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // cairnd through a wrapper that records how it ended.
    wrapper_ = dir_ + "/cairnd.sh";
    std::ofstream(wrapper_) << "#!/bin/sh\n\"" << CAIRN_TEST_CAIRND << "\" \"$@\"\necho $? > \"" << status_file()
                            << ".tmp\" && mv \"" << status_file() << ".tmp\" \"" << status_file() << "\"\n";
    ASSERT_EQ(::chmod(wrapper_.c_str(), 0700), 0);
    setenv("CAIRN_PERSISTENT", (dir_ + "/store").c_str(), 1);
    setenv("CAIRN_SCRATCH", (dir_ + "/scratch").c_str(), 1);
    setenv("CAIRN_RUN", "daemon", 1);
    setenv("CAIRN_ENGINE_HOST", "daemon", 1);
    setenv("CAIRN_DAEMON_PROGRAM", wrapper_.c_str(), 1);
    setenv("CAIRN_KEEP_PERSISTENT", "0", 1);
  }
  void TearDown() override {
    for (const char* k : {"CAIRN_PERSISTENT", "CAIRN_SCRATCH", "CAIRN_RUN", "CAIRN_ENGINE_HOST",
                          "CAIRN_DAEMON_PROGRAM", "CAIRN_KEEP_PERSISTENT"})
      unsetenv(k);
    ASSERT_TRUE(storage::storage_env::posix()->remove_tree(dir_));
  }
  std::string status_file() const { return dir_ + "/cairnd.status"; }
  // cairnd's exit status once it has ended (it ends with its job), -1 if it
  // has not within a minute.
  int daemon_exit() const {
    for (int i = 0; i < 600; ++i) {
      std::ifstream f(status_file());
      int rc = -1;
      if (f >> rc) return rc;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  std::string dir_, wrapper_;
};

client make_client() {
  auto c = client::create();
  EXPECT_TRUE(c) << c.error().to_string();
  return std::move(c).value();
}

// Version v's data: n doubles, distinct per version and position.
std::vector<double> data_of(int v, size_t n) {
  std::vector<double> a(n);
  std::iota(a.begin(), a.end(), 0.5 + 1000.0 * v);
  return a;
}

TEST_F(daemon_test, growing_images_are_committed_by_the_daemon_and_restored) {
  constexpr int kVersions = 6;
  std::vector<std::vector<double>> saved;
  {
    auto c = make_client();
    std::vector<double> a;
    std::vector<int32_t> b(333);
    std::iota(b.begin(), b.end(), -7);
    ASSERT_TRUE(c.protect("b", std::span<int32_t>(b)));
    for (int v = 1; v <= kVersions; ++v) {
      a = data_of(v, 4096u << v);  // 64 KiB .. 2 MiB: each version needs a larger slot
      ASSERT_TRUE(c.protect("a", std::span<double>(a)));
      ASSERT_TRUE(c.checkpoint("ck", v)) << "version " << v;
      saved.push_back(a);
      a.assign(a.size(), -1.0);  // later changes must not reach the version
    }
    for (int v = 1; v <= kVersions; ++v) ASSERT_TRUE(c.wait("ck", v, CAIRN_LEVEL_PERSISTENT)) << "version " << v;
    ASSERT_TRUE(c.finalize(true));
  }
  EXPECT_EQ(daemon_exit(), 0) << "cairnd did not end cleanly (a sanitizer report makes it exit non-zero)";
  for (int v = 1; v <= kVersions; ++v)
    EXPECT_TRUE(storage::storage_env::posix()->exists(format::manifest_path(dir_ + "/store", "daemon", "ck", v)))
        << "version " << v;

  // A new execution (a cairnd of its own) restores every version bit for bit.
  ::unlink(status_file().c_str());
  auto r = make_client();
  std::vector<int32_t> b(333, 0);
  ASSERT_TRUE(r.protect("b", std::span<int32_t>(b)));
  auto newest = r.restart_test("ck");
  ASSERT_TRUE(newest) << newest.error().to_string();
  EXPECT_EQ(*newest, kVersions);
  for (int v = kVersions; v >= 1; --v) {
    std::vector<double> a(saved[v - 1].size(), 0.0);
    ASSERT_TRUE(r.protect("a", std::span<double>(a)));
    status st = r.restart("ck", v);
    ASSERT_TRUE(st) << "version " << v << ": " << st.to_string();
    EXPECT_EQ(a, saved[v - 1]) << "version " << v;
  }
  std::vector<int32_t> want(333);
  std::iota(want.begin(), want.end(), -7);
  EXPECT_EQ(b, want);
  ASSERT_TRUE(r.finalize(true));
  EXPECT_EQ(daemon_exit(), 0) << "the second cairnd did not end cleanly";
}

}  // namespace
}  // namespace cairn

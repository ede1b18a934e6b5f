// Single-process client behaviour through the public C++ and C APIs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <numeric>
#include <set>
#include <sys/stat.h>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "cairn.h"
#include "cairn/cairn.hpp"
#include "client/client.hpp"
#include "engine/cow.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/run_info.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"
#include "util/cpu.hpp"

namespace cairn {
namespace {

class client_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cairn-client-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    setenv("CAIRN_PERSISTENT", (dir_ + "/store").c_str(), 1);
    setenv("CAIRN_SCRATCH", (dir_ + "/scratch").c_str(), 1);
    setenv("CAIRN_RUN", "unit", 1);
    // Whole histories (the default keeps the newest 3); the retention tests set their own.
    setenv("CAIRN_KEEP_PERSISTENT", "0", 1);
    // The node-local level stays after finalize: the tests look at it (the
    // default removes it; tests/integration/test_restart.py checks that).
    setenv("CAIRN_KEEP_LOCAL_AFTER_FINALIZE", "true", 1);
  }
  void TearDown() override {
    for (const char* k : {"CAIRN_PERSISTENT", "CAIRN_SCRATCH", "CAIRN_RUN", "CAIRN_MODE", "CAIRN_KEEP_LOCAL",
                          "CAIRN_KEEP_PERSISTENT", "CAIRN_PERSISTENT_INTERVAL", "CAIRN_FAULT_INJECT",
                          "CAIRN_STAGING_POLICY", "CAIRN_STAGING_LIMIT", "CAIRN_IO_RATE_LIMIT", "CAIRN_BOGUS", "CAIRN_TAGS", "CAIRN_CODE_VERSION",
                          "CAIRN_KEEP_LOCAL_AFTER_FINALIZE", "CAIRN_CAPTURE", "CAIRN_METRICS_DIR",
                          "CAIRN_RESTART_VERIFY", "CAIRN_STAGING_SLOTS"})
      unsetenv(k);
    ASSERT_TRUE(storage::storage_env::posix()->remove_tree(dir_));
  }
  std::string store() const { return dir_ + "/store"; }
  std::string scratch() const { return dir_ + "/scratch"; }
  std::string dir_;
};

client make_client() {
  auto c = client::create();
  EXPECT_TRUE(c) << c.error().to_string();
  return std::move(c).value();
}

TEST_F(client_test, checkpoint_wait_restart_round_trip_in_both_modes) {
  for (const char* mode : {"thread", "sync"}) {
    setenv("CAIRN_MODE", mode, 1);
    setenv("CAIRN_RUN", mode, 1);
    std::vector<double> a(5000);
    std::vector<int32_t> b(777);
    std::iota(a.begin(), a.end(), 0.25);
    std::iota(b.begin(), b.end(), -5);
    auto c = make_client();
    ASSERT_TRUE(c.protect("a", std::span<double>(a)));
    ASSERT_TRUE(c.protect("b", std::span<int32_t>(b)));
    ASSERT_TRUE(c.checkpoint("ck", 1));
    auto saved_a = a;
    auto saved_b = b;
    a[3] = -1;  // later changes must not leak into version 1
    ASSERT_TRUE(c.checkpoint("ck", 2));
    ASSERT_TRUE(c.wait("ck", 1, CAIRN_LEVEL_PERSISTENT));
    ASSERT_TRUE(c.wait("ck", 2, CAIRN_LEVEL_PERSISTENT));
    auto levels = c.test("ck", 1);
    ASSERT_TRUE(levels);
    EXPECT_EQ(*levels, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL | CAIRN_LEVEL_PERSISTENT);
    ASSERT_TRUE(c.finalize(true));

    auto r = make_client();
    std::fill(a.begin(), a.end(), 0);
    std::fill(b.begin(), b.end(), 0);
    ASSERT_TRUE(r.protect("a", std::span<double>(a)));
    ASSERT_TRUE(r.protect("b", std::span<int32_t>(b)));
    auto v = r.restart_test("ck");
    ASSERT_TRUE(v) << v.error().to_string();
    EXPECT_EQ(*v, 2);
    ASSERT_TRUE(r.restart("ck", 1));
    EXPECT_EQ(a, saved_a) << mode;
    EXPECT_EQ(b, saved_b) << mode;
    EXPECT_TRUE(storage::storage_env::posix()->exists(format::manifest_path(store(), mode, "ck", 1)));
  }
}

// Scratch on tmpfs: recycled node-local files are kept mapped and each
// version's image is copied into the mapping (engine/recycler.hpp). Every
// version's node-local shard holds exactly its data, checked as soon as it
// is there, and the newest restores from the node-local level bit for bit.
TEST_F(client_test, node_local_shards_written_through_kept_mappings_hold_their_versions) {
  char tmpl[] = "/dev/shm/cairn-client-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string shm = tmpl;
  setenv("CAIRN_SCRATCH", shm.c_str(), 1);
  setenv("CAIRN_KEEP_LOCAL", "1", 1);
  std::vector<uint64_t> big(600000);  // 4.6 MiB
  auto fill = [&](int64_t v) {
    for (size_t i = 0; i < big.size(); ++i) big[i] = (i + 1) * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(v);
  };
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_UINT64));
    for (int64_t v = 1; v <= 10; ++v) {
      fill(v);
      ASSERT_TRUE(c.checkpoint("ck", v));
      ASSERT_TRUE(c.wait("ck", v, CAIRN_LEVEL_LOCAL));
      auto img = format::read_shard_image(storage::storage_env::posix(), format::shard_path(shm, "unit", "ck", v, 0));
      ASSERT_TRUE(img) << v << ": " << img.error().to_string();
      ASSERT_EQ(img->header.regions[0].length, big.size() * 8);
      EXPECT_EQ(std::memcmp(img->bytes().data() + img->header.regions[0].offset, big.data(), big.size() * 8), 0) << v;
    }
    ASSERT_TRUE(c.finalize(true));
  }
  std::fill(big.begin(), big.end(), 0);
  {
    // The node-local copy only.
    ASSERT_TRUE(storage::storage_env::posix()->remove_tree(format::version_dir(store(), "unit", "ck", 10)));
    auto c = make_client();
    ASSERT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_UINT64));
    auto v = c.restart_test("ck");
    ASSERT_TRUE(v) << v.error().to_string();
    EXPECT_EQ(*v, 10);
    ASSERT_TRUE(c.restart("ck", 10));
    const auto restored = big;
    fill(10);
    EXPECT_EQ(restored, big);
    ASSERT_TRUE(c.finalize(true));
  }
  ASSERT_TRUE(storage::storage_env::posix()->remove_tree(shm));
}

// capture = cow: each version holds its regions as they were at its
// checkpoint, bit for bit, whatever the application writes right after
// (every block at once, the worst case), for a region copied in the
// background, a block with halos (copied inside the call) and a region
// unprotected and freed while its copy runs.
TEST_F(client_test, cow_capture_keeps_each_version_as_it_was_at_its_checkpoint) {
  setenv("CAIRN_CAPTURE", "cow", 1);
  setenv("CAIRN_METRICS_DIR", (dir_ + "/metrics").c_str(), 1);
  const size_t n = size_t{3} << 20;  // 24 MiB of doubles
  std::vector<double> a(n);
  std::vector<double> grid(4 * 6);
  const uint64_t global[] = {10, 4}, start[] = {2, 0}, count[] = {2, 4}, mshape[] = {4, 6}, mstart[] = {1, 1};
  std::map<int, std::vector<double>> want_a, want_grid;
  auto fill = [](std::vector<double>& v, double seed) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = seed + static_cast<double>(i) * 0.5;
  };
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("a", std::span<double>(a)));
    ASSERT_TRUE(c.protect_block("grid", grid.data(), CAIRN_FLOAT64, global, start, count, mshape, mstart));
    for (int v = 1; v <= 4; ++v) {
      fill(a, v);
      fill(grid, 100 * v);
      auto* scratch = new std::vector<double>(size_t{1} << 20, v);  // 8 MiB, its own mapping
      ASSERT_TRUE(c.protect("scratch", std::span<double>(*scratch)));
      want_a[v] = a;
      want_grid[v] = grid;
      ASSERT_TRUE(c.checkpoint("ck", v));
      fill(a, -v);  // rewrites every block while the copy may still run
      fill(grid, -v);
      ASSERT_TRUE(c.unprotect("scratch"));  // waits for the copy: the memory may go
      delete scratch;
    }
    ASSERT_TRUE(c.wait("ck", 4, CAIRN_LEVEL_PERSISTENT));
    auto levels = c.test("ck", 4);
    ASSERT_TRUE(levels);
    EXPECT_TRUE(*levels & CAIRN_LEVEL_CAPTURED);
    ASSERT_TRUE(c.finalize(true));
  }
  // Copy-on-write was in use (the metric exists only then), unless
  // userfaultfd is not available here (and the notice said so). How many
  // writes waited depends on the timing: not counted on.
  std::string prom;
  if (auto t = storage::storage_env::posix()->read_all(dir_ + "/metrics/cairn_unit_0.prom")) prom.assign(t->begin(), t->end());
  if (engine::cow_capture::make()) {
    EXPECT_NE(prom.find("cairn_capture_write_faults"), std::string::npos) << prom;
  }
  unsetenv("CAIRN_METRICS_DIR");
  for (int v = 1; v <= 4; ++v) {
    std::vector<double> back_a(n, -7), back_grid(4 * 6, -7);
    auto r = make_client();
    ASSERT_TRUE(r.protect("a", std::span<double>(back_a)));
    ASSERT_TRUE(r.protect_block("grid", back_grid.data(), CAIRN_FLOAT64, global, start, count, mshape, mstart));
    std::vector<double> back_scratch(size_t{1} << 20);
    ASSERT_TRUE(r.protect("scratch", std::span<double>(back_scratch)));
    ASSERT_TRUE(r.restart("ck", v));
    EXPECT_TRUE(std::memcmp(back_a.data(), want_a[v].data(), n * sizeof(double)) == 0) << v;
    for (int row = 1; row <= 2; ++row)
      for (int col = 1; col <= 4; ++col) EXPECT_EQ(back_grid[row * 6 + col], want_grid[v][row * 6 + col]) << v;
    EXPECT_EQ(back_scratch, std::vector<double>(size_t{1} << 20, v));
    ASSERT_TRUE(r.finalize(true));
  }
}

// capture = copy_or_cow: a checkpoint that finds no staging slot made (the
// first after protect, a state that grew) goes copy-on-write, and one that
// finds its slot ready copies; every version holds its regions as they were
// at its checkpoint, whatever the application writes right after.
TEST_F(client_test, copy_or_cow_captures_copy_on_write_only_where_no_slot_is_ready) {
  setenv("CAIRN_CAPTURE", "copy_or_cow", 1);
  setenv("CAIRN_STAGING_SLOTS", "1", 1);
  setenv("CAIRN_METRICS_DIR", (dir_ + "/metrics").c_str(), 1);
  // 64 MiB: the slot made ahead after protect takes tens of milliseconds to
  // fault in, the checkpoint right after protect comes within one.
  const size_t n = size_t{8} << 20;
  std::vector<double> a(n), b;
  std::map<int, std::vector<double>> want_a, want_b;
  auto fill = [](std::vector<double>& v, double seed) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = seed + static_cast<double>(i) * 0.25;
  };
  {
    auto c = make_client();
    for (int v = 1; v <= 4; ++v) {
      if (v == 4) b.resize(n / 2);
      fill(a, v);
      fill(b, 10 * v);
      want_a[v] = a;
      want_b[v] = b;
      // Protected right before the checkpoint, as StateSaver.save does: the
      // first time, and when the state grew (the slot no longer holds it).
      if (v == 1) {
        ASSERT_TRUE(c.protect("a", std::span<double>(a)));
      }
      if (v == 4) {
        ASSERT_TRUE(c.protect("b", std::span<double>(b)));
      }
      ASSERT_TRUE(c.checkpoint("ck", v));
      fill(a, -v);  // rewrites every block while a copy may still run
      fill(b, -v);
      ASSERT_TRUE(c.wait("ck", v, CAIRN_LEVEL_CAPTURED));
    }
    ASSERT_TRUE(c.wait("ck", 4, CAIRN_LEVEL_PERSISTENT));
    ASSERT_TRUE(c.finalize(true));
  }
  std::string prom;
  if (auto t = storage::storage_env::posix()->read_all(dir_ + "/metrics/cairn_unit_0.prom"))
    prom.assign(t->begin(), t->end());
  if (engine::cow_capture::make()) {
    // Versions 1 and 4 made their slot; 2 and 3 copied into theirs.
    EXPECT_NE(prom.find("cairn_captures_copy_on_write_total{run=\"unit\",rank=\"0\"} 2\n"), std::string::npos) << prom;
  } else {
    EXPECT_EQ(prom.find("cairn_captures_copy_on_write"), std::string::npos) << prom;
  }
  unsetenv("CAIRN_METRICS_DIR");
  for (int v = 1; v <= 4; ++v) {
    std::vector<double> back_a(n, -7), back_b(v == 4 ? n / 2 : 0, -7);
    auto r = make_client();
    ASSERT_TRUE(r.protect("a", std::span<double>(back_a)));
    if (v == 4) {
      ASSERT_TRUE(r.protect("b", std::span<double>(back_b)));
    }
    ASSERT_TRUE(r.restart("ck", v));
    EXPECT_TRUE(std::memcmp(back_a.data(), want_a[v].data(), n * sizeof(double)) == 0) << v;
    EXPECT_EQ(back_b, want_b[v]) << v;
    ASSERT_TRUE(r.finalize(true));
  }
}

// The slot made ahead is sized from sums that protect and unprotect keep (not
// a plan of every region at each protect): after regions added, one replaced
// by a larger one and one unprotected, the first checkpoint finds it ready
// (copy_or_cow copies into it instead of going copy-on-write).
TEST_F(client_test, the_slot_made_ahead_holds_the_regions_left_by_protects_and_unprotects) {
  setenv("CAIRN_CAPTURE", "copy_or_cow", 1);
  setenv("CAIRN_STAGING_SLOTS", "1", 1);
  setenv("CAIRN_METRICS_DIR", (dir_ + "/metrics").c_str(), 1);
  std::vector<std::vector<float>> regs;
  for (int i = 0; i < 40; ++i) regs.emplace_back(size_t{1} << 18, static_cast<float>(i));  // 1 MiB each
  std::vector<float> larger(size_t{3} << 18, 7.0f);
  {
    auto c = make_client();
    for (int i = 0; i < 40; ++i)
      ASSERT_TRUE(c.protect("region-" + std::string(static_cast<size_t>(i), 'r'), std::span<float>(regs[i])));
    ASSERT_TRUE(c.protect("region-", std::span<float>(larger)));  // replaces region 0
    ASSERT_TRUE(c.unprotect("region-r"));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // settled, then made
    ASSERT_TRUE(c.checkpoint("a-checkpoint-name", 1));
    ASSERT_TRUE(c.wait("a-checkpoint-name", 1, CAIRN_LEVEL_PERSISTENT));
    ASSERT_TRUE(c.finalize(true));
  }
  unsetenv("CAIRN_METRICS_DIR");
  std::string prom;
  if (auto t = storage::storage_env::posix()->read_all(dir_ + "/metrics/cairn_unit_0.prom"))
    prom.assign(t->begin(), t->end());
  if (engine::cow_capture::make()) {
    EXPECT_NE(prom.find("cairn_captures_copy_on_write_total{run=\"unit\",rank=\"0\"} 0\n"), std::string::npos) << prom;
  }
}

// A copy-on-write capture zeroes the alignment padding after each region in
// the background: a slot that held a longer region of an earlier version
// gives none of its bytes to the next version's file.
TEST_F(client_test, cow_capture_zeroes_the_padding_a_shorter_region_leaves_in_a_reused_slot) {
  setenv("CAIRN_CAPTURE", "cow", 1);
  setenv("CAIRN_STAGING_SLOTS", "1", 1);
  std::vector<uint8_t> a((size_t{3} << 20) + 4000, 0xab), b(size_t{1} << 20, 0x5c);
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("a", std::span<uint8_t>(a)));
    ASSERT_TRUE(c.protect("b", std::span<uint8_t>(b)));
    ASSERT_TRUE(c.checkpoint("ck", 1));
    ASSERT_TRUE(c.wait("ck", 1, CAIRN_LEVEL_PERSISTENT));
    // The same layout rounded to pages, a shorter region: the slot is reused.
    ASSERT_TRUE(c.protect("a", std::span<uint8_t>(a.data(), (size_t{3} << 20) + 123)));
    ASSERT_TRUE(c.checkpoint("ck", 2));
    ASSERT_TRUE(c.wait("ck", 2, CAIRN_LEVEL_PERSISTENT));
    ASSERT_TRUE(c.finalize(true));
  }
  auto img = format::read_shard_image(storage::storage_env::posix(), format::shard_path(store(), "unit", "ck", 2, 0));
  ASSERT_TRUE(img) << img.error().to_string();
  const auto& d = img->header.regions[0];
  ASSERT_EQ(d.length, (uint64_t{3} << 20) + 123);
  const std::byte* pad = img->bytes().data() + d.offset + d.length;
  const uint64_t pad_bytes = format::align_up(d.offset + d.length) - d.offset - d.length;
  ASSERT_GT(pad_bytes, 3000u);
  EXPECT_TRUE(std::all_of(pad, pad + pad_bytes, [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_EQ(std::memcmp(img->bytes().data() + img->header.regions[1].offset, b.data(), b.size()), 0);
}

// A large copy is shared with an idle engine thread where one may run on
// another CPU (the test machines: two cores). What the image holds is what
// the regions held at the call, bit for bit, padding zeroed, even though
// every byte is overwritten right after cairn_checkpoint returns, and a
// second version reusing the slot holds nothing of the first.
TEST_F(client_test, a_copy_shared_with_an_engine_thread_holds_the_regions_as_they_were_at_the_call) {
  setenv("CAIRN_STAGING_SLOTS", "1", 1);
  std::vector<uint8_t> a((size_t{20} << 20) + 13), c(1);
  std::vector<double> b((size_t{17} << 17) - 5);
  auto fill = [&](int v) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 31 + v);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<double>(i) * 0.5 + v;
    c[0] = static_cast<uint8_t>(v);
  };
  std::map<int, std::tuple<std::vector<uint8_t>, std::vector<double>, std::vector<uint8_t>>> want;
  {
    auto cl = make_client();
    ASSERT_TRUE(cl.protect("a", std::span<uint8_t>(a)));
    ASSERT_TRUE(cl.protect("b", std::span<double>(b)));
    ASSERT_TRUE(cl.protect("c", std::span<uint8_t>(c)));
    for (int v = 1; v <= 2; ++v) {
      fill(v);
      want[v] = {a, b, c};
      ASSERT_TRUE(cl.checkpoint("ck", v));
      // Right after the call, from the last bytes copied backwards (where
      // the helper's last piece would be): none of it may reach the image.
      c[0] = 0xee;
      std::fill(b.rbegin(), b.rend(), -1.0);
      std::fill(a.rbegin(), a.rend(), uint8_t{0xee});
      ASSERT_TRUE(cl.wait("ck", v, CAIRN_LEVEL_PERSISTENT));
    }
    ASSERT_TRUE(cl.finalize(true));
  }
  for (int v = 1; v <= 2; ++v) {
    auto img =
        format::read_shard_image(storage::storage_env::posix(), format::shard_path(store(), "unit", "ck", v, 0));
    ASSERT_TRUE(img) << img.error().to_string();
    const auto& d = img->header.regions[0];
    const std::byte* pad = img->bytes().data() + d.offset + d.length;
    EXPECT_TRUE(std::all_of(pad, img->bytes().data() + format::align_up(d.offset + d.length),
                            [](std::byte x) { return x == std::byte{0}; }));
  }
  std::vector<uint8_t> a2(a.size()), c2(1);
  std::vector<double> b2(b.size());
  auto r = make_client();
  ASSERT_TRUE(r.protect("a", std::span<uint8_t>(a2)));
  ASSERT_TRUE(r.protect("b", std::span<double>(b2)));
  ASSERT_TRUE(r.protect("c", std::span<uint8_t>(c2)));
  for (int v = 2; v >= 1; --v) {
    ASSERT_TRUE(r.restart("ck", v));
    EXPECT_TRUE(a2 == std::get<0>(want[v])) << v;
    EXPECT_TRUE(b2 == std::get<1>(want[v])) << v;
    EXPECT_TRUE(c2 == std::get<2>(want[v])) << v;
  }
}

// Where copy-on-write does not apply, capture = cow says why once and copies.
TEST_F(client_test, cow_capture_where_it_does_not_apply_says_so_and_copies) {
  setenv("CAIRN_CAPTURE", "cow", 1);
  setenv("CAIRN_MODE", "sync", 1);
  std::vector<double> a(1000, 2.5);
  testing::internal::CaptureStderr();
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("a", std::span<double>(a)));
    ASSERT_TRUE(c.checkpoint("ck", 1));
    ASSERT_TRUE(c.finalize(true));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("capture = cow does not apply here (mode = sync"), std::string::npos) << err;
  std::vector<double> back(1000);
  auto r = make_client();
  ASSERT_TRUE(r.protect("a", std::span<double>(back)));
  ASSERT_TRUE(r.restart("ck", 1));
  EXPECT_EQ(back, a);
}

TEST_F(client_test, restart_with_mismatched_region_leaves_buffers_untouched) {
  std::vector<double> a(100, 1.5);
  std::vector<double> b(10, 2.5);
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("a", std::span<double>(a)));
    ASSERT_TRUE(c.protect("b", std::span<double>(b)));
    ASSERT_TRUE(c.checkpoint("ck", 0));
    ASSERT_TRUE(c.finalize(true));
  }
  std::vector<double> a2(100, 7.0);
  std::vector<double> b2(11, 7.0);  // one element more than checkpointed
  auto r = make_client();
  ASSERT_TRUE(r.protect("a", std::span<double>(a2)));
  ASSERT_TRUE(r.protect("b", std::span<double>(b2)));
  status st = r.restart("ck", 0);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  EXPECT_NE(st.message().find("region 'b'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("88 bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("80 bytes"), std::string::npos) << st.message();
  EXPECT_EQ(a2, std::vector<double>(100, 7.0));  // nothing restored, not even the matching region
  EXPECT_EQ(b2, std::vector<double>(11, 7.0));
}

TEST_F(client_test, versions_must_increase_and_names_are_checked) {
  int x = 3;
  auto c = make_client();
  EXPECT_EQ(c.checkpoint("ck", 1).code(), errc::invalid_argument);  // nothing protected
  ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT32));
  ASSERT_TRUE(c.checkpoint("ck", 5));
  EXPECT_EQ(c.checkpoint("ck", 5).code(), errc::invalid_argument);
  EXPECT_EQ(c.checkpoint("ck", 4).code(), errc::invalid_argument);
  EXPECT_EQ(c.checkpoint("a/b", 6).code(), errc::invalid_argument);
  EXPECT_EQ(c.checkpoint("ck", -1).code(), errc::invalid_argument);
  EXPECT_EQ(c.protect("file:x", &x, 1, CAIRN_INT32).code(), errc::invalid_argument);
  EXPECT_EQ(c.wait("ck", 99, CAIRN_LEVEL_LOCAL).code(), errc::not_found);
  EXPECT_EQ(c.unprotect("nope").code(), errc::not_found);
  ASSERT_TRUE(c.checkpoint("other", 0));  // versions are per name
}

TEST_F(client_test, a_later_execution_cannot_replace_a_committed_version) {
  int64_t x = 111;
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
    ASSERT_TRUE(c.checkpoint("ck", 3));
    ASSERT_TRUE(c.finalize(true));
  }
  const std::string shard = format::shard_path(store(), "unit", "ck", 3, 0);
  auto before = storage::storage_env::posix()->read_all(shard);
  ASSERT_TRUE(before);
  {
    // Starts over without restarting: version 3 exists, so it is refused,
    // and version 4 is the first this execution may write.
    x = 222;
    auto c = make_client();
    ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
    status st = c.checkpoint("ck", 3);
    ASSERT_EQ(st.code(), errc::exists) << st.to_string();
    EXPECT_NE(st.message().find("already has version 3 committed by 1 rank(s) from an earlier execution"),
              std::string::npos) << st.message();
    ASSERT_EQ(c.checkpoint("ck", 2).code(), errc::exists);
    ASSERT_TRUE(c.checkpoint("ck", 4));
    ASSERT_TRUE(c.finalize(true));
  }
  EXPECT_EQ(*storage::storage_env::posix()->read_all(shard), *before);
  setenv("CAIRN_SCRATCH", (dir_ + "/scratch2").c_str(), 1);  // force the persistent copies
  auto r = make_client();
  ASSERT_TRUE(r.protect("x", &x, 1, CAIRN_INT64));
  x = 0;
  ASSERT_TRUE(r.restart("ck", 3));
  EXPECT_EQ(x, 111);
  ASSERT_TRUE(r.restart("ck", 4));
  EXPECT_EQ(x, 222);
}

// One execution checkpoints x = 10 as version 1 and x = 20 as version 2 of "ck".
void checkpoint_x_twice(int64_t* x) {
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", x, 1, CAIRN_INT64));
  for (int64_t v : {1, 2}) {
    *x = v * 10;
    ASSERT_TRUE(c.checkpoint("ck", v));
  }
  ASSERT_TRUE(c.finalize(true));
}

TEST_F(client_test, a_committed_version_damaged_on_every_level_is_replaced_after_a_restart) {
  int64_t x = 0;
  ASSERT_NO_FATAL_FAILURE(checkpoint_x_twice(&x));
  // Version 2 damaged at both levels: the last byte of x's region flipped.
  for (const std::string& root : {store(), scratch()}) {
    const std::string p = format::shard_path(root, "unit", "ck", 2, 0);
    auto data = storage::storage_env::posix()->read_all(p);
    ASSERT_TRUE(data);
    std::string d = *data;
    d[4096] = static_cast<char>(d[4096] ^ 0x5a);
    ASSERT_TRUE(storage::storage_env::posix()->write_atomic(p, d, true));
  }
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
  auto v = c.restart_test("ck");
  ASSERT_TRUE(v) << v.error().to_string();
  EXPECT_EQ(*v, 1);
  ASSERT_TRUE(c.restart("ck", 1));
  EXPECT_EQ(x, 10);
  x = 20;
  ASSERT_TRUE(c.checkpoint("ck", 2));  // recomputed: replaces the damaged commit
  ASSERT_TRUE(c.wait("ck", 2, CAIRN_LEVEL_PERSISTENT));
  ASSERT_TRUE(c.finalize(true));
  auto r = make_client();
  ASSERT_TRUE(r.protect("x", &x, 1, CAIRN_INT64));
  auto again = r.restart_test("ck");
  ASSERT_TRUE(again) << again.error().to_string();
  EXPECT_EQ(*again, 2);
}

// restart_verify = while: restart_test checks the node-local shard's header
// only, and restart verifies each region as it reads it into place. A damaged
// node-local copy is restored from the persistent level before restart
// returns; damaged at both levels, restart fails and restart_test then offers
// the version before it.
TEST_F(client_test, restart_verifying_while_it_reads_restores_from_the_next_level_where_the_data_are_damaged) {
  setenv("CAIRN_RESTART_VERIFY", "while", 1);
  std::vector<uint64_t> big(300000);  // 2.3 MiB: read and hashed in pieces
  int64_t x = 0;
  std::vector<std::vector<uint64_t>> saved;
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_UINT64));
    ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
    for (int64_t v : {1, 2}) {
      for (size_t i = 0; i < big.size(); ++i) big[i] = i * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(v);
      x = v * 10;
      saved.push_back(big);
      ASSERT_TRUE(c.checkpoint("ck", v));
    }
    ASSERT_TRUE(c.finalize(true));
  }
  // One execution restores `version` (restart_test must offer `offered`)
  // and returns restart's outcome.
  auto restore = [&](int64_t offered, int64_t version) -> status {
    std::fill(big.begin(), big.end(), 0);
    x = 0;
    auto c = make_client();
    EXPECT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_UINT64));
    EXPECT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
    auto v = c.restart_test("ck");
    EXPECT_TRUE(v) << v.error().to_string();
    if (v) {
      EXPECT_EQ(*v, offered);
    }
    status st = c.restart("ck", version);
    if (st) {
      EXPECT_EQ(big, saved[static_cast<size_t>(version - 1)]);
      EXPECT_EQ(x, version * 10);
    } else {
      // Offered no more in this execution.
      auto again = c.restart_test("ck");
      EXPECT_TRUE(again) << again.error().to_string();
      if (again) {
        EXPECT_EQ(*again, version - 1);
      }
      EXPECT_TRUE(c.restart("ck", version - 1));
      EXPECT_EQ(big, saved[static_cast<size_t>(version - 2)]);
    }
    EXPECT_TRUE(c.finalize(true));
    return st;
  };
  ASSERT_TRUE(restore(2, 2));  // intact
  // The last byte of the large region flipped, the header left intact.
  auto damage = [&](const std::string& root) {
    const std::string p = format::shard_path(root, "unit", "ck", 2, 0);
    auto h = format::read_header(storage::storage_env::posix(), p);
    ASSERT_TRUE(h);
    auto data = storage::storage_env::posix()->read_all(p);
    ASSERT_TRUE(data);
    std::string d = *data;
    const size_t at = h->regions[0].offset + h->regions[0].length - 1;
    d[at] = static_cast<char>(d[at] ^ 0x5a);
    ASSERT_TRUE(storage::storage_env::posix()->write_atomic(p, d, true));
  };
  ASSERT_NO_FATAL_FAILURE(damage(scratch()));
  status st = restore(2, 2);
  EXPECT_TRUE(st) << st.to_string();  // from the persistent level
  ASSERT_NO_FATAL_FAILURE(damage(store()));
  st = restore(2, 2);
  EXPECT_EQ(st.code(), errc::corruption) << st.to_string();
  EXPECT_NE(st.message().find("call cairn_restart_test again"), std::string::npos) << st.message();
  // Recorded beside its MANIFEST: the next execution is not offered it,
  // restores version 1 and may write version 2 again, which removes the record.
  const std::string marker = format::damaged_path(store(), "unit", "ck", 2);
  EXPECT_TRUE(storage::storage_env::posix()->exists(marker));
  {
    std::fill(big.begin(), big.end(), 0);
    auto c = make_client();
    ASSERT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_UINT64));
    ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
    auto v = c.restart_test("ck");
    ASSERT_TRUE(v) << v.error().to_string();
    EXPECT_EQ(*v, 1);
    ASSERT_TRUE(c.restart("ck", 1));
    EXPECT_EQ(big, saved[0]);
    big = saved[1];
    x = 20;
    ASSERT_TRUE(c.checkpoint("ck", 2));
    ASSERT_TRUE(c.finalize(true));
  }
  EXPECT_FALSE(storage::storage_env::posix()->exists(marker));
  ASSERT_TRUE(restore(2, 2));
}

// The VELOC drop-in's restart and cairn.pytorch's load: a restart_begin/end
// sequence without routed files reads the regions in place as well, and may
// call restart more than once; damaged node-local data come from the next level.
TEST_F(client_test, restart_verifying_while_it_reads_in_a_restart_sequence_may_restore_twice) {
  setenv("CAIRN_RESTART_VERIFY", "while", 1);
  std::vector<uint64_t> big(300000);
  std::vector<uint64_t> saved(big.size());
  for (size_t i = 0; i < big.size(); ++i) saved[i] = i * 0x9e3779b97f4a7c15ull;
  {
    auto c = make_client();
    big = saved;
    ASSERT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_UINT64));
    ASSERT_TRUE(c.checkpoint("ck", 1));
    ASSERT_TRUE(c.finalize(true));
  }
  auto restore_twice = [&] {
    auto c = make_client();
    ASSERT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_UINT64));
    auto v = c.restart_test("ck");
    ASSERT_TRUE(v) << v.error().to_string();
    ASSERT_TRUE(c.restart_begin("ck", *v));
    for (int round = 0; round < 2; ++round) {
      std::fill(big.begin(), big.end(), 0);
      status st = c.restart("ck", *v);
      ASSERT_TRUE(st) << st.to_string();
      EXPECT_EQ(big, saved) << "round " << round;
    }
    ASSERT_TRUE(c.restart_end(true));
    ASSERT_TRUE(c.finalize(true));
  };
  ASSERT_NO_FATAL_FAILURE(restore_twice());
  const std::string p = format::shard_path(scratch(), "unit", "ck", 1, 0);
  auto h = format::read_header(storage::storage_env::posix(), p);
  ASSERT_TRUE(h);
  auto data = storage::storage_env::posix()->read_all(p);
  ASSERT_TRUE(data);
  std::string d = *data;
  d[h->regions[0].offset + 12345] ^= 0x01;
  ASSERT_TRUE(storage::storage_env::posix()->write_atomic(p, d, true));
  ASSERT_NO_FATAL_FAILURE(restore_twice());
}

// A writer of the store re-seals version 2's header (and its MANIFEST entry)
// so that its one region claims `claim` bytes, over a sparse file of that
// size, and removes the node-local level (the persistent copy is then read
// into memory).
void forge_version_2_claiming(const std::string& store, const std::string& scratch, uint64_t claim) {
  auto* env = storage::storage_env::posix();
  ASSERT_TRUE(env->remove_tree(scratch));
  const std::string shard = format::shard_path(store, "unit", "ck", 2, 0);
  auto h = format::read_header(env, shard);
  ASSERT_TRUE(h);
  h->regions.at(0).count = claim / 8;
  ASSERT_TRUE(format::plan_layout(*h));
  std::string head(h->data_offset, '\0');
  format::encode_header(*h, std::as_writable_bytes(std::span<char>(head.data(), head.size())));
  ASSERT_TRUE(env->write_atomic(shard, head, false));
  ASSERT_EQ(truncate(shard.c_str(), static_cast<off_t>(h->file_size)), 0);  // sparse
  const std::string mpath = format::manifest_path(store, "unit", "ck", 2);
  auto m = format::read_manifest(env, mpath);
  ASSERT_TRUE(m);
  m->shards.at(0).header_checksum = h->header_checksum;
  m->shards.at(0).size = h->file_size;
  ASSERT_TRUE(env->write_atomic(mpath, format::encode_manifest(*m), true));
}

TEST_F(client_test, a_header_claiming_more_memory_than_the_node_has_is_refused_before_allocating) {
  // restart_test before any region is protected: the node's memory is the
  // only bound. The restart refuses the header before allocating or reading
  // anything, says why, and restores version 1.
  int64_t x = 0;
  ASSERT_NO_FATAL_FAILURE(checkpoint_x_twice(&x));
  ASSERT_NO_FATAL_FAILURE(forge_version_2_claiming(store(), scratch(), util::available_memory() + (uint64_t{1} << 30)));
  auto c = make_client();
  x = 0;
  testing::internal::CaptureStderr();
  auto v = c.restart_test("ck");
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(v) << v.error().to_string();
  EXPECT_EQ(*v, 1);
  EXPECT_NE(err.find("bytes of memory; this node has"), std::string::npos) << err;
  ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
  ASSERT_TRUE(c.restart("ck", 1));
  EXPECT_EQ(x, 10);
}

TEST_F(client_test, a_header_claiming_more_than_a_protected_region_is_refused_before_allocating) {
  // The region is protected: 64 MiB under its name for its 8 bytes is not
  // this program's checkpoint, though the node could hold it. Refused on the
  // header, before anything is read, with what to do; version 1 is restored.
  int64_t x = 0;
  ASSERT_NO_FATAL_FAILURE(checkpoint_x_twice(&x));
  ASSERT_NO_FATAL_FAILURE(forge_version_2_claiming(store(), scratch(), uint64_t{64} << 20));
  auto c = make_client();
  x = 0;
  ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
  testing::internal::CaptureStderr();
  auto v = c.restart_test("ck");
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(v) << v.error().to_string();
  EXPECT_EQ(*v, 1);
  EXPECT_NE(err.find("its region 'x' holds 67108864 bytes; this execution protected 8"), std::string::npos) << err;
  ASSERT_TRUE(c.restart("ck", 1));
  EXPECT_EQ(x, 10);
}

TEST_F(client_test, restart_test_without_checkpoints_is_not_found) {
  auto c = make_client();
  auto v = c.restart_test("never");
  ASSERT_FALSE(v);
  EXPECT_EQ(v.error().code(), errc::not_found);
}

TEST_F(client_test, retention_keeps_the_newest_versions_per_level) {
  setenv("CAIRN_KEEP_LOCAL", "2", 1);
  setenv("CAIRN_KEEP_PERSISTENT", "3", 1);
  int64_t x = 0;
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
  for (int v = 0; v < 8; ++v) {
    x = v;
    ASSERT_TRUE(c.checkpoint("ck", v));
    ASSERT_TRUE(c.wait("ck", v, CAIRN_LEVEL_PERSISTENT));
  }
  ASSERT_TRUE(c.finalize(true));
  auto env = storage::storage_env::posix();
  EXPECT_EQ(format::list_versions(env, scratch(), "unit", "ck"), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(format::list_versions(env, store(), "unit", "ck"), (std::vector<int64_t>{5, 6, 7}));
}

TEST_F(client_test, steady_state_local_shards_reuse_retired_files) {
  setenv("CAIRN_KEEP_LOCAL", "2", 1);
  std::vector<double> a(100000);
  auto env = storage::storage_env::posix();
  std::set<ino_t> inodes;
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("a", std::span<double>(a)));
    for (int v = 0; v < 10; ++v) {
      std::iota(a.begin(), a.end(), v * 0.5);
      ASSERT_TRUE(c.checkpoint("ck", v));
      ASSERT_TRUE(c.wait("ck", v, CAIRN_LEVEL_PERSISTENT));
      struct stat st {};
      ASSERT_EQ(::stat(format::shard_path(scratch(), "unit", "ck", v, 0).c_str(), &st), 0);
      inodes.insert(st.st_ino);
    }
    ASSERT_TRUE(c.finalize(true));
  }
  // Ten versions, two kept: the retired files came back as new versions' files.
  EXPECT_LE(inodes.size(), 5u);
  EXPECT_EQ(format::list_versions(env, scratch(), "unit", "ck"), (std::vector<int64_t>{8, 9}));
  // A recycled file restarts like any other, bit for bit.
  std::vector<double> expect(a.size());
  std::iota(expect.begin(), expect.end(), 9 * 0.5);
  std::fill(a.begin(), a.end(), 0);
  auto r = make_client();
  ASSERT_TRUE(r.protect("a", std::span<double>(a)));
  auto v = r.restart_test("ck");
  ASSERT_TRUE(v) << v.error().to_string();
  EXPECT_EQ(*v, 9);
  ASSERT_TRUE(r.restart("ck", 9));
  EXPECT_EQ(std::memcmp(a.data(), expect.data(), a.size() * sizeof(double)), 0);
  // The new execution emptied the bin the previous one left.
  auto bin = env->list(scratch() + "/recycle/unit");
  ASSERT_TRUE(bin);
  EXPECT_TRUE(bin->empty());
  ASSERT_TRUE(r.finalize(true));
}

TEST_F(client_test, io_rate_limit_paces_the_persistent_write) {
  // 16 MiB and a header at 32 MiB/s: three chunks, the last started >= 0.5 s in.
  setenv("CAIRN_IO_RATE_LIMIT", "32M", 1);
  std::vector<double> a(2u << 20, 1.5);
  auto c = make_client();
  ASSERT_TRUE(c.protect("a", std::span<double>(a)));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.checkpoint("ck", 1));
  ASSERT_TRUE(c.wait("ck", 1, CAIRN_LEVEL_PERSISTENT));
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.45);
  ASSERT_TRUE(c.finalize(true));
  unsetenv("CAIRN_IO_RATE_LIMIT");
}

TEST_F(client_test, persistent_interval_flushes_every_kth_version) {
  setenv("CAIRN_PERSISTENT_INTERVAL", "3", 1);
  setenv("CAIRN_KEEP_LOCAL", "0", 1);
  int64_t x = 0;
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT64));
  for (int v = 1; v <= 6; ++v) ASSERT_TRUE(c.checkpoint("ck", v));
  EXPECT_EQ(c.wait("ck", 1, CAIRN_LEVEL_PERSISTENT).code(), errc::not_found);
  ASSERT_TRUE(c.wait("ck", 3, CAIRN_LEVEL_PERSISTENT));
  ASSERT_TRUE(c.finalize(true));
  auto env = storage::storage_env::posix();
  EXPECT_EQ(format::list_versions(env, store(), "unit", "ck"), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(format::list_versions(env, scratch(), "unit", "ck"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST_F(client_test, persistent_failure_reaches_wait_and_next_checkpoint_and_keeps_old_versions) {
  setenv("CAIRN_FAULT_INJECT", "level=persistent,action=error,kind=write,errno=28,version=2", 1);
  std::vector<int32_t> x(1000, 1);
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", std::span<int32_t>(x)));
  ASSERT_TRUE(c.checkpoint("ck", 1));
  ASSERT_TRUE(c.wait("ck", 1, CAIRN_LEVEL_PERSISTENT));
  x[0] = 2;
  ASSERT_TRUE(c.checkpoint("ck", 2));  // capture succeeds; the flush will fail
  status w = c.wait("ck", 2, CAIRN_LEVEL_PERSISTENT);
  EXPECT_EQ(w.code(), errc::no_space);
  EXPECT_NE(w.message().find("No space"), std::string::npos) << w.message();
  EXPECT_TRUE(c.wait("ck", 2, CAIRN_LEVEL_LOCAL));  // the local level still holds it
  status next = c.checkpoint("ck", 3);
  // The latched error, once, as a code of its own: version 3 is taken all the same.
  EXPECT_EQ(next.code(), errc::earlier_failed);
  EXPECT_NE(next.message().find("version 3 was taken; an earlier version failed (no_space)"), std::string::npos)
      << next.message();
  EXPECT_NE(next.message().find("version 2"), std::string::npos) << next.message();
  EXPECT_EQ(c.test("ck", 2).error().code(), errc::no_space);  // the failed version keeps its own error
  EXPECT_EQ(c.checkpoint("ck", 3).code(), errc::invalid_argument);  // taken: not larger than the previous one
  ASSERT_TRUE(c.checkpoint("ck", 4));
  ASSERT_TRUE(c.finalize(true));
  auto env = storage::storage_env::posix();
  EXPECT_TRUE(env->exists(format::manifest_path(store(), "unit", "ck", 1)));
  EXPECT_FALSE(env->exists(format::manifest_path(store(), "unit", "ck", 2)));
  EXPECT_FALSE(env->exists(format::shard_path(store(), "unit", "ck", 2, 0) + ".tmp"));
  EXPECT_TRUE(env->exists(format::manifest_path(store(), "unit", "ck", 3)));
}

TEST_F(client_test, staging_policy_eagain_reports_full_staging) {
  setenv("CAIRN_STAGING_POLICY", "eagain", 1);
  setenv("CAIRN_STAGING_LIMIT", "8M", 1);  // one slot of ~8 MiB
  std::vector<char> big(6 << 20, 'x');
  auto c = make_client();
  ASSERT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_BYTE));
  // Keep the only slot busy: several checkpoints back to back; at least one must
  // find it busy (the engine needs time to write 6 MiB twice), and none may fail otherwise.
  int again = 0, ok = 0;
  for (int v = 0; v < 50 && again == 0; ++v) {
    status st = c.checkpoint("ck", v);
    if (st.code() == errc::again) ++again;
    else if (st) ++ok;
    else FAIL() << st.to_string();
  }
  EXPECT_GE(ok, 1);
  EXPECT_EQ(again, 1);
  ASSERT_TRUE(c.finalize(true));
}

TEST_F(client_test, staging_limit_smaller_than_a_checkpoint_is_explained) {
  setenv("CAIRN_STAGING_LIMIT", "4K", 1);
  std::vector<char> big(1 << 20);
  auto c = make_client();
  ASSERT_TRUE(c.protect("big", big.data(), big.size(), CAIRN_BYTE));
  status st = c.checkpoint("ck", 0);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  EXPECT_NE(st.message().find("staging_limit"), std::string::npos) << st.message();
}

TEST_F(client_test, file_mode_round_trip) {
  {
    auto c = make_client();
    ASSERT_TRUE(c.checkpoint_begin("files", 4));
    auto p = c.route_file("/some/where/state.dat");
    ASSERT_TRUE(p);
    ASSERT_TRUE(storage::storage_env::posix()->write_atomic(*p, "hello state", false));
    auto q = c.route_file("params.txt");
    ASSERT_TRUE(storage::storage_env::posix()->write_atomic(*q, "n=3", false));
    ASSERT_TRUE(c.checkpoint_end(true));
    ASSERT_TRUE(c.wait("files", 4, CAIRN_LEVEL_PERSISTENT));
    ASSERT_TRUE(c.finalize(true));
  }
  auto r = make_client();
  auto v = r.restart_test("files");
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, 4);
  ASSERT_TRUE(r.restart_begin("files", 4));
  auto p = r.route_file("state.dat");
  ASSERT_TRUE(p);
  EXPECT_EQ(*storage::storage_env::posix()->read_all(*p), "hello state");
  EXPECT_EQ(r.route_file("missing.dat").error().code(), errc::not_found);
  ASSERT_TRUE(r.restart_end(true));
}

// Names that would break the store or its JSON, and sizes that overflow, are
// refused where they enter with CAIRN_EINVAL and a message naming the rule;
// the handle goes on working.
TEST_F(client_test, bad_names_and_overflowing_sizes_are_refused_at_the_call) {
  cairn_t* c = nullptr;
  ASSERT_EQ(cairn_init(nullptr, &c), CAIRN_OK);
  double d[4] = {1, 2, 3, 4};
  EXPECT_EQ(cairn_protect(c, "bad\xff", d, 4, CAIRN_FLOAT64), CAIRN_EINVAL);
  EXPECT_NE(std::string(cairn_last_error()).find("not valid UTF-8"), std::string::npos) << cairn_last_error();
  EXPECT_EQ(cairn_protect(c, "big", d, SIZE_MAX / 2, CAIRN_FLOAT64), CAIRN_EINVAL);
  EXPECT_NE(std::string(cairn_last_error()).find("more bytes than a checkpoint can hold"), std::string::npos)
      << cairn_last_error();
  const uint64_t huge[2] = {uint64_t{1} << 40, uint64_t{1} << 40};
  EXPECT_EQ(cairn_protect_shaped(c, "shape", d, CAIRN_FLOAT64, 2, huge, 0), CAIRN_EINVAL);
  EXPECT_EQ(cairn_protect(c, "d", d, 4, CAIRN_FLOAT64), CAIRN_OK);
  EXPECT_EQ(cairn_checkpoint(c, "ck\x01", 1), CAIRN_EINVAL);
  EXPECT_NE(std::string(cairn_last_error()).find("control character"), std::string::npos) << cairn_last_error();
  EXPECT_EQ(cairn_checkpoint(c, "RUN", 1), CAIRN_EINVAL);
  EXPECT_EQ(cairn_checkpoint(c, "\xc0\xaf", 1), CAIRN_EINVAL);  // an overlong '/'
  EXPECT_EQ(cairn_tag(c, "k", "v\xff"), CAIRN_EINVAL);
  EXPECT_EQ(cairn_set_code_version(c, "v1\n"), CAIRN_EINVAL);
  // Later checkpoints work; versions up to INT64_MAX list and restore.
  EXPECT_EQ(cairn_checkpoint(c, "ck", INT64_MAX - 1), CAIRN_OK);
  EXPECT_EQ(cairn_wait(c, "ck", INT64_MAX - 1, CAIRN_LEVEL_PERSISTENT), CAIRN_OK);
  EXPECT_EQ(cairn_finalize(&c, 1), CAIRN_OK);
  ASSERT_EQ(cairn_init(nullptr, &c), CAIRN_OK);
  ASSERT_EQ(cairn_protect(c, "d", d, 4, CAIRN_FLOAT64), CAIRN_OK);
  int64_t v = -1;
  EXPECT_EQ(cairn_restart_test(c, "ck", &v), CAIRN_OK) << cairn_last_error();
  EXPECT_EQ(v, INT64_MAX - 1);
  EXPECT_EQ(cairn_checkpoint(c, "ck", 1), CAIRN_EEXIST);  // the floor sees the 19-digit version
  EXPECT_EQ(cairn_finalize(&c, 1), CAIRN_OK);
}

// cairn_config_value gives each key as cairn_init resolved it: the
// environment over the file over the default.
TEST_F(client_test, config_value_is_what_init_resolved_from_environment_file_and_defaults) {
  const std::string file = dir_ + "/cairn.toml";
  ASSERT_TRUE(storage::storage_env::posix()->write_atomic(file, "capture = \"cow\"\nkeep_local = 5\n", false));
  setenv("CAIRN_KEEP_LOCAL", "2", 1);
  cairn_t* c = nullptr;
  ASSERT_EQ(cairn_init(file.c_str(), &c), CAIRN_OK) << cairn_last_error();
  char v[64];
  ASSERT_EQ(cairn_config_value(c, "capture", v, sizeof v), CAIRN_OK) << cairn_last_error();
  EXPECT_STREQ(v, "cow");
  ASSERT_EQ(cairn_config_value(c, "keep_local", v, sizeof v), CAIRN_OK);
  EXPECT_STREQ(v, "2");
  ASSERT_EQ(cairn_config_value(c, "staging_slots", v, sizeof v), CAIRN_OK);
  EXPECT_STREQ(v, "2");
  EXPECT_EQ(cairn_config_value(c, "no_such_key", v, sizeof v), CAIRN_ENOTFOUND);
  EXPECT_NE(std::string(cairn_last_error()).find("no configuration key 'no_such_key'"), std::string::npos);
  char small[3];
  EXPECT_EQ(cairn_config_value(c, "capture", small, sizeof small), CAIRN_EINVAL);
  EXPECT_NE(std::string(cairn_last_error()).find("needs 4 bytes"), std::string::npos) << cairn_last_error();
  EXPECT_EQ(cairn_finalize(&c, 1), CAIRN_OK);
}

TEST_F(client_test, c_api_reports_codes_and_messages) {
  setenv("CAIRN_BOGUS", "1", 1);
  cairn_t* c = nullptr;
  EXPECT_EQ(cairn_init(nullptr, &c), CAIRN_EINVAL);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(cairn_last_error()).find("CAIRN_BOGUS"), std::string::npos) << cairn_last_error();
  unsetenv("CAIRN_BOGUS");
  ASSERT_EQ(cairn_init(nullptr, &c), CAIRN_OK);
  double d[4] = {1, 2, 3, 4};
  EXPECT_EQ(cairn_protect(c, nullptr, d, 4, CAIRN_FLOAT64), CAIRN_EINVAL);
  EXPECT_EQ(cairn_protect(c, "d", d, 4, CAIRN_FLOAT64), CAIRN_OK);
  EXPECT_EQ(cairn_checkpoint(c, "ck", 0), CAIRN_OK);
  unsigned levels = 0;
  EXPECT_EQ(cairn_wait(c, "ck", 0, CAIRN_LEVEL_PERSISTENT), CAIRN_OK);
  EXPECT_EQ(cairn_test(c, "ck", 0, &levels), CAIRN_OK);
  EXPECT_TRUE(levels & CAIRN_LEVEL_PERSISTENT);
  EXPECT_EQ(cairn_wait(c, "ck", 0, 0x30), CAIRN_EINVAL);
  int64_t v = -1;
  EXPECT_EQ(cairn_restart_test(c, "nothing", &v), CAIRN_ENOTFOUND);
  EXPECT_STREQ(cairn_strerror(CAIRN_ECORRUPT), "corrupt data");
  EXPECT_EQ(cairn_finalize(&c, 1), CAIRN_OK);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(cairn_finalize(&c, 1), CAIRN_EINVAL);
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

TEST_F(client_test, block_with_halos_stores_only_the_block_and_restores_it_in_place) {
  // A 4x6 local buffer with a one-cell halo around a 2x4 block of a 10x4 global array.
  std::vector<double> buf(4 * 6), saved;
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<double>(i);
  const uint64_t global[] = {10, 4}, start[] = {2, 0}, count[] = {2, 4}, mshape[] = {4, 6}, mstart[] = {1, 1};
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect_block("grid", buf.data(), CAIRN_FLOAT64, global, start, count, mshape, mstart));
    ASSERT_TRUE(c.checkpoint("ck", 1));
    ASSERT_TRUE(c.finalize(true));
  }
  auto h = format::read_header(storage::storage_env::posix(), format::shard_path(store(), "unit", "ck", 1, 0));
  ASSERT_TRUE(h);
  ASSERT_EQ(h->regions.size(), 1u);
  EXPECT_EQ(h->regions[0].count, 8u);
  EXPECT_EQ(h->regions[0].global, (std::vector<uint64_t>{10, 4}));
  EXPECT_EQ(h->regions[0].start, (std::vector<uint64_t>{2, 0}));
  // The block in the file is rows 1..2, columns 1..4 of the buffer.
  auto data = storage::storage_env::posix()->read_all(format::shard_path(store(), "unit", "ck", 1, 0));
  const double* stored = reinterpret_cast<const double*>(data->data() + h->regions[0].offset);
  for (int r = 0; r < 2; ++r)
    for (int col = 0; col < 4; ++col) EXPECT_EQ(stored[r * 4 + col], buf[(r + 1) * 6 + col + 1]);

  std::vector<double> back(4 * 6, -1.0);
  auto r = make_client();
  ASSERT_TRUE(r.protect_block("grid", back.data(), CAIRN_FLOAT64, global, start, count, mshape, mstart));
  ASSERT_TRUE(r.restart("ck", 1));
  for (int row = 0; row < 4; ++row)
    for (int col = 0; col < 6; ++col) {
      bool inside = row >= 1 && row <= 2 && col >= 1 && col <= 4;
      EXPECT_EQ(back[row * 6 + col], inside ? buf[row * 6 + col] : -1.0) << row << "," << col;  // halos untouched
    }
}

TEST_F(client_test, block_layout_is_validated) {
  std::vector<double> buf(16);
  const uint64_t global[] = {4, 4}, start[] = {3, 0}, count[] = {2, 4};
  auto c = make_client();
  EXPECT_EQ(c.protect_block("g", buf.data(), CAIRN_FLOAT64, global, start, count).code(), errc::invalid_argument);
  const uint64_t start_ok[] = {0, 0}, mshape[] = {2, 3}, mstart[] = {0, 0};
  EXPECT_EQ(c.protect_block("g", buf.data(), CAIRN_FLOAT64, global, start_ok, count, mshape, mstart).code(),
            errc::invalid_argument);  // block of 4 columns does not fit 3
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

TEST_F(client_test, run_identity_records_every_execution) {
  setenv("CAIRN_CODE_VERSION", "v1.2", 1);
  setenv("CAIRN_TAGS", "compiler=gcc,opt=O2", 1);
  int x = 1;
  {
    auto c = make_client();
    ASSERT_TRUE(c.protect("x", &x, 1, CAIRN_INT32));
    ASSERT_TRUE(c.tag("purpose", "unit test"));
    ASSERT_TRUE(c.checkpoint("ck", 1));
    ASSERT_TRUE(c.finalize(true));
  }
  unsetenv("CAIRN_TAGS");
  unsetenv("CAIRN_CODE_VERSION");
  {
    auto c = make_client();
    ASSERT_TRUE(c.set_code_version("v1.3"));
    EXPECT_EQ(c.tag("a=b", "x").code(), errc::invalid_argument);
  }
  auto info = format::read_run_info(storage::storage_env::posix(), store(), "unit");
  ASSERT_TRUE(info) << info.error().to_string();
  EXPECT_EQ(info->run, "unit");
  EXPECT_EQ(info->code_version, "v1.3");
  EXPECT_EQ(info->tags.at("compiler"), "gcc");
  EXPECT_EQ(info->tags.at("purpose"), "unit test");
  ASSERT_EQ(info->executions.size(), 2u);
  EXPECT_EQ(info->executions[0].code_version, "v1.2");
  EXPECT_GT(info->executions[0].ended_at, info->executions[0].started_at);
  EXPECT_EQ(info->executions[1].nranks, 1u);
  EXPECT_EQ(info->executions[0].config.at("code_version"), "v1.2");
  EXPECT_EQ(info->executions[1].hosts.size(), 1u);
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

// Writes versions 1..n of checkpoint "ck" with x[i] = i + offset(version) as run `run`.
void write_run(const char* run, int n, double perturb_at_version, double delta) {
  setenv("CAIRN_RUN", run, 1);
  std::vector<double> x(20000);
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", std::span<double>(x)));
  for (int v = 1; v <= n; ++v) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i) * 0.5 + v;
    if (v >= perturb_at_version) x[12345] += delta;
    ASSERT_TRUE(c.checkpoint("ck", v));
  }
  ASSERT_TRUE(c.finalize(true));
}

// The compare stage runs beside the levels, so a wait for the persistent level
// does not wait for it: polls until `n` versions were compared or found their
// reference missing (pending), for at most 20 s.
cairn_divergence_t wait_for_comparisons(client& c, int64_t n) {
  cairn_divergence_t d{};
  for (int i = 0; i < 2000; ++i) {
    EXPECT_TRUE(c.impl()->divergence(&d));
    if (d.compared + d.pending >= n) break;
    usleep(10000);
  }
  return d;
}

TEST_F(client_test, online_comparison_equal_runs_do_not_diverge) {
  write_run("ref", 3, 1e9, 0);
  setenv("CAIRN_REFERENCE_RUN", "ref", 1);
  setenv("CAIRN_COMPARE_ABS", "1e-9", 1);
  setenv("CAIRN_RUN", "new", 1);
  std::vector<double> x(20000);
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", std::span<double>(x)));
  for (int v = 1; v <= 3; ++v) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i) * 0.5 + v;
    if (v == 2) x[7] += 1e-12;  // within the tolerance
    ASSERT_TRUE(c.checkpoint("ck", v));
  }
  ASSERT_TRUE(c.wait("ck", 3, CAIRN_LEVEL_PERSISTENT));
  cairn_divergence_t d = wait_for_comparisons(c, 3);
  EXPECT_EQ(d.diverged, 0);
  EXPECT_EQ(d.version, -1);
  EXPECT_EQ(d.compared, 3);
  EXPECT_EQ(d.pending, 0);
  ASSERT_TRUE(c.finalize(true));
  unsetenv("CAIRN_REFERENCE_RUN");
  unsetenv("CAIRN_COMPARE_ABS");
}

TEST_F(client_test, online_comparison_stops_the_run_at_the_first_divergence) {
  write_run("ref", 4, 1e9, 0);
  setenv("CAIRN_REFERENCE_RUN", "ref", 1);
  setenv("CAIRN_COMPARE_ABS", "1e-9", 1);
  setenv("CAIRN_ON_DIVERGENCE", "stop", 1);
  setenv("CAIRN_RUN", "new", 1);
  std::vector<double> x(20000);
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", std::span<double>(x)));
  status st;
  int v = 1;
  for (; v <= 4; ++v) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i) * 0.5 + v;
    if (v >= 2) x[12345] += 1e-3;
    st = c.checkpoint("ck", v);
    if (!st) break;
    ASSERT_TRUE(c.wait("ck", v, CAIRN_LEVEL_PERSISTENT));
    (void)wait_for_comparisons(c, v);  // the next checkpoint sees how v compared
  }
  EXPECT_EQ(st.code(), errc::diverged) << st.to_string();
  EXPECT_EQ(v, 3);  // version 2 diverged; the checkpoint after it refuses
  cairn_divergence_t d;
  ASSERT_TRUE(c.impl()->divergence(&d));
  EXPECT_EQ(d.diverged, 1);
  EXPECT_EQ(d.version, 2);
  EXPECT_STREQ(d.region, "x");
  EXPECT_EQ(d.index, 12345u);
  EXPECT_EQ(d.structural, 0);
  (void)c.finalize(true);
  for (const char* k : {"CAIRN_REFERENCE_RUN", "CAIRN_COMPARE_ABS", "CAIRN_ON_DIVERGENCE"}) unsetenv(k);
}

TEST_F(client_test, online_comparison_waits_for_a_reference_that_is_still_running) {
  setenv("CAIRN_REFERENCE_RUN", "late", 1);
  setenv("CAIRN_RUN", "early", 1);
  std::vector<double> x(1000, 2.0);
  auto c = make_client();
  ASSERT_TRUE(c.protect("x", std::span<double>(x)));
  ASSERT_TRUE(c.checkpoint("ck", 1));
  ASSERT_TRUE(c.wait("ck", 1, CAIRN_LEVEL_PERSISTENT));
  cairn_divergence_t d = wait_for_comparisons(c, 1);
  EXPECT_EQ(d.pending, 1);
  EXPECT_EQ(d.compared, 0);
  {
    // The reference commits version 1 later, with a different value.
    unsetenv("CAIRN_REFERENCE_RUN");
    setenv("CAIRN_RUN", "late", 1);
    std::vector<double> y(1000, 2.5);
    auto r = make_client();
    ASSERT_TRUE(r.protect("x", std::span<double>(y)));
    ASSERT_TRUE(r.checkpoint("ck", 1));
    ASSERT_TRUE(r.finalize(true));
  }
  // The next progress retries in the background; poll until it has run.
  for (int i = 0; i < 200 && d.compared == 0; ++i) {
    ASSERT_TRUE(c.impl()->divergence(&d));
    if (d.compared == 0) usleep(10000);
  }
  EXPECT_EQ(d.compared, 1);
  EXPECT_EQ(d.pending, 0);
  ASSERT_TRUE(c.impl()->divergence(&d));  // the collective part agrees on it
  EXPECT_EQ(d.diverged, 1);
  EXPECT_EQ(d.version, 1);
  EXPECT_STREQ(d.value, "2");
  EXPECT_STREQ(d.reference, "2.5");
  ASSERT_TRUE(c.finalize(true));
}

}  // namespace
}  // namespace cairn

// ---- the levels' registration (client/levels.hpp) ---------------------------

namespace cairn {
namespace {

// A level_host with a configuration and nothing else: what the levels'
// factories look at (they run no collective).
class config_host final : public level_host {
 public:
  explicit config_host(config c) : cfg_(std::move(c)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  comm::communicator& comm() override { std::abort(); }
  const config& cfg() const override { return cfg_; }
  storage::storage_env* env() override { return storage::storage_env::posix(); }
  engine::engine& engine() override { std::abort(); }
  status agree(status mine) override { return mine; }
  std::string exchange_message(bool, const std::string& mine) override { return mine; }
  status progress_round() override { return {}; }
  status wait_level(version_record&, unsigned) override { return {}; }
  status remove_persistent_below(const std::string&, int64_t) override { return {}; }
  void index_committed(const std::string&, int64_t) override {}
  const std::map<std::string, int64_t>& newest_versions() const override { return newest_; }
  std::vector<std::pair<std::string, int64_t>> tracked_versions() const override { return {}; }
  uint32_t node_count() const override { return 1; }
  const std::string& node() const override { return node_; }
  result<std::string> plane_key() override { return std::string(32, 'k'); }
  void record_runtime_level(const version_record&, unsigned, double, double) override {}
  engine::staging_pool& staging() override { return pool_; }
  uint32_t attempt() const override { return 1; }
  const std::deque<version_record*>& pending() const override { return pending_; }

 private:
  std::deque<version_record*> pending_;
  std::string node_ = "node0";
  engine::staging_pool pool_;
  config cfg_;
  std::map<std::string, int64_t> newest_;
};

// The levels a configuration registers, with the host they keep a pointer to.
struct registered {
  std::unique_ptr<config_host> host;
  result<std::vector<std::unique_ptr<level>>> levels = std::vector<std::unique_ptr<level>>();
};

registered levels_of(const std::map<std::string, std::string>& values) {
  auto c = config::from_values(values);
  EXPECT_TRUE(c) << c.error().to_string();
  registered r;
  r.host = std::make_unique<config_host>(std::move(c).value());
  r.levels = make_levels(r.host.get());
  return r;
}

TEST(Levels, TheDefaultConfigurationRegistersNone) {
  auto r = levels_of({});
  ASSERT_TRUE(r.levels) << r.levels.error().to_string();
  EXPECT_TRUE(r.levels->empty());
}

// Configurations that do not go together are refused by the levels'
// factories, naming the keys.
TEST(Levels, LevelsRefuseWhatTheyDoNotCombineWith) {
  for (const auto& [values, says] : std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {{{"agents", "127.0.0.1:1"}, {"persistent_layout", "aggregated"}}, "does not combine with agents"},
           {{{"agents", "127.0.0.1:1"}, {"redundancy", "xor"}}, "does not combine with checkpoint agents"},
           {{{"agents_lend", "true"}}, "agents_lend"},
           {{{"redundancy", "xor"}, {"local_enabled", "false"}}, "protects the node-local level"},
           {{{"engine_host", "daemon"}, {"mode", "sync"}}, "mode = sync runs the stages in the application"},
           {{{"engine_host", "daemon"}, {"agents", "127.0.0.1:1"}}, "agents are not run by the daemon"},
           {{{"engine_host", "daemon"}, {"persistent_layout", "aggregated"}}, "aggregated is not run by the daemon"}}) {
    auto r = levels_of(values);
    ASSERT_FALSE(r.levels) << says;
    EXPECT_EQ(r.levels.error().code(), errc::invalid_argument);
    EXPECT_NE(r.levels.error().message().find(says), std::string::npos) << r.levels.error().message();
  }
}

TEST(Levels, TheAgentsWriteAndKeepTheirVersions) {
  auto r = levels_of({{"agents", "127.0.0.1:1"}});
  ASSERT_TRUE(r.levels) << r.levels.error().to_string();
  ASSERT_EQ(r.levels->size(), 1u);
  const level& agents = *r.levels->front();
  EXPECT_TRUE(agents.commits_persistent());
  EXPECT_TRUE(agents.keeps_restored());
  EXPECT_EQ(agents.wants(1), unsigned{CAIRN_LEVEL_PROTECTED});
  EXPECT_EQ(agents.where(), "the agents' memory");
}

// Redundancy protects every redundancy_interval-th version, records its
// scheme in the protected versions' manifests, and keeps node-local
// versions from the newest protected one.
TEST(Levels, RedundancyProtectsEveryIntervalAndKeepsTheNewestProtected) {
  auto r = levels_of({{"redundancy", "xor"}, {"redundancy_interval", "3"}});
  ASSERT_TRUE(r.levels) << r.levels.error().to_string();
  ASSERT_EQ(r.levels->size(), 1u);
  level& red = *r.levels->front();
  EXPECT_FALSE(red.commits_persistent());
  EXPECT_TRUE(red.rebuilds());
  EXPECT_EQ(red.wants(1), 0u);
  EXPECT_EQ(red.wants(3), unsigned{CAIRN_LEVEL_PROTECTED});
  EXPECT_EQ(red.wants(6), unsigned{CAIRN_LEVEL_PROTECTED});
  engine::version_job job;
  format::manifest m;
  job.wanted = CAIRN_LEVEL_PERSISTENT;
  red.describe(job, &m);
  EXPECT_FALSE(m.redundancy.has_value());
  job.wanted |= CAIRN_LEVEL_PROTECTED;
  red.describe(job, &m);
  EXPECT_TRUE(m.redundancy.has_value());
  // Nothing protected yet: node-local retention keeps nothing back for it.
  EXPECT_EQ(red.keep_local_from("x"), INT64_MIN);
  version_record rec;
  rec.name = "x";
  rec.version = 6;
  rec.job = std::make_shared<engine::version_job>();
  red.on_level_complete(rec, CAIRN_LEVEL_LOCAL);
  EXPECT_EQ(red.keep_local_from("x"), INT64_MIN);
  red.on_level_complete(rec, CAIRN_LEVEL_PROTECTED);
  EXPECT_EQ(red.keep_local_from("x"), 6);
  EXPECT_GT(rec.protected_at, 0);
  EXPECT_EQ(red.keep_local_from("y"), INT64_MIN);
}

// The node daemon runs every stage (the client builds no graph) and comes
// after the levels whose sets it encodes.
TEST(Levels, TheDaemonRunsTheStagesAndComesLast) {
  auto r = levels_of({{"engine_host", "daemon"}, {"redundancy", "partner"}});
  ASSERT_TRUE(r.levels) << r.levels.error().to_string();
  ASSERT_EQ(r.levels->size(), 2u);
  EXPECT_TRUE(r.levels->front()->rebuilds());
  EXPECT_TRUE(r.levels->back()->runs_stages());
  EXPECT_FALSE(r.levels->back()->commits_persistent());
  // Not started: abandoning and closing hold nothing and do nothing.
  r.levels->back()->abandon();
  r.levels->back()->close();
}

// The aggregated level writes the persistent level's data (the client
// commits it), plans each version from every rank's record and describes
// the container in the manifest; the leaders read retired node-local files.
TEST(Levels, AggregationPlansWritesAndDescribesTheContainer) {
  auto r = levels_of({{"persistent_layout", "aggregated"}, {"aggregate_strategy", "aligned"}});
  ASSERT_TRUE(r.levels) << r.levels.error().to_string();
  ASSERT_EQ(r.levels->size(), 1u);
  level& agg = *r.levels->front();
  EXPECT_TRUE(agg.writes_persistent_data());
  EXPECT_FALSE(agg.commits_persistent());
  EXPECT_FALSE(agg.reads_retired_local());
  EXPECT_TRUE(agg.plans());
  auto p = agg.plan({{100, 1, 0}, {200, 1, 0}, {300, 2, 0}});
  ASSERT_TRUE(p) << p.error().to_string();
  version_record rec;
  rec.job = std::make_shared<engine::version_job>();
  rec.job->plan = *p;
  format::manifest m;
  agg.describe(*rec.job, &m);
  EXPECT_TRUE(m.aggregated);
  EXPECT_EQ(m.container.strategy, "aligned");
  EXPECT_FALSE(m.container.files.empty());
  // Not mpiio: no step of its own.
  EXPECT_FALSE(agg.step_state(rec).has_value());
  EXPECT_FALSE(agg.awaits_step());

  auto leaders = levels_of({{"persistent_layout", "aggregated"}, {"aggregate_strategy", "leaders"}});
  ASSERT_TRUE(leaders.levels) << leaders.levels.error().to_string();
  EXPECT_TRUE(leaders.levels->front()->reads_retired_local());
}

// A level that overrides nothing changes nothing the client asks.
TEST(Levels, DefaultHooksChangeNothing) {
  struct plain final : level {};
  plain p;
  EXPECT_FALSE(p.commits_persistent());
  EXPECT_FALSE(p.writes_persistent_data());
  EXPECT_FALSE(p.plans());
  EXPECT_FALSE(p.awaits_step());
  EXPECT_EQ(p.wants(7), 0u);
  EXPECT_FALSE(p.lends());
  std::string what;
  EXPECT_EQ(p.committed_floor("x", 4, &what), 4);
  std::set<int64_t> cands;
  p.candidates("x", &cands);
  EXPECT_TRUE(cands.empty());
  format::shard_image img;
  std::string why;
  EXPECT_EQ(p.load("x", 1, &img, &why).code(), errc::not_found);
  version_record rec;
  EXPECT_FALSE(p.wait(rec, CAIRN_LEVEL_PERSISTENT).has_value());
  EXPECT_EQ(p.reached(rec), 0u);
  auto change = p.probe();
  ASSERT_TRUE(change);
  EXPECT_EQ(*change, CAIRN_AGENTS_UNCHANGED);
}

}  // namespace
}  // namespace cairn

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <mutex>
#include <thread>

#include <sys/mman.h>
#include <unistd.h>

#include "cairn.h"
#include "daemon/protocol.hpp"
#include "engine/engine.hpp"
#include "engine/recycler.hpp"
#include "engine/staging.hpp"
#include "engine/stages.hpp"
#include "format/layout.hpp"
#include "format/shard.hpp"
#include "storage/geometry.hpp"
#include "storage/storage_env.hpp"
#include "util/hash.hpp"

namespace cairn::engine {
namespace {

// Records the order in which (stage, version) pairs ran.
struct trace {
  std::mutex mu;
  std::vector<std::pair<std::string, int64_t>> events;
  void add(const std::string& s, int64_t v) {
    std::lock_guard lk(mu);
    events.emplace_back(s, v);
  }
};

class fake_stage final : public stage {
 public:
  fake_stage(std::string name, unsigned level, trace* t, bool essential = false, int64_t fail_version = -1,
             int sleep_ms = 0)
      : name_(std::move(name)), level_(level), t_(t), essential_(essential), fail_(fail_version), sleep_ms_(sleep_ms) {}
  const char* name() const override { return name_.c_str(); }
  unsigned level() const override { return level_; }
  bool essential() const override { return essential_; }
  status run(version_job& job) override {
    if (sleep_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    t_->add(name_, job.header.version);
    if (job.header.version == fail_) return {errc::io_error, "injected"};
    return {};
  }

 private:
  std::string name_;
  unsigned level_;
  trace* t_;
  bool essential_;
  int64_t fail_;
  int sleep_ms_;
};

std::shared_ptr<version_job> make_job(int64_t v, unsigned wanted = CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL |
                                                                  CAIRN_LEVEL_PERSISTENT) {
  auto j = std::make_shared<version_job>();
  j->header.name = "t";
  j->header.version = v;
  j->wanted = wanted;
  j->done = CAIRN_LEVEL_CAPTURED;
  return j;
}

// Threads of this process named `name`, as top shows them.
int threads_named(const std::string& name) {
  int n = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(t.path() / "comm");
    std::string comm;
    if (std::getline(in, comm) && comm == name) ++n;
  }
  return n;
}

TEST(engine, its_threads_are_named_cairn_engine) {
  const int before = threads_named("cairn-engine");
  {
    engine e(engine_mode::thread, 2, {}, std::vector<std::unique_ptr<stage>>());
    // Each worker names itself when it starts.
    for (int i = 0; i < 200 && threads_named("cairn-engine") < before + 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(threads_named("cairn-engine"), before + 2);
  }
  EXPECT_EQ(threads_named("cairn-engine"), before);
}

TEST(engine, stages_run_in_order_per_version_with_two_workers) {
  trace t;
  std::vector<std::unique_ptr<stage>> st;
  st.push_back(std::make_unique<fake_stage>("a", 0, &t, true, -1, 1));
  st.push_back(std::make_unique<fake_stage>("local", CAIRN_LEVEL_LOCAL, &t, false, -1, 2));
  st.push_back(std::make_unique<fake_stage>("persistent", CAIRN_LEVEL_PERSISTENT, &t, false, -1, 3));
  engine e(engine_mode::thread, 2, {}, std::move(st));
  std::vector<std::shared_ptr<version_job>> jobs;
  for (int v = 0; v < 6; ++v) {
    jobs.push_back(make_job(v));
    e.submit(jobs.back());
  }
  e.wait_idle();
  // Within each stage, versions appear in submission order.
  for (const char* s : {"a", "local", "persistent"}) {
    int64_t last = -1;
    for (auto& [name, v] : t.events)
      if (name == s) { EXPECT_EQ(v, last + 1) << s; last = v; }
    EXPECT_EQ(last, 5) << s;
  }
  for (auto& j : jobs) {
    unsigned done, failed;
    bool fin;
    e.levels(*j, &done, &failed, &fin);
    EXPECT_TRUE(fin);
    EXPECT_EQ(done, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL | CAIRN_LEVEL_PERSISTENT);
    EXPECT_EQ(failed, 0u);
  }
  EXPECT_TRUE(e.take_error());
}

TEST(engine, failing_stage_marks_its_level_and_latches_once) {
  trace t;
  std::vector<std::unique_ptr<stage>> st;
  st.push_back(std::make_unique<fake_stage>("local", CAIRN_LEVEL_LOCAL, &t));
  st.push_back(std::make_unique<fake_stage>("persistent", CAIRN_LEVEL_PERSISTENT, &t, false, 1));
  engine e(engine_mode::thread, 1, {}, std::move(st));
  auto j0 = make_job(0), j1 = make_job(1), j2 = make_job(2);
  e.submit(j0);
  e.submit(j1);
  e.submit(j2);
  e.wait_idle();
  unsigned done, failed;
  bool fin;
  status err;
  e.levels(*j1, &done, &failed, &fin, &err);
  EXPECT_EQ(done & CAIRN_LEVEL_LOCAL, CAIRN_LEVEL_LOCAL);  // a non-essential failure keeps other levels
  EXPECT_EQ(failed, CAIRN_LEVEL_PERSISTENT);
  EXPECT_EQ(err.code(), errc::io_error);
  EXPECT_NE(err.message().find("version 1, stage persistent"), std::string::npos) << err.message();
  e.levels(*j2, &done, &failed, &fin);
  EXPECT_EQ(failed, 0u);  // later versions still run
  status latched = e.take_error();
  EXPECT_EQ(latched.code(), errc::io_error);
  EXPECT_TRUE(e.take_error());  // taken once
}

class throwing_stage final : public stage {
 public:
  explicit throwing_stage(bool bad_alloc) : bad_alloc_(bad_alloc) {}
  const char* name() const override { return "throws"; }
  unsigned level() const override { return CAIRN_LEVEL_PERSISTENT; }
  status run(version_job& job) override {
    if (job.header.version == 1) {
      if (bad_alloc_) throw std::bad_alloc();
      throw std::runtime_error("a name the encoder refused");
    }
    return {};
  }

 private:
  bool bad_alloc_;
};

TEST(engine, a_stage_or_task_that_throws_fails_its_version_and_the_process_lives) {
  for (bool bad_alloc : {false, true}) {
    std::vector<std::unique_ptr<stage>> st;
    st.push_back(std::make_unique<throwing_stage>(bad_alloc));
    engine e(engine_mode::thread, 1, {}, std::move(st));
    auto j0 = make_job(0), j1 = make_job(1), j2 = make_job(2);
    e.submit(j0);
    e.submit(j1);
    e.submit(j2);
    e.submit_task([]() -> status { throw std::logic_error("task"); });
    e.wait_idle();
    unsigned done, failed;
    bool fin;
    status err;
    e.levels(*j1, &done, &failed, &fin, &err);
    EXPECT_TRUE(fin);
    EXPECT_EQ(failed, CAIRN_LEVEL_PERSISTENT);
    EXPECT_EQ(err.code(), bad_alloc ? errc::no_space : errc::internal) << err.to_string();
    if (!bad_alloc) {
      EXPECT_NE(err.message().find("a name the encoder refused"), std::string::npos) << err.message();
    }
    e.levels(*j2, &done, &failed, &fin);
    EXPECT_EQ(failed, 0u);  // later versions still run
    EXPECT_EQ(done & CAIRN_LEVEL_PERSISTENT, CAIRN_LEVEL_PERSISTENT);
    EXPECT_FALSE(e.take_error());
  }
}

TEST(engine, essential_failure_abandons_the_version) {
  trace t;
  std::vector<std::unique_ptr<stage>> st;
  st.push_back(std::make_unique<fake_stage>("checksum", 0, &t, true, 0));
  st.push_back(std::make_unique<fake_stage>("local", CAIRN_LEVEL_LOCAL, &t));
  engine e(engine_mode::sync, 1, {}, std::move(st));
  auto j = make_job(0);
  e.submit(j);  // sync: runs inline
  unsigned done, failed;
  bool fin;
  e.levels(*j, &done, &failed, &fin);
  EXPECT_TRUE(fin);
  EXPECT_EQ(failed & CAIRN_LEVEL_LOCAL, CAIRN_LEVEL_LOCAL);
  ASSERT_EQ(t.events.size(), 1u);  // local never ran
}

TEST(engine, skipped_level_is_neither_done_nor_failed) {
  trace t;
  std::vector<std::unique_ptr<stage>> st;
  st.push_back(std::make_unique<fake_stage>("persistent", CAIRN_LEVEL_PERSISTENT, &t));
  engine e(engine_mode::thread, 1, {}, std::move(st));
  auto j = make_job(0, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL);
  e.submit(j);
  e.wait_levels(*j, CAIRN_LEVEL_PERSISTENT);
  e.wait_idle();
  unsigned done, failed;
  bool fin;
  e.levels(*j, &done, &failed, &fin);
  EXPECT_EQ(done, static_cast<unsigned>(CAIRN_LEVEL_CAPTURED));
  EXPECT_EQ(failed, 0u);
  EXPECT_TRUE(t.events.empty());
}

TEST(engine, shutdown_without_drain_cancels_queued_jobs_and_returns_slots) {
  trace t;
  std::vector<std::unique_ptr<stage>> st;
  st.push_back(std::make_unique<fake_stage>("local", CAIRN_LEVEL_LOCAL, &t, false, -1, 50));
  staging_pool pool;
  ASSERT_TRUE(pool.reserve(4096, 4));
  auto e = std::make_unique<engine>(engine_mode::thread, 1, util::thread_setup{}, std::move(st));
  std::vector<std::shared_ptr<version_job>> jobs;
  for (int v = 0; v < 4; ++v) {
    auto j = make_job(v, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL);
    j->image = pool.acquire(false);
    ASSERT_NE(j->image, nullptr);
    j->pool = &pool;
    jobs.push_back(j);
    e->submit(j);
  }
  EXPECT_FALSE(pool.has_free());
  e->shutdown(false);
  int cancelled = 0;
  for (auto& j : jobs) {
    unsigned done, failed;
    bool fin;
    status err;
    e->levels(*j, &done, &failed, &fin, &err);
    EXPECT_TRUE(fin);
    if (err.code() == errc::cancelled) {
      ++cancelled;
      EXPECT_EQ(failed, static_cast<unsigned>(CAIRN_LEVEL_LOCAL));
    }
  }
  EXPECT_GE(cancelled, 2);
  for (int i = 0; i < 4; ++i) EXPECT_NE(pool.acquire(false), nullptr);  // every slot came back
}

// Waits (up to 10 s) for another stage to start before finishing: succeeds only
// when both run at the same time.
class rendezvous_stage final : public stage {
 public:
  rendezvous_stage(const char* name, unsigned level, std::atomic<int>* arrived) : name_(name), level_(level), n_(arrived) {}
  const char* name() const override { return name_; }
  unsigned level() const override { return level_; }
  status run(version_job&) override {
    ++*n_;
    for (int i = 0; i < 10000 && n_->load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return n_->load() >= 2 ? status() : status(errc::io_error, "ran alone");
  }

 private:
  const char* name_;
  unsigned level_;
  std::atomic<int>* n_;
};

TEST(engine, levels_after_the_image_stages_run_side_by_side) {
  trace t;
  std::atomic<int> arrived{0};
  stage_graph g;
  size_t image = g.add(std::make_unique<fake_stage>("checksum", 0, &t, true));
  g.add(std::make_unique<rendezvous_stage>("local", CAIRN_LEVEL_LOCAL, &arrived), {image});
  g.add(std::make_unique<rendezvous_stage>("persistent", CAIRN_LEVEL_PERSISTENT, &arrived), {image});
  engine e(engine_mode::thread, 2, {}, std::move(g));
  auto j = make_job(0);
  e.submit(j);
  e.wait_idle();
  unsigned done, failed;
  bool fin;
  e.levels(*j, &done, &failed, &fin);
  EXPECT_TRUE(fin);
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(done, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL | CAIRN_LEVEL_PERSISTENT);
}

TEST(engine, a_stage_waits_for_every_stage_it_names_and_versions_stay_in_order) {
  trace t;
  stage_graph g;
  size_t a = g.add(std::make_unique<fake_stage>("a", 0, &t, true));
  size_t b = g.add(std::make_unique<fake_stage>("b", CAIRN_LEVEL_LOCAL, &t, false, -1, 3), {a});
  size_t c = g.add(std::make_unique<fake_stage>("c", CAIRN_LEVEL_PERSISTENT, &t, false, -1, 1), {a});
  g.add(std::make_unique<fake_stage>("d", 0, &t), {b, c});
  engine e(engine_mode::thread, 3, {}, std::move(g));
  for (int v = 0; v < 5; ++v) e.submit(make_job(v));
  e.wait_idle();
  ASSERT_EQ(t.events.size(), 20u);
  auto pos = [&](const std::string& s, int64_t v) {
    for (size_t i = 0; i < t.events.size(); ++i)
      if (t.events[i] == std::make_pair(s, v)) return i;
    return t.events.size();
  };
  for (int v = 0; v < 5; ++v) {
    EXPECT_LT(pos("a", v), pos("b", v));
    EXPECT_LT(pos("a", v), pos("c", v));
    EXPECT_LT(pos("b", v), pos("d", v));
    EXPECT_LT(pos("c", v), pos("d", v));
    if (v > 0) {
      for (const char* s : {"a", "b", "c", "d"}) EXPECT_LT(pos(s, v - 1), pos(s, v)) << s << " " << v;
    }
  }
}

TEST(engine, essential_failure_in_a_graph_fails_every_level_after_it) {
  trace t;
  stage_graph g;
  size_t a = g.add(std::make_unique<fake_stage>("checksum", 0, &t, true, 1));
  g.add(std::make_unique<fake_stage>("local", CAIRN_LEVEL_LOCAL, &t), {a});
  g.add(std::make_unique<fake_stage>("persistent", CAIRN_LEVEL_PERSISTENT, &t), {a});
  engine e(engine_mode::thread, 2, {}, std::move(g));
  auto j0 = make_job(0), j1 = make_job(1), j2 = make_job(2);
  e.submit(j0);
  e.submit(j1);
  e.submit(j2);
  e.wait_idle();
  unsigned done, failed;
  bool fin;
  e.levels(*j1, &done, &failed, &fin);
  EXPECT_TRUE(fin);
  EXPECT_EQ(failed, static_cast<unsigned>(CAIRN_LEVEL_LOCAL | CAIRN_LEVEL_PERSISTENT));
  e.levels(*j2, &done, &failed, &fin);  // the next version is not affected
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(done, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL | CAIRN_LEVEL_PERSISTENT);
  EXPECT_EQ(t.events.size(), 7u);  // 3 + 1 + 3
}

// Follows the capture: records how much was captured when it started and
// reads the rest through job.capture.
class follower_stage final : public stage {
 public:
  follower_stage(trace* t, std::atomic<uint64_t>* seen_at_start) : t_(t), seen_(seen_at_start) {}
  const char* name() const override { return "follower"; }
  bool follows_capture() const override { return true; }
  status run(version_job& job) override {
    t_->add("follower", job.header.version);
    seen_->store(job.capture.wait_past(0));
    for (uint64_t at = 0; at < 100;) at = job.capture.wait_past(at);
    return {};
  }

 private:
  trace* t_;
  std::atomic<uint64_t>* seen_;
};

TEST(engine, a_stage_that_follows_the_capture_starts_before_it_ends_and_the_others_after) {
  trace t;
  std::atomic<uint64_t> seen{0};
  stage_graph g;
  size_t image = g.add(std::make_unique<fake_stage>("checksum", 0, &t, true));
  size_t follow = g.add(std::make_unique<follower_stage>(&t, &seen), {});
  g.add(std::make_unique<fake_stage>("persistent", CAIRN_LEVEL_PERSISTENT, &t), {image, follow});
  engine e(engine_mode::thread, 2, {}, std::move(g));
  auto j = make_job(0);
  j->capture_streams = true;
  e.submit(j, true);
  j->capture.publish(40);
  // The follower runs and sees the 40 bytes; the checksum waits for the capture.
  for (int i = 0; i < 2000 && seen.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(seen.load(), 40u);
  {
    std::lock_guard lk(t.mu);
    ASSERT_EQ(t.events.size(), 1u);
    EXPECT_EQ(t.events[0].first, "follower");
  }
  j->capture.publish(100);
  e.captured(*j);
  e.wait_idle();
  ASSERT_EQ(t.events.size(), 3u);
  EXPECT_EQ(t.events[1].first, "checksum");
  EXPECT_EQ(t.events[2].first, "persistent");
  unsigned done, failed;
  bool fin;
  e.levels(*j, &done, &failed, &fin);
  EXPECT_TRUE(fin);
  EXPECT_EQ(done, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_PERSISTENT);
}

// A capture that ends all at once (capture = cow: no progress in image
// order) starts no stage before it has ended, not even one that follows
// the capture (it would only hold an engine thread).
TEST(engine, a_capture_that_does_not_stream_starts_its_stages_when_it_ends) {
  trace t;
  std::atomic<uint64_t> seen{0};
  stage_graph g;
  g.add(std::make_unique<follower_stage>(&t, &seen));
  engine e(engine_mode::thread, 2, {}, std::move(g));
  auto j = make_job(0);
  e.submit(j, true);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard lk(t.mu);
    EXPECT_TRUE(t.events.empty());
  }
  j->capture.publish(100);
  e.captured(*j);
  e.wait_idle();
  EXPECT_EQ(seen.load(), 100u);
  ASSERT_EQ(t.events.size(), 1u);
}

// A checksum stage that follows the capture, and a version of one region
// of `bytes` in its own slot (declared before the engine, which goes first).
struct one_region_capture {
  explicit one_region_capture(uint64_t bytes) {
    j->header.run = "run";
    j->header.nranks = 1;
    j->done = 0;
    format::region_desc d;
    d.name = "x";
    d.type = CAIRN_BYTE;
    d.count = bytes;
    j->header.regions.push_back(d);
    EXPECT_TRUE(format::plan_layout(j->header));
    auto buf = aligned_buffer::allocate(j->header.file_size);
    EXPECT_TRUE(buf);
    if (buf) slot = std::move(buf).value();
    j->image = &slot;
  }
  static stage_graph graph() {
    stage_graph g;
    g.add(make_checksum_stage(false, 0, 0, true));
    return g;
  }
  aligned_buffer slot;
  std::shared_ptr<version_job> j = make_job(1, CAIRN_LEVEL_CAPTURED);
  engine e{engine_mode::thread, 2, {}, graph()};
};

// The checksum pass follows the application's copy: it hashes each piece
// once it is published and never before (bytes changed before their
// publication are hashed as published), and the header it encodes is the
// one a pass over the finished image gives.
TEST(engine, the_checksum_pass_follows_the_capture_and_reads_only_what_is_published) {
  one_region_capture c(8u << 20);
  auto& [slot, j, e] = c;
  j->capture_streams = true;
  std::byte* img = slot.data() + j->header.regions[0].offset;
  const uint64_t len = j->header.regions[0].length, half = len / 2;
  std::memset(img, 0x5a, len);  // what is there before the capture
  e.submit(j, true);
  for (uint64_t i = 0; i < half; ++i) img[i] = static_cast<std::byte>(i * 13 + 7);
  j->capture.publish(j->header.regions[0].offset + half);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the pass reaches the unpublished half
  for (uint64_t i = half; i < len; ++i) img[i] = static_cast<std::byte>(i * 13 + 7);
  e.captured(*j);
  e.wait_idle();
  unsigned done = 0, failed = 0;
  bool fin = false;
  e.levels(*j, &done, &failed, &fin);
  EXPECT_TRUE(fin);
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(done, static_cast<unsigned>(CAIRN_LEVEL_CAPTURED));
  EXPECT_EQ(j->header.regions[0].checksum, util::xxh3(img, len));
  auto h = format::decode_header(slot.span().first(j->header.data_offset), "the image");
  ASSERT_TRUE(h) << h.error().to_string();
  EXPECT_EQ(h->regions[0].checksum, util::xxh3(img, len));
}

// A capture that fails part-way (a background copy that could not finish)
// fails the version at its checksum pass with the capture's error, whether
// the pass was following it or not.
TEST(engine, a_capture_that_fails_part_way_fails_the_checksum_pass_with_its_error) {
  for (bool streams : {true, false}) {
    one_region_capture c(1u << 20);
    auto& [slot, j, e] = c;
    j->capture_streams = streams;
    e.submit(j, true);
    j->capture.publish(j->header.regions[0].offset + 4096);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    e.captured(*j, status(errc::io_error, "the copy stopped"));
    e.wait_idle();
    unsigned done = 0, failed = 0;
    bool fin = false;
    status err;
    e.levels(*j, &done, &failed, &fin, &err);
    EXPECT_TRUE(fin) << streams;
    EXPECT_EQ(done & CAIRN_LEVEL_CAPTURED, 0u) << streams;
    EXPECT_FALSE(err.is_ok()) << streams;
    EXPECT_NE(err.message().find("the copy stopped"), std::string::npos) << err.to_string();
    (void)e.take_error();
  }
}

// The persistent write begun during the capture (data part) and finished
// after the checksum (header, syncs, rename) produces the whole image; when
// the version is abandoned before the finish, its temporary goes.
TEST(engine, persistent_write_split_around_the_checksum_writes_the_image_or_leaves_nothing) {
  char tmpl[] = "/tmp/cairn-split-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto* env = storage::storage_env::posix();
  for (bool fail_checksum : {false, true}) {
    const std::string store = dir + (fail_checksum ? "/failed" : "/written");
    level_paths paths{"run", dir + "/scratch", store};
    trace t;
    stage_graph g;
    size_t image = fail_checksum ? g.add(std::make_unique<fake_stage>("checksum", 0, &t, true, 1))
                                 : g.add(make_checksum_stage());
    size_t data = g.add(make_persistent_data_stage(env, paths, true, true), {});
    g.add(make_persistent_stage(env, paths, true), {image, data});
    engine e(engine_mode::thread, 2, {}, std::move(g));
    auto j = make_job(1, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_PERSISTENT);
    j->header.run = "run";
    j->header.nranks = 1;
    format::region_desc d;
    d.name = "x";
    d.type = CAIRN_BYTE;
    d.count = 3 * 4096 + 100;
    j->header.regions.push_back(d);
    ASSERT_TRUE(format::plan_layout(j->header));
    auto buf = aligned_buffer::allocate(j->header.file_size);
    ASSERT_TRUE(buf);
    aligned_buffer slot = std::move(buf).value();
    j->image = &slot;
    j->capture_streams = true;
    e.submit(j, true);
    std::byte* img = slot.data() + j->header.regions[0].offset;
    const uint64_t len = j->header.regions[0].length;
    for (uint64_t i = 0; i < len; ++i) img[i] = static_cast<std::byte>(i * 7 + 1);
    std::memset(img + len, 0, j->header.file_size - j->header.regions[0].offset - len);
    j->capture.publish(j->header.regions[0].offset + 4096);
    j->capture.publish(j->header.file_size);
    e.captured(*j);
    e.wait_idle();
    unsigned done = 0, failed = 0;
    bool fin = false;
    for (int i = 0; i < 2000 && !fin; ++i) {
      e.levels(*j, &done, &failed, &fin);
      if (!fin) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(fin);
    const std::string path = format::shard_path(paths.persistent, "run", "t", 1, 0);
    if (fail_checksum) {
      EXPECT_EQ(failed & CAIRN_LEVEL_PERSISTENT, CAIRN_LEVEL_PERSISTENT);
      EXPECT_FALSE(env->exists(path));
      EXPECT_FALSE(env->exists(path + ".tmp"));
      (void)e.take_error();
    } else {
      EXPECT_EQ(done & CAIRN_LEVEL_PERSISTENT, CAIRN_LEVEL_PERSISTENT);
      auto got = env->read_all(path);
      ASSERT_TRUE(got);
      ASSERT_EQ(got->size(), j->header.file_size);
      EXPECT_EQ(std::memcmp(got->data(), slot.data(), got->size()), 0);
      EXPECT_FALSE(env->exists(path + ".tmp"));
    }
  }
  (void)env->remove_tree(dir);
}

TEST(engine, normal_tasks_go_before_queued_stages_and_low_tasks_after) {
  trace t;
  std::vector<std::unique_ptr<stage>> st;
  st.push_back(std::make_unique<fake_stage>("s", CAIRN_LEVEL_LOCAL, &t, false, -1, 20));
  engine e(engine_mode::thread, 1, {}, std::move(st));
  for (int v = 0; v < 3; ++v) e.submit(make_job(v, CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL));
  e.submit_task([&] { t.add("low", -1); return status(); }, task_priority::low);
  e.submit_task([&] { t.add("normal", -1); return status(); });
  e.wait_idle();
  ASSERT_EQ(t.events.size(), 5u);
  EXPECT_EQ(t.events.back().first, "low");  // after every stage that was ready
  EXPECT_NE(t.events[1].first, "low");
  // The normal task ran before the last version's stage (the first may have started already).
  size_t normal = 0;
  while (t.events[normal].first != "normal") ++normal;
  EXPECT_LE(normal, 1u);
}

TEST(recycler, only_files_this_process_wrote_are_binned_and_taken_by_exact_size) {
  char tmpl[] = "/tmp/cairn-recycler-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto env = storage::storage_env::posix();
  auto make = [&](const std::string& name, size_t bytes) {
    std::string path = dir + "/" + name;
    EXPECT_TRUE(env->write_atomic(path, std::string(bytes, 'x'), false));
    return path;
  };
  local_recycler r(env, dir, "run", 3, 2);
  std::string mine1 = make("a", 8192), mine2 = make("b", 8192), mine3 = make("c", 8192), theirs = make("d", 8192);
  for (const auto& p : {mine1, mine2, mine3}) r.wrote(p, 8192);
  ASSERT_TRUE(r.retire(theirs));  // not written here (it may be mapped by a restart): removed
  EXPECT_FALSE(env->exists(theirs));
  ASSERT_TRUE(r.retire(mine1));
  ASSERT_TRUE(r.retire(mine2));
  ASSERT_TRUE(r.retire(mine3));  // the bin holds two: removed
  r.wrote(dir + "/gone", 8192);
  ASSERT_TRUE(r.retire(dir + "/gone"));  // removed by someone else meanwhile: nothing to do
  for (const auto& p : {mine1, mine2, mine3}) EXPECT_FALSE(env->exists(p));
  auto bin = env->list(dir + "/recycle/run");
  ASSERT_TRUE(bin);
  EXPECT_EQ(bin->size(), 2u);
  EXPECT_FALSE(r.take(4096, dir + "/new.tmp"));  // only the exact size
  EXPECT_TRUE(r.take(8192, dir + "/new.tmp"));
  EXPECT_TRUE(env->exists(dir + "/new.tmp"));
  ASSERT_TRUE(r.clear());  // the other one (a crashed execution's leftovers)
  bin = env->list(dir + "/recycle/run");
  ASSERT_TRUE(bin);
  EXPECT_TRUE(bin->empty());
  EXPECT_FALSE(r.take(8192, dir + "/new2.tmp"));
  ASSERT_TRUE(env->remove_tree(dir));
}

// On tmpfs, a taken file comes with a mapping of it, which travels with the
// file through the bin and is used again; a file replaced meanwhile gets a
// new one; elsewhere (ext4 /tmp here) none.
TEST(recycler, taken_files_are_mapped_on_tmpfs_and_the_mapping_is_used_again) {
  auto env = storage::storage_env::posix();
  for (const char* base : {"/dev/shm/cairn-recycler-XXXXXX", "/tmp/cairn-recycler-XXXXXX"}) {
    std::string tmpl = base;
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    const std::string dir = tmpl;
    auto tmpfs = storage::detect_geometry(dir);
    ASSERT_TRUE(tmpfs);
    const bool maps = tmpfs->fs == "tmpfs";
    local_recycler r(env, dir, "run", 0, 2);
    const std::string a = dir + "/a";
    ASSERT_TRUE(env->write_atomic(a, std::string(3 * 4096 + 5, 'a'), false));
    r.wrote(a, 3 * 4096 + 5);
    ASSERT_TRUE(r.retire(a));
    std::shared_ptr<storage::mapped_file> m;
    ASSERT_TRUE(r.take(3 * 4096 + 5, dir + "/b.tmp", &m));
    EXPECT_EQ(m != nullptr, maps) << dir;
    if (m) {
      ASSERT_EQ(m->bytes().size(), 3u * 4096 + 5);
      std::memset(m->bytes().data(), 'b', m->bytes().size());
      auto back = env->read_all(dir + "/b.tmp");
      ASSERT_TRUE(back);
      EXPECT_EQ(*back, std::string(3 * 4096 + 5, 'b'));  // stores reach the file
    }
    storage::mapped_file* first = m.get();
    ASSERT_TRUE(env->rename(dir + "/b.tmp", dir + "/b"));
    r.wrote(dir + "/b", 3 * 4096 + 5, std::move(m));
    ASSERT_TRUE(r.retire(dir + "/b"));
    ASSERT_TRUE(r.take(3 * 4096 + 5, dir + "/c.tmp", &m));
    EXPECT_EQ(m.get(), first);  // the same mapping, the same file
    ASSERT_TRUE(env->rename(dir + "/c.tmp", dir + "/c"));
    r.wrote(dir + "/c", 3 * 4096 + 5, std::move(m));
    ASSERT_TRUE(r.retire(dir + "/c"));
    // The binned file replaced by another one (another inode): a new mapping.
    auto bin = env->list(dir + "/recycle/run");
    ASSERT_TRUE(bin);
    ASSERT_EQ(bin->size(), 1u);
    const std::string binned = dir + "/recycle/run/" + bin->front();
    ASSERT_TRUE(env->remove_file(binned));
    ASSERT_TRUE(env->write_atomic(binned, std::string(3 * 4096 + 5, 'z'), false));
    ASSERT_TRUE(r.take(3 * 4096 + 5, dir + "/d.tmp", &m));
    EXPECT_EQ(m != nullptr, maps);
    if (m) {
      EXPECT_TRUE(m->is(dir + "/d.tmp"));
      EXPECT_EQ(static_cast<char>(m->bytes()[0]), 'z');
    }
    m.reset();
    ASSERT_TRUE(r.clear());
    ASSERT_TRUE(env->remove_tree(dir));
  }
}

TEST(staging, reserving_ahead_never_waits_for_a_slot_in_use) {
  staging_pool pool;
  ASSERT_TRUE(pool.reserve(4096, 2));
  aligned_buffer* held = pool.acquire(false);
  ASSERT_NE(held, nullptr);
  ASSERT_TRUE(pool.try_reserve(100000, 100000 + 4096, 2));  // would have to replace the held slot
  EXPECT_EQ(pool.slot_bytes(), 4096u);
  pool.release(held);
  ASSERT_TRUE(pool.try_reserve(100000, 100000 + 4096, 2));
  EXPECT_EQ(pool.slot_bytes(), 100000u + 4096);
  EXPECT_EQ(pool.slots(), 2);
  ASSERT_TRUE(pool.try_reserve(100000, 200000, 2));  // big enough already: unchanged
  EXPECT_EQ(pool.slot_bytes(), 100000u + 4096);
}

TEST(staging, dropped_slots_are_announced) {
  // The node daemon maps every slot handed to it: it learns of each one the
  // pool drops (staging_pool::set_on_drop), so its memory does not grow with
  // every larger image.
  staging_pool pool;
  std::vector<uint64_t> dropped;
  pool.set_on_drop([&](uint64_t id) { dropped.push_back(id); });
  ASSERT_TRUE(pool.reserve(4096, 2));
  aligned_buffer* a = pool.acquire(false);
  aligned_buffer* b = pool.acquire(false);
  std::vector<uint64_t> first = {a->id(), b->id()};
  ASSERT_TRUE(pool.reserve(8192, 2, false));  // slots in use: nothing changes
  EXPECT_TRUE(dropped.empty());
  pool.release(a);
  pool.release(b);
  ASSERT_TRUE(pool.reserve(8192, 2));
  std::sort(first.begin(), first.end());
  std::sort(dropped.begin(), dropped.end());
  EXPECT_EQ(dropped, first);
  ASSERT_TRUE(pool.reserve(8192, 2));  // big enough: nothing more dropped
  EXPECT_EQ(dropped.size(), 2u);
}

// A slot of `size` made ahead on another thread (try_reserve); `done` once it returns.
static std::thread make_ahead(staging_pool& pool, size_t size, std::atomic<bool>& done) {
  return std::thread([&pool, size, &done] {
    EXPECT_TRUE(pool.try_reserve(size, size, 1));
    done = true;
  });
}

// Until `done`, for at most 5 s.
static void wait_until(const std::atomic<bool>& done) {
  for (int i = 0; i < 500 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

TEST(staging, a_paused_maker_waits_for_resume_or_for_a_reserve_that_needs_its_slot) {
  constexpr size_t size = size_t{64} << 20;  // several pieces
  staging_pool pool;
  pool.pause();
  std::atomic<bool> done{false};
  std::thread maker = make_ahead(pool, size, done);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done);  // paused between pieces
  EXPECT_EQ(pool.slots(), 0);
  // A capture's reserve waits for the slot being made, which goes on for it
  // (had it made a slot of its own, the maker would stay paused).
  ASSERT_TRUE(pool.reserve(size, 1));
  EXPECT_EQ(pool.slots(), 1);
  wait_until(done);
  EXPECT_TRUE(done);
  pool.resume();
  maker.join();
  EXPECT_EQ(pool.slots(), 1);

  // Without a waiting reserve, a paused maker goes on at resume.
  staging_pool other;
  other.pause();
  done = false;
  std::thread ahead([&] {
    EXPECT_TRUE(other.try_reserve(size, size, 2));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done);
  other.resume();
  ahead.join();
  EXPECT_EQ(other.slots(), 2);
}

// Pages of [p, p + n) in memory (mincore).
static size_t resident_pages(const std::byte* p, size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((n + page - 1) / page);
  if (mincore(const_cast<std::byte*>(p), n, in.data()) != 0) return SIZE_MAX;
  return static_cast<size_t>(std::count_if(in.begin(), in.end(), [](unsigned char c) { return c & 1; }));
}

TEST(staging, a_reserve_for_copy_on_write_takes_its_slot_before_it_is_faulted_in) {
  constexpr size_t size = size_t{64} << 20;
  // No slot yet: mapped, not touched (the capture's background copy faults it in).
  staging_pool fresh;
  ASSERT_TRUE(fresh.reserve(size, 1, true, false));
  aligned_buffer* slot = fresh.acquire(false);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(resident_pages(slot->data(), slot->size()), 0u);
  fresh.release(slot);

  // A slot being made ahead (paused here, so that it touches nothing more)
  // is handed over as it is, and its maker stops touching it.
  staging_pool pool;
  pool.pause();
  std::atomic<bool> done{false};
  std::thread maker = make_ahead(pool, size, done);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(pool.reserve(size, 1, true, false));
  EXPECT_EQ(pool.slots(), 1);
  wait_until(done);
  EXPECT_TRUE(done);  // not waiting for resume: it was handed over
  slot = pool.acquire(false);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(resident_pages(slot->data(), slot->size()), 0u);
  pool.release(slot);
  pool.resume();
  maker.join();
  EXPECT_EQ(pool.slots(), 1);
}

TEST(staging, a_deferred_maker_starts_at_its_time_for_a_waiting_reserve_or_never_once_stopped) {
  constexpr size_t size = size_t{32} << 20;
  using clock = std::chrono::steady_clock;
  // Deferred: no page touched until the time, which a later call moves.
  staging_pool pool;
  pool.defer_until(clock::now() + std::chrono::seconds(30));
  std::atomic<bool> done{false};
  std::thread maker([&] {
    EXPECT_TRUE(pool.try_reserve(size, size, 1));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done);
  const auto lifted = clock::now();
  pool.defer_until(lifted + std::chrono::milliseconds(300));
  maker.join();
  EXPECT_GE(clock::now() - lifted, std::chrono::milliseconds(300));
  EXPECT_EQ(pool.slots(), 1);

  // A capture's reserve does not wait for the time: the maker goes on for it.
  staging_pool waited;
  waited.defer_until(clock::now() + std::chrono::seconds(30));
  std::atomic<bool> made{false};
  std::thread ahead([&] {
    EXPECT_TRUE(waited.try_reserve(size, size, 1));
    made = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the maker has mapped its slot and waits
  const auto t0 = clock::now();
  ASSERT_TRUE(waited.reserve(size, 1));
  EXPECT_LT(clock::now() - t0, std::chrono::seconds(20));  // not the maker's 30 s
  // The reserve took the maker's slot: the maker is done, long before its
  // time (had the reserve made a slot of its own, the maker would still wait).
  for (int i = 0; i < 500 && !made; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(made);
  waited.stop_ahead();  // ends a maker still waiting (the failure above) instead of its 30 s
  ahead.join();
  EXPECT_EQ(waited.slots(), 1);

  // Stopped (finalize): the deferred maker drops its slot at once, and no
  // slot is made ahead any more.
  staging_pool stopped;
  stopped.defer_until(clock::now() + std::chrono::seconds(30));
  std::thread dropped([&] { EXPECT_TRUE(stopped.try_reserve(size, size, 1)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t1 = clock::now();
  stopped.stop_ahead();
  dropped.join();
  EXPECT_LT(clock::now() - t1, std::chrono::seconds(20));
  EXPECT_EQ(stopped.slots(), 0);
  EXPECT_TRUE(stopped.try_reserve(size, size, 1));
  EXPECT_EQ(stopped.slots(), 0);
}

// wait_ahead (the maker's wait before it reads the layout): until the time,
// which later calls move; false once stopped.
TEST(staging, wait_ahead_lasts_until_the_moved_time_or_the_stop) {
  using clock = std::chrono::steady_clock;
  staging_pool pool;
  EXPECT_TRUE(pool.wait_ahead());  // nothing deferred
  const auto t0 = clock::now();
  pool.defer_until(t0 + std::chrono::milliseconds(150));
  std::thread mover([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pool.defer_until(clock::now() + std::chrono::milliseconds(150));  // a protect in the burst
  });
  EXPECT_TRUE(pool.wait_ahead());
  EXPECT_GE(clock::now() - t0, std::chrono::milliseconds(250));
  mover.join();

  pool.defer_until(clock::now() + std::chrono::seconds(30));
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pool.stop_ahead();
  });
  const auto t1 = clock::now();
  EXPECT_FALSE(pool.wait_ahead());
  EXPECT_LT(clock::now() - t1, std::chrono::seconds(20));
  stopper.join();
}

TEST(staging, a_finished_restart_image_becomes_a_slot_when_one_is_missing) {
  staging_pool pool;
  auto image = aligned_buffer::allocate(3 * 4096);
  ASSERT_TRUE(image);
  std::byte* at = image->data();
  ASSERT_TRUE(pool.adopt(std::move(image).value(), 2));  // an empty pool takes any size
  EXPECT_EQ(pool.slots(), 1);
  EXPECT_EQ(pool.slot_bytes(), 3u * 4096);
  auto smaller = aligned_buffer::allocate(4096);
  ASSERT_TRUE(smaller);
  EXPECT_FALSE(pool.adopt(std::move(smaller).value(), 2));  // smaller than the pool's slots
  auto larger = aligned_buffer::allocate(4 * 4096);
  ASSERT_TRUE(larger);
  ASSERT_TRUE(pool.adopt(std::move(larger).value(), 2));
  auto third = aligned_buffer::allocate(3 * 4096);
  ASSERT_TRUE(third);
  EXPECT_FALSE(pool.adopt(std::move(third).value(), 2));  // the pool has its two slots
  EXPECT_EQ(pool.slots(), 2);
  // The first capture uses one without waiting and without a reserve.
  ASSERT_TRUE(pool.reserve(3 * 4096, 1));
  aligned_buffer* a = pool.acquire(false);
  aligned_buffer* b = pool.acquire(false);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(a->data() == at || b->data() == at);
  pool.release(a);
  pool.release(b);
  staging_pool shared;
  shared.set_shared(true);
  auto img = aligned_buffer::allocate(4096);
  ASSERT_TRUE(img);
  EXPECT_FALSE(shared.adopt(std::move(img).value(), 2));  // cairnd maps only the slots it was told of

  // The slots made ahead beside an adopted one that holds the need are of
  // its size (with no room to spare it is kept, not replaced).
  staging_pool kept;
  auto restored = aligned_buffer::allocate(3 * 4096);
  ASSERT_TRUE(restored);
  std::byte* kept_at = restored->data();
  ASSERT_TRUE(kept.adopt(std::move(restored).value(), 2));
  ASSERT_TRUE(kept.try_reserve(3 * 4096, 4 * 4096, 2));
  EXPECT_EQ(kept.slots(), 2);
  EXPECT_EQ(kept.slot_bytes(), 3u * 4096);
  aligned_buffer* x = kept.acquire(false);
  aligned_buffer* y = kept.acquire(false);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  EXPECT_TRUE(x->data() == kept_at || y->data() == kept_at);
  kept.release(x);
  kept.release(y);
}

TEST(staging, acquire_blocks_until_release_and_buffers_are_aligned) {
  staging_pool pool;
  ASSERT_TRUE(pool.reserve(10000, 1));
  EXPECT_GE(pool.slot_bytes(), 10000u);
  aligned_buffer* a = pool.acquire(false);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
  EXPECT_EQ(pool.acquire(false), nullptr);
  std::atomic<bool> got{false};
  std::thread th([&] {
    aligned_buffer* b = pool.acquire(true);
    got = true;
    pool.release(b);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(got.load());
  pool.release(a);
  th.join();
  EXPECT_TRUE(got.load());
}

// A shared slot travels over the daemon's protocol (its memory file with a
// slot frame) and the receiver maps the same pages.
TEST(daemon_protocol, shared_slot_and_frames_cross_a_socket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  daemon::channel a(sv[0]), b(sv[1]);
  auto slot = aligned_buffer::allocate_shared(3 * 4096);
  ASSERT_TRUE(slot.is_ok());
  ASSERT_GE(slot->fd(), 0);
  std::memset(slot->data(), 0x5a, slot->size());
  std::string big(300000, 'x');  // larger than a socket buffer: sent and read in pieces
  std::thread sender([&] {
    EXPECT_TRUE(a.send({daemon::msg::job, "{\"id\":1}", big, -1}).is_ok());
    EXPECT_TRUE(a.send({daemon::msg::slot, "{}", {}, slot->fd()}).is_ok());
  });
  auto f = b.recv();
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->type, daemon::msg::job);
  EXPECT_EQ(f->meta, "{\"id\":1}");
  EXPECT_EQ(f->payload, big);
  auto g = b.recv();
  sender.join();
  ASSERT_TRUE(g.is_ok());
  ASSERT_EQ(g->type, daemon::msg::slot);
  ASSERT_GE(g->fd, 0);
  auto mapped = aligned_buffer::map_shared(g->fd, slot->size());
  ASSERT_TRUE(mapped.is_ok());
  EXPECT_EQ(std::to_integer<int>(mapped->data()[4097]), 0x5a);
  mapped->data()[100] = std::byte{7};  // the same pages
  EXPECT_EQ(std::to_integer<int>(slot->data()[100]), 7);
  a.shutdown();
  auto end = b.recv();
  ASSERT_FALSE(end.is_ok());
  EXPECT_EQ(end.error().code(), errc::not_found);
}

}  // namespace
}  // namespace cairn::engine

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "util/aligned_buffer.hpp"
#include "util/config.hpp"
#include "util/copy.hpp"
#include "util/cpu.hpp"
#include "util/hash.hpp"
#include "util/json.hpp"
#include "util/names.hpp"
#include "util/process.hpp"

namespace cairn {
namespace {

std::string write_temp(const std::string& text) {
  char path[] = "/tmp/cairn-config-XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(copy, stream_copy_copies_every_byte_at_any_alignment_and_size) {
  // Below and above the non-temporal threshold (1 MiB), with heads and
  // tails that are not multiples of the vector width.
  std::vector<unsigned char> src((3u << 20) + 4096), dst(src.size() + 4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t len : {size_t{0}, size_t{1}, size_t{4095}, size_t{1} << 20, (size_t{1} << 20) + 77, (size_t{3} << 20) + 3})
    for (size_t so : {0, 1, 16, 63})
      for (size_t dof : {0, 5, 32, 64}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        util::stream_copy(dst.data() + dof, src.data() + so, len);
        ASSERT_EQ(std::memcmp(dst.data() + dof, src.data() + so, len), 0) << len << " " << so << " " << dof;
        for (size_t i = 0; i < dof; ++i) ASSERT_EQ(dst[i], 0xEE);  // nothing before
        ASSERT_EQ(dst[dof + len], 0xEE);                              // nor after
      }
}

TEST(copy, the_kernels_copy_is_slow_just_past_the_source_modulo_a_page) {
  auto at = [](uintptr_t a) { return reinterpret_cast<const void*>(a); };
  EXPECT_TRUE(util::kernel_copy_slow(at(0x7f0000010010), 0));      // malloc's large block, region on a page
  EXPECT_TRUE(util::kernel_copy_slow(at(0x7f000001003f), 4096));   // 63 past
  EXPECT_TRUE(util::kernel_copy_slow(at(0x7f0000010020), 0x10));  // 16 past a source 16 past a page
  EXPECT_FALSE(util::kernel_copy_slow(at(0x7f0000010000), 0));     // on the same offset
  EXPECT_FALSE(util::kernel_copy_slow(at(0x7f0000010040), 0));     // 64 past
  EXPECT_FALSE(util::kernel_copy_slow(at(0x7f0000010ff0), 0));     // before the source
}

TEST(config, defaults_without_file_or_environment) {
  auto c = config::load("", {});
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->mode, engine_mode::thread);
  EXPECT_EQ(c->persistent, "./cairn-store");
  EXPECT_EQ(c->keep_local, 2);
  EXPECT_EQ(c->persistent_interval, 1);
  EXPECT_FALSE(c->run.empty());
  EXPECT_FALSE(c->scratch.empty());
}

TEST(config, file_then_environment_wins) {
  std::string path = write_temp("mode = \"sync\"\nio_threads = 3\nstaging_limit = \"1G\"\nkeep_persistent = 4\n");
  auto c = config::load(path, {{"CAIRN_IO_THREADS", "2"}, {"CAIRN_PLACEMENT", "socket"}});
  std::remove(path.c_str());
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->mode, engine_mode::sync);
  EXPECT_EQ(c->io_threads, 2);
  EXPECT_EQ(c->placement, placement::socket);
  EXPECT_EQ(c->staging_limit, 1ull << 30);
  EXPECT_EQ(c->keep_persistent, 4);
}

// The node daemon rebuilds a rank's configuration from values(): every key
// must read back as it was written.
TEST(config, values_round_trip) {
  auto c = config::load("", {{"CAIRN_ENGINE_HOST", "daemon"}, {"CAIRN_IO_RATE_LIMIT", "200M"},
                             {"CAIRN_PLACEMENT", "socket"}, {"CAIRN_PERSISTENT_LAYOUT", "aggregated"},
                             {"CAIRN_HASH_ABS", "1e-9"}, {"CAIRN_TAGS", "a=1,b=2"},
                             {"CAIRN_WRITE_DURING_CAPTURE", "true"}});
  ASSERT_TRUE(c.is_ok()) << c.error().to_string();
  EXPECT_EQ(c->engine_host, engine_host::daemon);
  auto back = config::from_values(c->values());
  ASSERT_TRUE(back.is_ok()) << back.error().to_string();
  EXPECT_EQ(back->values(), c->values());
  EXPECT_EQ(back->engine_host, engine_host::daemon);
  EXPECT_EQ(back->write_during_capture, capture_overlap::on);
  EXPECT_FALSE(config::from_values({{"no_such_key", "1"}}).is_ok());
  EXPECT_FALSE(config::load("", {{"CAIRN_ENGINE_HOST", "process"}}).is_ok());
}

TEST(config, io_rate_limit_is_a_bandwidth) {
  auto d = config::load("", {});
  ASSERT_TRUE(d) << d.error().to_string();
  EXPECT_EQ(d->io_rate_limit, 0u);
  auto c = config::load("", {{"CAIRN_IO_RATE_LIMIT", "200M"}});
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->io_rate_limit, 200ull << 20);
  auto bad = config::load("", {{"CAIRN_IO_RATE_LIMIT", "fast"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("io_rate_limit"), std::string::npos) << bad.error().message();
}

TEST(config, engine_scheduling_keys) {
  auto d = config::load("", {});
  ASSERT_TRUE(d) << d.error().to_string();
  EXPECT_EQ(d->engine_priority, thread_priority::batch);
  EXPECT_EQ(d->engine_nice, 0);
  auto c = config::load("", {{"CAIRN_ENGINE_PRIORITY", "idle"}, {"CAIRN_ENGINE_NICE", "7"}});
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->engine_priority, thread_priority::idle);
  EXPECT_EQ(c->engine_nice, 7);
  auto bad = config::load("", {{"CAIRN_ENGINE_PRIORITY", "low"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("engine_priority"), std::string::npos) << bad.error().message();
}

// An engine thread's setup changes that thread only, not the application's.
TEST(cpu, thread_setup_applies_to_the_calling_thread_only) {
  const int policy_before = sched_getscheduler(0);
  const int nice_before = getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  int policy = -1, nice = -100;
  status st;
  std::thread t([&] {
    st = util::setup_this_thread({{}, thread_priority::batch, 3});
    policy = sched_getscheduler(0);
    nice = getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  });
  t.join();
  ASSERT_TRUE(st) << st.to_string();
  EXPECT_EQ(policy, SCHED_BATCH);
  EXPECT_EQ(nice, nice_before + 3);
  EXPECT_EQ(sched_getscheduler(0), policy_before);
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid))), nice_before);
}

// Placement from hwloc synthetic topologies, so the test does not depend on
// the machine it runs on. Synthetic PUs are numbered in order: in
// "pack:2 core:2 pu:2", PUs 0-1 are core 0 and 0-3 package 0.
std::vector<int> cpus(placement p, int home, const char* topo) {
  auto r = util::placement_cpus(p, home, topo);
  EXPECT_TRUE(r) << r.error().to_string();
  return r ? *r : std::vector<int>{-1};
}

TEST(cpu, placement_on_synthetic_topologies) {
  using v = std::vector<int>;
  const char* smt = "pack:2 core:2 pu:2";
  EXPECT_EQ(cpus(placement::none, 3, smt), v{});
  EXPECT_EQ(cpus(placement::core, 0, smt), v{1});  // the spare hardware thread of the core
  EXPECT_EQ(cpus(placement::core, 5, smt), v{4});
  EXPECT_EQ(cpus(placement::socket, 5, smt), (v{4, 5, 6, 7}));
  EXPECT_EQ(cpus(placement::socket, 1, smt), (v{0, 1, 2, 3}));
  EXPECT_EQ(cpus(placement::node, 1, smt), (v{0, 1, 2, 3, 4, 5, 6, 7}));
  // SMT-4 cores under caches (filtered out) and a package of two L3 groups.
  const char* wide = "pack:2 l3:2 core:2 pu:4";
  EXPECT_EQ(cpus(placement::core, 9, wide), (v{8, 10, 11}));
  EXPECT_EQ(cpus(placement::socket, 17, wide), (v{16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}));
  // No SMT: core is the application's own core.
  const char* flat = "pack:1 core:4 pu:1";
  EXPECT_EQ(cpus(placement::core, 2, flat), v{2});
  EXPECT_EQ(cpus(placement::socket, 2, flat), (v{0, 1, 2, 3}));
  EXPECT_EQ(cpus(placement::node, 0, flat), (v{0, 1, 2, 3}));
}

TEST(cpu, placement_errors_say_what) {
  auto out = util::placement_cpus(placement::core, 8, "pack:1 core:4 pu:2");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code(), errc::invalid_argument);
  EXPECT_NE(out.error().message().find("CPU 8"), std::string::npos) << out.error().message();
  auto bad = util::placement_cpus(placement::socket, 0, "pack:two");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), errc::invalid_argument);
  EXPECT_NE(bad.error().message().find("synthetic"), std::string::npos) << bad.error().message();
}

// This machine's topology: whatever it is, the engine gets CPUs it may run on.
TEST(cpu, placement_on_this_machine) {
  const int home = sched_getcpu();
  ASSERT_GE(home, 0);
  for (placement p : {placement::core, placement::socket, placement::node}) {
    auto r = util::placement_cpus(p, home);
    ASSERT_TRUE(r) << r.error().to_string();
    ASSERT_FALSE(r->empty());
    for (int c : *r) EXPECT_TRUE(c >= 0 && c < CPU_SETSIZE) << c;
  }
  auto node = util::placement_cpus(placement::node, home);
  EXPECT_NE(std::find(node->begin(), node->end(), home), node->end());
}

// Whether an engine thread may run on another CPU than the application
// thread: placed off its CPU, or inheriting a binding wider than one CPU
// (checked in a thread bound to one CPU, then to two where there are two).
TEST(cpu, engine_threads_run_elsewhere_only_off_the_application_threads_cpu) {
  EXPECT_FALSE(util::runs_elsewhere({3}, 3));
  EXPECT_TRUE(util::runs_elsewhere({2, 3}, 3));
  EXPECT_TRUE(util::runs_elsewhere({4}, 3));
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  std::vector<int> mine;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) mine.push_back(c);
  bool one = true, two = false;
  std::thread t([&] {
    ASSERT_TRUE(util::bind_this_thread({mine[0]}));
    one = util::runs_elsewhere({}, mine[0]);
    if (mine.size() > 1) {
      ASSERT_TRUE(util::bind_this_thread({mine[0], mine[1]}));
      two = util::runs_elsewhere({}, mine[0]);
    }
  });
  t.join();
  EXPECT_FALSE(one);
  EXPECT_EQ(two, mine.size() > 1);
}

TEST(config, unknown_file_key_is_named) {
  std::string path = write_temp("persistant = \"/x\"\n");
  auto c = config::load(path, {});
  std::remove(path.c_str());
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), errc::invalid_argument);
  EXPECT_NE(c.error().message().find("unknown key 'persistant'"), std::string::npos) << c.error().message();
}

TEST(config, unknown_environment_key_is_named) {
  auto c = config::load("", {{"CAIRN_PERISTENT", "/x"}});
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("CAIRN_PERISTENT"), std::string::npos) << c.error().message();
}

TEST(config, bad_values_name_the_key) {
  struct bad { const char* key; const char* value; };
  for (auto b : {bad{"CAIRN_MODE", "async"}, bad{"CAIRN_IO_THREADS", "0"}, bad{"CAIRN_IO_THREADS", "two"},
                 bad{"CAIRN_STAGING_LIMIT", "12Q"}, bad{"CAIRN_DIRECT_IO", "maybe"},
                 bad{"CAIRN_RUN", "a/b"}, bad{"CAIRN_PERSISTENT_INTERVAL", "-1"},
                 bad{"CAIRN_AGENTS_MODE", "rdma"}, bad{"CAIRN_AGENTS_BLOCKING", "sometimes"},
                 bad{"CAIRN_AGENTS_TIMEOUT", "-3"}, bad{"CAIRN_AGENTS_PROVIDER", ""}}) {
    auto c = config::load("", {{b.key, b.value}});
    ASSERT_FALSE(c) << b.key << "=" << b.value;
    EXPECT_EQ(c.error().code(), errc::invalid_argument);
    std::string key = std::string(b.key).substr(6);
    for (auto& ch : key) ch = static_cast<char>(tolower(ch));
    EXPECT_NE(c.error().message().find("'" + key + "'"), std::string::npos) << c.error().message();
  }
}

TEST(config, agents_keys) {
  auto d = config::load("", {});
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->agents.empty());  // agent mode off
  EXPECT_EQ(d->agents_mode, agents_transfer::pull);
  EXPECT_FALSE(d->agents_blocking);
  EXPECT_TRUE(d->agents_persist);
  EXPECT_EQ(d->agents_bind, "auto");
  auto c = config::load("", {{"CAIRN_AGENTS", "ctl:7420"}, {"CAIRN_AGENTS_MODE", "push"},
                             {"CAIRN_AGENTS_BLOCKING", "true"}, {"CAIRN_AGENTS_PERSIST", "false"},
                             {"CAIRN_AGENTS_PROVIDER", "verbs;ofi_rxm"}, {"CAIRN_AGENTS_SECRET_FILE", "/s"}});
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->agents, "ctl:7420");
  EXPECT_EQ(c->agents_mode, agents_transfer::push);
  EXPECT_TRUE(c->agents_blocking);
  EXPECT_FALSE(c->agents_persist);
  EXPECT_EQ(c->agents_provider, "verbs;ofi_rxm");
  EXPECT_EQ(c->agents_secret_file, "/s");
}

TEST(config, syntax_error_gives_line) {
  std::string path = write_temp("mode = \n");
  auto c = config::load(path, {});
  std::remove(path.c_str());
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("line 1"), std::string::npos) << c.error().message();
}

TEST(config, parse_size) {
  EXPECT_EQ(*parse_size("4096"), 4096u);
  EXPECT_EQ(*parse_size("64M"), 64ull << 20);
  EXPECT_EQ(*parse_size("2GiB"), 2ull << 30);
  EXPECT_FALSE(parse_size("-1"));
  EXPECT_FALSE(parse_size("M"));
  EXPECT_FALSE(parse_size("3X"));
}

TEST(status, from_errno_maps_no_space) {
  EXPECT_EQ(status::from_errno(ENOSPC, "write x").code(), errc::no_space);
  EXPECT_EQ(status::from_errno(EIO, "write x").code(), errc::io_error);
  EXPECT_NE(status::from_errno(EIO, "write x").message().find("write x"), std::string::npos);
}

TEST(hash, stream_equals_one_shot_and_hex_round_trips) {
  std::string data(100000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  util::xxh3_stream s;
  s.update(data.data(), 333);
  s.update(data.data() + 333, data.size() - 333);
  EXPECT_EQ(s.digest(), util::xxh3(data.data(), data.size()));
  uint64_t back = 0;
  ASSERT_TRUE(util::parse_hex64(util::hex64(0x0123456789abcdefull), &back));
  EXPECT_EQ(back, 0x0123456789abcdefull);
  EXPECT_FALSE(util::parse_hex64("xyz", &back));
}

}  // namespace
}  // namespace cairn

namespace cairn {
TEST(process, pid_gone_knows_dead_zombie_and_recycled_pids) {
  EXPECT_FALSE(util::pid_gone(static_cast<int>(::getpid())));
  EXPECT_FALSE(util::pid_gone(static_cast<int>(::getpid()), program_invocation_short_name));
  EXPECT_TRUE(util::pid_gone(static_cast<int>(::getpid()), "another-program"));  // as a recycled pid
  EXPECT_FALSE(util::pid_gone(0));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(util::pid_gone(static_cast<int>(child)));  // a zombie
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(util::pid_gone(static_cast<int>(child)));  // reaped
}

// The name ps and top show for a thread, from /proc.
static std::string thread_comm(long tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

TEST(process, threads_are_named_as_top_shows_them) {
  std::string seen, cut;
  std::thread([&] {
    util::name_this_thread("cairn-engine");
    seen = thread_comm(::syscall(SYS_gettid));
    util::name_this_thread("cairn-a-name-longer-than-fifteen");
    cut = thread_comm(::syscall(SYS_gettid));
  }).join();
  EXPECT_EQ(seen, "cairn-engine");
  EXPECT_EQ(cut, "cairn-a-name-lo");  // the kernel's 15 bytes
  EXPECT_EQ(thread_comm(::syscall(SYS_gettid)), program_invocation_short_name) << "the caller's own name stays";
}

TEST(names, utf8_and_the_rules_of_a_name) {
  EXPECT_TRUE(util::valid_utf8("heat2d"));
  EXPECT_TRUE(util::valid_utf8("W\xc3\xa4rme \xe2\x82\xac \xf0\x9f\x94\xa5"));
  EXPECT_FALSE(util::valid_utf8("bad\xff"));
  EXPECT_FALSE(util::valid_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(util::valid_utf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(util::valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(util::valid_utf8("\xe2\x82"));          // truncated
  EXPECT_TRUE(util::check_name("checkpoint", "W\xc3\xa4rme"));
  struct bad_name {
    std::string name, rule;
  };
  for (const auto& b : std::vector<bad_name>{{"", "empty"},
                                             {std::string(256, 'a'), "256 bytes"},
                                             {"bad\xff", "not valid UTF-8"},
                                             {"a\nb", "control character"},
                                             {"a/b", "'/'"},
                                             {".", "'.' and '..'"},
                                             {"..", "'.' and '..'"}}) {
    status st = util::check_name("checkpoint", b.name);
    EXPECT_EQ(st.code(), errc::invalid_argument) << b.name;
    EXPECT_NE(st.message().find(b.rule), std::string::npos) << st.message();
  }
  EXPECT_EQ(util::check_name("checkpoint", "bad\xff").message(), "checkpoint 'bad\\xff' is not valid UTF-8: names must be UTF-8 text");
  EXPECT_TRUE(util::check_text("code version", "v1.2\tdirty"));
  EXPECT_FALSE(util::check_text("code version", "v1\x01"));
}
}  // namespace cairn

TEST(json, integers_of_the_stores_decoders_are_checked_not_cast) {
  using nlohmann::json;
  const json j = json::parse(R"({"u": 7, "neg": -3, "big": 4294967296, "f": 7.8e91, "s": "7", "a": [1, 2, 3],
                                 "mixed": [1, 2.5]})");
  EXPECT_EQ(cairn::util::int_at<uint32_t>(j, "u"), 7u);
  EXPECT_EQ(cairn::util::int_at<int64_t>(j, "neg"), -3);
  EXPECT_EQ(cairn::util::int_at<uint64_t>(j, "big"), 4294967296u);
  EXPECT_EQ(cairn::util::int_or<uint32_t>(j, "absent", 9), 9u);
  EXPECT_EQ(cairn::util::ints_of<uint32_t>(j["a"], "a"), (std::vector<uint32_t>{1, 2, 3}));
  // A float (undefined behaviour when cast out of range), a negative for an
  // unsigned field, a value wider than the field and a string are refused,
  // as json::exceptions the decoders already turn into corruption errors.
  for (const char* key : {"neg", "big", "f", "s"}) EXPECT_THROW(cairn::util::int_at<uint32_t>(j, key), json::exception) << key;
  EXPECT_THROW(cairn::util::int_at<int64_t>(j, "f"), json::exception);
  EXPECT_THROW(cairn::util::ints_of<uint32_t>(j["mixed"], "mixed"), json::exception);
  EXPECT_THROW(cairn::util::ints_of<uint32_t>(j["u"], "u"), json::exception);
  try {
    cairn::util::int_at<uint32_t>(j, "big");
  } catch (const json::exception& e) {
    EXPECT_NE(std::string(e.what()).find("big must be an integer from 0 to 4294967295"), std::string::npos) << e.what();
  }
}

namespace cairn::util {
namespace {

// The VmFlags of the mapping that holds `p` (/proc/self/smaps).
std::string vm_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) in = lo <= at && at < hi;  // a mapping's first line
    if (in && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// Fresh huge pages slower to fault in than small ones would be (a host that
// backs each again): the rest of that memory and every buffer mapped later
// use small pages. A quick piece changes nothing.
TEST(aligned_buffer, huge_pages_found_slow_are_given_up_for_the_rest_and_later_buffers) {
  auto a = aligned_buffer::allocate(size_t{8} << 20, false);
  ASSERT_TRUE(a);
  fresh_pages_written(a->data(), size_t{2} << 20, 1e-5, a->data() + a->size());  // 5 us for 2 MiB: fine
  if (!huge_pages_pay()) GTEST_SKIP() << "huge pages were found slow on this node before the test";
  EXPECT_NE(vm_flags(a->data()).find(" hg"), std::string::npos) << vm_flags(a->data());
  fresh_pages_written(a->data(), size_t{2} << 20, 0.005, a->data() + a->size());  // 2.5 ms per MiB
  EXPECT_FALSE(huge_pages_pay());
  EXPECT_NE(vm_flags(a->data() + (size_t{4} << 20)).find(" nh"), std::string::npos);
  auto b = aligned_buffer::allocate(size_t{4} << 20, false);
  ASSERT_TRUE(b);
  EXPECT_EQ(vm_flags(b->data()).find(" hg"), std::string::npos) << vm_flags(b->data());
}

}  // namespace
}  // namespace cairn::util

// Copy-on-write capture (engine/cow.hpp) on real userfaultfd: whatever the
// application writes after begin, the image holds the bytes of the moment of
// begin, bit for bit.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/cow.hpp"

namespace cairn::engine {
namespace {

struct mapping {
  explicit mapping(size_t n, int flags = MAP_PRIVATE | MAP_ANONYMOUS, bool huge = true) : size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, flags, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    data = static_cast<std::byte*>(p);
    if (huge) (void)::madvise(p, n, MADV_HUGEPAGE);
  }
  ~mapping() {
    if (data) ::munmap(data, size);
  }
  size_t size;
  std::byte* data;
};

void fill(std::byte* p, size_t n, uint64_t seed) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) w[i] = seed * 0x9E3779B97F4A7C15ull + i;
  for (size_t i = n / 8 * 8; i < n; ++i) p[i] = std::byte(seed + i);
}

std::unique_ptr<cow_capture> make_or_skip() {
  auto c = cow_capture::make();
  if (!c) return nullptr;
  return std::move(*c);
}

#define COW_OR_SKIP(var)                                                 \
  auto var = make_or_skip();                                             \
  if (!var) GTEST_SKIP() << cow_capture::make().error().message();

struct outcome {
  status st;
  cow_report report;
  int calls = 0;
};

cow_capture::done_fn record(outcome* o) {
  return [o](status st, const cow_report& r) {
    o->st = std::move(st);
    o->report = r;
    ++o->calls;
  };
}

// One region of n bytes filled from `seed`, the image it is captured into,
// and the bytes the image must hold.
struct one_region {
  one_region(size_t n, uint64_t seed, bool huge = true)
      : region(n, MAP_PRIVATE | MAP_ANONYMOUS, huge), image(n), expect(n) {
    fill(region.data, n, seed);
    std::memcpy(expect.data, region.data, n);
  }
  std::vector<int> begin(cow_capture& cow, outcome* o) {
    r = {region.data, region.size, image.data};
    return cow.begin({&r, 1}, record(o));
  }
  bool captured() const { return std::memcmp(image.data, expect.data, region.size) == 0; }
  mapping region, image, expect;
  cow_region r;
};

TEST(cow, rewrite_right_after_begin_leaves_the_image_as_it_was) {
  COW_OR_SKIP(cow);
  const size_t n = size_t{64} << 20;
  one_region t(n, 1);
  outcome o;
  ASSERT_EQ(t.begin(*cow, &o), std::vector<int>{0});
  // The worst case: every block written at once, the last first (the copy
  // goes in address order). Whether a write waits depends on the timing (a
  // slow writer finds every block copied), so the faults are not counted on.
  t.region.data[n - 1] = std::byte{0};
  fill(t.region.data, n, 2);
  cow->caller_done();
  cow->drain();
  ASSERT_TRUE(o.st) << o.st.message();
  EXPECT_EQ(o.calls, 1);
  EXPECT_TRUE(t.captured());
  EXPECT_EQ(o.report.blocks, n / cow_capture::kBlock);
  // Writable again, without faults, after the capture.
  fill(t.region.data, n, 3);
  EXPECT_FALSE(cow->busy());
}

TEST(cow, pages_never_touched_are_captured_as_zeros) {
  COW_OR_SKIP(cow);
  const size_t n = size_t{8} << 20;
  mapping region(n), image(n);
  std::memset(image.data, 0x5a, n);
  outcome o;
  cow_region r{region.data, n, image.data};
  ASSERT_EQ(cow->begin({&r, 1}, record(&o)), std::vector<int>{0});
  std::memset(region.data, 0xff, n);
  cow->caller_done();
  cow->drain();
  ASSERT_TRUE(o.st) << o.st.message();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(image.data[i], std::byte{0}) << i;
}

TEST(cow, threads_and_the_kernel_write_during_the_copy) {
  COW_OR_SKIP(cow);
  const size_t n = size_t{32} << 20;
  one_region t(n, 7, false);  // 4 KiB pages
  std::byte* region = t.region.data;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::vector<char> msg(4096, 'k');
  ASSERT_EQ(::write(fds[1], msg.data(), msg.size()), ssize_t(msg.size()));
  outcome o;
  ASSERT_EQ(t.begin(*cow, &o), std::vector<int>{0});
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&, w] {
      for (size_t at = size_t(w) * 4096 * 3; at < n; at += 4096 * 17) region[at] = std::byte(0xee);
    });
  // read(2) into the last page: the kernel's write waits for the block too.
  ASSERT_EQ(::read(fds[0], region + n - 4096, 4096), 4096);
  for (auto& w : writers) w.join();
  cow->caller_done();
  cow->drain();
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_TRUE(o.st) << o.st.message();
  EXPECT_TRUE(t.captured());
  EXPECT_EQ(std::memcmp(region + n - 4096, msg.data(), 4096), 0);
}

TEST(cow, regions_sharing_pages_and_overlapping) {
  COW_OR_SKIP(cow);
  mapping mem(size_t{4} << 20), image(size_t{4} << 20), expect(size_t{4} << 20);
  fill(mem.data, mem.size, 11);
  std::memcpy(expect.data, mem.data, mem.size);
  // a: 100 bytes at 10; b: 3000 bytes at 200 (same page); c: across a block
  // boundary, unaligned; d: inside c.
  std::vector<cow_region> rs = {{mem.data + 10, 100, image.data},
                                {mem.data + 200, 3000, image.data + 4096},
                                {mem.data + (2 << 20) - 5000, 12345, image.data + 8192},
                                {mem.data + (2 << 20) - 100, 200, image.data + 65536}};
  outcome o;
  ASSERT_EQ(cow->begin(rs, record(&o)), std::vector<int>(4, 0));
  fill(mem.data, mem.size, 12);
  cow->caller_done();
  cow->drain();
  ASSERT_TRUE(o.st) << o.st.message();
  for (const auto& r : rs)
    EXPECT_EQ(std::memcmp(r.dst, expect.data + (r.src - mem.data), r.length), 0);
}

// The first and last page of a region that starts and ends inside pages hold
// other memory too (the heap's objects): they are not write-protected, so a
// write there never waits, and the region's bytes on them are the ones it had
// at begin.
TEST(cow, pages_a_region_shares_with_other_memory_are_not_protected) {
  COW_OR_SKIP(cow);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t n = size_t{64} << 20;  // 4 KiB pages: the copy reaches the last page tens of ms after begin
  mapping mem(n, MAP_PRIVATE | MAP_ANONYMOUS, false), image(n), expect(n);
  fill(mem.data, n, 21);
  std::memcpy(expect.data, mem.data, n);
  const size_t at = 100, length = n - page - at + 150;  // ends 150 bytes into the last page
  cow_region r{mem.data + at, length, image.data};
  outcome o;
  ASSERT_EQ(cow->begin({&r, 1}, record(&o)), std::vector<int>{0});
  // The neighbours on the shared pages, and the region's own bytes there.
  std::memset(mem.data + n - page, 0x22, page);
  std::memset(mem.data, 0x11, at + 10);
  cow->caller_done();
  cow->drain();
  ASSERT_TRUE(o.st) << o.st.message();
  EXPECT_EQ(o.report.faults, 0u);
  EXPECT_EQ(std::memcmp(image.data, expect.data + at, length), 0);
}

TEST(cow, shared_memory_is_left_to_the_caller) {
  COW_OR_SKIP(cow);
  mapping shared(size_t{1} << 20, MAP_SHARED | MAP_ANONYMOUS), priv(size_t{1} << 20), image(size_t{2} << 20);
  fill(shared.data, shared.size, 1);
  fill(priv.data, priv.size, 2);
  std::vector<cow_region> rs = {{shared.data, shared.size, image.data}, {priv.data, priv.size, image.data + shared.size}};
  outcome o;
  auto errs = cow->begin(rs, record(&o));
  EXPECT_NE(errs[0], 0);  // another process may write it through its own mapping
  EXPECT_EQ(errs[1], 0);
  std::memcpy(image.data, shared.data, shared.size);  // the caller's part
  EXPECT_EQ(o.calls, 0);                                // done waits for it
  fill(priv.data, priv.size, 3);
  cow->caller_done();
  cow->drain();
  ASSERT_TRUE(o.st) << o.st.message();
  EXPECT_EQ(o.calls, 1);
  std::vector<std::byte> want(priv.size);
  fill(want.data(), want.size(), 2);
  EXPECT_EQ(std::memcmp(image.data + shared.size, want.data(), want.size()), 0);
}

TEST(cow, memory_unmapped_during_the_copy_fails_the_capture_not_the_process) {
  COW_OR_SKIP(cow);
  int failed = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const size_t n = size_t{128} << 20;
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::memset(p, 1, n);
    mapping image(n);
    outcome o;
    cow_region r{static_cast<std::byte*>(p), n, image.data};
    ASSERT_EQ(cow->begin({&r, 1}, record(&o)), std::vector<int>{0});
    ::munmap(p, n);
    cow->caller_done();
    cow->drain();
    EXPECT_EQ(o.calls, 1);
    if (!o.st) {
      ++failed;
      EXPECT_NE(o.st.message().find("unmapped"), std::string::npos) << o.st.message();
    }
  }
  EXPECT_GT(failed, 0);  // 128 MiB take longer to copy than munmap to return
}

TEST(cow, fork_during_the_copy) {
  COW_OR_SKIP(cow);
  const size_t n = size_t{32} << 20;
  one_region t(n, 21);
  outcome o;
  ASSERT_EQ(t.begin(*cow, &o), std::vector<int>{0});
  pid_t child = ::fork();
  if (child == 0) {
    fill(t.region.data, n, 22);  // the child's own copy: no fault, nobody to serve it
    _exit(std::memcmp(t.region.data, t.expect.data, 64) != 0 ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  fill(t.region.data, n, 23);
  int ws = 0;
  ASSERT_EQ(::waitpid(child, &ws, 0), child);
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  cow->caller_done();
  cow->drain();
  ASSERT_TRUE(o.st) << o.st.message();
  EXPECT_TRUE(t.captured());
}

// MPI's single-copy transfers (CMA): another process writes into a
// protected region with process_vm_writev; its write waits for the block too.
TEST(cow, another_process_writing_with_process_vm_writev) {
  COW_OR_SKIP(cow);
  (void)::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // Yama: the child may write here
  const size_t n = size_t{16} << 20;
  one_region t(n, 31);
  const pid_t parent = ::getpid();
  outcome o;
  ASSERT_EQ(t.begin(*cow, &o), std::vector<int>{0});
  pid_t child = ::fork();
  if (child == 0) {
    std::vector<char> msg(n / 2, 'm');
    iovec local{msg.data(), msg.size()}, remote{t.region.data + n / 4, msg.size()};
    _exit(::process_vm_writev(parent, &local, 1, &remote, 1, 0) == ssize_t(msg.size()) ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  int ws = 0;
  ASSERT_EQ(::waitpid(child, &ws, 0), child);
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << "process_vm_writev into a protected region failed";
  cow->caller_done();
  cow->drain();
  ASSERT_TRUE(o.st) << o.st.message();
  EXPECT_TRUE(t.captured());
  EXPECT_EQ(t.region.data[n / 4], std::byte('m'));
}

TEST(cow, captures_in_a_row_and_an_empty_one) {
  COW_OR_SKIP(cow);
  const size_t n = size_t{6} << 20;
  mapping region(n), image(n), expect(n);
  for (int v = 0; v < 20; ++v) {
    fill(region.data, n, 100 + v);
    std::memcpy(expect.data, region.data, n);
    outcome o;
    cow_region r{region.data + 3, n - 7, image.data};
    ASSERT_EQ(cow->begin({&r, 1}, record(&o)), std::vector<int>{0});
    region.data[v * 4096 * 50] = std::byte(0);
    cow->caller_done();
    cow->drain();
    ASSERT_TRUE(o.st) << o.st.message();
    ASSERT_EQ(std::memcmp(image.data, expect.data + 3, n - 7), 0) << v;
  }
  outcome o;
  EXPECT_TRUE(cow->begin({}, record(&o)).empty());
  cow->caller_done();
  cow->drain();
  EXPECT_EQ(o.calls, 1);
  EXPECT_TRUE(o.st);
}

}  // namespace
}  // namespace cairn::engine

#include "engine/cow.hpp"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <numeric>

#include "util/aligned_buffer.hpp"
#include "util/clock.hpp"
#include "util/mutex.hpp"
#include "util/process.hpp"

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)  // Linux 6.4; older headers lack it
#endif

namespace cairn::engine {

namespace {

constexpr uint64_t kPiece = uint64_t{512} << 10;  // the background copy looks for faults between pieces

uint64_t page_size() {
  static const uint64_t p = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

// A range of whole pages, disjoint from the others, sorted: registered with
// the userfaultfd by the caller, protected and lifted by the thread.
struct span {
  uint64_t lo = 0, hi = 0;
  uint32_t first_block = 0, blocks = 0;
  int error = 0;  // why it is not protected (0: it is)
};

// Bytes of a region on a page it shares with other memory, copied by the
// caller into the arena (`at`) and put at `dst` by the thread, unless the
// region's span (`span`, UINT32_MAX: none) could not be protected: the caller
// copies that region whole.
struct edge {
  std::byte* dst = nullptr;
  uint64_t length = 0, at = 0;
  uint32_t span = UINT32_MAX;
};

// The unit copied and unprotected at a time: kBlock-aligned, inside one span.
struct block {
  uint64_t lo = 0, hi = 0;
  uint32_t first_ref = 0, refs = 0;  // regions overlapping it, in refs[]
  uint64_t copied = 0;               // [lo, copied) is in the image (0: nothing yet)
  bool done = false;                 // copied and unprotected (or not the thread's)
};

// UFFDIO_WRITEPROTECT over [lo, lo + len): on, or off (which wakes the
// writers waiting there). 0 or the errno.
int write_protect(int fd, uint64_t lo, uint64_t len, bool on) {
  uffdio_writeprotect w{};
  w.range.start = lo;
  w.range.len = len;
  w.mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
  return ::ioctl(fd, UFFDIO_WRITEPROTECT, &w) == 0 ? 0 : errno;
}

void unregister_range(int fd, uint64_t lo, uint64_t len) {
  uffdio_range r{lo, len};
  (void)::ioctl(fd, UFFDIO_UNREGISTER, &r);  // lifts what protection is left and wakes its writers
}

void* map_pages(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

int open_uffd() {
  // Without UFFD_USER_MODE_ONLY: a write by the kernel (read(2) into a
  // region, a CMA transfer of MPI) must wait for its block too; with it, the
  // kernel's write would fail with EFAULT.
  int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd >= 0) return fd;
  const int first = errno;
  int dev = ::open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (dev < 0) {
    errno = first;
    return -1;
  }
  fd = ::ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
  const int e = errno;
  ::close(dev);
  errno = e;
  return fd;
}

// The mappings of this process (/proc/self/maps) as [lo, hi) and whether
// each is private anonymous memory (perms "..p", inode 0: the heap, stacks,
// anonymous mmap). Only there does every write go through this process's
// page tables: shared memory is written by other processes through theirs
// (userfaultfd registers it, and would never see those writes).
struct mapping_kind {
  uint64_t lo, hi;
  bool private_anonymous;
};

std::vector<mapping_kind> read_maps() {
  std::vector<mapping_kind> out;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return out;
  char line[4096];
  while (std::fgets(line, sizeof(line), f)) {
    unsigned long long lo = 0, hi = 0, off = 0, inode = 0;
    char perms[8] = {};
    unsigned dmaj = 0, dmin = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &lo, &hi, perms, &off, &dmaj, &dmin, &inode) != 7) continue;
    out.push_back({lo, hi, perms[3] == 'p' && inode == 0});
    // A line longer than the buffer: skip its rest.
    while (!std::strchr(line, '\n') && std::fgets(line, sizeof(line), f)) {
    }
  }
  std::fclose(f);
  return out;
}

// 0 if [lo, hi) is all private anonymous memory, else EINVAL.
int check_private_anonymous(const std::vector<mapping_kind>& maps, uint64_t lo, uint64_t hi) {
  auto it = std::upper_bound(maps.begin(), maps.end(), lo, [](uint64_t v, const mapping_kind& m) { return v < m.hi; });
  for (uint64_t at = lo; at < hi; ++it) {
    if (it == maps.end() || it->lo > at || !it->private_anonymous) return EINVAL;
    at = it->hi;
  }
  return 0;
}

}  // namespace

// Everything the thread writes while pages are protected (mapped, see the
// header comment). The arrays are the capture's tables, made by begin on the
// caller's thread while the thread is idle.
struct cow_capture::control {
  cairn::mutex mu;
  cairn::condition_variable cv;
  bool ended CAIRN_GUARDED_BY(mu) = true;  // done returned for the capture begun last
  std::atomic<int> parts{0};               // the thread's part and the caller's, not over yet
  // The thread waits in poll(2) on the userfaultfd and on `wake` (an
  // eventfd): between captures, and while the caller protects, it serves
  // faults without being woken first. active: the tables below are the
  // current capture's (faults are served from them); go: the caller has
  // protected what it could (spans[].error final), copy; stop: end.
  int wake = -1;
  std::atomic<bool> active{false}, go{false}, stop{false};

  pid_t pid = 0;
  size_t arena_bytes = 0;
  std::byte* arena = nullptr;
  cow_region* regs = nullptr;
  size_t nregs = 0;
  span* spans = nullptr;
  size_t nspans = 0;
  block* blocks = nullptr;
  size_t nblocks = 0;
  uint32_t* refs = nullptr;
  edge* edges = nullptr;
  size_t nedges = 0;
  std::byte* edge_bytes = nullptr;
  std::byte* image_end = nullptr;  // past the last byte any region goes to

  bool dropped = false;  // the thread unregistered spans (after a failure)
  // The thread's result: which region could not be read, or which call failed.
  int fail_errno = 0;
  int fail_region = -1;
  const char* fail_what = nullptr;
  cow_report report;
  double t0 = 0;
};

result<std::unique_ptr<cow_capture>> cow_capture::make() {
  // The kernel's features, from a first descriptor (UFFDIO_API is once per descriptor).
  int probe = open_uffd();
  if (probe < 0) {
    return status(errc::not_supported,
                  std::string("userfaultfd is not available to this process (") + std::strerror(errno) +
                      "): allow it (sysctl vm.unprivileged_userfaultfd=1, or access to /dev/userfaultfd) or use "
                      "capture = copy");
  }
  uffdio_api api{};
  api.api = UFFD_API;
  const int rc = ::ioctl(probe, UFFDIO_API, &api);
  ::close(probe);
  const uint64_t need = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_UNPOPULATED;
  if (rc != 0 || (api.features & need) != need)
    return status(errc::not_supported,
                  "this kernel's userfaultfd cannot write-protect pages never touched (Linux 6.4 and later can): "
                  "capture = copy");
  int fd = open_uffd();
  if (fd < 0) return status(errc::not_supported, std::string("userfaultfd: ") + std::strerror(errno));
  api = {};
  api.api = UFFD_API;
  api.features = need;  // not WP_HUGETLBFS_SHMEM: shared memory is copied (another process's writes do not fault here)
  if (::ioctl(fd, UFFDIO_API, &api) != 0) {
    const int e = errno;
    ::close(fd);
    return status(errc::not_supported, std::string("userfaultfd UFFDIO_API: ") + std::strerror(e));
  }
  // process_vm_readv on this process: refused under some sandboxes.
  char from = 1, to = 0;
  iovec l{&to, 1}, r{&from, 1};
  if (::process_vm_readv(::getpid(), &l, 1, &r, 1, 0) != 1) {
    const int e = errno;
    ::close(fd);
    return status(errc::not_supported, std::string("process_vm_readv on this process: ") + std::strerror(e));
  }
  void* mem = map_pages(sizeof(control));
  if (!mem) {
    ::close(fd);
    return status(errc::no_space, "cow capture: cannot map its control block");
  }
  auto* ctl = new (mem) control();
  ctl->pid = ::getpid();
  ctl->wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ctl->wake < 0) {
    const int e = errno;
    ::close(fd);
    ctl->~control();
    ::munmap(mem, sizeof(control));
    return status(errc::not_supported, std::string("cow capture: eventfd: ") + std::strerror(e));
  }
  return std::unique_ptr<cow_capture>(new cow_capture(fd, ctl));
}

cow_capture::cow_capture(int uffd, control* ctl) : uffd_(uffd), ctl_(ctl) {
  thread_ = std::thread([this] { thread_main(); });
}

cow_capture::~cow_capture() {
  drain();
  ctl_->stop.store(true, std::memory_order_release);
  const uint64_t one = 1;
  (void)!::write(ctl_->wake, &one, sizeof(one));
  thread_.join();
  for (const auto& [lo, hi] : registered_) unregister_range(uffd_, lo, hi - lo);
  ::close(uffd_);  // would unregister too
  ::close(ctl_->wake);
  if (ctl_->arena) ::munmap(ctl_->arena, ctl_->arena_bytes);
  ctl_->~control();
  ::munmap(ctl_, sizeof(control));
}

bool cow_capture::busy() const {
  cairn::lock_guard lk(ctl_->mu);
  return !ctl_->ended;
}

void cow_capture::drain() {
  cairn::unique_lock lk(ctl_->mu);
  ctl_->cv.wait(lk, [&]() CAIRN_REQUIRES(ctl_->mu) { return ctl_->ended; });
}

// Registration lasts from one capture to the next (a capture of the same
// regions registers nothing: unregistering walks every page table entry,
// as long as the protection itself); spans no longer wanted are let go.
// Nothing is protected here (the thread is idle), so this thread may do it.
void cow_capture::register_spans(std::vector<span_ref> spans) {
  if (ctl_->dropped) {  // the last capture failed and unregistered
    registered_.clear();
    ctl_->dropped = false;
  }
  std::vector<std::pair<uint64_t, uint64_t>> keep;
  for (const auto& r : registered_) {
    const bool wanted = std::any_of(spans.begin(), spans.end(), [&](const span_ref& s) {
      return !*s.error && s.lo == r.first && s.hi == r.second;
    });
    if (wanted) {
      keep.push_back(r);
    } else {
      unregister_range(uffd_, r.first, r.second - r.first);  // gone already if the memory was unmapped
    }
  }
  registered_ = std::move(keep);
  for (auto& s : spans) {
    if (*s.error || std::find(registered_.begin(), registered_.end(), std::make_pair(s.lo, s.hi)) != registered_.end())
      continue;
    uffdio_register reg{};
    reg.range.start = s.lo;
    reg.range.len = s.hi - s.lo;
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    if (::ioctl(uffd_, UFFDIO_REGISTER, &reg) != 0) *s.error = errno;  // EBUSY: another userfaultfd has it
    else registered_.emplace_back(s.lo, s.hi);
  }
}

std::vector<int> cow_capture::begin(std::span<const cow_region> regions, done_fn done) {
  drain();
  control& c = *ctl_;
  const uint64_t pg = page_size();
  // Only the pages a region covers whole are write-protected. Its first and
  // last page, where it starts or ends inside one, hold other memory too
  // (heap objects, malloc's headers), whose writes would each wait for the
  // thread: the region's bytes there are copied now, into the arena (memory
  // touched already, unlike the staging image), and the thread puts them in
  // place. A region inside two pages is copied that way whole.
  // The regions by their whole pages, by address; overlapping page ranges
  // (regions that overlap) merge into one span (one registration, one fate).
  std::vector<uint32_t> order;
  std::vector<std::pair<uint64_t, uint64_t>> whole(regions.size());  // page-aligned, empty if none
  for (uint32_t i = 0; i < regions.size(); ++i) {
    const auto a = reinterpret_cast<uint64_t>(regions[i].src), e = a + regions[i].length;
    const uint64_t lo = (a + pg - 1) / pg * pg, hi = e / pg * pg;
    if (regions[i].length && lo < hi) {
      whole[i] = {lo, hi};
      order.push_back(i);
    }
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return whole[a].first < whole[b].first; });
  std::vector<span> spans;
  std::vector<uint32_t> reg_span(regions.size(), UINT32_MAX);
  for (uint32_t i : order) {
    const auto [lo, hi] = whole[i];
    if (spans.empty() || lo >= spans.back().hi) spans.push_back({lo, hi});
    else spans.back().hi = std::max(spans.back().hi, hi);
    reg_span[i] = static_cast<uint32_t>(spans.size() - 1);
  }
  std::vector<edge> edges;
  std::vector<const std::byte*> edge_src;  // where each edge's bytes are now
  uint64_t edge_total = 0;
  for (uint32_t i = 0; i < regions.size(); ++i) {
    const auto a = reinterpret_cast<uint64_t>(regions[i].src), e = a + regions[i].length;
    auto add = [&](uint64_t from, uint64_t to) {
      if (from >= to) return;
      edges.push_back({regions[i].dst + (from - a), to - from, edge_total, reg_span[i]});
      edge_src.push_back(regions[i].src + (from - a));
      edge_total += to - from;
    };
    if (reg_span[i] == UINT32_MAX) {
      add(a, e);
    } else {
      add(a, whole[i].first);
      add(whole[i].second, e);
    }
  }
  // Shared or file-backed memory is the caller's to copy. The mappings are
  // read again only when the spans change (a capture of the same regions
  // costs no read of /proc/self/maps).
  std::vector<std::pair<uint64_t, uint64_t>> bounds;
  for (const auto& sp : spans) bounds.emplace_back(sp.lo, sp.hi);
  if (bounds != checked_spans_) {
    const auto maps = read_maps();
    checked_errors_.clear();
    for (const auto& [lo, hi] : bounds) checked_errors_.push_back(check_private_anonymous(maps, lo, hi));
    checked_spans_ = std::move(bounds);
  }
  for (size_t k = 0; k < spans.size(); ++k) spans[k].error = checked_errors_[k];
  {
    std::vector<span_ref> refs;
    for (auto& sp : spans) refs.push_back({sp.lo, sp.hi, &sp.error});
    register_spans(std::move(refs));
  }
  std::vector<block> blocks;
  for (auto& s : spans) {
    s.first_block = static_cast<uint32_t>(blocks.size());
    for (uint64_t at = s.lo; at < s.hi;) {
      const uint64_t end = std::min(s.hi, (at / kBlock + 1) * kBlock);
      blocks.push_back({at, end});
      at = end;
    }
    s.blocks = static_cast<uint32_t>(blocks.size()) - s.first_block;
  }
  // The regions overlapping each block (several where regions overlap).
  std::vector<std::vector<uint32_t>> per_block(blocks.size());
  for (uint32_t i : order) {
    const auto [a, e] = whole[i];
    auto it = std::upper_bound(blocks.begin(), blocks.end(), a, [](uint64_t v, const block& b) { return v < b.hi; });
    for (; it != blocks.end() && it->lo < e; ++it) per_block[it - blocks.begin()].push_back(i);
  }
  size_t nrefs = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    blocks[b].first_ref = static_cast<uint32_t>(nrefs);
    blocks[b].refs = static_cast<uint32_t>(per_block[b].size());
    nrefs += per_block[b].size();
  }

  // The tables go where the thread may write (see the header comment).
  auto bytes_of = [](size_t n, size_t each) { return (n * each + 63) / 64 * 64; };
  const size_t need = bytes_of(regions.size(), sizeof(cow_region)) + bytes_of(spans.size(), sizeof(span)) +
                      bytes_of(blocks.size(), sizeof(block)) + bytes_of(nrefs, sizeof(uint32_t)) +
                      bytes_of(edges.size(), sizeof(edge)) + bytes_of(edge_total, 1);
  std::vector<int> result(regions.size(), 0);
  c.fail_errno = 0;
  c.fail_region = -1;
  c.fail_what = nullptr;
  c.report = {};
  c.t0 = util::now_s();
  done_ = std::move(done);
  {
    cairn::lock_guard lk(c.mu);
    c.ended = false;
  }
  if (need > c.arena_bytes) {
    if (c.arena) ::munmap(c.arena, c.arena_bytes);
    const size_t size = std::max<size_t>(need * 2, 1 << 16);
    c.arena = static_cast<std::byte*>(map_pages(size));
    c.arena_bytes = c.arena ? size : 0;
    if (!c.arena) {
      // The caller copies everything; its caller_done runs done (the thread has no part).
      c.parts.store(1, std::memory_order_relaxed);
      for (size_t i = 0; i < regions.size(); ++i) result[i] = regions[i].length ? ENOMEM : 0;
      return result;
    }
  }
  std::byte* at = c.arena;
  auto carve = [&](size_t n, size_t each) {
    std::byte* p = at;
    at += bytes_of(n, each);
    return p;
  };
  c.regs = reinterpret_cast<cow_region*>(carve(regions.size(), sizeof(cow_region)));
  c.spans = reinterpret_cast<span*>(carve(spans.size(), sizeof(span)));
  c.blocks = reinterpret_cast<block*>(carve(blocks.size(), sizeof(block)));
  c.refs = reinterpret_cast<uint32_t*>(carve(nrefs, sizeof(uint32_t)));
  c.edges = reinterpret_cast<edge*>(carve(edges.size(), sizeof(edge)));
  c.edge_bytes = carve(edge_total, 1);
  std::copy(regions.begin(), regions.end(), c.regs);
  std::copy(spans.begin(), spans.end(), c.spans);
  std::copy(blocks.begin(), blocks.end(), c.blocks);
  for (size_t b = 0; b < blocks.size(); ++b)
    std::copy(per_block[b].begin(), per_block[b].end(), c.refs + blocks[b].first_ref);
  std::copy(edges.begin(), edges.end(), c.edges);
  for (size_t k = 0; k < edges.size(); ++k) std::memcpy(c.edge_bytes + edges[k].at, edge_src[k], edges[k].length);
  c.nregs = regions.size();
  c.nspans = spans.size();
  c.nblocks = blocks.size();
  c.nedges = edges.size();
  c.image_end = nullptr;
  for (const auto& r : regions) c.image_end = std::max(c.image_end, r.dst + r.length);
  c.parts.store(2, std::memory_order_relaxed);

  // Protect. The thread serves faults from the tables from here on (this
  // thread's own writes, on its way back to the application, may touch
  // protected pages), and this thread never sleeps waiting for it: on a
  // loaded node, a wake-up would cost the application a time slice.
  c.go.store(false, std::memory_order_relaxed);
  c.active.store(true, std::memory_order_release);
  for (size_t k = 0; k < c.nspans; ++k) {
    span& sp = c.spans[k];
    if (sp.error || (sp.error = write_protect(uffd_, sp.lo, sp.hi - sp.lo, true)) == 0) continue;
    // A part may be protected: lift it, whatever it takes; the span is
    // registered again at the next capture (its memory changed under the registration?).
    if (write_protect(uffd_, sp.lo, sp.hi - sp.lo, false) != 0) unregister_range(uffd_, sp.lo, sp.hi - sp.lo);
    std::erase(registered_, std::make_pair(sp.lo, sp.hi));
  }
  for (size_t i = 0; i < regions.size(); ++i)
    result[i] = reg_span[i] == UINT32_MAX ? 0 : c.spans[reg_span[i]].error;
  c.go.store(true, std::memory_order_release);
  const uint64_t one = 1;
  (void)!::write(c.wake, &one, sizeof(one));
  return result;
}

void cow_capture::caller_done() { finish_part(); }

// Each part ends here once; the last runs done. Nothing is protected by then.
void cow_capture::finish_part() {
  if (ctl_->parts.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  control& c = *ctl_;
  status st;
  if (c.fail_what) {
    std::string where = c.fail_region >= 0 ? "a region of " + std::to_string(c.regs[c.fail_region].length) +
                                                 " bytes at " + std::to_string(reinterpret_cast<uint64_t>(c.regs[c.fail_region].src))
                                           : std::string("a region");
    st = status(errc::io_error, std::string("copy-on-write capture: ") + c.fail_what + " failed for " + where + " (" +
                                    std::strerror(c.fail_errno) +
                                    "): was its memory unmapped before the checkpoint was captured? Keep protected "
                                    "memory mapped until cairn_wait(CAPTURED) or cairn_unprotect returns, or use "
                                    "capture = copy");
  }
  done_fn done = std::move(done_);
  if (done) done(std::move(st), c.report);
  {
    cairn::lock_guard lk(c.mu);
    c.ended = true;
  }
  c.cv.notify_all();
}

void cow_capture::thread_main() {
  util::name_this_thread("cairn-cow");
  control& c = *ctl_;
  const int fd = uffd_;
  // Keeps the first failure; returns false for the caller to pass on.
  auto fail = [&](const char* what, int err, int region) {
    if (!c.fail_what) {
      c.fail_what = what;
      c.fail_errno = err;
      c.fail_region = region;
    }
    return false;
  };
  // Copies [lo, hi) of every region overlapping block b.
  auto copy_part = [&](const block& b, uint64_t lo, uint64_t hi) {
    for (uint32_t k = 0; k < b.refs; ++k) {
      const uint32_t i = c.refs[b.first_ref + k];
      const cow_region& r = c.regs[i];
      const auto a = reinterpret_cast<uint64_t>(r.src);
      const uint64_t from = std::max(lo, a), to = std::min(hi, a + r.length);
      const double t0 = util::now_s();
      for (uint64_t p = from; p < to;) {
        iovec local{r.dst + (p - a), to - p}, remote{reinterpret_cast<void*>(p), to - p};
        const ssize_t n = ::process_vm_readv(c.pid, &local, 1, &remote, 1, 0);
        if (n <= 0) return fail("reading the region", n < 0 ? errno : EFAULT, static_cast<int>(i));
        p += static_cast<uint64_t>(n);
      }
      // A staging slot not faulted in yet is faulted in here: whether its
      // huge pages pay (util/aligned_buffer.hpp).
      if (from < to) util::fresh_pages_written(r.dst + (from - a), to - from, util::now_s() - t0, c.image_end);
    }
    return true;
  };
  // Copies what is left of block b and lifts its protection.
  auto finish_block = [&](block& b) {
    if (b.done) return true;
    const bool ok = copy_part(b, std::max(b.lo, b.copied), b.hi);
    b.done = true;
    ++c.report.blocks;
    if (!ok) return false;
    if (int e = write_protect(fd, b.lo, b.hi - b.lo, false)) return fail("lifting the write protection", e, -1);
    return true;
  };
  auto find_block = [&](uint64_t addr) -> block* {
    block* end = c.blocks + c.nblocks;
    block* it = std::upper_bound(c.blocks, end, addr, [](uint64_t v, const block& b) { return v < b.hi; });
    return it != end && it->lo <= addr ? it : nullptr;
  };
  // Serves every write waiting now (or, with serve_only = false, drops the
  // messages: nothing is protected any more).
  auto serve = [&](bool serve_only = true) {
    uffd_msg msgs[16];
    for (;;) {
      const ssize_t n = ::read(fd, msgs, sizeof(msgs));
      if (n <= 0) return true;  // EAGAIN: none waiting
      for (size_t m = 0; serve_only && m < static_cast<size_t>(n) / sizeof(uffd_msg); ++m) {
        if (msgs[m].event != UFFD_EVENT_PAGEFAULT) continue;
        const uint64_t addr = msgs[m].arg.pagefault.address;
        ++c.report.faults;
        block* b = find_block(addr);
        if (b && !b->done) {
          if (!finish_block(*b)) return false;
        } else {
          // Lifted since the write stopped (its wake may have come first): wake it again.
          uffdio_range r{addr / page_size() * page_size(), page_size()};
          (void)::ioctl(fd, UFFDIO_WAKE, &r);
        }
      }
    }
  };

  for (;;) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {c.wake, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;  // EINTR
    if (fds[0].revents) (void)serve(c.active.load(std::memory_order_acquire));
    if (!fds[1].revents) continue;
    uint64_t n;
    (void)!::read(c.wake, &n, sizeof(n));
    if (c.stop.load(std::memory_order_acquire)) return;
    if (!c.go.load(std::memory_order_acquire)) continue;
    c.go.store(false, std::memory_order_relaxed);
    // Spans the caller could not protect are its to copy.
    for (size_t s = 0; s < c.nspans; ++s)
      if (c.spans[s].error)
        for (uint32_t b = 0; b < c.spans[s].blocks; ++b) c.blocks[c.spans[s].first_block + b].done = true;

    // Copy in address order, serving writes between pieces (a fault served
    // while the caller protected may have failed already).
    bool ok = c.fail_what == nullptr;
    for (size_t bi = 0; ok && bi < c.nblocks; ++bi) {
      block& b = c.blocks[bi];
      b.copied = b.lo;
      while (ok && !b.done) {
        ok = serve();
        if (!ok || b.done) break;
        const uint64_t end = std::min(b.copied + kPiece, b.hi);
        if (end == b.hi) {
          ok = finish_block(b);
        } else {
          ok = copy_part(b, b.copied, end);
          b.copied = end;
        }
      }
    }
    if (ok) ok = serve();
    // The bytes the caller copied from shared pages (not those of a region
    // it copies whole), last: into pages the copy faulted in already.
    for (size_t k = 0; ok && k < c.nedges; ++k) {
      const edge& g = c.edges[k];
      if (g.span == UINT32_MAX || !c.spans[g.span].error) std::memcpy(g.dst, c.edge_bytes + g.at, g.length);
    }
    if (!ok) {
      // Lift what is still protected (and wake its writers); where even that
      // fails, unregister, which lifts it too (the caller registers again).
      for (size_t s = 0; s < c.nspans; ++s) {
        const span& sp = c.spans[s];
        if (!sp.error && write_protect(fd, sp.lo, sp.hi - sp.lo, false) != 0) {
          unregister_range(fd, sp.lo, sp.hi - sp.lo);
          c.dropped = true;
        }
      }
      (void)serve(false);  // messages of writes the failure let go
    }
    c.report.copy_s = util::now_s() - c.t0;
    c.active.store(false, std::memory_order_release);
    finish_part();
  }
}

}  // namespace cairn::engine

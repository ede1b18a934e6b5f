// What a verified restart from the node-local level costs against an
// unverified read(2) of the same shard (VELOC's restart: one read into the
// application's buffer), for a shard of --mib MiB in a tmpfs file in --dir,
// restored into anonymous memory already faulted in (the application's
// regions). Per repetition, interleaved:
//   read(2)              one pread of the whole file (the reference);
//   map, hash, copy      mmap MAP_POPULATE, xxh3 of the mapping, then
//                        stream_copy into the regions (restart_verify =
//                        before: restart_test verifies, restart copies);
//   pieces read+hashed   pread of --piece KiB at a time straight into the
//                        regions, each piece hashed while it is in cache
//                        (restart_verify = while, before 2026-11-30);
//   through a buffer     pread of each piece into a page-aligned buffer,
//                        hashed there, then stream_copy_piece into the
//                        regions (shard_reader::read_region now).
// The regions start --offset bytes past a page: 16 is where malloc's and
// numpy's large blocks start, 0 a page-aligned buffer.
// Every variant's checksum is compared with the data's.
// usage: verified_read_bench [--mib 512] [--piece 256] [--reps 5] [--dir /dev/shm] [--offset 16]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "util/copy.hpp"
#include "util/hash.hpp"

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool read_fully(int fd, char* dst, size_t n, size_t off) {
  while (n > 0) {
    const ssize_t r = pread(fd, dst, n, static_cast<off_t>(off));
    if (r <= 0) return false;
    dst += r, off += static_cast<size_t>(r), n -= static_cast<size_t>(r);
  }
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  size_t mib = 512, piece = 256, offset = 16;
  int reps = 5;
  std::string dir = "/dev/shm";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mib")) mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--piece")) piece = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--offset")) offset = std::strtoull(argv[i + 1], nullptr, 10) % 4096;
  }
  const size_t n = mib << 20, step = piece << 10;
  auto* mem = static_cast<char*>(mmap(nullptr, n + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  auto* buf = static_cast<char*>(mmap(nullptr, step, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  char* dst = mem + offset;
  const std::string path = dir + "/cairn-verified-read-bench." + std::to_string(getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (mem == MAP_FAILED || buf == MAP_FAILED || fd < 0 || step == 0) {
    std::fprintf(stderr, "verified_read_bench: cannot set up %zu MiB in %s: %s\n", mib, dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = i * 0x9e3779b97f4a7c15ull;
    std::memcpy(dst + i, &v, 8);
  }
  const uint64_t want = cairn::util::xxh3(dst, n);
  if (pwrite(fd, dst, n, 0) != static_cast<ssize_t>(n)) return 1;
  std::memset(buf, 0, step);
  std::vector<double> plain, before, during, buffered;
  bool ok = true;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    ok &= read_fully(fd, dst, n, 0);
    double t1 = now();
    auto* m = static_cast<const char*>(mmap(nullptr, n, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0));
    ok &= m != MAP_FAILED && cairn::util::xxh3(m, n) == want;
    if (m != MAP_FAILED) {
      cairn::util::stream_copy(dst, m, n);
      munmap(const_cast<char*>(m), n);
    }
    double t2 = now();
    cairn::util::xxh3_stream h;
    for (size_t at = 0; at < n; at += step) {
      const size_t len = std::min(step, n - at);
      ok &= read_fully(fd, dst + at, len, at);
      h.update(dst + at, len);
    }
    ok &= h.digest() == want;
    double t3 = now();
    h.reset();
    for (size_t at = 0; at < n; at += step) {
      const size_t len = std::min(step, n - at);
      ok &= read_fully(fd, buf, len, at);
      h.update(buf, len);
      cairn::util::stream_copy_piece(dst + at, buf, len);
    }
    double t4 = now();
    ok &= h.digest() == want && cairn::util::xxh3(dst, n) == want;  // the regions hold the data
    plain.push_back(t1 - t0);
    before.push_back(t2 - t1);
    during.push_back(t3 - t2);
    buffered.push_back(t4 - t3);
  }
  close(fd);
  unlink(path.c_str());
  if (!ok) {
    std::fprintf(stderr, "verified_read_bench: a read failed or a checksum differed\n");
    return 1;
  }
  const double ref = median(plain);
  std::printf("%zu MiB from %s into memory %zu bytes past a page, medians of %d (x an unverified read(2), %.1f ms)\n",
              mib, dir.c_str(), offset, reps, ref * 1e3);
  std::printf("  map, hash, copy (before)              %7.1f ms  %5.2fx\n", median(before) * 1e3,
              median(before) / ref);
  std::printf("  %4zu KiB pieces read+hashed (while)   %7.1f ms  %5.2fx\n", piece, median(during) * 1e3,
              median(during) / ref);
  std::printf("  %4zu KiB pieces through a buffer (while) %6.1f ms  %5.2fx\n", piece, median(buffered) * 1e3,
              median(buffered) / ref);
  return 0;
}

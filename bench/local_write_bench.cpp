// What the node-local write of one version costs against the alternatives a
// staging slot that is itself a node-local file would have
// (docs/design/mapped-slots.md): per repetition, for a state of --mib MiB in
// anonymous memory faulted in (huge-page advised, as cairn's staging is):
//   write(2)      pwrite of the state into a recycled file in --dir (today's
//                 local stage: the file's pages exist, they are overwritten);
//   map+populate  mmap MAP_SHARED|MAP_POPULATE of that file, then munmap
//                 (what a slot rebound to another file each version costs);
//   mapped copy   memcpy into a mapping of the file kept from one version to
//                 the next (a slot that stays bound to its file);
//   memcpy        memcpy into anonymous memory faulted in (today's capture,
//                 the physical reference).
// usage: local_write_bench [--mib 312] [--reps 5] [--dir /dev/shm]
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

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void* anonymous(size_t n, int fill) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)madvise(p, n, MADV_HUGEPAGE);
  std::memset(p, fill, n);
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  size_t mib = 312;
  int reps = 5;
  std::string dir = "/dev/shm";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mib")) mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
  }
  const size_t n = mib << 20;
  void* src = anonymous(n, 7);
  void* dst = anonymous(n, 1);
  const std::string path = dir + "/cairn-local-write-bench." + std::to_string(getpid());
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (!src || !dst || fd < 0 || ftruncate(fd, static_cast<off_t>(n)) != 0 ||
      pwrite(fd, src, n, 0) != static_cast<ssize_t>(n)) {
    std::fprintf(stderr, "local_write_bench: cannot set up %zu MiB in %s: %s\n", mib, dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  void* kept = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  std::vector<double> wr, rebind, mapped, copy;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    for (size_t off = 0; off < n;) {
      const ssize_t w = pwrite(fd, static_cast<char*>(src) + off, std::min<size_t>(n - off, 64 << 20), off);
      if (w <= 0) return 1;
      off += static_cast<size_t>(w);
    }
    double t1 = now();
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    munmap(m, n);
    double t2 = now();
    std::memcpy(kept, src, n);
    double t3 = now();
    std::memcpy(dst, src, n);
    double t4 = now();
    wr.push_back(t1 - t0);
    rebind.push_back(t2 - t1);
    mapped.push_back(t3 - t2);
    copy.push_back(t4 - t3);
  }
  munmap(kept, n);
  close(fd);
  unlink(path.c_str());
  const double ref = median(copy);
  std::printf("%zu MiB in %s, medians of %d (x memcpy into anonymous memory, %.1f ms)\n", mib, dir.c_str(), reps,
              ref * 1e3);
  std::printf("  write(2) into a recycled file     %7.1f ms  %5.2fx\n", median(wr) * 1e3, median(wr) / ref);
  std::printf("  map+populate and unmap the file   %7.1f ms  %5.2fx\n", median(rebind) * 1e3, median(rebind) / ref);
  std::printf("  memcpy into a kept file mapping   %7.1f ms  %5.2fx\n", median(mapped) * 1e3, median(mapped) / ref);
  return 0;
}

#include "advise/measure.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>

#include "cairn.h"
#include "engine/stages.hpp"
#include "format/layout.hpp"
#include "format/shard.hpp"
#include "format/tree.hpp"
#include "storage/geometry.hpp"
#include "util/aligned_buffer.hpp"
#include "util/clock.hpp"
#include "util/copy.hpp"

namespace cairn::advise {
namespace {

double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

status check_options(const measure_options& o) {
  if (o.bytes_per_rank == 0) return {errc::invalid_argument, "bytes per rank must be positive"};
  if (o.ranks < 1 || o.ranks > 1024)
    return {errc::invalid_argument, "ranks per node must be in [1, 1024], not " + std::to_string(o.ranks)};
  if (o.reps < 1) return {errc::invalid_argument, "repetitions must be at least 1"};
  return {};
}

void tell(const measure_options& o, const std::string& what) {
  if (o.progress) o.progress(what);
}

struct round_times {
  double wall_s = 0;  // the best round's slowest thread
  double cpu_s = 0;   // the least CPU time of a round's slowest thread
};

// fn(i) on o.ranks threads at once, o.reps rounds (each told as `what` k/reps).
round_times best_of_rounds(const measure_options& o, const std::string& what, const std::function<void(int)>& fn) {
  round_times best;
  for (int rep = 0; rep < o.reps; ++rep) {
    tell(o, what + " " + std::to_string(rep + 1) + "/" + std::to_string(o.reps));
    std::vector<double> wall(o.ranks), cpu(o.ranks);
    std::barrier sync(o.ranks);
    std::vector<std::thread> ts;
    for (int i = 0; i < o.ranks; ++i) {
      ts.emplace_back([&, i] {
        sync.arrive_and_wait();
        double t0 = util::now_s(), c0 = thread_cpu_s();
        fn(i);
        cpu[i] = thread_cpu_s() - c0;
        wall[i] = util::now_s() - t0;
      });
    }
    for (auto& t : ts) t.join();
    double w = *std::max_element(wall.begin(), wall.end());
    double c = *std::max_element(cpu.begin(), cpu.end());
    if (best.wall_s == 0 || w < best.wall_s) best.wall_s = w;
    if (best.cpu_s == 0 || (c > 0 && c < best.cpu_s)) best.cpu_s = c;
  }
  return best;
}

}  // namespace

result<memory_measurement> measure_memory(const measure_options& o) {
  CAIRN_RETURN_IF_ERROR(check_options(o));
  const size_t n = o.bytes_per_rank;
  // Buffers as staging allocates them (page-aligned, pre-faulted), so the copy
  // measures the memory, not page faults.
  std::vector<util::aligned_buffer> src, dst;
  for (int i = 0; i < o.ranks; ++i) {
    tell(o, "memory: allocating buffers for thread " + std::to_string(i + 1) + "/" + std::to_string(o.ranks));
    CAIRN_ASSIGN_OR_RETURN(auto s, util::aligned_buffer::allocate(n, true));
    CAIRN_ASSIGN_OR_RETURN(auto d, util::aligned_buffer::allocate(n, true));
    std::memset(s.data(), 0x5a, n);
    src.push_back(std::move(s));
    dst.push_back(std::move(d));
  }
  memory_measurement best;
  auto copy = best_of_rounds(o, "memory: copy round", [&](int i) {
    util::stream_copy(dst[i].data(), src[i].data(), n);  // as the capture copies
  });
  best.copy_s = copy.wall_s;
  best.copy_cpu_s = copy.cpu_s;
  const double traffic = 2.0 * static_cast<double>(n) * o.ranks;  // read + write
  best.bandwidth = traffic / best.copy_s;
  best.bandwidth_cpu = best.copy_cpu_s > 0 ? traffic / best.copy_cpu_s : best.bandwidth;

  // The checksum pass over the copies, as the checksum stage makes it: one
  // region (of doubles where leaves are tolerant, which quantize values).
  std::vector<format::shard_header> headers(o.ranks);
  for (auto& h : headers) {
    h.regions.resize(1);
    h.regions[0].name = "advise";
    h.regions[0].type = o.hash_abs > 0 ? CAIRN_FLOAT64 : CAIRN_BYTE;
    h.regions[0].count = o.hash_abs > 0 ? n / 8 : n;
    h.regions[0].length = h.regions[0].count * (o.hash_abs > 0 ? 8 : 1);
  }
  auto hash = best_of_rounds(o, "checksum pass round", [&](int i) {
    const std::byte* regions[1] = {dst[i].data()};
    format::tree_file tree;
    format::checksum_and_tree(&headers[i], regions, o.hash_chunk, o.hash_abs, o.hash_trees ? &tree : nullptr);
    if (o.hash_trees) (void)format::encode_tree(tree);
  });
  const double hashed = static_cast<double>(n) * o.ranks;
  best.checksum = hashed / hash.wall_s;
  best.checksum_cpu = hash.cpu_s > 0 ? hashed / hash.cpu_s : best.checksum;
  return best;
}

result<io_measurement> measure_io(storage::storage_env* env, const std::string& dir, bool direct, bool durable,
                                  bool recycled, const measure_options& o) {
  CAIRN_RETURN_IF_ERROR(check_options(o));
  if (!env->exists(dir))
    return status(errc::not_found, "directory " + dir + " does not exist: create it or give another level directory");
  const size_t n = o.bytes_per_rank;
  const uint64_t file_bytes = format::align_up(n);  // O_DIRECT writes whole blocks, as a shard image is
  std::vector<util::aligned_buffer> bufs;
  for (int i = 0; i < o.ranks; ++i) {
    CAIRN_ASSIGN_OR_RETURN(auto b, util::aligned_buffer::allocate(file_bytes, true));
    std::memset(b.data(), 0xa5, file_bytes);
    bufs.push_back(std::move(b));
  }
  const std::string tmp = storage::join(dir, ".cairn-advise-" + std::to_string(::getpid()));
  CAIRN_RETURN_IF_ERROR(env->make_dirs(tmp));
  struct cleanup {
    storage::storage_env* env;
    std::string dir;
    ~cleanup() { (void)env->remove_tree(dir); }
  } cleanup_guard{env, tmp};
  io_measurement best;
  best.dir = dir;
  best.direct = direct;
  best.durable = durable;
  // As the engine does it per checkpoint: write the new version's file (in a
  // new version directory) and remove a retired version's (retention), or
  // overwrite the retired version's file under the new name (recycled).
  // Round 0 only writes the first "retired" version and is not timed.
  auto version_path = [&](int round, int i) {
    return storage::join(storage::join(tmp, "v" + std::to_string(round)),
                         format::shard_file_name(static_cast<uint32_t>(i)));
  };
  for (int rep = 0; rep <= o.reps; ++rep) {
    tell(o, std::string(durable ? "persistent" : "local") + " level " + dir + ": " +
                (rep == 0 ? std::string("first version") : "write round " + std::to_string(rep) + "/" + std::to_string(o.reps)));
    std::vector<double> wall(o.ranks), cpu(o.ranks);
    std::vector<status> st(o.ranks);
    std::barrier sync(o.ranks);
    std::vector<std::thread> ts;
    for (int i = 0; i < o.ranks; ++i) {
      ts.emplace_back([&, i] {
        sync.arrive_and_wait();
        double t0 = util::now_s(), c0 = thread_cpu_s();
        const std::string path = version_path(rep, i);
        const bool reuse = recycled && rep > 0;
        if (reuse) st[i] = env->make_dirs(storage::dirname_of(path));
        if (st[i] && reuse) st[i] = env->rename(version_path(rep - 1, i), path + ".tmp");
        if (st[i]) st[i] = engine::write_shard_file(env, path, bufs[i].data(), file_bytes, direct, durable, {}, reuse);
        if (st[i] && rep > 0 && !reuse) st[i] = env->remove_file(version_path(rep - 1, i));
        cpu[i] = thread_cpu_s() - c0;
        wall[i] = util::now_s() - t0;
      });
    }
    for (auto& t : ts) t.join();
    for (auto& s : st) CAIRN_RETURN_IF_ERROR(s.with_context("measuring the write bandwidth of " + dir));
    if (rep == 0) continue;
    double w = *std::max_element(wall.begin(), wall.end());
    double c = *std::max_element(cpu.begin(), cpu.end());
    if (best.write_s == 0 || w < best.write_s) best.write_s = w;
    if (best.write_cpu_s == 0 || (c > 0 && c < best.write_cpu_s)) best.write_cpu_s = c;
  }
  best.bandwidth = static_cast<double>(file_bytes) * o.ranks / best.write_s;
  best.bandwidth_cpu = best.write_cpu_s > 0 ? static_cast<double>(file_bytes) * o.ranks / best.write_cpu_s : best.bandwidth;
  if (auto g = storage::detect_geometry(dir)) best.fs = g->fs;
  if (durable) {
    // What a commit writes: a small file through a temporary name, synced,
    // renamed, the directory synced (the MANIFEST; the catalog's transaction
    // costs about the same).
    const std::string small(4096, 'm');
    for (int rep = 0; rep < o.reps; ++rep) {
      double t0 = util::now_s();
      CAIRN_RETURN_IF_ERROR(env->write_atomic(storage::join(tmp, "MANIFEST"), small, true)
                                .with_context("measuring a durable commit in " + dir));
      double t = util::now_s() - t0;
      if (best.commit_s == 0 || t < best.commit_s) best.commit_s = t;
    }
  }
  return best;
}

}  // namespace cairn::advise

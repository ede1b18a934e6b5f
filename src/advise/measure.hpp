// Measurements of paper 001's bandwidths on this node (docs/design/advise.md):
// B_M with `ranks` threads copying at once as the capture copies
// (util::stream_copy), and each level's B_IO with `ranks`
// writers writing as the engine's stages do (engine::write_shard_file).
// Long: a 512 MiB measurement moves gigabytes; `progress` is told each step.
// Not thread-safe (one measurement at a time); all file I/O through `env`.
#ifndef CAIRN_ADVISE_MEASURE_HPP
#define CAIRN_ADVISE_MEASURE_HPP

#include <cstdint>
#include <functional>
#include <string>

#include "cairn/status.hpp"
#include "storage/storage_env.hpp"

namespace cairn::advise {

struct measure_options {
  uint64_t bytes_per_rank = 64ull << 20;
  int ranks = 1;  // concurrent threads (the ranks per node that will run)
  int reps = 3;   // best of
  std::function<void(const std::string&)> progress;  // may be empty
  // The checksum pass as the engine's checksum stage makes it
  // (format::checksum_and_tree), timed by measure_memory over the copies.
  bool hash_trees = true;
  uint64_t hash_chunk = 64 << 10;
  double hash_abs = 0;
};

struct memory_measurement {
  double bandwidth = 0;      // bytes of memory traffic per second, node, wall clock
  double bandwidth_cpu = 0;  // the same over the slowest thread's CPU seconds
  double copy_s = 0;         // wall seconds of the best round (slowest thread)
  double copy_cpu_s = 0;     // CPU seconds of the best round's slowest thread
  // The checksum pass (with the hash trees as configured): bytes hashed per
  // second, node, wall clock and over the slowest thread's CPU seconds. It
  // is CPU-bound (hashing), not memory-bound, on most machines.
  double checksum = 0;
  double checksum_cpu = 0;
};
result<memory_measurement> measure_memory(const measure_options& o);

struct io_measurement {
  std::string dir;
  bool direct = false, durable = false;
  double bandwidth = 0;  // bytes per second, all writers together
  double write_s = 0;    // wall seconds of the best round (slowest writer)
  // The same over the slowest writer's CPU seconds: for a memory-backed level
  // (tmpfs) the write is all CPU, and this is its cost without other load.
  double bandwidth_cpu = 0;
  double write_cpu_s = 0;
  std::string fs;        // file system (storage::detect_geometry): "tmpfs", "ext4", ...
  double commit_s = 0;   // durable only: one small durable write (write_atomic), best round
};
// Per round, each of `ranks` writers writes a new version's file and removes
// the previous round's (the retention of a retired version), as the engine
// does per checkpoint; with `recycled`, it overwrites the previous round's
// file in place and renames it, as the local level does with a retired
// version's file (engine::local_recycler). Files of bytes_per_rank, in a
// temporary directory under `dir` (which must exist), removed afterwards also
// on error. direct, durable and recycled as the stage: local (false, false,
// engine_shape::recycled_local), persistent (direct_io, true, false).
result<io_measurement> measure_io(storage::storage_env* env, const std::string& dir, bool direct, bool durable,
                                  bool recycled,
                                  const measure_options& o);

}  // namespace cairn::advise

#endif

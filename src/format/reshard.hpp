// Restoring a version on another rank count (docs/design/reshard.md): which
// regions can be redistributed, and the byte runs of an old block that a new
// block needs. Used by restart (src/client/restart.cpp) and `cairn restartable`.
#ifndef CAIRN_FORMAT_RESHARD_HPP
#define CAIRN_FORMAT_RESHARD_HPP

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

// How one region of a version is restored on another rank count.
struct reshard_region {
  bool block = false;            // global layout: assembled from the old blocks by global index
  uint8_t type = 0;
  bool column_major = false;
  std::vector<uint64_t> global;  // storage order (blocks)
  uint64_t count = 0;            // replicated regions: elements of every rank's (identical) copy
};

// Every region of a version from its writers' headers (in rank order): a
// block of a global array when every rank declared it with the same global
// shape, type and order and the blocks hold exactly the global array's
// elements; replicated when no rank declared a layout and every copy has the
// same type, count and checksum. Otherwise unusable, naming the region and
// what to do; `what` names the version in messages ("'grid' version 6").
result<std::map<std::string, reshard_region>> plan_regions(const std::vector<shard_header>& old,
                                                           uint32_t new_nranks, const std::string& what);

// Every rank's header of the committed version `m` (file per process or
// aggregated), each checked against the MANIFEST (rank, name, version, header
// checksum): one small read per rank. `raw` (if given) gets each header's
// bytes as read, for decode_header elsewhere.
result<std::vector<shard_header>> read_version_headers(storage::storage_env* env, const std::string& store,
                                                       const std::string& run, const manifest& m,
                                                       std::vector<std::string>* raw = nullptr);

// One contiguous piece: bytes [src, src+len) of an old block's data go to
// [dst, dst+len) of the new block's (both contiguous, row-major).
struct copy_run {
  uint64_t src = 0, dst = 0, len = 0;
};

// The intersection of an old block (o_start, o_dims) with a new one (n_start,
// n_dims), all row-major global coordinates of equal rank, as copy runs of
// `elem`-byte elements in increasing src order, adjacent rows merged. Appends
// to *runs and returns the elements in the intersection (0: disjoint).
uint64_t overlap_runs(const std::vector<uint64_t>& o_start, const std::vector<uint64_t>& o_dims,
                      const std::vector<uint64_t>& n_start, const std::vector<uint64_t>& n_dims, size_t elem,
                      std::vector<copy_run>* runs);

}  // namespace cairn::format

#endif

// Version manifest: the commit record of a version at the persistent level.
// Written last, by whoever completes the version, once every rank's shard is
// durable (format/commit.hpp). Layout in
// docs/format/manifest.md.
#ifndef CAIRN_FORMAT_MANIFEST_HPP
#define CAIRN_FORMAT_MANIFEST_HPP

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

// 1: file per process (a shard file per rank). 2: adds the aggregated layout
// (docs/format/container.md); a file-per-process manifest is still written as 1.
inline constexpr int kManifestFormatVersion = 1;
inline constexpr int kManifestAggregatedVersion = 2;
inline constexpr int kContainerFormatVersion = 1;

// Aggregated layout: bytes [src, src+length) of a rank's image are at `offset`
// of data file `file`; `checksum` is xxh3 of those bytes.
struct image_extent {
  uint64_t src = 0;
  uint64_t length = 0;
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t checksum = 0;
};

// One data file of an aggregated version: data.<index:06>, `size` bytes,
// written by the ranks in `writers` (one for leaders; several for the
// baselines).
struct data_file {
  std::string name;
  uint64_t size = 0;
  std::vector<uint32_t> writers;
};

// How an aggregated version was written (container.md): what `cairn show`
// prints and the benchmarks count.
struct container_info {
  std::string strategy;            // posix_shared, aligned, mpiio, leaders
  uint64_t stripe = 0;             // stripe size the extents were aligned to
  uint32_t stripe_count = 0;       // of the data files' layout (0: unknown)
  std::vector<data_file> files;
  std::vector<uint32_t> leaders;   // the writers of the version, in plan order
  uint64_t bytes_between_nodes = 0;
  uint64_t bytes_within_nodes = 0;
  uint64_t padding = 0;            // bytes written only to align extents
};

// Per rank: the shard's identity and when each stage ran (wall-clock seconds
// since the epoch for *_at, durations in seconds).
struct shard_entry {
  uint32_t rank = 0;
  uint64_t size = 0;
  uint64_t header_checksum = 0;
  double captured_at = 0;
  double capture_s = 0;
  double checksum_s = 0;
  double hash_s = 0;       // what the hash trees add to the checksum pass; 0 when trees are off
  bool tree = false;       // tree.<rank> written beside the shard
  double local_s = 0;      // 0 when the local level was not written
  double persistent_s = 0;
  double persistent_at = 0;  // when the shard became durable
  std::string host;
  std::vector<image_extent> extents;  // aggregated layout: where the image is, in src order
};

// Which node-loss redundancy scheme (docs/design/redundancy.md) the version
// was encoded with: the configuration of the job that wrote it, recorded
// whether or not its sets had completed when the manifest was committed.
struct redundancy_info {
  std::string scheme;       // "partner", "xor" or "rs"
  std::string description;  // e.g. "xor(k=4, m=1)", as the runtime prints it
  uint32_t k = 0;           // members of the largest set
  uint32_t m = 0;           // parity blocks per stripe (partner, xor: 1)
  std::vector<std::vector<uint32_t>> sets;  // the ranks of each set, in set order
  double protected_at = 0;  // when every set was complete; 0: not yet known at commit
};

struct manifest {
  std::string run;
  std::string name;
  int64_t version = 0;
  uint32_t nranks = 0;
  double committed_at = 0;
  std::string executable;
  std::string mode;
  std::vector<shard_entry> shards;  // one per rank, in rank order
  bool aggregated = false;          // layout: shards in data files (container) or a file per rank
  container_info container;         // aggregated only
  std::optional<redundancy_info> redundancy;  // absent: not protected (or written before it was recorded)
};

std::string encode_manifest(const manifest& m);
result<manifest> decode_manifest(const std::string& text, const std::string& where);
result<manifest> read_manifest(storage::storage_env* env, const std::string& path);

// One writer's part of a version, recorded once it is durable so that the
// last writer can commit the version (format/commit.hpp, docs/format/store.md
// "Commit"). Never read after the commit.
inline constexpr int kPartFormatVersion = 1;
struct part_record {
  shard_entry entry;
  bool aggregated = false;  // entry.extents locate the image in the version's data files
  double protected_at = 0;  // redundancy: when this writer's set was complete (0: not protected)
};
std::string encode_part(const part_record& p);
result<part_record> decode_part(const std::string& text, const std::string& where);

}  // namespace cairn::format

#endif

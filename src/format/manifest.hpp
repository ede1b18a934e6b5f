// Version manifest: the commit record of a version at the persistent level.
// Written last, by rank 0, once every rank's shard is durable. Layout in
// docs/format/manifest.md.
#ifndef CAIRN_FORMAT_MANIFEST_HPP
#define CAIRN_FORMAT_MANIFEST_HPP

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

inline constexpr int kManifestFormatVersion = 1;

// Per rank: the shard's identity and when each stage ran (wall-clock seconds
// since the epoch for *_at, durations in seconds).
struct shard_entry {
  uint32_t rank = 0;
  uint64_t size = 0;
  uint64_t header_checksum = 0;
  double captured_at = 0;
  double capture_s = 0;
  double checksum_s = 0;
  double hash_s = 0;       // hash-tree stage; 0 when trees are off
  bool tree = false;       // tree.<rank> written beside the shard
  double local_s = 0;      // 0 when the local level was not written
  double persistent_s = 0;
  double persistent_at = 0;  // when the shard became durable
  std::string host;
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
};

std::string encode_manifest(const manifest& m);
result<manifest> decode_manifest(const std::string& text, const std::string& where);
result<manifest> read_manifest(storage::storage_env* env, const std::string& path);

}  // namespace cairn::format

#endif

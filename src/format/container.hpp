// The aggregated layout of a version (docs/format/container.md): every rank's
// image lies in M data files, as the extents its MANIFEST entry lists. These
// functions are the one reader of it: whoever reads a persistent shard opens
// it with open_persistent_image, whatever the version's layout, and reads it
// as a file (shard_reader, read_shard_image).
#ifndef CAIRN_FORMAT_CONTAINER_HPP
#define CAIRN_FORMAT_CONTAINER_HPP

#include <cstdint>
#include <memory>
#include <string>

#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

// data.<index:06>
std::string data_file_name(uint32_t index);
bool parse_data_file_name(const std::string& entry, uint32_t* index);

// Rank `rank`'s image in the aggregated version `m` (committed in directory
// `version_dir`) as a readable file of m.shards[rank].size bytes: reads go to
// the data files through the extents (opened once, on first use). A data file
// shorter than the manifest says is corruption. Errors: invalid_argument (no
// such rank, not aggregated), not_found, io_error.
result<std::unique_ptr<storage::readable_file>> open_container_image(storage::storage_env* env,
                                                                     const std::string& version_dir,
                                                                     const manifest& m, uint32_t rank);

// A persistent shard, whatever its version's layout: `m` is the version's
// manifest when the caller has read it (null: the shard file of a
// file-per-process version, or of a version without MANIFEST).
result<std::unique_ptr<storage::readable_file>> open_persistent_image(storage::storage_env* env,
                                                                      const std::string& store,
                                                                      const std::string& run,
                                                                      const std::string& name, int64_t version,
                                                                      uint32_t rank, const manifest* m);
// Where such a shard is, for messages: the shard file, or "<dir>/data.* (rank r)".
std::string persistent_image_where(const std::string& store, const std::string& run, const std::string& name,
                                   int64_t version, uint32_t rank, const manifest* m);

// Checks the checksum of every extent of `rank`'s image (all ranks when rank
// is negative). Adds the bytes read to *bytes when given. corruption names
// the first extent that does not match.
status verify_container_extents(storage::storage_env* env, const std::string& version_dir, const manifest& m,
                                int64_t rank, uint64_t* bytes = nullptr);

// Where verify_container_extents stopped: the rank, its extent, and the data
// file's path (cairn verify names them).
struct extent_problem {
  uint32_t rank = 0;
  image_extent extent;
  std::string path;
};
// The same, and when it fails on an extent (a checksum that does not match,
// or its bytes that cannot be read), sets *where to it.
status verify_container_extents(storage::storage_env* env, const std::string& version_dir, const manifest& m,
                                int64_t rank, uint64_t* bytes, extent_problem* where);

}  // namespace cairn::format

#endif

// Test support: writes small, deterministic cairn stores with the format module
// (shard files via plan_layout/encode_header, manifests via encode_manifest),
// and temporary directories for them. Used by the unit tests and by
// cairn_make_store (tests/integration). Not part of libcairn.
#ifndef CAIRN_TESTS_SUPPORT_TEST_STORE_HPP
#define CAIRN_TESTS_SUPPORT_TEST_STORE_HPP

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"

namespace cairn::test {

struct region_spec {
  std::string name;
  uint8_t type = 0;            // cairn_type value
  uint64_t count = 0;          // elements
  std::vector<uint64_t> dims;  // empty = one-dimensional
  bool column_major = false;
};

// A complete shard file image (header, table, data) and its decoded header.
// Region bytes are a deterministic function of (run, name, version, rank,
// region), so two calls with the same arguments give the same bytes.
struct shard_image {
  format::shard_header header;
  std::vector<std::byte> bytes;
};
result<shard_image> make_shard_image(const std::string& run, const std::string& name, int64_t version, uint32_t rank,
                                     uint32_t nranks, const std::vector<region_spec>& regions);

struct version_spec {
  std::string run;
  std::string name;
  int64_t version = 0;
  uint32_t nranks = 1;
  std::vector<region_spec> regions;  // the same for every rank
  // Ranks whose shard is written; empty = every rank.
  std::vector<uint32_t> ranks;
  bool commit = true;  // write the MANIFEST (only when every rank is written)
  double committed_at = 1700000000.0;
  std::string executable = "/usr/bin/app";
  std::string mode = "thread";
};

// Writes spec's shards (and MANIFEST when spec.commit) under root with the
// store layout, creating directories. *out (if given) receives the manifest.
status write_version(const std::string& root, const version_spec& spec, format::manifest* out = nullptr);

// Rewrites the shard file at path compressed (format 3, zstd `level`), as a
// checkpoint agent writes it; the MANIFEST entry stays valid.
status compress_shard_file(const std::string& path, int level = 1);

// Writes bytes to path (creating its directory), replacing any file there.
status write_file(const std::string& path, const void* data, size_t len);

// A new empty directory under /tmp (mkdtemp), removed by the destructor.
class temp_dir {
 public:
  temp_dir();
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace cairn::test

#endif

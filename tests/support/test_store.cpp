#include "test_store.hpp"

#include <stdlib.h>

#include <cstring>

#include "format/layout.hpp"
#include "format/shard_io.hpp"
#include "storage/storage_env.hpp"
#include "util/hash.hpp"

namespace cairn::test {

result<shard_image> make_shard_image(const std::string& run, const std::string& name, int64_t version, uint32_t rank,
                                     uint32_t nranks, const std::vector<region_spec>& regions) {
  shard_image img;
  format::shard_header& h = img.header;
  h.run = run;
  h.name = name;
  h.version = version;
  h.rank = rank;
  h.nranks = nranks;
  for (const auto& spec : regions) {
    format::region_desc r;
    r.name = spec.name;
    r.type = spec.type;
    r.count = spec.count;
    r.dims = spec.dims;
    r.flags = spec.column_major ? format::kColumnMajor : 0;
    h.regions.push_back(std::move(r));
  }
  CAIRN_RETURN_IF_ERROR(format::plan_layout(h));
  img.bytes.assign(h.file_size, std::byte{0});
  for (auto& r : h.regions) {
    // Seeded by everything that identifies the region, so versions differ.
    const std::string key =
        run + "/" + name + "/" + std::to_string(version) + "/" + std::to_string(rank) + "/" + r.name;
    uint64_t seed = util::xxh3(key.data(), key.size());
    for (uint64_t i = 0; i < r.length; ++i) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      img.bytes[r.offset + i] = static_cast<std::byte>(seed >> 56);
    }
    r.checksum = util::xxh3(img.bytes.data() + r.offset, r.length);
  }
  format::encode_header(h, img.bytes);
  return img;
}

status compress_shard_file(const std::string& path, int level) {
  storage::storage_env* env = storage::storage_env::posix();
  CAIRN_ASSIGN_OR_RETURN(format::shard_image img, format::read_shard_image(env, path));
  format::compress_options o;
  o.level = level;
  CAIRN_ASSIGN_OR_RETURN(format::compressed_shard c,
                         format::compress_shard(img.header, img.image.span().first(img.header.file_size), o));
  const std::string tmp = path + ".tmp";
  CAIRN_ASSIGN_OR_RETURN(auto f, env->create(tmp, false));
  CAIRN_RETURN_IF_ERROR(f->write_at(0, c.bytes.data(), c.header.stored_size));
  CAIRN_RETURN_IF_ERROR(f->close());
  return env->rename(tmp, path);
}

status write_file(const std::string& path, const void* data, size_t len) {
  storage::storage_env* env = storage::storage_env::posix();
  CAIRN_RETURN_IF_ERROR(env->make_dirs(storage::dirname_of(path)));
  CAIRN_ASSIGN_OR_RETURN(auto f, env->create(path, false));
  CAIRN_RETURN_IF_ERROR(f->write_at(0, data, len));
  return f->close();
}

status write_version(const std::string& root, const version_spec& spec, format::manifest* out) {
  std::vector<uint32_t> ranks = spec.ranks;
  if (ranks.empty())
    for (uint32_t r = 0; r < spec.nranks; ++r) ranks.push_back(r);
  format::manifest m;
  m.run = spec.run;
  m.name = spec.name;
  m.version = spec.version;
  m.nranks = spec.nranks;
  m.committed_at = spec.committed_at;
  m.executable = spec.executable;
  m.mode = spec.mode;
  for (uint32_t rank : ranks) {
    CAIRN_ASSIGN_OR_RETURN(shard_image img,
                           make_shard_image(spec.run, spec.name, spec.version, rank, spec.nranks, spec.regions));
    CAIRN_RETURN_IF_ERROR(write_file(format::shard_path(root, spec.run, spec.name, spec.version, rank),
                                     img.bytes.data(), img.bytes.size()));
    format::shard_entry e;
    e.rank = rank;
    e.size = img.header.file_size;
    e.header_checksum = img.header.header_checksum;
    // Timings: fixed fractions of a second before the commit, distinct per rank.
    e.captured_at = spec.committed_at - 1.0;
    e.capture_s = 0.001 * (rank + 1);
    e.checksum_s = 0.0005 * (rank + 1);
    e.local_s = 0.002 * (rank + 1);
    e.persistent_s = 0.01 * (rank + 1);
    e.persistent_at = spec.committed_at - 0.5 + 0.01 * rank;
    e.host = "node" + std::to_string(rank / 2);
    m.shards.push_back(std::move(e));
  }
  if (spec.commit) {
    if (ranks.size() != spec.nranks) return {errc::invalid_argument, "write_version: commit needs every rank"};
    const std::string text = format::encode_manifest(m);
    CAIRN_RETURN_IF_ERROR(storage::storage_env::posix()->write_atomic(
        format::manifest_path(root, spec.run, spec.name, spec.version), text, false));
  }
  if (out != nullptr) *out = std::move(m);
  return {};
}

temp_dir::temp_dir() {
  char tmpl[] = "/tmp/cairn-test-XXXXXX";
  if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
}

temp_dir::~temp_dir() {
  if (!path_.empty()) (void)storage::storage_env::posix()->remove_tree(path_);
}

}  // namespace cairn::test

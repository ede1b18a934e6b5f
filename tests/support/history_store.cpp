#include "history_store.hpp"

#include <cstring>

#include "format/layout.hpp"
#include "format/shard.hpp"
#include "format/tree.hpp"
#include "storage/storage_env.hpp"
#include "test_store.hpp"
#include "util/hash.hpp"

namespace cairn::test {

uint64_t element_count(const region_data& r) {
  const uint64_t es = format::type_size(r.type);
  return es == 0 ? 0 : r.bytes.size() / es;
}

status write_history_version(const std::string& root, const history_version& v, bool manifest) {
  format::manifest m;
  m.run = v.run;
  m.name = v.name;
  m.version = v.version;
  m.nranks = static_cast<uint32_t>(v.ranks.size());
  m.committed_at = 1700000000.0 + static_cast<double>(v.version);
  m.executable = "/usr/bin/test";
  m.mode = "sync";
  for (uint32_t rank = 0; rank < v.ranks.size(); ++rank) {
    format::shard_header h;
    h.run = v.run;
    h.name = v.name;
    h.version = v.version;
    h.rank = rank;
    h.nranks = m.nranks;
    for (const region_data& rd : v.ranks[rank]) {
      format::region_desc d;
      d.name = rd.name;
      d.type = rd.type;
      d.count = element_count(rd);
      d.dims = rd.dims;
      d.flags = rd.column_major ? format::kColumnMajor : 0;
      if (!rd.global.empty()) {
        d.flags |= format::kHasLayout;
        d.global = rd.global;
        d.start = rd.start;
      }
      h.regions.push_back(std::move(d));
    }
    CAIRN_RETURN_IF_ERROR(format::plan_layout(h));
    std::vector<std::byte> image(h.file_size, std::byte{0});
    for (size_t i = 0; i < h.regions.size(); ++i) {
      auto& d = h.regions[i];
      const auto& src = v.ranks[rank][i].bytes;
      if (!src.empty()) std::memcpy(image.data() + d.offset, src.data(), src.size());
      d.checksum = util::xxh3(image.data() + d.offset, d.length);
    }
    format::encode_header(h, image);
    const std::string path = format::shard_path(root, v.run, v.name, v.version, rank);
    CAIRN_RETURN_IF_ERROR(write_file(path, image.data(), image.size()));
    if (v.tree.write) {
      const std::string tree =
          format::encode_tree(format::build_tree(h, image, v.tree.chunk_bytes, v.tree.quantum));
      CAIRN_RETURN_IF_ERROR(write_file(storage::join(storage::dirname_of(path), format::tree_file_name(rank)),
                                       tree.data(), tree.size()));
    }
    format::shard_entry e;
    e.rank = rank;
    e.size = h.file_size;
    e.header_checksum = h.header_checksum;
    e.tree = v.tree.write;
    e.host = "node0";
    m.shards.push_back(std::move(e));
  }
  if (manifest && v.commit) {
    CAIRN_RETURN_IF_ERROR(storage::storage_env::posix()->write_atomic(
        format::manifest_path(root, v.run, v.name, v.version), format::encode_manifest(m), false));
  }
  return {};
}

}  // namespace cairn::test

#include "analytics/online.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard_io.hpp"

namespace cairn::analytics {
namespace {

bool same_structure(const format::region_desc& a, const format::region_desc& b) {
  return a.type == b.type && a.count == b.count && a.dims == b.dims && a.global == b.global && a.start == b.start &&
         (a.flags & format::kColumnMajor) == (b.flags & format::kColumnMajor);
}

}  // namespace

result<online_outcome> compare_with_reference(storage::storage_env* env, const online_reference& ref,
                                              const format::shard_header& mine, std::span<const std::byte> image,
                                              const format::tree_file* my_tree, online_divergence* out) {
  const std::string mpath = format::manifest_path(ref.store, ref.run, mine.name, mine.version);
  if (!env->exists(mpath)) return online_outcome::pending;
  CAIRN_ASSIGN_OR_RETURN(format::manifest m, format::read_manifest(env, mpath));
  out->version = mine.version;
  out->rank = mine.rank;
  out->name = mine.name;
  if (m.nranks != mine.nranks) {
    out->kind = "structural";
    out->region = "";
    out->value = std::to_string(mine.nranks) + " ranks";
    out->reference = std::to_string(m.nranks) + " ranks";
    return online_outcome::diverged;
  }
  if (mine.rank >= m.shards.size())
    return status(errc::corruption, mpath + ": lists " + std::to_string(m.shards.size()) + " shards for " +
                                        std::to_string(m.nranks) + " ranks");
  // The reference shard: its local copy (a shard file at every level's
  // layout) when it is the committed one, else the persistent one: a shard
  // file, or the rank's image in the data files of an aggregated version.
  std::string path = format::persistent_image_where(ref.store, ref.run, mine.name, mine.version, mine.rank, &m);
  bool local = false;
  if (!ref.scratch.empty()) {
    std::string lpath = format::shard_path(ref.scratch, ref.run, mine.name, mine.version, mine.rank);
    auto lh = format::read_header(env, lpath);
    if (lh && lh->header_checksum == m.shards[mine.rank].header_checksum) {
      path = lpath;
      local = true;
    }
  }
  // The reference shard may be compressed (written by an agent): read it
  // through a shard_reader, by the image's offsets.
  CAIRN_ASSIGN_OR_RETURN(auto opened, local ? env->open_read(path)
                                           : format::open_persistent_image(env, ref.store, ref.run, mine.name,
                                                                           mine.version, mine.rank, &m));
  CAIRN_ASSIGN_OR_RETURN(auto file, format::shard_reader::open(std::move(opened), path));
  const format::shard_header& rh = file->header();
  if (rh.header_checksum != m.shards[mine.rank].header_checksum)
    return status(errc::corruption, path + ": does not match the reference's MANIFEST");
  // No trees are written for aggregated versions (container.md): their data are read.
  std::optional<format::tree_file> rtree;
  if (my_tree && (local || !m.aggregated)) {
    auto t = format::read_tree(env, storage::join(storage::dirname_of(path), format::tree_file_name(mine.rank)));
    if (t && t->shard_header_checksum == rh.header_checksum && t->chunk_bytes == my_tree->chunk_bytes)
      rtree = std::move(t).value();
  }

  std::vector<std::byte> buf;
  for (const auto& r : mine.regions) {
    auto it = std::find_if(rh.regions.begin(), rh.regions.end(), [&](auto& d) { return d.name == r.name; });
    if (it == rh.regions.end() || !same_structure(r, *it)) {
      out->kind = "structural";
      out->region = r.name;
      out->value = std::string(format::type_name(r.type)) + " x " + std::to_string(r.count);
      out->reference = it == rh.regions.end() ? "missing"
                                              : std::string(format::type_name(it->type)) + " x " + std::to_string(it->count);
      return online_outcome::diverged;
    }
    const format::region_tree* mt = my_tree ? my_tree->find(r.name) : nullptr;
    const format::region_tree* rt = rtree ? rtree->find(r.name) : nullptr;
    if (mt && rt && mt->exact_root == rt->exact_root && mt->exact.size() == rt->exact.size()) continue;
    const bool tolerant = mt && rt && mt->has_tolerant && rt->has_tolerant && my_tree->quantum == rtree->quantum &&
                          tolerant_leaves_prove(my_tree->quantum, ref.tol).usable;
    const uint64_t es = format::type_size(r.type);
    const uint64_t per = format::elements_per_chunk(my_tree ? my_tree->chunk_bytes : (4u << 20), r.type);
    for (uint64_t first = 0, c = 0; first < r.count; first += per, ++c) {
      const uint64_t n = std::min(per, r.count - first);
      if (mt && rt && c < mt->exact.size() && c < rt->exact.size()) {
        if (mt->exact[c] == rt->exact[c]) continue;
        if (tolerant && mt->tolerant[c] == rt->tolerant[c]) continue;
      }
      buf.resize(n * es);
      CAIRN_RETURN_IF_ERROR(file->read(it->offset + first * es, buf.data(), n * es));
      compare_stats s;
      compare_into(&s, image.data() + r.offset + first * es, buf.data(), n, r.type, ref.tol, first);
      if (s.mismatch > 0) {
        out->kind = "mismatch";
        out->region = r.name;
        out->index = s.first->index;
        out->value = s.first->a.to_string();
        out->reference = s.first->b.to_string();
        return online_outcome::diverged;
      }
    }
  }
  return online_outcome::equal;
}

}  // namespace cairn::analytics

#include "format/commit.hpp"

#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "util/clock.hpp"

namespace cairn::format {

result<bool> commit_if_complete(storage::storage_env* env, const std::string& store, const shard_header& h,
                                const std::string& executable, const std::string& mode) {
  manifest m;
  m.run = h.run;
  m.name = h.name;
  m.version = h.version;
  m.nranks = h.nranks;
  m.executable = executable;
  m.mode = mode;
  for (uint32_t r = 0; r < h.nranks; ++r) {
    const std::string path = shard_path(store, h.run, h.name, h.version, r);
    if (!env->exists(path)) return false;
    auto sh = read_header(env, path);
    // A damaged or foreign shard is not ours to judge here: its writer
    // replaces it, or restart rejects the version.
    if (!sh) return false;
    if (sh->run != h.run || sh->name != h.name || sh->version != h.version || sh->rank != r ||
        sh->nranks != h.nranks || sh->attempt != h.attempt)
      return false;
    shard_entry e;
    e.rank = r;
    e.size = sh->file_size;
    e.header_checksum = sh->header_checksum;
    m.shards.push_back(std::move(e));
  }
  const std::string mpath = manifest_path(store, h.run, h.name, h.version);
  if (env->exists(mpath)) {
    auto old = read_manifest(env, mpath);
    if (old && old->nranks == m.nranks) {
      bool same = true;
      for (uint32_t r = 0; r < m.nranks && same; ++r)
        same = old->shards[r].header_checksum == m.shards[r].header_checksum && old->shards[r].size == m.shards[r].size;
      if (same) return true;
    }
  }
  m.committed_at = util::wall_s();
  // Other writers may commit the same version at the same moment: each has its
  // own temporary file, and the renames replace identical content.
  CAIRN_RETURN_IF_ERROR(env->write_atomic(mpath, encode_manifest(m), true, /*unique_tmp=*/true));
  return true;
}

}  // namespace cairn::format

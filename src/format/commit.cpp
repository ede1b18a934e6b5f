#include "format/commit.hpp"

#include <cstdio>
#include <set>

#include "format/layout.hpp"
#include "util/clock.hpp"
#include "util/mutex.hpp"

namespace cairn::format {

status sync_version_parents(storage::storage_env* env, const std::string& store, const std::string& run,
                            const std::string& name) {
  static cairn::mutex mu;
  static std::set<std::string> synced CAIRN_GUARDED_BY(mu);  // checkpoint directories whose chain is durable
  const std::string cdir = checkpoint_dir(store, run, name);
  CAIRN_RETURN_IF_ERROR(env->sync_dir(cdir));
  {
    cairn::lock_guard lk(mu);
    if (synced.count(cdir)) return {};
  }
  const std::string rdir = storage::dirname_of(cdir);
  CAIRN_RETURN_IF_ERROR(env->sync_dir(rdir));
  CAIRN_RETURN_IF_ERROR(env->sync_dir(runs_dir(store)));
  CAIRN_RETURN_IF_ERROR(env->sync_dir(store));
  cairn::lock_guard lk(mu);
  synced.insert(cdir);
  return {};
}

namespace {

std::string parts_dir(const std::string& vdir, uint32_t attempt) {
  char b[32];
  std::snprintf(b, sizeof b, "parts.%08x", attempt);
  return storage::join(vdir, b);
}

// Node `index` of tree level `level`: level 0 holds the parts' records, level
// l > 0 a marker per complete group of kPartFanIn nodes of level l-1.
std::string node_name(uint32_t level, uint32_t index) {
  return (level == 0 ? "r." : "g" + std::to_string(level) + ".") + std::to_string(index);
}

// The committed_at of the MANIFEST at mpath if it lists exactly m's shards, else 0.
double committed_as(storage::storage_env* env, const std::string& mpath, const manifest& m) {
  if (!env->exists(mpath)) return 0;
  auto old = read_manifest(env, mpath);
  if (!old || old->nranks != m.nranks) return 0;
  for (uint32_t r = 0; r < m.nranks; ++r)
    if (old->shards[r].header_checksum != m.shards[r].header_checksum || old->shards[r].size != m.shards[r].size)
      return 0;
  return old->committed_at > 0 ? old->committed_at : 1e-9;
}

}  // namespace

result<double> write_commit(storage::storage_env* env, const std::string& store, manifest m) {
  const std::string mpath = manifest_path(store, m.run, m.name, m.version);
  // Committed already (by the last writer, which removed the records).
  if (double at = committed_as(env, mpath, m); at > 0) return at;
  CAIRN_RETURN_IF_ERROR(sync_version_parents(env, store, m.run, m.name));
  const std::string vdir = version_dir(store, m.run, m.name, m.version);
  // An aggregated version's data files were created by whichever writer came
  // first, and none of them synced the directory: their entries are made
  // durable before the MANIFEST that names them (a shard file's writer syncs
  // it after its rename).
  if (m.aggregated) CAIRN_RETURN_IF_ERROR(env->sync_dir(vdir));
  if (m.committed_at == 0) m.committed_at = util::wall_s();
  CAIRN_RETURN_IF_ERROR(env->write_atomic(mpath, encode_manifest(m), true, /*unique_tmp=*/true));
  // The part records of every attempt (a killed execution's too) served
  // their purpose: best effort, retention removes the directory anyway.
  if (auto names = env->list(vdir))
    for (const std::string& n : *names)
      if (n.rfind("parts.", 0) == 0) (void)env->remove_tree(storage::join(vdir, n));
  return m.committed_at;
}

result<bool> record_part(storage::storage_env* env, const std::string& store, const manifest& tmpl, uint32_t attempt,
                         const part_record& part) {
  const uint32_t n = tmpl.nranks;
  const std::string vdir = version_dir(store, tmpl.run, tmpl.name, tmpl.version);
  const std::string pdir = parts_dir(vdir, attempt);
  CAIRN_RETURN_IF_ERROR(env->make_dirs(pdir));
  uint32_t index = part.entry.rank;
  CAIRN_RETURN_IF_ERROR(env->write_atomic(storage::join(pdir, node_name(0, index)), encode_part(part), false, true));
  // Climb while this node's group is complete. Each writer creates its node
  // before it looks at its siblings, so of two writers that complete a group
  // at once, at least the later sees every node: a group is never left
  // unclimbed (both may climb: the commit is idempotent).
  uint32_t width = n;
  for (uint32_t level = 0; width > 1; ++level) {
    const uint32_t first = index / kPartFanIn * kPartFanIn;
    const uint32_t last = std::min(width, first + kPartFanIn);
    for (uint32_t i = first; i < last; ++i)
      if (i != index && !env->exists(storage::join(pdir, node_name(level, i)))) return false;
    index /= kPartFanIn;
    width = (width + kPartFanIn - 1) / kPartFanIn;
    if (width > 1) {
      auto f = env->create(storage::join(pdir, node_name(level + 1, index)), false);
      if (!f) return f.take_status();
      CAIRN_RETURN_IF_ERROR((*f)->close());
    }
  }
  // This writer completed the version.
  manifest m = tmpl;
  m.shards.clear();
  double protected_at = 0;
  bool all_protected = true;
  const std::string mpath = manifest_path(store, tmpl.run, tmpl.name, tmpl.version);
  for (uint32_t r = 0; r < n; ++r) {
    const std::string path = storage::join(pdir, node_name(0, r));
    auto text = env->read_all(path);
    // Another committer finished and removed the records.
    if (!text) return env->exists(mpath) ? result<bool>(false) : result<bool>(text.take_status());
    CAIRN_ASSIGN_OR_RETURN(part_record p, decode_part(*text, path));
    if (p.entry.rank != r)
      return status(errc::corruption, path + ": the record of rank " + std::to_string(p.entry.rank));
    protected_at = std::max(protected_at, p.protected_at);
    all_protected = all_protected && p.protected_at > 0;
    m.shards.push_back(std::move(p.entry));
  }
  if (m.redundancy) m.redundancy->protected_at = all_protected ? protected_at : 0;
  CAIRN_RETURN_IF_ERROR(write_commit(env, store, std::move(m)).take_status());
  return true;
}

status remove_version(storage::storage_env* env, const std::string& vdir) {
  // Another remover (a retention task beside this one, `cairn gc`) may take
  // the directory away at any point: that is the same outcome.
  auto gone = [&](status st) { return st.is_ok() || !env->exists(vdir) ? status() : st; };
  const std::string manifest = storage::join(vdir, kManifestName);
  if (env->exists(manifest)) {
    CAIRN_RETURN_IF_ERROR(env->remove_file(manifest));
    CAIRN_RETURN_IF_ERROR(gone(env->sync_dir(vdir)));
  }
  CAIRN_RETURN_IF_ERROR(env->remove_tree(vdir));
  return env->sync_dir(storage::dirname_of(vdir));
}

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
  CAIRN_RETURN_IF_ERROR(write_commit(env, store, std::move(m)).take_status());
  return true;
}

}  // namespace cairn::format

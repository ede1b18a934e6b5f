// Restart of client_impl: the candidates of every level, the version every
// rank can restore (agree_restartable), the verified load of this rank's
// shard (load_shard), the restore into the protected regions, the commit of
// a restored version its job never committed, and file mode. On another
// rank count: restart_reshard.cpp.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <optional>
#include <set>

#include "client/client.hpp"
#include "client/restart_checks.hpp"
#include "format/container.hpp"
#include "format/commit.hpp"
#include "format/layout.hpp"
#include "util/copy.hpp"
#include "util/names.hpp"

namespace cairn {

status image_fits_regions(const format::shard_header& h, const std::map<std::string, region>& regions,
                          const std::string& path) {
  for (const auto& d : h.regions) {
    auto it = regions.find(d.name);
    if (it == regions.end()) continue;
    const uint64_t mine = it->second.count * format::type_size(it->second.type);  // below 2^62 (protect)
    if (d.length > mine)
      return {errc::unusable, path + ": its region '" + d.name + "' holds " + std::to_string(d.length) +
                                  " bytes; this execution protected " + std::to_string(mine) +
                                  " under that name; not read (a checkpoint of another configuration, or a damaged "
                                  "header: protect the region with its checkpointed size, or use another run)"};
  }
  return {};
}

status image_fits_memory(uint64_t bytes, const std::string& path) {
  const uint64_t avail = util::available_memory();
  if (avail > 0 && bytes > avail)
    return {errc::no_space, path + ": its image needs " + std::to_string(bytes) + " bytes of memory; this node has " +
                                std::to_string(avail) + " available"};
  return {};
}

namespace {

// Reads a whole shard (compressed or not) and verifies it into *out; an
// uncompressed shard that can be mapped (`in_place`: the node-local level) is
// verified where it lies, not copied. `expect` (may be null) is the manifest
// entry the shard must match; it and the shard's identity are checked before
// any data are read. `file`: the shard, opened (a shard file, or the rank's
// image in an aggregated version); `path` names it.
status read_verified(result<std::unique_ptr<storage::readable_file>> file, const std::string& path, uint32_t rank,
                     uint32_t nranks, const std::string& name, int64_t version, const format::shard_entry* expect,
                     bool in_place, const std::map<std::string, region>& regions, format::shard_image* out) {
  const auto identity = format::shard_identity_check(path, rank, nranks, name, version, expect);
  // An image read into memory must fit in what the node has and in what the
  // protected regions can take: checked on the header, before anything is
  // allocated (a header that claims far more than its job ever wrote is
  // refused, not obeyed).
  const auto check = [&, in_place](const format::shard_header& h) -> status {
    CAIRN_RETURN_IF_ERROR(identity(h));
    if (in_place) return {};
    CAIRN_RETURN_IF_ERROR(image_fits_regions(h, regions, path));
    return image_fits_memory(h.file_size, path);
  };
  if (!file) return file.take_status();
  CAIRN_ASSIGN_OR_RETURN(*out, in_place ? format::map_shard_image(std::move(file).value(), path, check)
                                        : format::read_shard_image(std::move(file).value(), path, check));
  return {};
}

// restart_verify = while: opens a node-local shard and checks its header as
// read_verified does (identity, the MANIFEST's entry, the regions' fit), but
// reads none of its data: restore verifies them as it reads them into the
// regions. not_supported for a compressed shard (read_verified reads it).
// check_unverified makes those checks of an opened reader (a node-local
// shard, or a copy a level lends: agent memory).
result<std::unique_ptr<format::shard_reader>> check_unverified(result<std::unique_ptr<format::shard_reader>> rd,
                                                               uint32_t rank, uint32_t nranks, const std::string& name,
                                                               int64_t version, const format::shard_entry& expect,
                                                               const std::map<std::string, region>& regions) {
  if (!rd) return rd;
  const format::shard_header& h = rd.value()->header();
  const std::string& where = rd.value()->path();
  CAIRN_RETURN_IF_ERROR(format::shard_identity_check(where, rank, nranks, name, version, &expect)(h));
  if (h.compressed()) return status(errc::not_supported, where + ": compressed");
  CAIRN_RETURN_IF_ERROR(image_fits_regions(h, regions, where));
  return rd;
}

result<std::unique_ptr<format::shard_reader>> open_unverified(storage::storage_env* env, const std::string& path,
                                                              uint32_t rank, uint32_t nranks, const std::string& name,
                                                              int64_t version, const format::shard_entry& expect,
                                                              const std::map<std::string, region>& regions) {
  return check_unverified(format::shard_reader::open(env, path), rank, nranks, name, version, expect, regions);
}

}  // namespace

std::vector<int64_t> client_impl::local_candidates(const std::string& name) {
  const uint32_t me = static_cast<uint32_t>(rank());
  std::set<int64_t> out;
  if (cfg_.local_enabled) {
    for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name))
      if (env_->exists(format::shard_path(cfg_.scratch, cfg_.run, name, v, me))) out.insert(v);
  }
  for (int64_t v : format::list_versions(env_, cfg_.persistent, cfg_.run, name))
    if (env_->exists(format::manifest_path(cfg_.persistent, cfg_.run, name, v))) out.insert(v);
  for (const auto& l : levels_) l->candidates(name, &out);
  return {out.begin(), out.end()};
}

status client_impl::load_shard(const std::string& name, int64_t version, bool local, bool others, bool defer) {
  const uint32_t me = static_cast<uint32_t>(rank());
  const uint32_t n = static_cast<uint32_t>(size());
  restart_version_ = -1;
  restart_rebuilt_ = false;
  restart_unverified_.reset();
  reshard_.reset();
  std::string why;
  status worst;  // invalid_argument (rank count) is more useful to report than corruption
  // When the version is committed at the persistent level, its MANIFEST says
  // which shard is current: a local shard that differs is left over from an
  // earlier execution and must not be mixed in.
  std::string mpath = format::manifest_path(cfg_.persistent, cfg_.run, name, version);
  std::optional<format::manifest> committed = committed_manifest(name, version);
  // A deferred shard: its header is the restart's, its data are read by restore.
  auto keep_deferred = [&](std::unique_ptr<format::shard_reader> rd) -> status {
    restart_.header = rd->header();
    restart_unverified_ = std::move(rd);
    restart_name_ = name;
    restart_version_ = version;
    return {};
  };
  if (cfg_.local_enabled && local) {
    std::string path = format::shard_path(cfg_.scratch, cfg_.run, name, version, me);
    if (!others && !env_->exists(path)) return {errc::not_found, path + ": missing"};
    if (env_->exists(path)) {
      const format::shard_entry* expect = committed ? &committed->shards[me] : nullptr;
      // Deferred only when committed: the persistent level then holds the
      // same image (the MANIFEST's header checksum) to restore from if
      // the data turn out damaged.
      if (defer && committed) {
        auto rd = open_unverified(env_, path, me, n, name, version, *expect, regions_);
        if (rd) return keep_deferred(std::move(rd).value());
      }
      status st = read_verified(env_->open_read(path), path, me, n, name, version, expect, true, regions_, &restart_);
      if (st && !committed) st = written_by_this_store(restart_.header, path);
      if (!st) restart_ = format::shard_image();
      if (st) {
        restart_name_ = name;
        restart_version_ = version;
        return {};
      }
      if (!others) return st;  // the caller tries redundancy, then the rest
      std::fprintf(stderr, "cairn: rank %d: local copy of '%s' version %lld unusable, trying the persistent level: %s\n",
                   rank(), name.c_str(), static_cast<long long>(version), st.message().c_str());
      why = "local: " + st.message();
      worst = st;
    }
  }
  if (!others) return {errc::not_found, "no node-local copy"};
  // The levels that hold copies of their own (agent memory) next: faster
  // than the persistent level, and they may hold versions not written yet.
  for (const auto& l : levels_) {
    if (defer && committed) {
      // Deferred as a node-local shard is (committed: the persistent level
      // holds the image to fall back to), its data read by restore.
      auto rd = check_unverified(l->open_unverified(name, version), me, n, name, version, committed->shards[me],
                                 regions_);
      if (rd) return keep_deferred(std::move(rd).value());
    }
    status st = l->load(name, version, &restart_, &why);
    if (st) {
      restart_name_ = name;
      restart_version_ = version;
      return {};
    }
    if (st.code() != errc::not_found && worst.is_ok()) worst = st;
  }
  if (env_->exists(mpath)) {
    auto m = committed ? result<format::manifest>(*committed) : format::read_manifest(env_, mpath);
    status st;
    if (!m) {
      st = m.error();
    } else if (m->nranks != n) {
      st = status(errc::invalid_argument, mpath + ": version written by " + std::to_string(m->nranks) +
                                              " ranks; this job has " + std::to_string(n) +
                                              " (restart with the same number of ranks)");
    } else {
      // Straight from the shard file or the data files (aggregated): no copy to scratch first.
      const format::manifest* mf = &*m;
      st = read_verified(format::open_persistent_image(env_, cfg_.persistent, cfg_.run, name, version, me, mf),
                         format::persistent_image_where(cfg_.persistent, cfg_.run, name, version, me, mf), me, n,
                         name, version, &m->shards[me], false, regions_, &restart_);
    }
    if (st) {
      restart_name_ = name;
      restart_version_ = version;
      return {};
    }
    std::fprintf(stderr, "cairn: rank %d: persistent copy of '%s' version %lld unusable: %s\n", rank(),
                 name.c_str(), static_cast<long long>(version), st.message().c_str());
    why += (why.empty() ? "" : "; ") + std::string("persistent: ") + st.message();
    if (worst.is_ok() || st.code() == errc::invalid_argument) worst = st;
  }
  if (worst.is_ok()) worst = status(errc::not_found, "no copy at any level");
  return {worst.code(), "'" + name + "' version " + std::to_string(version) + ": " + why};
}

std::optional<format::manifest> client_impl::committed_manifest(const std::string& name, int64_t version) {
  const std::string mpath = format::manifest_path(cfg_.persistent, cfg_.run, name, version);
  if (!env_->exists(mpath)) return std::nullopt;
  auto m = format::read_manifest(env_, mpath);
  if (!m || m->nranks != static_cast<uint32_t>(size())) return std::nullopt;
  return std::move(m).value();
}

status client_impl::written_by_this_store(const format::shard_header& h, const std::string& where) const {
  // Not committed, and no execution of this run in this store wrote it:
  // another store's run of the same name shares the node-local directory.
  if (store_attempts_.empty() || store_attempts_.count(h.attempt)) return {};
  return {errc::unusable, where + ": written by an execution of run '" + cfg_.run +
                              "' that this store's RUN does not list (another store's run of the same name shares "
                              "the node-local directory); not restored"};
}

status client_impl::take_rebuilt(const std::string& name, int64_t version, format::shard_image image) {
  // Checked as a node-local shard is (read_verified; the rebuild verified
  // the checksums and that it is the image its set protected).
  const std::string where = "the shard of '" + name + "' version " + std::to_string(version) +
                            " rebuilt from redundancy";
  const std::optional<format::manifest> committed = committed_manifest(name, version);
  const uint32_t me = static_cast<uint32_t>(rank());
  CAIRN_RETURN_IF_ERROR(format::shard_identity_check(where, me, static_cast<uint32_t>(size()), name, version,
                                                     committed ? &committed->shards[me] : nullptr)(image.header));
  CAIRN_RETURN_IF_ERROR(image_fits_regions(image.header, regions_, where));
  if (!committed) CAIRN_RETURN_IF_ERROR(written_by_this_store(image.header, where));
  restart_ = std::move(image);
  restart_rebuilt_ = true;
  restart_name_ = name;
  restart_version_ = version;
  return {};
}

result<int64_t> client_impl::agree_restartable(const std::string& name, int64_t max_version) {
  std::vector<int64_t> cands = local_candidates(name);
  // A bound (cairn_restart_test_max): versions above it do not exist for
  // this question, so none below it is "not found", not "unusable".
  if (max_version >= 0) cands.erase(std::upper_bound(cands.begin(), cands.end(), max_version), cands.end());
  for (const auto& l : levels_) CAIRN_RETURN_IF_ERROR(l->restart_allowed(name));
  level* rebuilder = nullptr;  // a level that rebuilds lost node-local shards
  for (const auto& l : levels_)
    if (l->rebuilds()) rebuilder = l.get();
  // Damaged at every level (found by a restart that verified while it
  // copied): not offered again until a checkpoint replaces them.
  std::set<int64_t> excluded = damaged_[name];
  int64_t cap = max_version >= 0 ? max_version : INT64_MAX;
  status newest_failure;  // why the newest version some rank has was rejected
  for (;;) {
    // Newest version <= cap that this rank has and has not been excluded.
    int64_t mine = -1;
    for (auto it = cands.rbegin(); it != cands.rend(); ++it)
      if (*it <= cap && !excluded.count(*it)) { mine = *it; break; }
    int64_t g = comm_->min(mine);
    if (g < 0) return nothing_restartable(name, cands, newest_failure);
    cap = g;
    if (comm_->min(mine == g ? 1 : 0) == 0) continue;  // some rank lacks g: look lower
    if (marked_damaged(name, g)) {
      // An earlier cairn_restart found every copy damaged: not read again.
      excluded.insert(g);
      damaged_[name].insert(g);
      if (newest_failure.is_ok())
        newest_failure = status(errc::corruption, "'" + name + "' version " + std::to_string(g) +
                                                      ": an earlier restart found every copy damaged (" +
                                                      format::damaged_path(cfg_.persistent, cfg_.run, name, g) + ")");
      continue;
    }
    status st;
    if (auto m = other_rank_count(name, g)) {
      // Written by another rank count: redistributed by the regions' global
      // layout. When the regions are protected already, their bytes are read
      // and verified now, so that a damaged version is skipped here.
      st = agree(plan_reshard(name, g, std::move(*m)));
      if (st && comm_->min(regions_.empty() || !check_reshard_regions(name, g) ? 0 : 1) == 1)
        st = agree(reshard_read(name, g));
      if (st) {
        restart_name_ = name;
        restart_version_ = g;
        return g;
      }
    } else if (rebuilder) {
      // The node-local shard; where some rank's is missing or corrupt, its
      // set's survivors rebuild it; failing that, the other levels.
      status mine = load_shard(name, g, true, false, defer_verification());
      if (comm_->min(mine ? 1 : 0) == 0) {
        // The rebuild exposes the survivors' verified images: a shard
        // whose verification was deferred is verified now (damaged, its
        // rank is rebuilt too).
        if (restart_unverified_) mine = load_shard(name, g, true, false);
        const bool had = mine.is_ok();
        format::shard_image image;
        status rebuilt = rebuilder->rebuild(name, g, had ? &restart_ : nullptr, &image);
        if (!had && rebuilt) mine = take_rebuilt(name, g, std::move(image));
        if (!had && !mine) mine = load_shard(name, g, false, true);
      }
      st = agree(mine);
    } else {
      st = agree(load_shard(name, g, true, true, defer_verification()));
    }
    if (st) {
      // Every rank's copy must come from the same execution: after a failure,
      // copies of a version number the failed execution left behind (local
      // shards, agent memory) can differ between ranks.
      int64_t a = restart_.header.attempt;
      std::vector<int64_t> v = {a, -a};
      comm_->allreduce_min(v);
      if (v[0] == -v[1]) return g;
      st = status(errc::corruption, "'" + name + "' version " + std::to_string(g) +
                                        ": the ranks' copies come from different executions");
    }
    if (newest_failure.is_ok()) newest_failure = st;
    excluded.insert(g);
    // Damaged beyond repair at every level: the only version number a later
    // checkpoint of this execution may write again (see floor_of).
    if (st.code() == errc::corruption) damaged_[name].insert(g);
    restart_version_ = -1;
    restart_ = format::shard_image();
    restart_unverified_.reset();
    restart_rebuilt_ = false;
    reshard_.reset();
  }
}

status client_impl::nothing_restartable(const std::string& name, const std::vector<int64_t>& cands,
                                        const status& newest_failure) {
  // "No checkpoint" only when nothing exists that a job of the right shape
  // could restore: a committed version (MANIFEST) or a shard written by
  // another rank count makes it "checkpoints this job cannot use".
  bool committed = false;
  for (auto v = cands.rbegin(); v != cands.rend() && !committed; ++v)
    committed = env_->exists(format::manifest_path(cfg_.persistent, cfg_.run, name, *v));
  std::string other_shape;
  const uint32_t me = static_cast<uint32_t>(rank());
  if (cfg_.local_enabled) {
    for (auto v = cands.rbegin(); v != cands.rend() && other_shape.empty(); ++v) {
      auto h = format::read_header(env_, format::shard_path(cfg_.scratch, cfg_.run, name, *v, me));
      if (h && h->nranks != static_cast<uint32_t>(size()))
        other_shape = "local shards of version " + std::to_string(*v) + " were written by " +
                      std::to_string(h->nranks) + " ranks; this job has " + std::to_string(size());
    }
  }
  std::vector<int64_t> ev = {committed ? 0 : 1, other_shape.empty() ? 1 : 0};
  comm_->allreduce_min(ev);
  const std::string shape = ev[1] == 0 ? exchange_message(!other_shape.empty(), other_shape) : std::string();
  std::string looked = (cfg_.local_enabled ? cfg_.scratch + ", " : std::string()) + cfg_.persistent;
  for (const auto& l : levels_)
    if (!l->where().empty()) looked += " and " + l->where();
  std::string msg = "no restartable version of checkpoint '" + name + "' in run '" + cfg_.run + "' (looked in " +
                    looked + ")";
  if (ev[0] == 1 && ev[1] == 1) {
    if (!newest_failure.is_ok()) msg += "; newest rejected: " + newest_failure.message();
    return {errc::not_found, msg};
  }
  msg = "run '" + cfg_.run + "' has checkpoints of '" + name + "' that this job cannot restore (newest: " +
        (!newest_failure.is_ok() ? newest_failure.message() : ev[1] == 0 ? shape : msg) +
        "). Relaunch with the rank count that wrote them, repair or remove them ('cairn verify', 'cairn gc'), or "
        "use another run (CAIRN_RUN) to start fresh; nothing was changed";
  return {errc::unusable, msg};
}

result<int64_t> client_impl::restart_test(const std::string& name, int64_t max_version) {
  CAIRN_RETURN_IF_ERROR(check_name("checkpoint", name));
  auto v = [&] {
    engine::staging_pause pause(pool_);
    return agree_restartable(name, max_version);
  }();
  restart_asked_ = true;
  if (!v) restart_phase_over();  // no restart follows
  return v;
}

status client_impl::restart(const std::string& name, int64_t version) {
  drain_capture();  // a background copy reads the regions the restart writes
  status st = [&] {
    engine::staging_pause pause(pool_);
    return restore(name, version);
  }();
  if (st) adopt_local_versions(name, version);
  restart_phase_over();
  return st;
}

status client_impl::restore(const std::string& name, int64_t version) {
  CAIRN_RETURN_IF_ERROR(check_name("checkpoint", name));
  // Use the image restart_test verified, or load and verify now (collectively).
  bool cached = restart_name_ == name && restart_version_ == version;
  if (comm_->min(cached ? 1 : 0) == 0) {
    restart_version_ = -1;
    reshard_.reset();
    if (auto m = other_rank_count(name, version)) CAIRN_RETURN_IF_ERROR(agree(plan_reshard(name, version, std::move(*m))));
    else CAIRN_RETURN_IF_ERROR(agree(load_shard(name, version, true, true, defer_verification())));
  }
  if (reshard_) return restart_resharded(name, version);

  // Check every protected region against the checkpoint before touching any.
  status st;
  for (auto& entry : regions_) {
    const std::string& rname = entry.first;  // (clang 14 cannot capture a structured binding)
    auto& r = entry.second;
    auto it = std::find_if(restart_.header.regions.begin(), restart_.header.regions.end(),
                           [&](const format::region_desc& d) { return d.name == rname; });
    if (it == restart_.header.regions.end()) {
      st = status(errc::invalid_argument, "region '" + rname + "' is protected but not in '" + name + "' version " +
                                              std::to_string(version));
      break;
    }
    if (it->type == r.type && it->count == r.count && it->dims != r.dims && !it->dims.empty() && !r.dims.empty()) {
      st = status(errc::invalid_argument, "region '" + rname + "': protected with another shape than checkpointed; "
                                          "buffers left untouched");
      break;
    }
    if (it->type != r.type || it->count != r.count) {
      st = status(errc::invalid_argument,
                  "region '" + rname + "': protected as " + std::to_string(r.count) + " x " +
                      format::type_name(r.type) + " (" + std::to_string(r.count * format::type_size(r.type)) +
                      " bytes) but checkpointed as " + std::to_string(it->count) + " x " +
                      format::type_name(it->type) + " (" + std::to_string(it->length) +
                      " bytes); buffers left untouched");
      break;
    }
  }
  if (st && regions_.empty() && !files_)
    st = status(errc::invalid_argument, "cairn_restart: no region is protected (call cairn_protect first)");
  CAIRN_RETURN_IF_ERROR(agree(st));
  // Ranks whose node-local shard was deferred verify it now; the others
  // (a shard from another level, or verified before) copy the image.
  if (restart_unverified_) st = restore_unverified(name, version);
  else copy_restart_image();
  st = agree(st);
  if (!st) {
    // Damaged at every level: restart_test offers it no more, and a
    // checkpoint of this execution may replace it (check_committed_floor).
    if (st.code() == errc::corruption) {
      damaged_[name].insert(version);
      mark_damaged(name, version, st.message());
    }
    floors_.erase(name);
    restart_version_ = -1;
    restart_unverified_.reset();
    restart_ = format::shard_image();
    return st;
  }
  // Versions continue after the restored one.
  last_version_[name] = version;
  if (!files_) {
    restart_version_ = -1;
    if (commit_restored(name, version)) return {};
    release_restart_image();
  }
  return {};
}

bool client_impl::marked_damaged(const std::string& name, int64_t version) {
  int64_t marked = 0;
  if (rank() == 0) marked = env_->exists(format::damaged_path(cfg_.persistent, cfg_.run, name, version)) ? 1 : 0;
  return -comm_->min(-marked) == 1;
}

void client_impl::mark_damaged(const std::string& name, int64_t version, const std::string& why) {
  // Only a committed version has a directory at the persistent level to
  // record it in; the next execution's restart_test then skips it too.
  if (rank() != 0 || !env_->exists(format::manifest_path(cfg_.persistent, cfg_.run, name, version))) return;
  const std::string path = format::damaged_path(cfg_.persistent, cfg_.run, name, version);
  status st = env_->write_atomic(path, "every copy found damaged by cairn_restart: " + why + "\n", true);
  if (!st)
    std::fprintf(stderr, "cairn: warning: could not record that '%s' version %lld is damaged at every level (%s); a "
                         "later execution's restart_test may offer it again\n", name.c_str(),
                 static_cast<long long>(version), st.to_string().c_str());
}

bool client_impl::defer_verification() const { return cfg_.restart_verify == restart_verification::during; }

void client_impl::copy_restart_image() {
  for (auto& entry : regions_) {
    const std::string& rname = entry.first;  // (clang 14 cannot capture a structured binding)
    auto& r = entry.second;
    auto it = std::find_if(restart_.header.regions.begin(), restart_.header.regions.end(),
                           [&](const format::region_desc& d) { return d.name == rname; });
    if (!r.mem_shape.empty()) {
      // Only read (to_contiguous = false): the image may be a read-only mapping.
      copy_block(const_cast<std::byte*>(restart_.bytes().data()) + it->offset, static_cast<std::byte*>(r.ptr),
                 format::type_size(r.type), row_major_dims(r), r.mem_shape, r.mem_start, false);
    } else if (it->length) {
      util::stream_copy(r.ptr, restart_.bytes().data() + it->offset, it->length);
    }
  }
}

status client_impl::restore_unverified(const std::string& name, int64_t version) {
  // Kept until the image is released: a restart_begin/end sequence may call
  // cairn_restart again (cairn.pytorch reads its state region first).
  format::shard_reader* rd = restart_unverified_.get();
  const format::shard_header h = restart_.header;
  // Regions laid out in memory as blocks of a larger array are copied from
  // a whole verified image (copy_block), not read in place.
  const bool in_place = std::all_of(regions_.begin(), regions_.end(),
                                    [](const auto& e) { return e.second.mem_shape.empty(); });
  status st;
  for (size_t i = 0; in_place && st && i < h.regions.size(); ++i) {
    auto it = regions_.find(h.regions[i].name);
    if (it != regions_.end() && h.regions[i].length)
      st = rd->read_region(i, std::span<std::byte>(static_cast<std::byte*>(it->second.ptr), h.regions[i].length));
  }
  if (in_place && st) return {};
  if (!st) {
    const bool local = rd->path() == format::shard_path(cfg_.scratch, cfg_.run, name, version, rank());
    const std::string copy = local ? "node-local copy of '" + name + "' version " + std::to_string(version)
                                   : rd->path();
    std::fprintf(stderr, "cairn: rank %d: %s damaged (%s); restoring it from the next level\n", rank(), copy.c_str(),
                 st.message().c_str());
  }
  // The node-local copy verified whole (not in place), else the next level
  // that holds the image the MANIFEST names.
  status again = load_shard(name, version, !in_place, true);
  if (again && restart_.header.header_checksum != h.header_checksum)
    again = status(errc::corruption, "the copy found holds another image than the node-local shard's header names");
  if (!again) {
    const std::string part = st ? std::string() : st.message() + "; ";
    const std::string regions = in_place ? "the protected regions now hold part of it" : "buffers left untouched";
    return {again.code() == errc::not_found ? errc::corruption : again.code(),
            "'" + name + "' version " + std::to_string(version) + ": " + part + again.message() + "; " + regions +
                " (call cairn_restart_test again for an older version)"};
  }
  copy_restart_image();
  return {};
}

status client_impl::store_rebuilt(const format::shard_image& img) {
  const auto& h = img.header;
  const std::string path = format::shard_path(cfg_.scratch, cfg_.run, h.name, h.version, h.rank);
  status st = engine::write_shard_file(env_, path, img.bytes().data(), h.file_size, false, false);
  if (!st)
    std::fprintf(stderr, "cairn: rank %u: the shard of '%s' version %lld rebuilt from redundancy could not be stored "
                         "at the node-local level (%s); a later restart rebuilds it again\n",
                 h.rank, h.name.c_str(), static_cast<long long>(h.version), st.to_string().c_str());
  return {};  // the application has its data: this only puts the node-local copy back
}

bool client_impl::commit_restored(const std::string& name, int64_t version) {
  // Only what the node-local level held of this job's shape (file per
  // process; a level that keeps its own copies keeps what it restored).
  if (!cfg_.local_enabled || !engine_ ||
      std::any_of(levels_.begin(), levels_.end(), [](const auto& l) { return l->keeps_restored(); }))
    return false;
  int64_t committed = 1;
  if (rank() == 0) committed = env_->exists(format::manifest_path(cfg_.persistent, cfg_.run, name, version)) ? 1 : 0;
  if (comm_->min(committed) == 1) return false;
  // Never committed (its job died first): each rank writes the image it
  // restored to the persistent level and records its part; the last one
  // commits it, so the run is consistent and a node loss cannot take it.
  engine::version_job job;
  job.header = restart_.header;
  job.wanted = CAIRN_LEVEL_PERSISTENT;
  format::manifest tmpl = describe_version(job);
  format::part_record part;
  part.entry.rank = restart_.header.rank;
  part.entry.size = restart_.header.file_size;
  part.entry.header_checksum = restart_.header.header_checksum;
  part.entry.host = host_;
  auto img = std::make_shared<format::shard_image>(std::move(restart_));
  restart_ = format::shard_image();
  storage::storage_env* env = rate_env_ ? rate_env_.get() : env_;
  engine_->submit_task(
      [this, img, env, tmpl = std::move(tmpl), part, attempt = job.header.attempt,
       rebuilt = std::exchange(restart_rebuilt_, false)]() mutable -> status {
        const auto& h = img->header;
        if (rebuilt) (void)store_rebuilt(*img);
        const std::string path = format::shard_path(cfg_.persistent, h.run, h.name, h.version, h.rank);
        status st = engine::write_shard_file(env, path, img->bytes().data(), h.file_size, false, true, "");
        if (st) st = format::record_part(env_, cfg_.persistent, tmpl, attempt, part).take_status();
        img.reset();
        if (!st)
          std::fprintf(stderr, "cairn: warning: '%s' version %lld, restored from the node-local level, was never "
                               "committed and could not be committed now (%s); it stays at the node-local level only\n",
                       h.name.c_str(), static_cast<long long>(h.version), st.to_string().c_str());
        return {};
      },
      engine::task_priority::low);
  return true;
}

void client_impl::release_restart_image() {
  restart_unverified_.reset();
  if (std::exchange(restart_rebuilt_, false) && restart_.image.size() > 0) {
    // Rebuilt from redundancy: restored from memory, stored at the node-local
    // level afterwards (by an engine task, while the application goes on).
    auto img = std::make_shared<format::shard_image>(std::move(restart_));
    restart_ = format::shard_image();
    if (engine_) engine_->submit_task([this, img]() { return store_rebuilt(*img); }, engine::task_priority::low);
    else (void)store_rebuilt(*img);
    return;
  }
  // Unmapping a node-local shard's 512 MiB takes 14 ms here (its page
  // tables): an engine task does it, after the application got its data.
  if (engine_ && restart_.mapped) {
    auto img = std::make_shared<format::shard_image>(std::move(restart_));
    engine_->submit_task([img]() mutable -> status {
      img.reset();
      return {};
    }, engine::task_priority::low);
  } else if (restart_.image.size() > 0) {
    // An image read into memory is faulted in and the size of this
    // checkpoint's shard: the staging slot of the execution's first
    // checkpoint, which then blocks like the later ones.
    if (auto slots = staging_slots(restart_.header.name, restart_.image.size()))
      (void)pool_.adopt(std::move(restart_.image), *slots);
  }
  restart_ = format::shard_image();
}

// ---- file mode -------------------------------------------------------------

std::string client_impl::files_dir() const {
  // Per execution (its attempt tag): a second execution never removes a
  // first one's routed files (docs/design/run-identity.md).
  char attempt[16];
  std::snprintf(attempt, sizeof attempt, "%08x", attempt_);
  return storage::join(cfg_.local_enabled ? cfg_.scratch : cfg_.persistent,
                       "files/" + cfg_.run + "/" + attempt);
}

status client_impl::checkpoint_begin(const std::string& name, int64_t version) {
  if (files_) return {errc::invalid_argument, "a file-mode sequence is already open (call the matching _end)"};
  CAIRN_RETURN_IF_ERROR(check_name("checkpoint", name));
  file_mode fm;
  fm.name = name;
  fm.version = version;
  fm.dir = storage::join(files_dir(), name + ".v" + std::to_string(version) + ".rank" + std::to_string(rank()));
  status st = env_->remove_tree(fm.dir);
  if (st) st = env_->make_dirs(fm.dir);
  CAIRN_RETURN_IF_ERROR(agree(st));
  files_ = std::move(fm);
  return {};
}

result<std::string> client_impl::route_file(const std::string& file) {
  if (!files_) return status(errc::invalid_argument, "cairn_route_file outside a checkpoint/restart begin-end sequence");
  std::string base = file.substr(file.find_last_of('/') == std::string::npos ? 0 : file.find_last_of('/') + 1);
  if (base.empty() || base == "." || base == "..")
    return status(errc::invalid_argument, "cairn_route_file: '" + file + "' has no file name");
  if (files_->restarting) {
    auto& regs = restart_.header.regions;
    if (std::none_of(regs.begin(), regs.end(), [&](auto& d) { return d.name == "file:" + base; }))
      return status(errc::not_found, "file '" + base + "' is not in '" + files_->name + "' version " +
                                         std::to_string(files_->version));
  } else if (std::find(files_->files.begin(), files_->files.end(), base) == files_->files.end()) {
    files_->files.push_back(base);
  }
  return storage::join(files_->dir, base);
}

status client_impl::checkpoint_end(bool success) {
  if (!files_ || files_->restarting) return {errc::invalid_argument, "cairn_checkpoint_end without cairn_checkpoint_begin"};
  file_mode fm = std::move(*files_);
  files_.reset();
  // Every routed file, mapped (capture copies it from the page cache into a
  // staging slot: no copy into fresh memory first), else read; a missing one
  // is an error of this rank.
  std::vector<std::unique_ptr<storage::readable_file>> mapped;
  std::vector<std::string> read;
  read.reserve(fm.files.size());  // spans point into these strings: never moved
  std::vector<std::span<const std::byte>> contents;
  static const std::byte kEmpty[1] = {};  // an empty file's region: a valid pointer, no bytes
  status st = success ? status() : status(errc::cancelled, "the application reported failure to cairn_checkpoint_end");
  for (size_t i = 0; st && i < fm.files.size(); ++i) {
    const std::string path = storage::join(fm.dir, fm.files[i]);
    auto f = env_->open_read(path);
    if (!f) {
      st = f.error().with_context("routed file '" + fm.files[i] + "' was not written");
      break;
    }
    std::span<const std::byte> bytes = (*f)->size() > 0 ? (*f)->map() : std::span<const std::byte>(kEmpty, 0);
    if (bytes.empty() && (*f)->size() > 0) {
      auto data = env_->read_all(path);
      if (!data) {
        st = data.error().with_context("routed file '" + fm.files[i] + "'");
        break;
      }
      read.push_back(std::move(data).value());
      bytes = std::as_bytes(std::span<const char>(read.back()));
    }
    mapped.push_back(std::move(f).value());
    contents.push_back(bytes);
  }
  st = agree(st);
  std::vector<region> regs;
  if (st) {
    for (size_t i = 0; i < fm.files.size(); ++i) {
      region r;
      r.name = "file:" + fm.files[i];
      // Capture only reads a region (a mapping is read-only).
      r.ptr = const_cast<std::byte*>(contents[i].data());
      r.count = contents[i].size();
      r.type = CAIRN_BYTE;
      regs.push_back(std::move(r));
    }
    if (regs.empty()) st = agree(status(errc::invalid_argument, "cairn_checkpoint_end: no file was routed"));
  }
  if (st) st = capture(fm.name, fm.version, regs, false);  // the mappings go below
  (void)env_->remove_tree(fm.dir);  // the files now live in the shard
  return st;
}

status client_impl::restart_begin(const std::string& name, int64_t version) {
  if (files_) return {errc::invalid_argument, "a file-mode sequence is already open (call the matching _end)"};
  CAIRN_RETURN_IF_ERROR(check_name("checkpoint", name));
  engine::staging_pause pause(pool_);
  // A shard restart_test left unverified (restart_verify = while) is
  // loaded again, verified, when it holds routed files (they are written
  // from a whole image); its memory regions alone are read in place by
  // cairn_restart, as outside a sequence (the VELOC drop-in's restart).
  const auto& regs = restart_.header.regions;
  const bool files_in_it =
      std::any_of(regs.begin(), regs.end(), [](const format::region_desc& d) { return d.name.rfind("file:", 0) == 0; });
  bool cached = restart_name_ == name && restart_version_ == version && !(restart_unverified_ && files_in_it);
  if (comm_->min(cached ? 1 : 0) == 0) {
    reshard_.reset();
    if (auto m = other_rank_count(name, version)) {
      CAIRN_RETURN_IF_ERROR(agree(plan_reshard(name, version, std::move(*m))));
      restart_name_ = name;
      restart_version_ = version;
    } else {
      CAIRN_RETURN_IF_ERROR(agree(load_shard(name, version)));
    }
  }
  file_mode fm;
  fm.restarting = true;
  fm.name = name;
  fm.version = version;
  fm.dir = storage::join(files_dir(),
                         name + ".v" + std::to_string(version) + ".rank" + std::to_string(rank()) + ".restore");
  status st = env_->remove_tree(fm.dir);
  if (st) st = env_->make_dirs(fm.dir);
  for (auto& d : restart_.header.regions) {
    if (!st) break;
    if (d.name.rfind("file:", 0) != 0) continue;
    // One file name in this execution's directory, never a path out of it
    // (the header's names were checked; "file:.." would still climb).
    const std::string base = d.name.substr(5);
    st = util::check_name("routed file", base);
    if (!st) {
      st = status(errc::corruption, "checkpoint '" + name + "' version " + std::to_string(version) + ": " +
                                        st.message() + " (the shard is damaged or forged; nothing was written)");
      break;
    }
    // Straight from the verified image: no copy into fresh memory first.
    st = env_->write_atomic(storage::join(fm.dir, base),
                            std::string_view(reinterpret_cast<const char*>(restart_.bytes().data() + d.offset), d.length),
                            false);
  }
  CAIRN_RETURN_IF_ERROR(agree(st));
  last_version_[name] = version;
  files_ = std::move(fm);
  return {};
}

status client_impl::restart_end(bool) {
  if (!files_ || !files_->restarting) return {errc::invalid_argument, "cairn_restart_end without cairn_restart_begin"};
  (void)env_->remove_tree(files_->dir);
  files_.reset();
  restart_version_ = -1;
  release_restart_image();
  reshard_.reset();
  restart_phase_over();
  return {};
}

result<uint64_t> client_impl::restart_region_size(const std::string& region) const {
  if (!files_ || !files_->restarting)
    return status(errc::invalid_argument, "cairn_restart_region_size outside a cairn_restart_begin/end sequence");
  if (reshard_)
    if (auto size = resharded_region_size(region)) return *size;
  for (const auto& d : restart_.header.regions)
    if (d.name == region) return d.length;
  return status(errc::not_found, "region '" + region + "' is not in '" + files_->name + "' version " +
                                     std::to_string(files_->version));
}

}  // namespace cairn

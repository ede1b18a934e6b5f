// Restart on another rank count (docs/design/reshard.md): the plan from
// every writing rank's header, the check of the protected regions against
// it, the read that verifies every byte it redistributes, and the restore.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include "client/client.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/reshard.hpp"
#include "util/copy.hpp"
#include "util/hash.hpp"

namespace cairn {

namespace {

// Row-major view of a storage-order vector (reversed for column-major data).
std::vector<uint64_t> row_major(std::vector<uint64_t> v, bool column_major) {
  if (column_major) std::reverse(v.begin(), v.end());
  return v;
}

std::string dims_text(const std::vector<uint64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const format::region_desc* find_region(const format::shard_header& h, const std::string& name) {
  for (const auto& d : h.regions)
    if (d.name == name) return &d;
  return nullptr;
}

// A range of an old rank's image read whole and verified against `hash`
// (a hash-tree leaf, a container extent's checksum or the region's checksum).
struct check_unit {
  uint64_t offset = 0, length = 0, hash = 0;
  const char* what = "";
  bool operator<(const check_unit& o) const { return offset < o.offset; }
};

}  // namespace

struct client_impl::reshard_state {
  format::manifest m;                     // written by m.nranks ranks
  std::vector<format::shard_header> old;  // every writing rank's header
  std::map<std::string, format::reshard_region> regions;
  // reshard_read's result: per protected region, this rank's block (row-major,
  // contiguous), verified; `key` records the protection it was read for.
  struct staged_block {
    std::string key;
    std::unique_ptr<std::byte[]> bytes;  // size bytes, not zeroed: every byte is written by reshard_read
    size_t size = 0;
  };
  std::map<std::string, staged_block> staged;
  uint64_t bytes_read = 0, bytes_needed = 0;
};

namespace {
std::string protection_key(const region& r) {
  return std::to_string(r.type) + dims_text(r.global) + dims_text(r.start) + dims_text(r.dims) +
         std::to_string(r.count) + (r.column_major ? "F" : "C");
}
}  // namespace

std::optional<format::manifest> client_impl::other_rank_count(const std::string& name, int64_t version) {
  std::string mpath = format::manifest_path(cfg_.persistent, cfg_.run, name, version);
  if (!env_->exists(mpath)) return std::nullopt;
  auto m = format::read_manifest(env_, mpath);
  if (!m || m->nranks == static_cast<uint32_t>(size()) || m->shards.size() != m->nranks) return std::nullopt;
  return std::move(m).value();
}

status client_impl::plan_reshard(const std::string& name, int64_t version, format::manifest m) {
  reshard_.reset();
  restart_ = format::shard_image();
  restart_unverified_.reset();
  restart_rebuilt_ = false;
  const uint32_t old_n = m.nranks;
  // Rank 0 reads every old rank's header (one small read each) and sends the
  // raw bytes to the others: N headers read once, not N x M times.
  std::string blob;
  if (rank() == 0) {
    std::vector<std::string> raw;
    auto hs = format::read_version_headers(env_, cfg_.persistent, cfg_.run, m, &raw);
    if (!hs) {
      blob = "E" + std::to_string(static_cast<int>(hs.error().code())) + ":" + hs.error().message();
    } else {
      blob = "H";
      for (const auto& b : raw) {
        uint32_t len = static_cast<uint32_t>(b.size());
        blob.append(reinterpret_cast<const char*>(&len), sizeof len);
        blob += b;
      }
    }
  }
  comm_->broadcast(&blob, 0);
  if (blob.empty()) return {errc::internal, "restart on another rank count: no header data from rank 0"};
  if (blob[0] == 'E') {
    size_t colon = blob.find(':');
    return {static_cast<errc>(std::stoi(blob.substr(1, colon - 1))), blob.substr(colon + 1)};
  }
  auto rs = std::make_shared<reshard_state>();
  size_t pos = 1;
  for (uint32_t k = 0; k < old_n; ++k) {
    uint32_t len = 0;
    if (pos + sizeof len > blob.size()) return {errc::internal, "restart on another rank count: short header data"};
    std::memcpy(&len, blob.data() + pos, sizeof len);
    pos += sizeof len;
    auto h = format::decode_header(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(blob.data() + pos), len),
        format::persistent_image_where(cfg_.persistent, cfg_.run, name, version, k, &m));
    if (!h) return h.take_status();
    pos += len;
    rs->old.push_back(std::move(h).value());
  }
  // The same decision on every rank: every rank decides from the same headers.
  CAIRN_ASSIGN_OR_RETURN(rs->regions,
                         format::plan_regions(rs->old, static_cast<uint32_t>(size()),
                                              "'" + name + "' version " + std::to_string(version)));
  rs->m = std::move(m);
  reshard_ = std::move(rs);
  return {};
}

status client_impl::check_reshard_regions(const std::string& name, int64_t version) {
  if (regions_.empty()) return {errc::invalid_argument, "cairn_restart: no region is protected (call cairn_protect first)"};
  const std::string ver = "'" + name + "' version " + std::to_string(version);
  for (const auto& [rname, r] : regions_) {
    auto it = reshard_->regions.find(rname);
    if (it == reshard_->regions.end())
      return {errc::invalid_argument, "region '" + rname + "' is protected but not in " + ver};
    const format::reshard_region& rr = it->second;
    if (rr.block) {
      if (r.global != rr.global || r.type != rr.type || r.column_major != rr.column_major)
        return {errc::invalid_argument,
                "region '" + rname + "' of " + ver + " is a block of a global array " + dims_text(rr.global) +
                    " of " + format::type_name(rr.type) + " written by " + std::to_string(reshard_->m.nranks) +
                    " ranks: to restore it on " + std::to_string(size()) +
                    " ranks, protect it with cairn_protect_block with the same global shape, type and storage "
                    "order (protected: " + (r.global.empty() ? std::string("no global layout") : dims_text(r.global)) +
                    " of " + format::type_name(r.type) + "); buffers left untouched"};
    } else if (r.type != rr.type || r.count != rr.count) {
      return {errc::invalid_argument, "region '" + rname + "': protected as " + std::to_string(r.count) + " x " +
                                          format::type_name(r.type) + " but checkpointed as " +
                                          std::to_string(rr.count) + " x " + format::type_name(rr.type) +
                                          "; buffers left untouched"};
    }
  }
  return {};
}

// Longer than 120 lines for a reason: it plans what to read from each old
// rank, then reads each old rank's pieces, verifying every checked unit once
// before copying it into the regions' staged blocks; the steps share the
// plan and the staged blocks.
status client_impl::reshard_read(const std::string& name, int64_t version) {
  reshard_state& rs = *reshard_;
  rs.staged.clear();
  rs.bytes_read = rs.bytes_needed = 0;
  const uint32_t old_n = rs.m.nranks;
  // What to read from each old rank: (region, runs).
  struct piece {
    const region* r;
    const format::region_desc* d;
    std::vector<format::copy_run> runs;
  };
  std::vector<std::vector<piece>> from(old_n);
  for (const auto& [rname, r] : regions_) {
    const format::reshard_region& rr = rs.regions.at(rname);
    const size_t es = format::type_size(r.type);
    auto& sb = rs.staged[rname];
    sb.key = protection_key(r);
    sb.size = r.count * es;
    sb.bytes.reset(new std::byte[sb.size]);
    rs.bytes_needed += r.count * es;
    if (!rr.block) {
      // The same bytes on every old rank: spread the reads over them.
      uint32_t k = static_cast<uint32_t>(rank()) % old_n;
      const format::region_desc* d = find_region(rs.old[k], rname);
      if (d->length) from[k].push_back({&r, d, {{0, 0, d->length}}});
      continue;
    }
    const auto n_start = row_major(r.start, r.column_major), n_dims = row_major_dims(r);
    uint64_t covered = 0;
    std::vector<std::pair<std::vector<uint64_t>, std::vector<uint64_t>>> boxes;  // old blocks that overlap
    bool disjoint = true;
    for (uint32_t k = 0; k < old_n; ++k) {
      const format::region_desc* d = find_region(rs.old[k], rname);
      piece p{&r, d, {}};
      auto o_start = row_major(d->start, rr.column_major), o_dims = row_major(d->dims, rr.column_major);
      covered += format::overlap_runs(o_start, o_dims, n_start, n_dims, es, &p.runs);
      if (p.runs.empty()) continue;
      // The old blocks this rank reads must not overlap one another (then,
      // with `covered`, every byte of the new block is written exactly once).
      for (const auto& [bs, bd] : boxes) {
        bool apart = false;
        for (size_t i = 0; i < bs.size(); ++i)
          apart |= o_start[i] >= bs[i] + bd[i] || bs[i] >= o_start[i] + o_dims[i];
        disjoint &= apart;
      }
      boxes.push_back({std::move(o_start), std::move(o_dims)});
      from[k].push_back(std::move(p));
    }
    if (covered != r.count || !disjoint)
      return {errc::corruption, "region '" + rname + "' of '" + name + "' version " + std::to_string(version) +
                                    ": the old blocks " + (disjoint ? "cover " + std::to_string(covered) +
                                                                          " of this rank's " +
                                                                          std::to_string(r.count) + " elements"
                                                                    : std::string("overlap one another"))};
  }
  const std::string vdir = format::version_dir(cfg_.persistent, cfg_.run, name, version);
  // One read buffer for every piece, grown as needed (not zeroed: only the
  // bytes read into it are used).
  std::unique_ptr<std::byte[]> buf;
  uint64_t buf_cap = 0;
  for (uint32_t k = 0; k < old_n; ++k) {
    if (from[k].empty()) continue;
    // Sources: the node-local copy where this node sees it, then the persistent level.
    struct source {
      std::string where, tree;
      bool extents = false;
    };
    std::vector<source> sources;
    if (cfg_.local_enabled) {
      std::string p = format::shard_path(cfg_.scratch, cfg_.run, name, version, k);
      if (env_->exists(p))
        sources.push_back({p, storage::join(format::version_dir(cfg_.scratch, cfg_.run, name, version),
                                            format::tree_file_name(k)), false});
    }
    sources.push_back({format::persistent_image_where(cfg_.persistent, cfg_.run, name, version, k, &rs.m),
                       rs.m.aggregated ? std::string() : storage::join(vdir, format::tree_file_name(k)),
                       rs.m.aggregated});
    status st;
    for (size_t si = 0; si < sources.size(); ++si) {
      const source& src = sources[si];
      const bool persistent = si + 1 == sources.size();
      st = [&]() -> status {
        auto file = persistent ? format::open_persistent_image(env_, cfg_.persistent, cfg_.run, name, version, k, &rs.m)
                               : env_->open_read(src.where);
        if (!file) return file.take_status();
        CAIRN_ASSIGN_OR_RETURN(auto reader, format::shard_reader::open(std::move(file).value(), src.where));
        if (reader->header().header_checksum != rs.old[k].header_checksum)
          return {errc::corruption, src.where + ": not the shard the version's MANIFEST names"};
        std::optional<format::tree_file> tree;
        if (!src.tree.empty() && env_->exists(src.tree)) {
          auto t = format::read_tree(env_, src.tree);
          if (t && t->shard_header_checksum == rs.old[k].header_checksum) {
            rs.bytes_read += format::encode_tree(*t).size();  // read whole
            tree = std::move(t).value();
          }
        }
        for (const piece& p : from[k]) {
          const format::region_desc& d = *p.d;
          // Verification units covering the runs: the smallest available.
          std::vector<check_unit> units;
          const format::region_tree* rt = tree ? tree->find(d.name) : nullptr;
          const uint64_t es = format::type_size(d.type);
          if (rt && rt->count == d.count) {
            const uint64_t cb = format::elements_per_chunk(tree->chunk_bytes, d.type) * es;
            if (rt->exact.size() != (d.length + cb - 1) / cb) rt = nullptr;
            else {
              for (const format::copy_run& run : p.runs)
                for (uint64_t c = run.src / cb; c <= (run.src + run.len - 1) / cb; ++c)
                  if (units.empty() || units.back().offset != d.offset + c * cb)
                    units.push_back({d.offset + c * cb, std::min(cb, d.length - c * cb), rt->exact[c], "chunk"});
            }
          } else {
            rt = nullptr;
          }
          if (!rt && src.extents) {
            // Aggregated: each extent has its checksum; use them unless they
            // span more than the region itself.
            for (const format::copy_run& run : p.runs) {
              const uint64_t a = d.offset + run.src, b = a + run.len;
              for (const auto& e : rs.m.shards[k].extents)
                if (e.src < b && e.src + e.length > a) units.push_back({e.src, e.length, e.checksum, "extent"});
            }
            std::sort(units.begin(), units.end());
            units.erase(std::unique(units.begin(), units.end(),
                                    [](const check_unit& a, const check_unit& b) { return a.offset == b.offset; }),
                        units.end());
            uint64_t total = 0;
            for (const auto& u : units) total += u.length;
            if (total > d.length) units.clear();
          }
          if (units.empty() && !rt) units.push_back({d.offset, d.length, d.checksum, "region"});
          std::sort(units.begin(), units.end());
          units.erase(std::unique(units.begin(), units.end(),
                                  [](const check_unit& a, const check_unit& b) { return a.offset == b.offset; }),
                      units.end());
          // Read the units (contiguous ones at once) into a buffer spanning them.
          const uint64_t base = units.front().offset;
          const uint64_t span = units.back().offset + units.back().length - base;
          if (span > buf_cap) {
            buf.reset(new std::byte[span]);
            buf_cap = span;
          }
          for (size_t i = 0; i < units.size();) {
            size_t j = i + 1;
            uint64_t end = units[i].offset + units[i].length;
            while (j < units.size() && units[j].offset == end) end += units[j++].length;
            CAIRN_RETURN_IF_ERROR(reader->read(units[i].offset, buf.get() + (units[i].offset - base),
                                               end - units[i].offset));
            i = j;
          }
          for (const check_unit& u : units)
            if (util::xxh3(buf.get() + (u.offset - base), u.length) != u.hash)
              return {errc::corruption, src.where + ": region '" + d.name + "', " + u.what + " at image offset " +
                                            std::to_string(u.offset) + " (" + std::to_string(u.length) +
                                            " bytes): checksum mismatch"};
          std::byte* out = rs.staged[p.r->name].bytes.get();
          for (const format::copy_run& run : p.runs)
            std::memcpy(out + run.dst, buf.get() + (d.offset + run.src - base), run.len);
        }
        rs.bytes_read += reader->bytes_read();  // the header too
        return {};
      }();
      if (st) break;
      if (!persistent)
        std::fprintf(stderr, "cairn: rank %d: local copy of rank %u's shard of '%s' version %lld unusable, "
                             "reading the persistent level: %s\n", rank(), k, name.c_str(),
                     static_cast<long long>(version), st.message().c_str());
    }
    if (!st) return {st.code(), "'" + name + "' version " + std::to_string(version) + " (written by " +
                                    std::to_string(old_n) + " ranks): " + st.message()};
  }
  return {};
}

status client_impl::restart_resharded(const std::string& name, int64_t version) {
  // Check every protected region before any is read or written.
  CAIRN_RETURN_IF_ERROR(agree(check_reshard_regions(name, version)));
  bool staged = true;
  for (const auto& [rname, r] : regions_) {
    auto it = reshard_->staged.find(rname);
    staged &= it != reshard_->staged.end() && it->second.key == protection_key(r);
  }
  if (comm_->min(staged ? 1 : 0) == 0) CAIRN_RETURN_IF_ERROR(agree(reshard_read(name, version)));
  // Every rank's bytes are verified: now write the buffers.
  for (auto& [rname, r] : regions_) {
    auto& sb = reshard_->staged.at(rname);
    if (!r.mem_shape.empty())
      copy_block(sb.bytes.get(), static_cast<std::byte*>(r.ptr), format::type_size(r.type), row_major_dims(r),
                 r.mem_shape, r.mem_start, false);
    else if (sb.size)
      util::stream_copy(r.ptr, sb.bytes.get(), sb.size);
  }
  if (rank() == 0)
    std::fprintf(stderr, "cairn: restored '%s' version %lld, written by %u ranks, on %d ranks (regions redistributed "
                         "by their global layout; rank 0 read %llu bytes for %llu needed)\n",
                 name.c_str(), static_cast<long long>(version), reshard_->m.nranks, size(),
                 static_cast<unsigned long long>(reshard_->bytes_read),
                 static_cast<unsigned long long>(reshard_->bytes_needed));
  last_version_[name] = version;
  if (!files_) {
    restart_version_ = -1;
    reshard_.reset();
  }
  return {};
}

std::optional<result<uint64_t>> client_impl::resharded_region_size(const std::string& region) const {
  // A replicated region has its size; a block's is that of the block this
  // rank protects.
  auto it = reshard_->regions.find(region);
  if (it == reshard_->regions.end()) return std::nullopt;
  if (!it->second.block) return result<uint64_t>(it->second.count * format::type_size(it->second.type));
  return result<uint64_t>(status(errc::invalid_argument, "region '" + region + "' is a block of a global array written by " +
                                                            std::to_string(reshard_->m.nranks) + " ranks: its size on this "
                                                            "rank is that of the block it protects with cairn_protect_block"));
}

}  // namespace cairn

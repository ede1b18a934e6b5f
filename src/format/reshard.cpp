#include "format/reshard.hpp"

#include <algorithm>

#include "format/container.hpp"

namespace cairn::format {
namespace {

std::string dims_text(const std::vector<uint64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const region_desc* find_region(const shard_header& h, const std::string& name) {
  for (const auto& d : h.regions)
    if (d.name == name) return &d;
  return nullptr;
}

}  // namespace

result<std::map<std::string, reshard_region>> plan_regions(const std::vector<shard_header>& old,
                                                           uint32_t new_nranks, const std::string& what) {
  std::map<std::string, reshard_region> out;
  if (old.empty()) return status(errc::corruption, what + ": no shard headers");
  const size_t old_n = old.size();
  const std::string head = what + " was written by " + std::to_string(old_n) + " ranks; this job has " +
                           std::to_string(new_nranks) + ": ";
  for (size_t k = 1; k < old_n; ++k)
    if (old[k].regions.size() != old[0].regions.size())
      return status(errc::unusable, head + "rank " + std::to_string(k) + " has " +
                                        std::to_string(old[k].regions.size()) + " regions and rank 0 " +
                                        std::to_string(old[0].regions.size()) + ", so they cannot be redistributed");
  for (const auto& d0 : old[0].regions) {
    if (d0.name.rfind("file:", 0) == 0)
      return status(errc::unusable, head + "it holds files of the file-based mode, which restart only on the rank "
                                           "count that wrote them");
    reshard_region rr;
    rr.type = d0.type;
    rr.block = d0.flags & kHasLayout;
    rr.column_major = d0.flags & kColumnMajor;
    rr.global = d0.global;
    rr.count = d0.count;
    uint64_t elements = 0;
    bool same_bytes = true;
    for (size_t k = 0; k < old_n; ++k) {
      const region_desc* d = find_region(old[k], d0.name);
      if (!d)
        return status(errc::unusable, head + "region '" + d0.name + "' is in rank 0's shard but not in rank " +
                                          std::to_string(k) + "'s, so it cannot be redistributed");
      if (rr.block && (!(d->flags & kHasLayout) || d->type != rr.type || d->global != rr.global ||
                       bool(d->flags & kColumnMajor) != rr.column_major))
        return status(errc::unusable, head + "region '" + d0.name + "' has different types or global layouts on "
                                          "the ranks that wrote it (rank 0 and rank " + std::to_string(k) + ")");
      elements += d->count;
      same_bytes &= !(d->flags & kHasLayout) && d->type == d0.type && d->count == d0.count &&
                    d->checksum == d0.checksum;
    }
    if (rr.block) {
      uint64_t prod = 1;
      for (auto g : rr.global) prod *= g;
      if (elements != prod)
        return status(errc::unusable, head + "the blocks of region '" + d0.name + "' hold " +
                                          std::to_string(elements) + " elements, not the " + std::to_string(prod) +
                                          " of its global shape " + dims_text(rr.global) +
                                          " (blocks that overlap or leave gaps cannot be redistributed)");
    } else if (!same_bytes) {
      return status(errc::unusable,
                    head + "region '" + d0.name + "' has no global layout (protected with cairn_protect, not "
                           "cairn_protect_block) and differs between the ranks that wrote it, so it can only be "
                           "restored on " + std::to_string(old_n) + " ranks. Relaunch with " +
                           std::to_string(old_n) + " ranks, or declare the region with cairn_protect_block (or "
                           "keep it the same on every rank) in the run that writes the checkpoints");
    }
    out[d0.name] = std::move(rr);
  }
  return out;
}

result<std::vector<shard_header>> read_version_headers(storage::storage_env* env, const std::string& store,
                                                       const std::string& run, const manifest& m,
                                                       std::vector<std::string>* raw) {
  std::vector<shard_header> out;
  if (m.shards.size() != m.nranks)
    return status(errc::corruption, "MANIFEST of '" + m.name + "' version " + std::to_string(m.version) + " lists " +
                                        std::to_string(m.shards.size()) + " shards for " +
                                        std::to_string(m.nranks) + " ranks");
  for (uint32_t k = 0; k < m.nranks; ++k) {
    const std::string where = persistent_image_where(store, run, m.name, m.version, k, &m);
    CAIRN_ASSIGN_OR_RETURN(auto f, open_persistent_image(env, store, run, m.name, m.version, k, &m));
    size_t need = kAlign;
    std::string buf;
    result<shard_header> h = status(errc::again, "");
    for (int tries = 0; tries < 3; ++tries) {
      buf.resize(std::min<uint64_t>(need, f->size()));
      if (status rs = f->read_at(0, buf.data(), buf.size()); !rs) return rs;
      h = decode_header(std::span<const std::byte>(reinterpret_cast<const std::byte*>(buf.data()), buf.size()),
                        where, &need);
      if (h || h.error().code() != errc::again || need <= buf.size()) break;
    }
    if (!h) return h.take_status();
    if (h->rank != k || h->nranks != m.nranks || h->name != m.name || h->version != m.version ||
        h->header_checksum != m.shards[k].header_checksum)
      return status(errc::corruption, where + ": does not match the version's MANIFEST (header of rank " +
                                          std::to_string(h->rank) + " of " + std::to_string(h->nranks) + ")");
    out.push_back(std::move(h).value());
    if (raw) raw->push_back(std::move(buf));
  }
  return out;
}

uint64_t overlap_runs(const std::vector<uint64_t>& o_start, const std::vector<uint64_t>& o_dims,
                      const std::vector<uint64_t>& n_start, const std::vector<uint64_t>& n_dims, size_t elem,
                      std::vector<copy_run>* runs) {
  const size_t nd = o_dims.size();
  if (nd == 0 || n_dims.size() != nd || o_start.size() != nd || n_start.size() != nd) return 0;
  std::vector<uint64_t> lo(nd), ext(nd);
  uint64_t volume = 1;
  for (size_t d = 0; d < nd; ++d) {
    lo[d] = std::max(o_start[d], n_start[d]);
    uint64_t hi = std::min(o_start[d] + o_dims[d], n_start[d] + n_dims[d]);
    if (hi <= lo[d]) return 0;
    ext[d] = hi - lo[d];
    volume *= ext[d];
  }
  std::vector<uint64_t> os(nd, elem), ns(nd, elem);  // byte strides
  for (size_t d = nd - 1; d > 0; --d) {
    os[d - 1] = os[d] * o_dims[d];
    ns[d - 1] = ns[d] * n_dims[d];
  }
  const uint64_t row = ext[nd - 1] * elem, rows = volume / ext[nd - 1];
  std::vector<uint64_t> idx(nd, 0);
  for (uint64_t r = 0; r < rows; ++r) {
    uint64_t src = 0, dst = 0;
    for (size_t d = 0; d < nd; ++d) {
      src += (lo[d] + idx[d] - o_start[d]) * os[d];
      dst += (lo[d] + idx[d] - n_start[d]) * ns[d];
    }
    if (!runs->empty() && runs->back().src + runs->back().len == src && runs->back().dst + runs->back().len == dst)
      runs->back().len += row;
    else
      runs->push_back({src, dst, row});
    for (size_t d = nd - 1; d-- > 0;) {  // odometer over the outer dimensions
      if (++idx[d] < ext[d]) break;
      idx[d] = 0;
    }
  }
  return volume;
}

}  // namespace cairn::format

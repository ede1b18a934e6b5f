#include "fabric/transfer.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include "util/mutex.hpp"

namespace cairn::fabric {

// ---- transfer_engine -----------------------------------------------------------

struct transfer_engine::impl {
  transfer_options opts;
  fabric_options lane_opts;
  std::vector<std::unique_ptr<fabric_context>> lanes;
  fabric_properties props;
  cairn::mutex call_mu;  // one pull/push at a time

  status ensure_lanes() {
    for (auto& lane : lanes) {
      if (lane && lane->health().is_ok()) continue;
      lane.reset();  // closes the failed endpoint: nothing writes into buffers after this
      CAIRN_ASSIGN_OR_RETURN(lane, fabric_context::create(lane_opts));
    }
    return {};
  }

  status run(bool is_read, std::span<const transfer_part> parts);
};

transfer_engine::transfer_engine(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
transfer_engine::~transfer_engine() = default;

result<std::unique_ptr<transfer_engine>> transfer_engine::create(const transfer_options& options) {
  if (options.threads < 1 || options.threads > 256)
    return status(errc::invalid_argument, "transfer_options.threads must be in [1, 256]");
  if (options.piece_bytes == 0) return status(errc::invalid_argument, "transfer_options.piece_bytes must be positive");
  auto p = std::make_unique<impl>();
  p->opts = options;
  p->lane_opts = options.fabric;
  p->lane_opts.thread_safe = false;
  p->lane_opts.progress_thread = false;
  p->lane_opts.service.clear();  // lanes only initiate: any port
  p->lanes.resize(options.threads);
  CAIRN_RETURN_IF_ERROR(p->ensure_lanes());
  p->props = p->lanes[0]->properties();
  return std::unique_ptr<transfer_engine>(new transfer_engine(std::move(p)));
}

int transfer_engine::threads() const { return static_cast<int>(impl_->lanes.size()); }
const fabric_properties& transfer_engine::properties() const { return impl_->props; }

status transfer_engine::pull(const remote_buffer& src, std::span<std::byte> local, std::span<const extent> extents) {
  const transfer_part part{src, local, extents};
  return impl_->run(true, {&part, 1});
}

status transfer_engine::push(const remote_buffer& dst, std::span<std::byte> local, std::span<const extent> extents) {
  const transfer_part part{dst, local, extents};
  return impl_->run(false, {&part, 1});
}

status transfer_engine::pull(std::span<const transfer_part> parts) { return impl_->run(true, parts); }

status transfer_engine::impl::run(bool is_read, std::span<const transfer_part> parts) {
  const char* what = is_read ? "pull" : "push";
  uint64_t total = 0;
  for (const auto& p : parts) {
    for (const auto& e : p.extents) {
      if (e.offset + e.length < e.offset || e.offset + e.length > p.local.size() ||
          e.offset + e.length > p.remote.length)
        return status(errc::invalid_argument, std::string(what) + ": extent [" + std::to_string(e.offset) + ", +" +
                                                  std::to_string(e.length) + ") outside the buffers (local " +
                                                  std::to_string(p.local.size()) + ", remote " +
                                                  std::to_string(p.remote.length) + " bytes)");
      total += e.length;
    }
    if (p.remote.peer.empty() && !p.extents.empty())
      return status(errc::invalid_argument, std::string(what) + ": no peer name");
  }
  if (total == 0) return {};

  cairn::lock_guard call(call_mu);
  CAIRN_RETURN_IF_ERROR(ensure_lanes());
  const size_t n = lanes.size();

  // Each part's pieces in order, the parts' pieces in turn; lane i takes the
  // pieces that start in [i*total/n, (i+1)*total/n) of that sequence.
  struct piece {
    size_t part;
    extent e;
  };
  std::vector<std::vector<piece>> of_part(parts.size());
  size_t rounds = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    for (const auto& e : parts[p].extents)
      for (uint64_t off = 0; off < e.length; off += opts.piece_bytes)
        of_part[p].push_back({p, {e.offset + off, std::min<uint64_t>(opts.piece_bytes, e.length - off)}});
    rounds = std::max(rounds, of_part[p].size());
  }
  std::vector<std::vector<piece>> work(n);
  uint64_t done = 0;
  for (size_t k = 0; k < rounds; ++k)
    for (const auto& pieces : of_part) {
      if (k >= pieces.size()) continue;
      const size_t lane = std::min<size_t>(n - 1, static_cast<size_t>((static_cast<unsigned __int128>(done) * n) / total));
      work[lane].push_back(pieces[k]);
      done += pieces[k].e.length;
    }

  std::vector<status> results(n);
  auto run_lane = [&](size_t i) {
    fabric_context& ctx = *lanes[i];
    // Consecutive pieces of one part go in one call (one peer per call).
    for (size_t at = 0; at < work[i].size();) {
      const transfer_part& p = parts[work[i][at].part];
      size_t end = at;
      while (end < work[i].size() && work[i][end].part == work[i][at].part) ++end;
      auto peer = ctx.insert_peer(p.remote.peer);
      if (!peer) {
        results[i] = peer.take_status();
        return;
      }
      // FI_MR_LOCAL providers: the local buffer registered in this lane's
      // domain for the call. (A registration cache keyed by address is
      // unsafe when the caller frees and remaps memory, so there is none.)
      memory_region mr;
      if (ctx.properties().needs_local_mr) {
        auto r = ctx.register_memory(p.local.data(), p.local.size(), kLocal);
        if (!r) {
          results[i] = r.take_status();
          return;
        }
        mr = std::move(r).value();
      }
      std::vector<rma_op> ops;
      ops.reserve(end - at);
      for (size_t k = at; k < end; ++k) {
        const extent& e = work[i][k].e;
        ops.push_back({p.local.data() + e.offset, static_cast<size_t>(e.length), p.remote.addr + e.offset,
                       p.remote.key, mr ? &mr : nullptr});
      }
      at = end;
      if (opts.max_bytes_per_s <= 0) {
        results[i] = is_read ? ctx.read(*peer, ops) : ctx.write(*peer, ops);
        if (!results[i]) return;
        continue;
      }
      // Capped: one piece at a time, each lane at its share of the rate.
      const double rate = opts.max_bytes_per_s / static_cast<double>(n);
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t moved = 0;
      for (const auto& op : ops) {
        std::span<const rma_op> one(&op, 1);
        results[i] = is_read ? ctx.read(*peer, one) : ctx.write(*peer, one);
        if (!results[i]) return;
        moved += op.len;
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(static_cast<double>(moved) / rate)));
      }
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 1; i < n; ++i)
    if (!work[i].empty()) threads.emplace_back(run_lane, i);
  run_lane(0);
  for (auto& t : threads) t.join();

  status first;
  for (auto& r : results)
    if (!r.is_ok() && first.is_ok()) first = r;
  // Replace the lanes of failed calls now: closing their endpoints makes sure
  // nothing posted by this call writes into a local buffer after we return,
  // and a fresh endpoint connects afresh where the provider dropped the
  // connection on the error.
  for (size_t i = 0; i < n; ++i)
    if (!results[i].is_ok() || !lanes[i]->health().is_ok()) lanes[i].reset();
  status again = ensure_lanes();
  if (!first.is_ok()) return first.with_context(std::string(what) + " of " + std::to_string(total) + " bytes");
  return again;
}

// ---- shard images ----------------------------------------------------------------

std::vector<extent> image_extents(const format::shard_header& h) {
  std::vector<extent> raw;
  raw.push_back({0, h.data_offset});
  for (const auto& r : h.regions)
    if (r.length > 0) raw.push_back({r.offset, r.length});
  std::sort(raw.begin(), raw.end(), [](const extent& a, const extent& b) { return a.offset < b.offset; });
  std::vector<extent> out;
  for (const auto& e : raw) {
    if (e.length == 0) continue;
    if (!out.empty() && out.back().offset + out.back().length >= e.offset) {
      out.back().length = std::max(out.back().offset + out.back().length, e.offset + e.length) - out.back().offset;
    } else {
      out.push_back(e);
    }
  }
  return out;
}

void zero_padding(const format::shard_header& h, std::span<std::byte> image) {
  uint64_t pos = 0;
  for (const auto& e : image_extents(h)) {
    if (e.offset >= image.size()) break;
    if (e.offset > pos) std::memset(image.data() + pos, 0, e.offset - pos);
    pos = std::max(pos, e.offset + e.length);
  }
  if (image.size() > pos) std::memset(image.data() + pos, 0, image.size() - pos);
}

result<format::shard_header> verify_shard_image(std::span<const std::byte> image, const std::string& where,
                                                const format::shard_header* expect) {
  CAIRN_ASSIGN_OR_RETURN(format::shard_header h, format::decode_header(image, where));
  if (h.file_size != image.size())
    return status(errc::corruption, where + ": header says " + std::to_string(h.file_size) + " bytes, image has " +
                                        std::to_string(image.size()));
  if (expect != nullptr) {
    if (h.run != expect->run || h.name != expect->name || h.version != expect->version || h.rank != expect->rank ||
        h.nranks != expect->nranks)
      return status(errc::corruption, where + ": image is " + h.run + "/" + h.name + " v" + std::to_string(h.version) +
                                          " rank " + std::to_string(h.rank) + "/" + std::to_string(h.nranks) +
                                          ", expected " + expect->run + "/" + expect->name + " v" +
                                          std::to_string(expect->version) + " rank " + std::to_string(expect->rank) +
                                          "/" + std::to_string(expect->nranks));
  }
  CAIRN_RETURN_IF_ERROR(format::verify_image(h, image, where));
  return h;
}

result<format::shard_header> pull_image(transfer_engine& lanes, const remote_buffer& src, std::span<std::byte> local,
                                        const format::shard_header* expect, std::span<const lent_region> lent) {
  const std::string where = "image from peer " + to_hex(src.peer).substr(0, 16) + "...";
  if (local.size() < src.length)
    return status(errc::invalid_argument, "pull_image: local buffer of " + std::to_string(local.size()) +
                                              " bytes for an image of " + std::to_string(src.length));
  if (src.length < format::kFixedHeaderBytes)
    return status(errc::corruption, where + ": " + std::to_string(src.length) + " bytes is too short for a shard");
  // Header block: the fixed header and the region table.
  uint64_t have = std::min<uint64_t>(src.length, format::kAlign);
  extent first{0, have};
  CAIRN_RETURN_IF_ERROR(lanes.pull(src, local, std::span<const extent>(&first, 1)));
  size_t need = 0;
  auto h = format::decode_header(local.first(have), where, &need);
  if (!h && h.error().code() == errc::again && need > have && need <= src.length) {
    extent more{have, need - have};
    CAIRN_RETURN_IF_ERROR(lanes.pull(src, local, std::span<const extent>(&more, 1)));
    have = need;
    h = format::decode_header(local.first(have), where, &need);
  }
  if (!h) return h.take_status();
  if (h->file_size != src.length)
    return status(errc::corruption, where + ": header says " + std::to_string(h->file_size) +
                                        " bytes, the peer announced " + std::to_string(src.length));
  // Lent regions come from the application's memory: a remote buffer whose
  // byte `offset` (the region's offset in the image) is the lent address.
  std::vector<const lent_region*> from(h->regions.size(), nullptr);
  for (const auto& l : lent) {
    if (l.index >= h->regions.size() || from[l.index])
      return status(errc::corruption, where + ": lent region " + std::to_string(l.index) + " is out of range or repeated");
    from[l.index] = &l;
  }
  // Everything but the bytes already here; padding is zeroed, not moved.
  std::vector<extent> rest;
  for (const auto& e : image_extents(*h)) {
    uint64_t begin = std::max<uint64_t>(e.offset, have), end = e.offset + e.length;
    if (begin < end) rest.push_back({begin, end - begin});
  }
  zero_padding(*h, local.first(src.length));
  if (lent.empty()) {
    CAIRN_RETURN_IF_ERROR(lanes.pull(src, local, rest));
  } else {
    std::vector<extent> own;  // regions (and header bytes) still read from src
    for (size_t i = 0; i < h->regions.size(); ++i) {
      const auto& d = h->regions[i];
      if (d.length == 0) continue;
      if (d.offset < have) return status(errc::corruption, where + ": region '" + d.name + "' overlaps the header");
      extent e{d.offset, d.length};
      if (!from[i]) {
        own.push_back(e);
        continue;
      }
      remote_buffer r{src.peer, from[i]->addr - d.offset, from[i]->key, src.length};  // mod 2^64
      CAIRN_RETURN_IF_ERROR(lanes.pull(r, local, std::span<const extent>(&e, 1)).with_context("lent region '" + d.name + "'"));
    }
    CAIRN_RETURN_IF_ERROR(lanes.pull(src, local, own));
  }
  return verify_shard_image(local.first(src.length), where, expect);
}

}  // namespace cairn::fabric

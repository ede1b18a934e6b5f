#include "agents/transfer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace cairn::agents {

// ---- transfer_engine -----------------------------------------------------------

struct transfer_engine::impl {
  transfer_options opts;
  fabric_options lane_opts;
  std::vector<std::unique_ptr<fabric_context>> lanes;
  fabric_properties props;
  std::mutex call_mu;  // one pull/push at a time

  status ensure_lanes() {
    for (auto& lane : lanes) {
      if (lane && lane->health().is_ok()) continue;
      lane.reset();  // closes the failed endpoint: nothing writes into buffers after this
      CAIRN_ASSIGN_OR_RETURN(lane, fabric_context::create(lane_opts));
    }
    return {};
  }

  status run(bool is_read, const remote_buffer& rb, std::span<std::byte> local, std::span<const extent> extents);
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
  return impl_->run(true, src, local, extents);
}

status transfer_engine::push(const remote_buffer& dst, std::span<std::byte> local, std::span<const extent> extents) {
  return impl_->run(false, dst, local, extents);
}

status transfer_engine::impl::run(bool is_read, const remote_buffer& rb, std::span<std::byte> local,
                                  std::span<const extent> extents) {
  const char* what = is_read ? "pull" : "push";
  uint64_t total = 0;
  for (const auto& e : extents) {
    if (e.offset + e.length < e.offset || e.offset + e.length > local.size() || e.offset + e.length > rb.length)
      return status(errc::invalid_argument, std::string(what) + ": extent [" + std::to_string(e.offset) + ", +" +
                                                std::to_string(e.length) + ") outside the buffers (local " +
                                                std::to_string(local.size()) + ", remote " +
                                                std::to_string(rb.length) + " bytes)");
    total += e.length;
  }
  if (total == 0) return {};
  if (rb.peer.empty()) return status(errc::invalid_argument, std::string(what) + ": no peer name");

  std::lock_guard call(call_mu);
  CAIRN_RETURN_IF_ERROR(ensure_lanes());
  const size_t n = lanes.size();

  // Pieces in order; lane i takes the pieces that start in [i*total/n, (i+1)*total/n).
  std::vector<std::vector<extent>> work(n);
  uint64_t done = 0;
  for (const auto& e : extents) {
    for (uint64_t off = 0; off < e.length; off += opts.piece_bytes) {
      const uint64_t len = std::min<uint64_t>(opts.piece_bytes, e.length - off);
      const size_t lane = std::min<size_t>(n - 1, static_cast<size_t>((static_cast<unsigned __int128>(done) * n) / total));
      work[lane].push_back({e.offset + off, len});
      done += len;
    }
  }

  std::vector<status> results(n);
  auto run_lane = [&](size_t i) {
    if (work[i].empty()) return;
    fabric_context& ctx = *lanes[i];
    auto peer = ctx.insert_peer(rb.peer);
    if (!peer) {
      results[i] = peer.take_status();
      return;
    }
    // FI_MR_LOCAL providers: the local buffer registered in this lane's domain
    // for the call. (A registration cache keyed by address is unsafe when the
    // caller frees and remaps memory, so there is none.)
    memory_region mr;
    if (ctx.properties().needs_local_mr) {
      auto r = ctx.register_memory(local.data(), local.size(), kLocal);
      if (!r) {
        results[i] = r.take_status();
        return;
      }
      mr = std::move(r).value();
    }
    std::vector<rma_op> ops;
    ops.reserve(work[i].size());
    for (const auto& e : work[i])
      ops.push_back({local.data() + e.offset, static_cast<size_t>(e.length), rb.addr + e.offset, rb.key,
                     mr ? &mr : nullptr});
    if (opts.max_bytes_per_s <= 0) {
      results[i] = is_read ? ctx.read(*peer, ops) : ctx.write(*peer, ops);
      return;
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
  // nothing posted by this call writes into `local` after we return, and a
  // fresh endpoint connects afresh where the provider dropped the connection
  // on the error.
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

// ---- messages ------------------------------------------------------------------------

const char* data_msg_name(data_msg t) {
  switch (t) {
    case data_msg::ready: return "READY";
    case data_msg::push_target: return "PUSH_TARGET";
    case data_msg::push_done: return "PUSH_DONE";
    case data_msg::held: return "HELD";
    case data_msg::restore: return "RESTORE";
    case data_msg::restore_source: return "RESTORE_SOURCE";
    case data_msg::restore_done: return "RESTORE_DONE";
    case data_msg::restored: return "RESTORED";
    case data_msg::query: return "QUERY";
    case data_msg::holding: return "HOLDING";
    case data_msg::release: return "RELEASE";
    case data_msg::released: return "RELEASED";
  }
  return "?";
}

namespace {

class writer {
 public:
  template <typename T>
  void put(T v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof v);  // little-endian hosts only (x86-64, aarch64)
    out_.append(reinterpret_cast<const char*>(b), sizeof b);
  }
  void str(std::string_view s) {
    s = s.substr(0, 0xffff);
    put<uint16_t>(static_cast<uint16_t>(s.size()));
    out_.append(s);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class reader {
 public:
  explicit reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool get(T* v) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool str(std::string* s) {
    uint16_t n = 0;
    if (!get(&n) || in_.size() < n) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool empty() const { return in_.empty(); }

 private:
  std::string_view in_;
};

}  // namespace

std::string encode_data_message(const data_message& m) {
  writer w;
  w.put<uint32_t>(kMessageMagic);
  w.put<uint16_t>(kWireVersion);
  w.put<uint16_t>(static_cast<uint16_t>(m.type));
  w.put<uint8_t>(static_cast<uint8_t>(m.mode));
  w.put<uint64_t>(m.request);
  w.put<int64_t>(m.version);
  w.put<uint32_t>(m.rank);
  w.put<uint32_t>(m.nranks);
  w.put<uint64_t>(m.addr);
  w.put<uint64_t>(m.key);
  w.put<uint64_t>(m.length);
  w.put<int32_t>(m.code);
  w.str(m.reply_to);
  w.str(m.run);
  w.str(m.name);
  w.str(std::string_view(m.text).substr(0, 1024));
  return w.take();
}

result<data_message> decode_data_message(std::string_view bytes) {
  reader r(bytes);
  uint32_t magic = 0;
  uint16_t version = 0, type = 0;
  uint8_t mode = 0;
  data_message m;
  if (!r.get(&magic) || magic != kMessageMagic) return status(errc::corruption, "agent message: bad magic");
  if (!r.get(&version) || version != kWireVersion)
    return status(errc::not_supported, "agent message: wire version " + std::to_string(version) + ", this side speaks " +
                                           std::to_string(kWireVersion));
  bool ok = r.get(&type) && r.get(&mode) && r.get(&m.request) && r.get(&m.version) && r.get(&m.rank) &&
            r.get(&m.nranks) && r.get(&m.addr) && r.get(&m.key) && r.get(&m.length) && r.get(&m.code) &&
            r.str(&m.reply_to) && r.str(&m.run) && r.str(&m.name) && r.str(&m.text) && r.empty();
  if (!ok) return status(errc::corruption, "agent message: truncated or malformed");
  if (type < 1 || type > static_cast<uint16_t>(data_msg::released))
    return status(errc::corruption, "agent message: unknown type " + std::to_string(type));
  if (mode > 2) return status(errc::corruption, "agent message: unknown mode " + std::to_string(mode));
  m.type = static_cast<data_msg>(type);
  m.mode = static_cast<transfer_mode>(mode);
  return m;
}

status data_message_status(const data_message& m) {
  if (m.code == 0) return {};
  errc c = static_cast<errc>(m.code);
  if (m.code > 0 || m.code < static_cast<int>(errc::exists)) c = errc::internal;
  return status(c, m.text);
}

// ---- agent_client --------------------------------------------------------------------

struct agent_client::impl {
  client_options opts;
  std::string agent_name;
  std::unique_ptr<fabric_context> ctx;
  fabric_addr agent = 0;
  std::unique_ptr<transfer_engine> lanes;
  uint64_t next_request = 1;
  // Lent application memory, registered once (agents_lend): (address, size).
  std::map<std::pair<const std::byte*, size_t>, memory_region> lent_mrs;

  status ensure_lanes() {
    if (lanes) return {};
    transfer_options t;
    t.fabric = opts.fabric;
    t.threads = opts.threads;
    t.piece_bytes = opts.piece_bytes;
    CAIRN_ASSIGN_OR_RETURN(lanes, transfer_engine::create(t));
    return {};
  }

  status send(const data_message& m) { return ctx->send(agent, encode_data_message(m)); }

  // A READY for h's image of `length` bytes.
  data_message ready(const format::shard_header& h, transfer_mode mode, uint64_t length) {
    data_message req;
    req.type = data_msg::ready;
    req.mode = mode;
    req.request = next_request++;
    req.run = h.run;
    req.name = h.name;
    req.version = h.version;
    req.rank = h.rank;
    req.nranks = h.nranks;
    req.length = length;
    req.reply_to = ctx->name();
    return req;
  }

  // Pull and lend: exposes the image for reading, sends req and waits for HELD.
  status expose_and_wait(std::span<std::byte> image, data_message req, const std::string& what) {
    auto not_held = [&](status st) { return st.with_context(what + " not held by the agent"); };
    CAIRN_ASSIGN_OR_RETURN(memory_region mr, ctx->register_memory(image.data(), image.size(), kRemoteRead));
    req.addr = mr.remote_address();
    req.key = mr.key();
    if (status st = send(req); !st) return not_held(st);
    auto reply = await(req.request, data_msg::held, what);
    if (!reply) return not_held(reply.take_status());
    if (status st = data_message_status(*reply); !st) return not_held(st);
    return {};
  }

  // The reply of type `want` to `request`; drops stale replies of earlier
  // requests. io_error after reply_timeout_s.
  result<data_message> await(uint64_t request, data_msg want, const std::string& what) {
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                             std::chrono::duration<double>(opts.reply_timeout_s));
    while (true) {
      double left = std::chrono::duration<double>(deadline - clock::now()).count();
      if (left <= 0)
        return status(errc::io_error, what + ": no " + data_msg_name(want) + " from the agent within " +
                                          std::to_string(opts.reply_timeout_s) + " s (agent gone?)");
      auto bytes = ctx->recv(left);
      if (!bytes) {
        if (bytes.error().code() == errc::again) continue;
        return bytes.take_status().with_context(what);
      }
      auto m = decode_data_message(*bytes);
      if (!m) continue;  // not ours to answer; the agent logs its own errors
      if (m->request != request || m->type != want) continue;
      return m;
    }
  }
};

agent_client::agent_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
agent_client::~agent_client() = default;
fabric_context& agent_client::context() { return *impl_->ctx; }

result<std::unique_ptr<agent_client>> agent_client::create(const client_options& options,
                                                           const std::string& agent_name) {
  auto p = std::make_unique<impl>();
  p->opts = options;
  p->agent_name = agent_name;
  fabric_options fo = options.fabric;
  fo.thread_safe = true;
  fo.progress_thread = true;  // the agent reads or writes our memory while we wait
  CAIRN_ASSIGN_OR_RETURN(p->ctx, fabric_context::create(fo));
  CAIRN_ASSIGN_OR_RETURN(p->agent, p->ctx->insert_peer(agent_name));
  return std::unique_ptr<agent_client>(new agent_client(std::move(p)));
}

void agent_client::forget_lent() { impl_->lent_mrs.clear(); }

status agent_client::checkpoint(std::span<std::byte> image, const format::shard_header& h,
                                std::span<const std::byte* const> lent) {
  if (std::none_of(lent.begin(), lent.end(), [](const std::byte* p) { return p != nullptr; }))
    return checkpoint(image, h, transfer_mode::pull);
  impl& m = *impl_;
  const std::string what = h.run + "/" + h.name + " v" + std::to_string(h.version) + " rank " + std::to_string(h.rank);
  if (image.size() != h.file_size || lent.size() != h.regions.size())
    return status(errc::invalid_argument, what + ": image or lent regions do not match the header");
  std::vector<lent_region> regions;
  for (size_t i = 0; i < lent.size(); ++i) {
    if (!lent[i]) continue;
    const size_t len = h.regions[i].length;
    auto it = m.lent_mrs.find({lent[i], len});
    if (it == m.lent_mrs.end()) {
      // The provider may need the pages mapped (FI_MR_ALLOCATED); the
      // application's regions are. Read-only use: const is kept.
      auto mr = m.ctx->register_memory(const_cast<std::byte*>(lent[i]), len, kRemoteRead);
      if (!mr) return mr.take_status().with_context(what + ": registering lent region '" + h.regions[i].name + "'");
      it = m.lent_mrs.emplace(std::make_pair(lent[i], len), std::move(mr).value()).first;
    }
    regions.push_back({static_cast<uint32_t>(i), it->second.remote_address(), it->second.key()});
  }
  data_message req = m.ready(h, transfer_mode::lend, image.size());
  req.text = encode_lent(regions);
  // The agent reads the header block (and any region not lent) from the image.
  return m.expose_and_wait(image, std::move(req), what);
}

status agent_client::checkpoint(std::span<std::byte> image, const format::shard_header& h, transfer_mode mode) {
  impl& m = *impl_;
  const std::string what = h.run + "/" + h.name + " v" + std::to_string(h.version) + " rank " + std::to_string(h.rank);
  if (image.size() != h.file_size)
    return status(errc::invalid_argument, what + ": image of " + std::to_string(image.size()) +
                                              " bytes, header says " + std::to_string(h.file_size));
  data_message req = m.ready(h, mode, image.size());
  if (mode == transfer_mode::pull) return m.expose_and_wait(image, std::move(req), what);
  auto not_held = [&](status st) { return st.with_context(what + " not held by the agent"); };

  if (status st = m.ensure_lanes(); !st) return not_held(st);
  if (status st = m.send(req); !st) return not_held(st);
  auto target = m.await(req.request, data_msg::push_target, what);
  if (!target) return not_held(target.take_status());
  if (status st = data_message_status(*target); !st) return not_held(st);
  remote_buffer dst{m.agent_name, target->addr, target->key, target->length};
  const std::vector<extent> ext = image_extents(h);
  status pushed = m.lanes->push(dst, image, ext);
  data_message done = req;
  done.type = data_msg::push_done;
  done.code = static_cast<int32_t>(pushed.code());
  done.text = pushed.message();
  if (status st = m.send(done); !st) return not_held(st);
  if (!pushed) return not_held(pushed);
  auto reply = m.await(req.request, data_msg::held, what);
  if (!reply) return not_held(reply.take_status());
  if (status st = data_message_status(*reply); !st) return not_held(st);
  return {};
}

result<restored_image> agent_client::restore(const std::string& run, const std::string& name, uint32_t rank,
                                             int64_t version, std::span<std::byte> buffer, transfer_mode mode) {
  impl& m = *impl_;
  const std::string what = "restore of " + run + "/" + name + " rank " + std::to_string(rank) +
                           (version < 0 ? std::string(" (newest)") : " v" + std::to_string(version));
  data_message req;
  req.type = data_msg::restore;
  req.mode = mode;
  req.request = m.next_request++;
  req.run = run;
  req.name = name;
  req.version = version;
  req.rank = rank;
  req.length = buffer.size();
  req.reply_to = m.ctx->name();

  if (mode == transfer_mode::push) {
    // Registered only for this call: once it is closed, a late write from the
    // agent fails on its side instead of landing in `buffer`.
    CAIRN_ASSIGN_OR_RETURN(memory_region mr, m.ctx->register_memory(buffer.data(), buffer.size(), kRemoteWrite));
    req.addr = mr.remote_address();
    req.key = mr.key();
    CAIRN_RETURN_IF_ERROR(m.send(req).with_context(what));
    CAIRN_ASSIGN_OR_RETURN(data_message reply, m.await(req.request, data_msg::restored, what));
    CAIRN_RETURN_IF_ERROR(data_message_status(reply).with_context(what));
    if (reply.length > buffer.size()) return status(errc::corruption, what + ": agent reports more bytes than asked");
    restored_image out;
    out.version = reply.version;
    out.length = reply.length;
    // Only the header and the regions were written: zero the padding so the
    // buffer holds exactly the shard file's bytes.
    CAIRN_ASSIGN_OR_RETURN(format::shard_header h, format::decode_header(buffer.first(reply.length), what));
    zero_padding(h, buffer.first(reply.length));
    CAIRN_ASSIGN_OR_RETURN(out.header, verify_shard_image(buffer.first(reply.length), what));
    return out;
  }

  CAIRN_RETURN_IF_ERROR(m.ensure_lanes().with_context(what));
  CAIRN_RETURN_IF_ERROR(m.send(req).with_context(what));
  CAIRN_ASSIGN_OR_RETURN(data_message src, m.await(req.request, data_msg::restore_source, what));
  CAIRN_RETURN_IF_ERROR(data_message_status(src).with_context(what));
  restored_image out;
  out.version = src.version;
  out.length = src.length;
  data_message done = req;
  done.type = data_msg::restore_done;
  status st;
  if (src.length > buffer.size()) {
    st = status(errc::invalid_argument, what + ": version " + std::to_string(src.version) + " needs " +
                                            std::to_string(src.length) + " bytes, the buffer has " +
                                            std::to_string(buffer.size()));
  } else {
    auto h = pull_image(*m.lanes, remote_buffer{m.agent_name, src.addr, src.key, src.length}, buffer);
    if (h) out.header = std::move(h).value();
    else st = h.take_status().with_context(what);
  }
  done.code = static_cast<int32_t>(st.code());
  (void)m.send(done);  // lets the agent drop the registration; it times out otherwise
  if (!st) return st;
  return out;
}

namespace {

// The text lists of the protocol: "a:b:c" triples of unsigned decimals,
// comma-separated, nothing else.
using triple = std::array<unsigned long long, 3>;

std::string join_triples(const std::vector<triple>& v) {
  std::string out;
  for (const auto& t : v) {
    if (!out.empty()) out += ',';
    out += std::to_string(t[0]) + ':' + std::to_string(t[1]) + ':' + std::to_string(t[2]);
  }
  return out;
}

result<std::vector<triple>> split_triples(const std::string& text, const char* what) {
  std::vector<triple> out;
  if (!text.empty() && text.back() == ',') return status(errc::corruption, std::string(what) + ": list ends with ','");
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    triple t{};
    int used = 0;
    if (item.empty() || item[0] == '-' ||
        std::sscanf(item.c_str(), "%llu:%llu:%llu%n", &t[0], &t[1], &t[2], &used) != 3 ||
        used != static_cast<int>(item.size()))
      return status(errc::corruption, std::string(what) + ": malformed entry '" + item + "'");
    out.push_back(t);
    pos = end + 1;
  }
  return out;
}

}  // namespace

std::string encode_lent(const std::vector<lent_region>& v) {
  std::vector<triple> t;
  for (const auto& l : v) t.push_back({l.index, l.addr, l.key});
  return join_triples(t);
}

result<std::vector<lent_region>> decode_lent(const std::string& text) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<triple> ts, split_triples(text, "READY: lent regions"));
  std::vector<lent_region> out;
  for (const auto& t : ts) {
    if (t[0] > UINT32_MAX) return status(errc::corruption, "READY: lent region index " + std::to_string(t[0]));
    out.push_back({static_cast<uint32_t>(t[0]), t[1], t[2]});
  }
  return out;
}

std::string encode_held(const std::vector<held_info>& v) {
  std::vector<triple> t;
  for (const auto& h : v) t.push_back({static_cast<unsigned long long>(h.version), h.length, h.attempt});
  return join_triples(t);
}

result<std::vector<held_info>> decode_held(const std::string& text) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<triple> ts, split_triples(text, "HOLDING"));
  std::vector<held_info> out;
  for (const auto& t : ts) {
    if (t[0] > static_cast<unsigned long long>(INT64_MAX) || t[2] > UINT32_MAX)
      return status(errc::corruption, "HOLDING: version or attempt out of range");
    out.push_back({static_cast<int64_t>(t[0]), t[1], static_cast<uint32_t>(t[2])});
  }
  return out;
}

result<std::vector<held_info>> agent_client::held(const std::string& run, const std::string& name, uint32_t rank) {
  impl& m = *impl_;
  const std::string what = "query of " + run + "/" + name + " rank " + std::to_string(rank);
  data_message req;
  req.type = data_msg::query;
  req.request = m.next_request++;
  req.run = run;
  req.name = name;
  req.rank = rank;
  req.reply_to = m.ctx->name();
  CAIRN_RETURN_IF_ERROR(m.send(req).with_context(what));
  CAIRN_ASSIGN_OR_RETURN(data_message reply, m.await(req.request, data_msg::holding, what));
  CAIRN_RETURN_IF_ERROR(data_message_status(reply).with_context(what));
  return decode_held(reply.text);
}

result<uint64_t> agent_client::release(const std::string& run) {
  impl& m = *impl_;
  const std::string what = "release of " + run;
  data_message req;
  req.type = data_msg::release;
  req.request = m.next_request++;
  req.run = run;
  req.reply_to = m.ctx->name();
  CAIRN_RETURN_IF_ERROR(m.send(req).with_context(what));
  CAIRN_ASSIGN_OR_RETURN(data_message reply, m.await(req.request, data_msg::released, what));
  CAIRN_RETURN_IF_ERROR(data_message_status(reply).with_context(what));
  return static_cast<uint64_t>(std::max<int64_t>(0, reply.version));
}

}  // namespace cairn::agents

#include "agents/data_protocol.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <system_error>
#include <sys/random.h>
#include <time.h>

namespace cairn::agents {

// ---- freshness ----------------------------------------------------------------------

int64_t wall_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

status replay_guard::admit(const data_message& m, int64_t now_ns) {
  if (m.session == 0) return status(errc::invalid_argument, "no session (a client of another version?)");
  const int64_t age = now_ns - m.sent_ns;
  if (age > window_ns_ || -age > window_ns_)
    return status(errc::invalid_argument,
                  "sent " + std::to_string(static_cast<double>(age) / 1e9) + " s ago by the sender's clock, outside the " +
                      std::to_string(static_cast<double>(window_ns_) / 1e9) +
                      " s freshness window (a replay, or clocks that disagree)");
  // Sessions silent for a window cannot send anything admissible again.
  if (now_ns - swept_ns_ > window_ns_ / 4) {
    for (auto it = sessions_.begin(); it != sessions_.end();)
      it = now_ns - it->second.last_ns > window_ns_ ? sessions_.erase(it) : std::next(it);
    swept_ns_ = now_ns;
  }
  const uint32_t bit = 1u << (static_cast<unsigned>(m.type) & 31u);
  auto [it, fresh] = sessions_.try_emplace(m.session);
  seen& s = it->second;
  if (!fresh) {
    if (m.request < s.request || (m.request == s.request && (s.types & bit)))
      return status(errc::invalid_argument, std::string("a replay: ") + data_msg_name(m.type) + " of request " +
                                                std::to_string(m.request) + " was taken already");
    if (m.request > s.request) s.types = 0;
  }
  s.request = m.request;
  s.types |= bit;
  s.last_ns = std::max(s.last_ns, m.sent_ns);
  return {};
}


// ---- agent_client --------------------------------------------------------------------

namespace {

// "restore of RUN/NAME rank R vV" (or "(newest)"), for errors.
std::string restore_what(const std::string& run, const std::string& name, uint32_t rank, int64_t version) {
  return "restore of " + run + "/" + name + " rank " + std::to_string(rank) +
         (version < 0 ? std::string(" (newest)") : " v" + std::to_string(version));
}

}  // namespace

struct agent_client::impl {
  client_options opts;
  std::string agent_name;
  std::unique_ptr<fabric::fabric_context> ctx;
  fabric::fabric_addr agent = 0;
  std::unique_ptr<fabric::transfer_engine> lanes;
  uint64_t next_request = 1;
  uint64_t session = 0;  // random, never 0: replies that do not echo it are not ours
  // Lent application memory, registered once (agents_lend): (address, size).
  std::map<std::pair<const std::byte*, size_t>, fabric::memory_region> lent_mrs;

  // Lanes being opened in the background (prepare_lanes).
  std::future<result<std::unique_ptr<fabric::transfer_engine>>> lanes_coming;

  fabric::transfer_options lane_options() const {
    fabric::transfer_options t;
    t.fabric = opts.fabric;
    t.threads = opts.threads;
    t.piece_bytes = opts.piece_bytes;
    return t;
  }

  status ensure_lanes() {
    if (lanes) return {};
    if (lanes_coming.valid()) {
      auto made = lanes_coming.get();
      if (made) {
        lanes = std::move(made).value();
        return {};
      }
      // Opened again below: the failure may have been passing.
    }
    CAIRN_ASSIGN_OR_RETURN(lanes, fabric::transfer_engine::create(lane_options()));
    return {};
  }

  status send(data_message m) {
    m.session = session;
    m.sent_ns = wall_ns();
    std::string bytes = encode_data_message(m);
    return ctx->send(agent, opts.key.empty() ? bytes : fabric::seal(opts.key, kToAgent, std::move(bytes)));
  }

  // A RESTORE of (run, name, rank) version `version` (-1: the newest).
  data_message restore_request(const std::string& run, const std::string& name, uint32_t rank, int64_t version,
                               transfer_mode mode) {
    data_message req;
    req.type = data_msg::restore;
    req.mode = mode;
    req.request = next_request++;
    req.run = run;
    req.name = name;
    req.version = version;
    req.rank = rank;
    req.reply_to = ctx->name();
    return req;
  }

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
    CAIRN_ASSIGN_OR_RETURN(fabric::memory_region mr,
                           ctx->register_memory(image.data(), image.size(), fabric::kRemoteRead));
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
      std::optional<std::string_view> in = *bytes;
      if (!opts.key.empty()) in = fabric::unseal(opts.key, kFromAgent, *bytes);
      if (!in) continue;  // not from our agent (a stranger's, or another application's)
      auto m = decode_data_message(*in);
      if (!m) continue;  // not ours to answer; the agent logs its own errors
      if (m->session != session || m->request != request || m->type != want) continue;
      return m;
    }
  }
};

agent_client::agent_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
agent_client::~agent_client() = default;

void agent_client::prepare_lanes() {
  impl& m = *impl_;
  if (m.lanes || m.lanes_coming.valid()) return;
  try {
    m.lanes_coming = std::async(std::launch::async,
                                [t = m.lane_options()] { return fabric::transfer_engine::create(t); });
  } catch (const std::system_error&) {
    // No thread to spare: ensure_lanes opens them when they are needed.
  }
}
fabric::fabric_context& agent_client::context() { return *impl_->ctx; }

result<std::unique_ptr<agent_client>> agent_client::create(const client_options& options,
                                                           const std::string& agent_name) {
  if (!options.key.empty() && options.key.size() != fabric::kPlaneKeyBytes)
    return status(errc::internal, "agents: an application key of " + std::to_string(options.key.size()) + " bytes");
  auto p = std::make_unique<impl>();
  p->opts = options;
  p->agent_name = agent_name;
  while (p->session == 0)
    if (::getrandom(&p->session, sizeof p->session, 0) != sizeof p->session)
      return status(errc::io_error, "agents: getrandom for a session failed");
  fabric::fabric_options fo = options.fabric;
  fo.thread_safe = true;
  fo.progress_thread = true;  // the agent reads or writes our memory while we wait
  CAIRN_ASSIGN_OR_RETURN(p->ctx, fabric::fabric_context::create(fo));
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
  std::vector<fabric::lent_region> regions;
  for (size_t i = 0; i < lent.size(); ++i) {
    if (!lent[i]) continue;
    const size_t len = h.regions[i].length;
    auto it = m.lent_mrs.find({lent[i], len});
    if (it == m.lent_mrs.end()) {
      // The provider may need the pages mapped (FI_MR_ALLOCATED); the
      // application's regions are. Read-only use: const is kept.
      auto mr = m.ctx->register_memory(const_cast<std::byte*>(lent[i]), len, fabric::kRemoteRead);
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
  fabric::remote_buffer dst{m.agent_name, target->addr, target->key, target->length};
  const std::vector<fabric::extent> ext = fabric::image_extents(h);
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
  const std::string what = restore_what(run, name, rank, version);
  if (mode == transfer_mode::pull) {
    CAIRN_ASSIGN_OR_RETURN(restore_lease lease, open_restore(run, name, rank, version));
    restored_image out;
    out.version = lease.version;
    out.length = lease.length;
    status st;
    if (lease.length > buffer.size()) {
      st = status(errc::invalid_argument, what + ": version " + std::to_string(lease.version) + " needs " +
                                              std::to_string(lease.length) + " bytes, the buffer has " +
                                              std::to_string(buffer.size()));
    } else {
      auto h = fabric::pull_image(*m.lanes, lease.source, buffer);
      if (h) out.header = std::move(h).value();
      else st = h.take_status().with_context(what);
    }
    close_restore(lease, st);
    if (!st) return st;
    return out;
  }

  data_message req = m.restore_request(run, name, rank, version, mode);
  req.length = buffer.size();
  // Registered only for this call: once it is closed, a late write from the
  // agent fails on its side instead of landing in `buffer`.
  CAIRN_ASSIGN_OR_RETURN(fabric::memory_region mr,
                         m.ctx->register_memory(buffer.data(), buffer.size(), fabric::kRemoteWrite));
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
  fabric::zero_padding(h, buffer.first(reply.length));
  CAIRN_ASSIGN_OR_RETURN(out.header, fabric::verify_shard_image(buffer.first(reply.length), what));
  return out;
}

result<restore_lease> agent_client::open_restore(const std::string& run, const std::string& name, uint32_t rank,
                                                 int64_t version) {
  impl& m = *impl_;
  const std::string what = restore_what(run, name, rank, version);
  data_message req = m.restore_request(run, name, rank, version, transfer_mode::pull);
  CAIRN_RETURN_IF_ERROR(m.ensure_lanes().with_context(what));
  CAIRN_RETURN_IF_ERROR(m.send(req).with_context(what));
  CAIRN_ASSIGN_OR_RETURN(data_message src, m.await(req.request, data_msg::restore_source, what));
  CAIRN_RETURN_IF_ERROR(data_message_status(src).with_context(what));
  restore_lease lease;
  lease.run = run;
  lease.name = name;
  lease.rank = rank;
  lease.version = src.version;
  lease.length = src.length;
  lease.request = req.request;
  lease.source = fabric::remote_buffer{m.agent_name, src.addr, src.key, src.length};
  return lease;
}

status agent_client::read_restored(const restore_lease& lease, uint64_t offset, std::span<std::byte> out) {
  impl& m = *impl_;
  if (offset > lease.length || out.size() > lease.length - offset)
    return status(errc::invalid_argument, "read of " + std::to_string(out.size()) + " bytes at " +
                                              std::to_string(offset) + " past the lent image's " +
                                              std::to_string(lease.length));
  if (out.empty()) return {};
  CAIRN_RETURN_IF_ERROR(m.ensure_lanes());
  // The range as a buffer of its own: registered addresses (or offsets, by
  // the provider's mode) count from the image's first byte.
  const fabric::remote_buffer range{lease.source.peer, lease.source.addr + offset, lease.source.key, out.size()};
  const fabric::extent all{0, out.size()};
  return m.lanes->pull(range, out, {&all, 1});
}

void agent_client::close_restore(const restore_lease& lease, const status& st) {
  impl& m = *impl_;
  data_message done;
  done.type = data_msg::restore_done;
  done.mode = transfer_mode::pull;
  done.request = lease.request;
  done.run = lease.run;
  done.name = lease.name;
  done.rank = lease.rank;
  done.version = lease.version;
  done.reply_to = m.ctx->name();
  done.code = static_cast<int32_t>(st.code());
  (void)m.send(done);  // lets the agent drop the registration; it times out otherwise
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

std::string encode_lent(const std::vector<fabric::lent_region>& v) {
  std::vector<triple> t;
  for (const auto& l : v) t.push_back({l.index, l.addr, l.key});
  return join_triples(t);
}

result<std::vector<fabric::lent_region>> decode_lent(const std::string& text) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<triple> ts, split_triples(text, "READY: lent regions"));
  std::vector<fabric::lent_region> out;
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

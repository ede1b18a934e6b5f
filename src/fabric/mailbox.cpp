#include "fabric/mailbox.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "util/clock.hpp"

namespace cairn::fabric {
namespace {

void note_refused(std::atomic<uint64_t>& refused, uint32_t self, const std::string& what) {
  if (refused.fetch_add(1) == 0)
    std::fprintf(stderr, "cairn: rank %u: %s: dropped a message without this job's key (another job's, or a "
                         "stranger's); further ones are counted only\n",
                 self, what.c_str());
}

}  // namespace

result<std::shared_ptr<mailbox>> mailbox::create(const mailbox_options& o) {
  if (sodium_init() < 0) return status(errc::internal, "libsodium could not be initialised (no entropy source?)");
  auto p = std::make_shared<mailbox>();
  p->opts_ = o;
  fabric_options f;
  f.provider = o.provider;
  f.node = o.bind;
  f.timeout_s = o.timeout_s;
  f.thread_safe = true;
  f.progress_thread = true;  // peers read this rank's registered memory through this endpoint
  auto ctx = fabric_context::create(f);
  if (!ctx) return ctx.take_status().with_context(o.what);
  p->ctx_ = std::move(ctx).value();
  transfer_options t;
  t.fabric = f;
  t.fabric.thread_safe = false;
  t.fabric.progress_thread = false;
  t.threads = std::max(1, o.lanes);
  CAIRN_ASSIGN_OR_RETURN(p->lanes_, transfer_engine::create(t));
  while (p->session_ == 0) randombytes_buf(&p->session_, sizeof p->session_);
  p->address_.assign(reinterpret_cast<const char*>(&p->session_), sizeof p->session_);
  p->address_ += p->ctx_->name();
  return p;
}

status mailbox::join(uint32_t self, const std::vector<std::string>& addresses, std::string key) {
  if (key.size() != kPlaneKeyBytes)
    return {errc::internal, opts_.what + ": a job key of " + std::to_string(key.size()) + " bytes"};
  if (self >= addresses.size())
    return {errc::internal, opts_.what + ": rank " + std::to_string(self) + " not in the job"};
  peers_.clear();
  sessions_.clear();
  for (const auto& a : addresses) {
    uint64_t session = 0;
    if (a.size() <= sizeof session)
      return {errc::internal, opts_.what + ": an address of " + std::to_string(a.size()) + " bytes"};
    std::memcpy(&session, a.data(), sizeof session);
    sessions_.push_back(session);
    peers_.push_back(a.substr(sizeof session));
  }
  self_ = self;
  key_ = std::move(key);
  // Messages without this job's seal are dropped as they arrive, not queued
  // until the next await (a stranger's flood would fill memory meanwhile).
  ctx_->set_inbox_filter([key = key_, self, what = opts_.what, refused = refused_](std::string_view m) {
    if (unseal(key, self, m)) return true;
    note_refused(*refused, self, what);
    return false;
  });
  taken_.assign(peers_.size(), window{});
  addrs_.assign(peers_.size(), 0);
  inserted_.assign(peers_.size(), false);
  return {};
}

result<fabric_addr> mailbox::peer(uint32_t rank) {
  if (rank >= peers_.size()) return status(errc::internal, opts_.what + ": no rank " + std::to_string(rank));
  if (!inserted_[rank]) {
    CAIRN_ASSIGN_OR_RETURN(addrs_[rank], ctx_->insert_peer(peers_[rank]));
    inserted_[rank] = true;
  }
  return addrs_[rank];
}

status mailbox::send(uint32_t rank, data_message m) {
  if (key_.empty()) return {errc::internal, opts_.what + ": send before join"};
  CAIRN_ASSIGN_OR_RETURN(auto a, peer(rank));
  m.session = session_;
  m.request = next_request_++;
  return ctx_->send(a, seal(key_, rank, encode_data_message(m)));
}

bool mailbox::window::take(uint64_t request) {
  if (request == 0) return false;
  if (request > top) {
    const uint64_t shift = request - top;
    seen = shift >= 64 ? 0 : seen << shift;
    seen |= 1;
    top = request;
    return true;
  }
  const uint64_t below = top - request;
  if (below >= 64 || (seen >> below & 1) != 0) return false;
  seen |= uint64_t{1} << below;
  return true;
}

bool mailbox::fresh(const data_message& m) {
  const bool ok = m.session == sessions_[m.rank] && taken_[m.rank].take(m.request);
  if (!ok && replayed_++ == 0)
    std::fprintf(stderr, "cairn: rank %u: %s: dropped a sealed message from rank %u that is not fresh (%s); "
                         "further ones are counted only\n",
                 self_, opts_.what.c_str(), m.rank,
                 m.session != sessions_[m.rank] ? "another session of that rank: a recording replayed?"
                                                : "a request taken already: a recording replayed?");
  return ok;
}

result<data_message> mailbox::await(data_msg want, const std::string& name, int64_t version, uint32_t from,
                                    const std::atomic<bool>& cancelled) {
  auto& box = want == data_msg::ready ? ready_ : held_;
  const auto key = std::make_tuple(name, version, from);
  double quiet_since = util::now_s();
  while (true) {
    if (auto it = box.find(key); it != box.end()) {
      data_message m = std::move(it->second);
      box.erase(it);
      return m;
    }
    if (cancelled.load())
      return status(errc::cancelled, "'" + name + "' version " + std::to_string(version) +
                                         ": cancelled (the version failed on another rank)");
    if (util::now_s() - quiet_since > opts_.timeout_s)
      return status(errc::io_error, opts_.what + ": '" + name + "' version " + std::to_string(version) + ": no " +
                                        data_msg_name(want) + " from rank " + std::to_string(from) + " within " +
                                        std::to_string(static_cast<int>(opts_.timeout_s)) + " s (rank or node gone?)");
    auto bytes = ctx_->recv(0.1);
    if (!bytes) {
      if (bytes.error().code() == errc::again) continue;
      return bytes.take_status().with_context(opts_.what);
    }
    const auto in = unseal(key_, self_, *bytes);
    if (!in) {
      note_refused(*refused_, self_, opts_.what);
      continue;
    }
    auto m = decode_data_message(*in);
    if (!m || (m->type != data_msg::ready && m->type != data_msg::held) || m->rank >= peers_.size()) continue;
    if (!fresh(*m)) continue;
    quiet_since = util::now_s();
    if (m->name == name && m->version < version) continue;  // stale: that version is over here
    auto& to = m->type == data_msg::ready ? ready_ : held_;
    to[std::make_tuple(m->name, m->version, m->rank)] = std::move(*m);
  }
}

bool mailbox::arrived(data_msg want, const std::string& name, int64_t version, uint32_t from) const {
  const auto& box = want == data_msg::ready ? ready_ : held_;
  return box.count(std::make_tuple(name, version, from)) > 0;
}

status mailbox::pull(uint32_t rank, uint64_t addr, uint64_t key, std::byte* local, uint64_t len) {
  const read one{rank, addr, key, local, len};
  return pull({&one, 1});
}

status mailbox::pull(std::span<const read> reads) {
  std::vector<extent> whole;
  whole.reserve(reads.size());
  std::vector<transfer_part> parts;
  for (const auto& r : reads) {
    if (r.len == 0) continue;
    if (r.rank >= peers_.size()) return status(errc::internal, opts_.what + ": no rank " + std::to_string(r.rank));
    whole.push_back({0, r.len});
    parts.push_back({{peers_[r.rank], r.addr, r.key, r.len}, {r.local, r.len}, {&whole.back(), 1}});
  }
  return lanes_->pull(parts);
}

}  // namespace cairn::fabric

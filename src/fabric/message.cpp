#include "fabric/message.hpp"

#include <cstring>

namespace cairn::fabric {

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
  w.put<uint64_t>(m.session);
  w.put<int64_t>(m.sent_ns);
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
  bool ok = r.get(&type) && r.get(&mode) && r.get(&m.request) && r.get(&m.session) && r.get(&m.sent_ns) && r.get(&m.version) && r.get(&m.rank) &&
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
  if (m.code > 0 || m.code < static_cast<int>(errc::busy)) c = errc::internal;
  return status(c, m.text);
}

}  // namespace cairn::fabric

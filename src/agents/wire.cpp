#include "agents/wire.hpp"

#include <cmath>
#include <cstring>

namespace cairn::agents {
namespace {

void put16(std::string* s, uint16_t v) {
  for (int i = 0; i < 2; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get(std::string_view b, size_t off, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(b[off + i])) << (8 * i);
  return v;
}

decoded_frame fail(frame_error e, std::string detail) {
  decoded_frame d;
  d.what = decoded_frame::kind::error;
  d.error = e;
  d.detail = std::move(detail);
  return d;
}

}  // namespace

bool is_known_type(uint16_t t) {
  switch (static_cast<ctl_type>(t)) {
    case ctl_type::hello: case ctl_type::hello_ack: case ctl_type::error: case ctl_type::reply:
    case ctl_type::node_register: case ctl_type::heartbeat: case ctl_type::node_leave:
    case ctl_type::node_update: case ctl_type::app_register: case ctl_type::app_unregister:
    case ctl_type::app_progress: case ctl_type::app_resize: case ctl_type::agent_migrate:
    case ctl_type::app_agents: case ctl_type::status:
      return true;
  }
  return false;
}

const char* type_name(ctl_type t) {
  switch (t) {
    case ctl_type::hello: return "hello";
    case ctl_type::hello_ack: return "hello_ack";
    case ctl_type::error: return "error";
    case ctl_type::reply: return "reply";
    case ctl_type::node_register: return "node_register";
    case ctl_type::heartbeat: return "heartbeat";
    case ctl_type::node_leave: return "node_leave";
    case ctl_type::node_update: return "node_update";
    case ctl_type::app_register: return "app_register";
    case ctl_type::app_unregister: return "app_unregister";
    case ctl_type::app_progress: return "app_progress";
    case ctl_type::app_resize: return "app_resize";
    case ctl_type::agent_migrate: return "agent_migrate";
    case ctl_type::app_agents: return "app_agents";
    case ctl_type::status: return "status";
  }
  return "unknown";
}

const char* frame_error_name(frame_error e) {
  switch (e) {
    case frame_error::none: return "none";
    case frame_error::truncated: return "truncated";
    case frame_error::bad_magic: return "bad_magic";
    case frame_error::bad_version: return "bad_version";
    case frame_error::bad_type: return "bad_type";
    case frame_error::bad_flags: return "bad_flags";
    case frame_error::oversized: return "oversized";
    case frame_error::bad_tag: return "bad_tag";
    case frame_error::replayed: return "replayed";
    case frame_error::bad_sequence: return "bad_sequence";
    case frame_error::bad_payload: return "bad_payload";
    case frame_error::unexpected: return "unexpected";
  }
  return "unknown";
}

std::string encode_header(ctl_type type, uint64_t seq, uint32_t length) {
  std::string h(kFrameMagic, sizeof kFrameMagic);
  put16(&h, kProtocolVersion);
  put16(&h, static_cast<uint16_t>(type));
  put64(&h, seq);
  put32(&h, length);
  put32(&h, 0);  // flags: reserved
  return h;
}

std::string encode_frame(std::string_view key, ctl_type type, uint64_t seq, std::string_view payload) {
  std::string f = encode_header(type, seq, static_cast<uint32_t>(payload.size()));
  f.append(payload);
  f += hmac(key, f);
  return f;
}

frame_error check_header(std::string_view b, uint32_t max_payload, frame_header* out) {
  if (b.size() < kHeaderSize) return frame_error::truncated;
  if (std::memcmp(b.data(), kFrameMagic, sizeof kFrameMagic) != 0) return frame_error::bad_magic;
  frame_header h;
  h.version = static_cast<uint16_t>(get(b, 4, 2));
  h.type = static_cast<uint16_t>(get(b, 6, 2));
  h.seq = get(b, 8, 8);
  h.length = static_cast<uint32_t>(get(b, 16, 4));
  h.flags = static_cast<uint32_t>(get(b, 20, 4));
  if (h.version != kProtocolVersion) return frame_error::bad_version;
  if (!is_known_type(h.type)) return frame_error::bad_type;
  if (h.flags != 0) return frame_error::bad_flags;
  if (h.length > max_payload) return frame_error::oversized;
  *out = h;
  return frame_error::none;
}

decoded_frame decode_frame(std::string_view buf, std::string_view key, uint32_t max_payload) {
  decoded_frame d;
  // The magic is checked on the first bytes already, so that a stream that is
  // not ours is refused at once rather than after a 24-byte wait.
  size_t m = buf.size() < sizeof kFrameMagic ? buf.size() : sizeof kFrameMagic;
  if (std::memcmp(buf.data(), kFrameMagic, m) != 0) return fail(frame_error::bad_magic, "not a cairn control frame");
  if (buf.size() < kHeaderSize) return d;
  frame_header h;
  frame_error e = check_header(buf, max_payload, &h);
  if (e != frame_error::none) {
    frame_header raw;
    raw.version = static_cast<uint16_t>(get(buf, 4, 2));
    raw.type = static_cast<uint16_t>(get(buf, 6, 2));
    raw.length = static_cast<uint32_t>(get(buf, 16, 4));
    raw.flags = static_cast<uint32_t>(get(buf, 20, 4));
    std::string detail;
    switch (e) {
      case frame_error::bad_version:
        detail = "protocol version " + std::to_string(raw.version) + ", this build speaks " +
                 std::to_string(kProtocolVersion);
        break;
      case frame_error::bad_type: detail = "message type " + std::to_string(raw.type); break;
      case frame_error::bad_flags: detail = "reserved flags " + std::to_string(raw.flags); break;
      case frame_error::oversized:
        detail = "payload of " + std::to_string(raw.length) + " bytes, limit " + std::to_string(max_payload);
        break;
      default: detail = "bad header"; break;
    }
    return fail(e, detail);
  }
  // No overflow: length <= max_payload < 2^32 and size_t is 64-bit.
  const size_t total = kHeaderSize + static_cast<size_t>(h.length) + kTagSize;
  if (buf.size() < total) return d;
  std::string_view signed_part = buf.substr(0, kHeaderSize + h.length);
  if (!tag_equal(hmac(key, signed_part), buf.substr(kHeaderSize + h.length, kTagSize))) {
    return fail(frame_error::bad_tag, std::string("authentication tag mismatch on a ") +
                                          type_name(static_cast<ctl_type>(h.type)) +
                                          " frame (wrong secret or altered frame)");
  }
  d.what = decoded_frame::kind::frame;
  d.header = h;
  d.payload = buf.substr(kHeaderSize, h.length);
  d.consumed = total;
  return d;
}

std::string session::seal(ctl_type type, std::string_view payload) {
  const uint64_t seq = send_seq_++;
  return encode_frame(send_key_, type, seq, cipher_xor(send_cipher_, seq, payload));
}

decoded_frame session::open(std::string_view buf, uint32_t max_payload, std::string* plain) {
  decoded_frame d = decode_frame(buf, recv_key_, max_payload);
  if (d.what != decoded_frame::kind::frame) return d;
  if (d.header.seq < recv_seq_) {
    return fail(frame_error::replayed, "sequence " + std::to_string(d.header.seq) + " already seen (expected " +
                                           std::to_string(recv_seq_) + ")");
  }
  if (d.header.seq > recv_seq_) {
    return fail(frame_error::bad_sequence,
                "sequence " + std::to_string(d.header.seq) + ", expected " + std::to_string(recv_seq_));
  }
  ++recv_seq_;
  *plain = cipher_xor(recv_cipher_, d.header.seq, d.payload);
  return d;
}

}  // namespace cairn::agents

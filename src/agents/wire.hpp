// Frames of the agents control plane (docs/format/control.md): a 24-byte
// header (magic, protocol version, message type, sequence, payload length,
// flags), a JSON payload of at most max_payload bytes, and an HMAC tag over
// header and payload. Everything here is a pure function of its arguments
// (no I/O, no clocks), so it can be fuzzed and unit-tested byte by byte.
// Thread-safety: free functions are safe; a session is used by one thread.
#ifndef CAIRN_AGENTS_WIRE_HPP
#define CAIRN_AGENTS_WIRE_HPP

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "agents/auth.hpp"
#include "cairn/status.hpp"
#include "util/json.hpp"

namespace cairn::agents {

inline constexpr char kFrameMagic[4] = {'C', 'R', 'N', 'C'};
inline constexpr uint16_t kProtocolVersion = 2;  // 2: payloads after the handshake are encrypted
inline constexpr size_t kHeaderSize = 24;
inline constexpr uint32_t kDefaultMaxPayload = 1u << 20;  // 1 MiB

enum class ctl_type : uint16_t {
  hello = 1,          // client -> server, first frame, secret key
  hello_ack = 2,      // server -> client, second frame, secret key
  error = 3,          // reply: {code, message}
  reply = 4,          // reply: request-specific body
  node_register = 10, // manager -> controller
  heartbeat = 11,     // manager -> controller
  node_leave = 12,    // manager -> controller (graceful leave)
  node_update = 13,   // controller -> manager: the agents the node must run
  app_register = 20,  // client -> controller
  app_unregister = 21,
  app_progress = 22,
  app_resize = 23,
  agent_migrate = 24,
  app_agents = 25,    // client's probe: the agents of an application now
  status = 30,        // anyone -> controller or manager: the whole state
};
bool is_known_type(uint16_t t);
const char* type_name(ctl_type t);

// Why a frame was rejected. Every rejection closes the connection (the byte
// stream cannot be resynchronised) and is logged by the service.
enum class frame_error {
  none,
  truncated,     // the stream ended inside a frame
  bad_magic,
  bad_version,
  bad_type,      // a type number this version does not define
  bad_flags,     // reserved flags not zero
  oversized,     // payload length above the limit (checked before reading it)
  bad_tag,       // HMAC mismatch: wrong secret, tampering, or not a cairn peer
  replayed,      // sequence lower than expected: a frame seen before
  bad_sequence,  // sequence higher than expected: frames missing
  bad_payload,   // not a JSON object, too deep, or fields of the wrong type
  unexpected,    // a type not allowed here (e.g. anything but hello first)
};
const char* frame_error_name(frame_error e);

struct frame_header {
  uint16_t version = 0;
  uint16_t type = 0;
  uint64_t seq = 0;
  uint32_t length = 0;
  uint32_t flags = 0;
};

// The header bytes of a frame (little-endian fields).
std::string encode_header(ctl_type type, uint64_t seq, uint32_t length);
// header || payload || HMAC(key, header || payload). payload.size() must fit in 32 bits.
std::string encode_frame(std::string_view key, ctl_type type, uint64_t seq, std::string_view payload);

// Parses and validates a header (magic, version, type, flags, length <=
// max_payload) from the first kHeaderSize bytes of `bytes` (which must hold
// at least that many). Returns none and fills *out when valid.
frame_error check_header(std::string_view bytes, uint32_t max_payload, frame_header* out);

// Result of decoding the front of a byte buffer.
struct decoded_frame {
  enum class kind { need_more, frame, error } what = kind::need_more;
  frame_error error = frame_error::none;
  std::string detail;         // human-readable reason for an error
  frame_header header;
  std::string_view payload;   // points into the buffer given to decode_frame
  size_t consumed = 0;        // bytes of the buffer the frame occupies
};

// Decodes the frame at the front of buf under key: need_more while buf holds
// less than a whole frame (a header is validated as soon as its 24 bytes are
// there, so an oversized or garbage frame is refused before its payload
// arrives); error for a bad header or tag; frame otherwise. The sequence is
// not checked here (see session). Never reads outside buf.
decoded_frame decode_frame(std::string_view buf, std::string_view key, uint32_t max_payload);

// Per-connection sequence and key state: frames are sealed with the sending
// keys and consecutive sequence numbers, and opened only with the receiving
// keys and exactly the next expected sequence. The payload is encrypted
// (cipher_xor under the cipher key, the frame's sequence as nonce), then
// tagged with the tag key over the header and the ciphertext.
class session {
 public:
  session() = default;
  session(session_keys tag, session_keys cipher, bool client)
      : send_key_(client ? tag.c2s : tag.s2c),
        recv_key_(client ? tag.s2c : tag.c2s),
        send_cipher_(client ? cipher.c2s : cipher.s2c),
        recv_cipher_(client ? cipher.s2c : cipher.c2s) {}
  std::string seal(ctl_type type, std::string_view payload);
  // decode_frame with the receiving tag key, then: a sequence below the
  // expected one is `replayed`, above it `bad_sequence`; on success the
  // expected sequence advances and *plain receives the decrypted payload
  // (the decoded frame's payload is the ciphertext).
  decoded_frame open(std::string_view buf, uint32_t max_payload, std::string* plain);
  uint64_t next_send() const { return send_seq_; }
  uint64_t next_recv() const { return recv_seq_; }

 private:
  std::string send_key_;
  std::string recv_key_;
  std::string send_cipher_;
  std::string recv_cipher_;
  uint64_t send_seq_ = 1;  // 0 is the handshake's
  uint64_t recv_seq_ = 1;
};

// The strict JSON reading (util/json.hpp) under the names this module uses.
using util::fields;

}  // namespace cairn::agents

#endif

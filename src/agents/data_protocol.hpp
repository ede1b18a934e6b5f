// The agents' protocol over the inter-rank data plane (src/fabric): the small
// two-sided messages an application rank and its checkpoint agent exchange
// (data_message), the text lists some of them carry, and the application's
// side (agent_client). The bytes move with fabric::transfer_engine and
// fabric::pull_image; the agent's side is tools/agent. See
// docs/design/agents_data_plane.md.
//
// The aggregated flush (src/aggregate/leaders.cpp) speaks the READY and HELD
// messages of this protocol between ranks and leaders, with the same codec,
// and so includes this header. The messages stay here rather than in
// src/fabric because what they carry (a version of run/name for one rank, a
// transfer mode, the restore, query and release verbs) is the agents'
// vocabulary; src/fabric moves bytes between endpoints and knows no protocol.
// Should the aggregation's messages ever need to differ, it gets its own.
#ifndef CAIRN_AGENTS_DATA_PROTOCOL_HPP
#define CAIRN_AGENTS_DATA_PROTOCOL_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.hpp"
#include "fabric/fabric.hpp"
#include "fabric/transfer.hpp"
#include "format/shard.hpp"

namespace cairn::agents {

// ---- protocol messages -------------------------------------------------------
//
// Little-endian binary, at most fabric_context::max_message_bytes(): magic
// "CAGM", wire version, type, then the fields of `data_message` in order (strings
// as u16 length + bytes). A version of the protocol:
//
//   pull:    client READY(mode pull, buffer)     -> agent reads -> HELD(code)
//   lend:    client READY(mode lend, buffer, text: lent regions)
//                                                -> agent reads the header block from
//                                                   the buffer, lent regions from the
//                                                   application's memory -> HELD(code)
//   push:    client READY(mode push, length)     -> agent PUSH_TARGET(buffer)
//            client writes, PUSH_DONE            -> agent verifies -> HELD(code)
//   restart: client RESTORE(mode push, buffer)   -> agent writes -> RESTORED(code, length)
//            client RESTORE(mode pull)           -> agent RESTORE_SOURCE(buffer)
//            client reads, RESTORE_DONE          -> agent RESTORED(code)
//   query:   client QUERY(run, name, rank)       -> agent HOLDING(text: versions)
//   release: client RELEASE(run[, name])         -> agent RELEASED(version: count)
//
// `request` is chosen by the client and echoed; `reply_to` is the sender's
// endpoint name. A reply with code != 0 carries errc and a message.
inline constexpr uint32_t kMessageMagic = 0x4d474143;  // "CAGM"
inline constexpr uint16_t kWireVersion = 1;

enum class data_msg : uint16_t {
  ready = 1,
  push_target = 2,
  push_done = 3,
  held = 4,
  restore = 5,
  restore_source = 6,
  restore_done = 7,
  restored = 8,
  query = 9,      // which versions of (run, name, rank) the agent holds in memory
  holding = 10,   // reply: text = "version:length:attempt" entries, comma-separated
  release = 11,   // drop every held version of run (name empty: all names), cancel their writes
  released = 12,  // reply: version = how many were dropped
};
const char* data_msg_name(data_msg t);

// lend: a pull whose regions come from the application's own (lent) memory.
enum class transfer_mode : uint8_t { pull = 0, push = 1, lend = 2 };

struct data_message {
  data_msg type = data_msg::ready;
  transfer_mode mode = transfer_mode::pull;
  uint64_t request = 0;
  int64_t version = 0;  // RESTORE: -1 = the newest held
  uint32_t rank = 0;
  uint32_t nranks = 1;
  uint64_t addr = 0;    // a registered buffer (remote_buffer)
  uint64_t key = 0;
  uint64_t length = 0;
  int32_t code = 0;     // errc of a reply
  std::string reply_to;
  std::string run;
  std::string name;
  std::string text;     // error message of a reply
};

std::string encode_data_message(const data_message& m);
result<data_message> decode_data_message(std::string_view bytes);
// A reply's code and text as a status.
status data_message_status(const data_message& m);

// The lent regions of a READY (mode lend) as its text: "index:addr:key"
// entries, comma-separated.
std::string encode_lent(const std::vector<fabric::lent_region>& v);
result<std::vector<fabric::lent_region>> decode_lent(const std::string& text);

// ---- the application's side ----------------------------------------------------

struct client_options {
  fabric::fabric_options fabric;  // of the client's own endpoint (progress thread on)
  int threads = 1;        // lanes for push and restore by read
  uint64_t piece_bytes = 4ull << 20;
  double reply_timeout_s = 60;  // waiting for HELD / RESTORED
};

// A version an agent holds in memory (QUERY).
struct held_info {
  int64_t version = 0;
  uint64_t length = 0;   // image bytes
  uint32_t attempt = 0;  // shard_header::attempt
};
std::string encode_held(const std::vector<held_info>& v);
result<std::vector<held_info>> decode_held(const std::string& text);

struct restored_image {
  int64_t version = 0;
  uint64_t length = 0;  // bytes of the image written into the buffer
  format::shard_header header;
};

// One application rank talking to one agent. Thread-safety: one call at a
// time.
class agent_client {
 public:
  // agent_name: the agent's endpoint name (raw bytes; from_hex of its name file).
  static result<std::unique_ptr<agent_client>> create(const client_options& options, const std::string& agent_name);
  ~agent_client();

  // Hands `image` (a complete, checksummed shard image, e.g. a staging slot)
  // to the agent and waits until it holds the version: ok when the agent
  // verified and keeps it; its error (or io_error "not held" on a timeout)
  // otherwise. The image must stay unchanged until this returns.
  status checkpoint(std::span<std::byte> image, const format::shard_header& h, transfer_mode mode);
  // The same with regions lent (mode pull only): region i of h is read from
  // lent[i] (h.regions[i].length bytes) instead of the image when lent[i] is
  // not null; the image then needs a valid header block only. Lent memory is
  // registered on first use and stays registered (a registration cache)
  // until forget_lent(); it must stay unchanged until this returns.
  status checkpoint(std::span<std::byte> image, const format::shard_header& h,
                    std::span<const std::byte* const> lent);
  void forget_lent();

  // Fetches a held version (version -1: the newest) of (run, name, rank) into
  // `buffer`, verified. push: the agent writes into buffer; pull: this side
  // reads from the agent.
  result<restored_image> restore(const std::string& run, const std::string& name, uint32_t rank, int64_t version,
                                 std::span<std::byte> buffer, transfer_mode mode);

  // The versions of (run, name, rank) the agent holds in memory, oldest first.
  result<std::vector<held_info>> held(const std::string& run, const std::string& name, uint32_t rank);

  // Asks the agent to drop every version of `run` it holds (and not to write
  // those it has not written yet). Returns how many it dropped.
  result<uint64_t> release(const std::string& run);

  fabric::fabric_context& context();

 private:
  struct impl;
  explicit agent_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace cairn::agents

#endif

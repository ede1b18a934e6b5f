// The small two-sided messages of the inter-rank data plane (src/fabric):
// READY/HELD between the ranks of a job (aggregation leaders, redundancy
// sets: fabric/mailbox.hpp), and the agents' protocol between an application
// rank and its checkpoint agent (agents/data_protocol.hpp). A version of
// run/name for one rank, a registered buffer, a transfer mode, a reply code.
// Thread-safety: free functions, safe from any thread.
#ifndef CAIRN_FABRIC_MESSAGE_HPP
#define CAIRN_FABRIC_MESSAGE_HPP

#include <cstdint>
#include <string>
#include <string_view>

#include "cairn/status.hpp"

namespace cairn::fabric {

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
// `session` (random, per agent client) and `sent_ns` (the sender's wall clock)
// make a sealed message fresh: an agent refuses one whose session already sent
// that request, or that was sent outside its freshness window
// (agents::replay_guard); a client takes only replies that echo its session.
// Between a job's ranks, the session is the sending mailbox's and a receiver
// takes each request once (fabric/mailbox.hpp). Version 2 added them.
inline constexpr uint32_t kMessageMagic = 0x4d474143;  // "CAGM"
inline constexpr uint16_t kWireVersion = 2;

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
  uint64_t session = 0;  // an agent client's, echoed in replies; between ranks, the sender mailbox's
  int64_t sent_ns = 0;   // CLOCK_REALTIME when sent (ns since the epoch)
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

}  // namespace cairn::fabric

#endif

// The agents' protocol over the inter-rank data plane (src/fabric): the text
// lists some of its messages (fabric/message.hpp) carry, and the
// application's side (agent_client). The bytes move with
// fabric::transfer_engine and fabric::pull_image; the agent's side is
// tools/agent. See docs/design/agents_data_plane.md.
#ifndef CAIRN_AGENTS_DATA_PROTOCOL_HPP
#define CAIRN_AGENTS_DATA_PROTOCOL_HPP

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.hpp"
#include "fabric/fabric.hpp"
#include "fabric/message.hpp"
#include "fabric/seal.hpp"
#include "fabric/transfer.hpp"
#include "format/shard.hpp"

namespace cairn::agents {

// ---- protocol messages: the codec is fabric/message.hpp --------------------------
using fabric::data_message;
using fabric::data_message_status;
using fabric::data_msg;
using fabric::data_msg_name;
using fabric::decode_data_message;
using fabric::encode_data_message;
using fabric::transfer_mode;

// The lent regions of a READY (mode lend) as its text: "index:addr:key"
// entries, comma-separated.
std::string encode_lent(const std::vector<fabric::lent_region>& v);
result<std::vector<fabric::lent_region>> decode_lent(const std::string& text);

// ---- the seal ---------------------------------------------------------------------
// Every message between an application and its agents is sealed
// (fabric/seal.hpp) under the application's key, which the controller draws
// at its registration and hands to its ranks and, through their managers, to
// its agents (docs/design/security.md, "Agents"). The context is the
// direction, so that a request cannot be reflected as a reply. An agent
// started without a key (by hand, for a benchmark) takes unsealed messages
// only, and says so when it starts.
inline constexpr uint32_t kToAgent = 0x41474e54;    // "TNGA"
inline constexpr uint32_t kFromAgent = 0x41505050;  // "PPPA"

// ---- freshness --------------------------------------------------------------------
// A seal proves who sent a message, not when: someone who records the fabric's
// traffic could send a sealed RELEASE again and drop versions the application
// holds at its agent now. Every client message carries its client's random
// session and request number and its wall-clock sending time; the agent takes
// a message only if it was sent within `window_s` of the agent's clock, and if
// its session has not sent that request number with that type before (a
// client's requests increase; the messages of one request have distinct
// types). A session is forgotten once it has been silent for a window: its
// replays are stale by then. Clocks of the nodes must agree within the window
// (NTP does far better). Thread-safety: one thread (the agent's dispatch).
class replay_guard {
 public:
  static constexpr double kDefaultWindowS = 300;
  explicit replay_guard(double window_s = kDefaultWindowS) : window_ns_(static_cast<int64_t>(window_s * 1e9)) {}
  // ok, or invalid_argument saying why the message is refused (a replay, a
  // stale or future message, no session). Admitting records it.
  status admit(const data_message& m, int64_t now_ns);
  size_t sessions() const { return sessions_.size(); }

 private:
  struct seen {
    uint64_t request = 0;  // the highest request of the session
    uint32_t types = 0;    // bit per data_msg seen for that request
    int64_t last_ns = 0;   // when the session last sent (its clock)
  };
  int64_t window_ns_;
  int64_t swept_ns_ = 0;
  std::map<uint64_t, seen> sessions_;
};
// CLOCK_REALTIME in ns since the epoch (data_message::sent_ns).
int64_t wall_ns();

// ---- the application's side ----------------------------------------------------

struct client_options {
  fabric::fabric_options fabric;  // of the client's own endpoint (progress thread on)
  int threads = 1;        // lanes for push and restore by read
  uint64_t piece_bytes = 4ull << 20;
  double reply_timeout_s = 60;  // waiting for HELD / RESTORED
  std::string key;              // the application's key (fabric::kPlaneKeyBytes); empty: unsealed
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

// A held version the agent lends for reading (restore by read, kept open):
// its bytes are read in ranges until close_restore, or until the agent's
// transfer timeout drops the loan (reads then fail).
struct restore_lease {
  std::string run, name;
  uint32_t rank = 0;
  int64_t version = 0;
  uint64_t length = 0;  // image bytes
  uint64_t request = 0;
  fabric::remote_buffer source;
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
  // Starts opening the transfer lanes a restore by read uses (about 30 ms
  // of endpoint set-up) on a thread of their own, so that they are ready
  // when asked for; a restart calls it before its first QUERY.
  void prepare_lanes();
  // Restore by read in steps (restart_verify = while: the regions are read
  // straight into the application's memory and verified as they arrive):
  // asks the agent to lend a held version, reads ranges of it, and tells the
  // agent it is done (`st`: whether the reads went well).
  result<restore_lease> open_restore(const std::string& run, const std::string& name, uint32_t rank,
                                     int64_t version);
  status read_restored(const restore_lease& lease, uint64_t offset, std::span<std::byte> out);
  void close_restore(const restore_lease& lease, const status& st);

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

// The node daemon's wire protocol (docs/design/daemon.md): frames over a Unix
// stream socket in the abstract namespace (nothing left in any directory, and
// per network namespace, i.e. per node, when nodes are emulated that way).
// A frame is [u32 length of the rest][u8 type][u32 meta length][meta: JSON]
// [payload: bytes]; a staging slot's memory file travels with its frame as
// SCM_RIGHTS ancillary data.
// Thread-safety: a channel may be sent on from several threads (sends are
// serialized); recv() is for one thread at a time.
#ifndef CAIRN_DAEMON_PROTOCOL_HPP
#define CAIRN_DAEMON_PROTOCOL_HPP

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.hpp"
#include "util/mutex.hpp"

namespace cairn::daemon {

enum class msg : uint8_t {
  // rank -> daemon
  hello = 1,      // meta: rank, nranks, pid, executable, token, config (every key)
  slot = 2,       // meta: id, size; fd: the slot's memory file
  job = 3,        // meta: id, slot, wanted, captured_at, capture_s; payload: the planned shard header
  committed = 4,  // meta: name, version: the application committed it (no commit needed on its death)
  bye = 5,        // the rank finalized: nothing more will come
  start = 6,      // meta: redundancy (null, or the rank's set and every rank's daemon endpoint): build the engine
  release = 7,    // meta: id: the rank dropped this staging slot (a larger one replaced it)
  // daemon -> rank
  welcome = 16,   // meta: pid, plane (hex endpoint name of the session's redundancy plane, or "")
  stage = 17,     // meta: id, stage (image|local|persistent), code, message, seconds; payload: hash trees (image)
};

struct frame {
  msg type = msg::hello;
  std::string meta;     // JSON
  std::string payload;  // bytes
  int fd = -1;          // received: owned by the receiver; sent: borrowed
};

// Frame limits: a frame's meta is at most kMaxMeta bytes; a whole frame at
// most what its channel allows (a rank's planned shard header is at most
// 64 MiB, format::decode_header).
inline constexpr uint32_t kMaxMeta = 1u << 20;
inline constexpr uint32_t kMaxFrame = (64u << 20) + kMaxMeta;

class channel {
 public:
  channel() = default;
  explicit channel(int fd, uint32_t max_frame = 1u << 30) : fd_(fd), max_frame_(max_frame) {}
  ~channel();
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;

  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Sends one frame (and its fd, if any). io_error when the peer is gone.
  status send(const frame& f);
  // Receives one frame; not_found when the peer closed the connection,
  // corruption when its lengths break the limits (the stream cannot be read
  // on after that).
  result<frame> recv();
  // The largest frame recv() accepts from now on.
  void set_max_frame(uint32_t n) { max_frame_ = n; }
  // Makes recv() of another thread return (the connection is shut down).
  void shutdown();

 private:
  status read_exact(char* p, size_t n);
  int fd_ = -1;
  uint32_t max_frame_ = 1u << 30;
  cairn::mutex send_mu_;
  std::deque<int> fds_;  // received descriptors not yet claimed by a frame
};

// The meta of each frame a rank sends, decoded strictly (util::json): a field
// missing, of the wrong type or out of range is refused with a message that
// names it; nothing here throws (docs/design/security.md).
inline constexpr size_t kTokenBytes = 32;  // the execution's token, hex in the hello
struct hello_msg {
  int rank = -1;
  uint32_t nranks = 0;
  int pid = 0;
  std::string executable;
  std::string token;  // kTokenBytes, decoded
  std::map<std::string, std::string> config;
};
result<hello_msg> decode_hello(std::string_view meta);

struct slot_msg {
  uint64_t id = 0;
  uint64_t size = 0;
};
result<slot_msg> decode_slot(std::string_view meta);  // slot and release (size 0)

struct job_msg {
  uint64_t id = 0, slot = 0;
  uint32_t wanted = 0;
  double captured_at = 0, capture_s = 0;
};
result<job_msg> decode_job(std::string_view meta);

struct committed_msg {
  std::string name;
  int64_t version = 0;
};
result<committed_msg> decode_committed(std::string_view meta);

// The start frame: the rank's redundancy set, if any.
struct start_msg {
  struct set {
    std::string scheme;
    uint32_t k = 0, m = 0, position = 0;
    std::vector<uint32_t> members;
    std::vector<std::string> nodes;
    std::vector<std::string> peers;  // endpoint names, decoded
    std::string key;                 // the job's data-plane key (fabric/mailbox.hpp), decoded
    // What a protected version's MANIFEST records (absent from older ranks).
    bool has_record = false;
    std::string record_scheme, record_description;
    uint32_t record_k = 0, record_m = 0;
    std::vector<std::vector<uint32_t>> record_sets;
  };
  std::optional<set> redundancy;
};
result<start_msg> decode_start(std::string_view meta);

// The abstract socket name of a job's daemon on a node.
std::string socket_name(uint32_t attempt, const std::string& run, const std::string& node);
// Listening socket (backlog for every rank of a node); the fd, owned by the caller.
result<int> listen_on(const std::string& name);
// Connects, retrying until `timeout_s` for a daemon that is still starting.
// Connects as a rank does: the socket's owner (SO_PEERCRED) must be this
// process's user, else whoever holds the abstract name is not our daemon.
result<int> connect_to(const std::string& name, double timeout_s);
// The peer of a connected Unix socket runs as this process's user
// (SO_PEERCRED); permission denied otherwise (docs/design/security.md).
status check_peer_user(int fd, const std::string& what);

}  // namespace cairn::daemon

#endif

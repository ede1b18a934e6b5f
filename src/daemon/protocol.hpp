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
#include <mutex>
#include <string>

#include "cairn/status.hpp"

namespace cairn::daemon {

enum class msg : uint8_t {
  // rank -> daemon
  hello = 1,      // meta: rank, nranks, pid, attempt, executable, config (every key)
  slot = 2,       // meta: id, size; fd: the slot's memory file
  job = 3,        // meta: id, slot, wanted, captured_at, capture_s; payload: the planned shard header
  committed = 4,  // meta: name, version: the application committed it (no commit needed on its death)
  bye = 5,        // the rank finalized: nothing more will come
  start = 6,      // meta: redundancy (null, or the rank's set and every rank's daemon endpoint): build the engine
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

class channel {
 public:
  channel() = default;
  explicit channel(int fd) : fd_(fd) {}
  ~channel();
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;

  bool open() const { return fd_ >= 0; }
  // Sends one frame (and its fd, if any). io_error when the peer is gone.
  status send(const frame& f);
  // Receives one frame; not_found when the peer closed the connection.
  result<frame> recv();
  // Makes recv() of another thread return (the connection is shut down).
  void shutdown();

 private:
  status read_exact(char* p, size_t n);
  int fd_ = -1;
  std::mutex send_mu_;
  std::deque<int> fds_;  // received descriptors not yet claimed by a frame
};

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

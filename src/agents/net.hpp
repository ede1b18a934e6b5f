// TCP transport of the agents control plane: RAII sockets, addresses, an
// authenticated framed connection (handshake, sequence, timeouts, bounded
// buffers) and a poll-based single-threaded service loop; plus a blocking
// request/reply call for command-line tools. Protocol: docs/format/control.md.
//
// A slow or half-open peer cannot block a service: sockets are non-blocking,
// output is queued (bounded), and a connection is closed when its handshake,
// a frame it has begun, its output, or its silence exceeds the limits.
// A frame that fails validation closes its connection (the stream cannot be
// resynchronised) and is logged; a well-framed, authenticated message whose
// JSON body is invalid is answered with an error message instead.
// Thread-safety: none; each object belongs to one thread.
#ifndef CAIRN_AGENTS_NET_HPP
#define CAIRN_AGENTS_NET_HPP

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agents/wire.hpp"
#include "cairn/status.hpp"

namespace cairn::agents {

class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {}
  ~unique_fd() { reset(); }
  unique_fd(unique_fd&& o) noexcept : fd_(o.release()) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct net_address {
  std::string host;  // name or numeric address (IPv6 without brackets)
  uint16_t port = 0;
  std::string to_string() const;  // "host:port", "[v6]:port"
};
// "HOST:PORT" or "[V6ADDR]:PORT"; invalid_argument otherwise.
result<net_address> parse_address(std::string_view text);

// A listening, non-blocking socket bound to a (SO_REUSEADDR).
result<unique_fd> listen_tcp(const net_address& a);
// A connected, non-blocking socket; io_error after timeout_ms.
result<unique_fd> connect_tcp(const net_address& a, int timeout_ms);
// "host:port" of the socket's local or peer end.
std::string socket_name(int fd, bool peer);

struct net_limits {
  uint32_t max_payload = kDefaultMaxPayload;
  double handshake_timeout_s = 5;  // from accept/connect to an established session
  double frame_timeout_s = 10;     // a frame once begun must be complete within this
  double idle_timeout_s = 300;     // an established connection silent this long is closed
  double write_timeout_s = 10;     // queued output that makes no progress this long
  size_t max_output = 16u << 20;   // queued output bytes before the peer counts as stuck
  size_t max_connections = 256;
};

struct ctl_message {
  ctl_type type = ctl_type::error;
  nlohmann::json body;
};

// Client nonces of recent handshakes, to refuse a replayed hello.
class nonce_cache {
 public:
  explicit nonce_cache(size_t capacity = 4096) : capacity_(capacity) {}
  // False if the nonce was seen (then it is a replay).
  bool insert(const std::string& nonce);

 private:
  size_t capacity_;
  std::deque<std::string> order_;
  std::set<std::string> seen_;
};

class connection {
 public:
  enum class side { client, server };
  // `secret` is the deployment secret; `nonces` (server side) is shared by
  // the service's connections and must outlive this one.
  connection(unique_fd fd, side s, std::string secret, net_limits lim, std::string peer, double now,
             nonce_cache* nonces = nullptr);
  // Client side: queues the hello frame announcing `role` and `id`.
  void start_client(const std::string& role, const std::string& id);
  // Server side, before the hello: a hello sealed with `secret` instead of
  // the deployment secret comes from a service (controller, manager), and the
  // session then runs under it (service()). The role "manager" is then
  // refused from anyone who sealed the hello with the deployment secret.
  void accept_service_secret(std::string secret) { service_secret_ = std::move(secret); }
  // The peer proved the service secret (always false without one).
  bool service() const { return service_; }
  // Reads what the socket holds and appends each complete message. False when
  // the connection must be closed (close_reason(); rejected() if the peer
  // sent something invalid rather than simply closing).
  bool on_readable(double now, std::vector<ctl_message>* out);
  bool on_writable(double now);
  // Queues a message; before the handshake completes it waits in a queue.
  void send(ctl_type t, const nlohmann::json& body);
  // False when a time limit is exceeded (close_reason() says which).
  bool check_timeouts(double now);
  bool wants_write() const { return out_off_ < out_.size(); }
  bool established() const { return state_ == state::established; }
  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  const std::string& role() const { return role_; }       // the client's, from its hello
  // Once established: the handshake's client nonce, then the server's. A
  // proof over it is good for this connection only (auth.hpp app_request_proof).
  const std::string& binding() const { return binding_; }
  const std::string& peer_id() const { return peer_id_; }
  const std::string& close_reason() const { return close_reason_; }
  bool rejected() const { return rejected_; }

 private:
  enum class state { awaiting_hello, awaiting_ack, established };
  bool reject(frame_error e, const std::string& detail);
  bool handle_handshake(const decoded_frame& d);
  void queue_frame(std::string frame, double now);

  unique_fd fd_;
  side side_;
  std::string secret_;
  std::string service_secret_;
  bool service_ = false;
  net_limits lim_;
  std::string peer_;
  nonce_cache* nonces_;
  state state_;
  session sess_;
  std::string client_nonce_;
  box_keypair kx_;  // client side, until the hello_ack: its key exchange pair
  std::string binding_;
  std::string role_, peer_id_;
  std::string in_;
  std::string out_;
  size_t out_off_ = 0;
  std::vector<std::pair<ctl_type, std::string>> pending_;  // payloads queued before the handshake
  double created_ = 0, last_frame_ = 0, partial_since_ = 0, write_progress_ = 0;
  std::string close_reason_;
  bool rejected_ = false;
};

class poll_source;  // metrics_http.hpp

// Serves a listening socket and outbound connections with poll().
class service_loop {
 public:
  class handler {
   public:
    virtual ~handler() = default;
    virtual void on_message(uint64_t conn, ctl_message& m) = 0;
    virtual void on_closed(uint64_t conn) { (void)conn; }
  };

  service_loop(std::string secret, net_limits lim) : secret_(std::move(secret)), lim_(lim) {}
  status listen(const net_address& a);
  std::string listen_address() const;  // actual "host:port" (port 0 resolved)
  // Connects (blocking up to timeout_ms) and starts the handshake as a client,
  // under `secret` (empty: the loop's).
  result<uint64_t> connect(const net_address& a, const std::string& role, const std::string& id, int timeout_ms,
                           const std::string& secret = "");
  // The service secret its accepted connections take (connection::accept_service_secret).
  void set_service_secret(std::string secret) { service_secret_ = std::move(secret); }
  void send(uint64_t conn, ctl_type t, const nlohmann::json& body);
  void close(uint64_t conn, const std::string& why);
  connection* find(uint64_t conn);
  // One round: waits up to timeout_ms for activity, then accepts, reads,
  // dispatches messages to h, writes, and enforces time limits.
  void run_once(int timeout_ms, handler& h);
  size_t connections() const { return conns_.size(); }
  // Also polls `s` (not owned; it must outlive the loop or be detached with
  // nullptr) in run_once: the metrics endpoint (metrics_http.hpp).
  void attach(poll_source* s) { extra_ = s; }

 private:
  void drop(uint64_t id, handler& h);
  poll_source* extra_ = nullptr;
  std::string secret_;
  std::string service_secret_;
  net_limits lim_;
  unique_fd listen_fd_;
  std::map<uint64_t, std::unique_ptr<connection>> conns_;
  uint64_t next_id_ = 1;
  nonce_cache nonces_;
  std::set<uint64_t> closing_;
};

// errc from its name ("invalid_argument"); internal if unknown.
errc errc_from_name(std::string_view name);
// The body of an error message for s.
nlohmann::json error_body(const status& s);

// For the services' main functions (controller, manager, agent): SIGTERM and
// SIGINT set the returned flag; SIGPIPE is ignored (a peer that goes away is
// an error of that connection, not of the service).
const std::atomic<bool>* install_stop_signals();

// Blocking request/reply for tools: connects, handshakes as `role`, sends one
// message and returns the body of the reply; an error reply becomes its
// status; io_error on a network failure or timeout.
result<nlohmann::json> control_call(const net_address& a, const std::string& secret, const std::string& role,
                            ctl_type t, const nlohmann::json& body, int timeout_ms, net_limits lim = {});

// The same, for a request that proves something of this connection: the
// message is sent once the handshake is done, after `finish` completed its
// body with the connection's binding().
using body_finish = std::function<void(nlohmann::json& body, std::string_view binding)>;
result<nlohmann::json> control_call_bound(const net_address& a, const std::string& secret, const std::string& role,
                                          ctl_type t, nlohmann::json body, const body_finish& finish, int timeout_ms,
                                          net_limits lim = {});

}  // namespace cairn::agents

#endif

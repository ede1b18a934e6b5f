#include "agents/net.hpp"

#include <signal.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>

#include "agents/log.hpp"
#include "agents/metrics_http.hpp"
#include "agents/protocol.hpp"
#include "util/clock.hpp"
#include "util/hex.hpp"

namespace cairn::agents {
namespace {

using nlohmann::json;

status set_nonblocking(int fd) {
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return status::from_errno(errno, "fcntl O_NONBLOCK");
  return {};
}

void set_nodelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct addrinfo_list {
  struct addrinfo* head = nullptr;
  ~addrinfo_list() {
    if (head != nullptr) ::freeaddrinfo(head);
  }
};

status resolve(const net_address& a, bool passive, addrinfo_list* out) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  std::string port = std::to_string(a.port);
  int rc = ::getaddrinfo(a.host.c_str(), port.c_str(), &hints, &out->head);
  if (rc != 0) {
    return {errc::invalid_argument, "cannot resolve " + a.to_string() + ": " + ::gai_strerror(rc)};
  }
  return {};
}

bool allowed_role(const std::string& r) {
  return r == "manager" || r == "client" || r == "admin" || r == "agent";
}

}  // namespace

void unique_fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string net_address::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

result<net_address> parse_address(std::string_view text) {
  net_address a;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return status(errc::invalid_argument, "bad address '" + std::string(text) + "': expected [V6ADDR]:PORT");
    }
    a.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon) {
      return status(errc::invalid_argument, "bad address '" + std::string(text) + "': expected HOST:PORT");
    }
    a.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  unsigned p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (a.host.empty() || port.empty() || ec != std::errc() || end != port.data() + port.size() || p > 65535) {
    return status(errc::invalid_argument, "bad address '" + std::string(text) + "': expected HOST:PORT (port 0-65535)");
  }
  a.port = static_cast<uint16_t>(p);
  return a;
}

result<unique_fd> listen_tcp(const net_address& a) {
  addrinfo_list ai;
  CAIRN_RETURN_IF_ERROR(resolve(a, true, &ai));
  status last(errc::io_error, "no address to listen on for " + a.to_string());
  for (auto* p = ai.head; p != nullptr; p = p->ai_next) {
    unique_fd fd(::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol));
    if (!fd) {
      last = status::from_errno(errno, "socket for " + a.to_string());
      continue;
    }
    int one = 1;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), p->ai_addr, p->ai_addrlen) != 0) {
      last = status::from_errno(errno, "bind to " + a.to_string());
      continue;
    }
    if (::listen(fd.get(), 64) != 0) {
      last = status::from_errno(errno, "listen on " + a.to_string());
      continue;
    }
    CAIRN_RETURN_IF_ERROR(set_nonblocking(fd.get()));
    return fd;
  }
  return last;
}

result<unique_fd> connect_tcp(const net_address& a, int timeout_ms) {
  addrinfo_list ai;
  CAIRN_RETURN_IF_ERROR(resolve(a, false, &ai));
  status last(errc::io_error, "no address for " + a.to_string());
  for (auto* p = ai.head; p != nullptr; p = p->ai_next) {
    unique_fd fd(::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol));
    if (!fd) {
      last = status::from_errno(errno, "socket for " + a.to_string());
      continue;
    }
    CAIRN_RETURN_IF_ERROR(set_nonblocking(fd.get()));
    int rc = ::connect(fd.get(), p->ai_addr, p->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last = status::from_errno(errno, "connect to " + a.to_string());
      continue;
    }
    if (rc != 0) {
      struct pollfd pfd {fd.get(), POLLOUT, 0};
      int n;
      do {
        n = ::poll(&pfd, 1, timeout_ms);
      } while (n < 0 && errno == EINTR);
      if (n == 0) {
        last = status(errc::io_error, "connect to " + a.to_string() + ": no answer within " +
                                          std::to_string(timeout_ms) + " ms");
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (n < 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        last = status::from_errno(err != 0 ? err : errno, "connect to " + a.to_string());
        continue;
      }
    }
    set_nodelay(fd.get());
    return fd;
  }
  return last;
}

std::string socket_name(int fd, bool peer) {
  struct sockaddr_storage ss {};
  socklen_t len = sizeof ss;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (rc != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    port = ntohs(s->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    port = ntohs(s->sin6_port);
  }
  return net_address{host, port}.to_string();
}

bool nonce_cache::insert(const std::string& nonce) {
  if (!seen_.insert(nonce).second) return false;
  order_.push_back(nonce);
  if (order_.size() > capacity_) {
    seen_.erase(order_.front());
    order_.pop_front();
  }
  return true;
}

connection::connection(unique_fd fd, side s, std::string secret, net_limits lim, std::string peer, double now,
                       nonce_cache* nonces)
    : fd_(std::move(fd)),
      side_(s),
      secret_(std::move(secret)),
      lim_(lim),
      peer_(std::move(peer)),
      nonces_(nonces),
      state_(s == side::server ? state::awaiting_hello : state::awaiting_ack),
      created_(now),
      last_frame_(now),
      write_progress_(now) {}

void connection::start_client(const std::string& role, const std::string& id) {
  client_nonce_ = random_nonce();
  kx_ = new_box_keypair();
  json hello = {{"role", role},
                {"id", id},
                {"nonce", util::hex_encode(client_nonce_)},
                {"kx", util::hex_encode(kx_.public_key)}};
  queue_frame(encode_frame(secret_, ctl_type::hello, 0, util::dump_json(hello)), created_);
}

void connection::queue_frame(std::string frame, double now) {
  if (out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
    write_progress_ = now;
  }
  out_ += frame;
}

void connection::send(ctl_type t, const json& body) {
  std::string payload = util::dump_json(body);
  if (state_ != state::established) {
    pending_.emplace_back(t, std::move(payload));
    return;
  }
  queue_frame(sess_.seal(t, payload), util::now_s());
}

bool connection::reject(frame_error e, const std::string& detail) {
  rejected_ = true;
  close_reason_ = std::string(frame_error_name(e)) + ": " + detail;
  return false;
}

bool connection::handle_handshake(const decoded_frame& d) {
  if (side_ == side::server) {
    if (d.header.type != static_cast<uint16_t>(ctl_type::hello)) {
      return reject(frame_error::unexpected, std::string("first message must be hello, got ") +
                                                 type_name(static_cast<ctl_type>(d.header.type)));
    }
    if (d.header.seq != 0) return reject(frame_error::bad_sequence, "hello with sequence " + std::to_string(d.header.seq));
    auto body = util::parse_json_object(d.payload);
    if (!body) return reject(frame_error::bad_payload, "hello: " + body.error().message());
    fields f(*body, "hello");
    std::string role, id, nonce_hex, nonce, kx_hex, kx;
    f.str("role", &role, true, 16);
    f.str("id", &id, false, kMaxNameLength);
    f.str("nonce", &nonce_hex, true, 64);
    f.str("kx", &kx_hex, true, 64);
    if (!f.ok()) return reject(frame_error::bad_payload, f.error().message());
    if (!allowed_role(role)) return reject(frame_error::bad_payload, "hello: unknown role '" + role + "'");
    if (role == "manager" && !service_secret_.empty() && !service_)
      return reject(frame_error::bad_tag, "hello: the role manager needs the service secret, not the deployment secret");
    if (!util::hex_decode(nonce_hex, kNonceSize, &nonce)) return reject(frame_error::bad_payload, "hello: bad nonce");
    if (!util::hex_decode(kx_hex, kBoxPublicKeySize, &kx)) return reject(frame_error::bad_payload, "hello: bad kx");
    if (nonces_ != nullptr && !nonces_->insert(nonce)) {
      return reject(frame_error::replayed, "hello with a client nonce seen before");
    }
    const box_keypair mine = new_box_keypair();
    auto cipher = server_cipher_keys(mine, kx);
    if (!cipher) return reject(frame_error::bad_payload, "hello: " + cipher.error().message());
    std::string server_nonce = random_nonce();
    sess_ = session(derive_session_keys(secret_, nonce, server_nonce), std::move(*cipher), false);
    binding_ = nonce + server_nonce;
    role_ = role;
    peer_id_ = id;
    json ack = {{"nonce", nonce_hex},
                {"server_nonce", util::hex_encode(server_nonce)},
                {"kx", util::hex_encode(mine.public_key)}};
    queue_frame(encode_frame(secret_, ctl_type::hello_ack, 0, util::dump_json(ack)), util::now_s());
  } else {
    if (d.header.type != static_cast<uint16_t>(ctl_type::hello_ack)) {
      return reject(frame_error::unexpected, std::string("expected hello_ack, got ") +
                                                 type_name(static_cast<ctl_type>(d.header.type)));
    }
    if (d.header.seq != 0) return reject(frame_error::bad_sequence, "hello_ack with sequence " + std::to_string(d.header.seq));
    auto body = util::parse_json_object(d.payload);
    if (!body) return reject(frame_error::bad_payload, "hello_ack: " + body.error().message());
    fields f(*body, "hello_ack");
    std::string echo, sn_hex, sn, kx_hex, kx;
    f.str("nonce", &echo, true, 64);
    f.str("server_nonce", &sn_hex, true, 64);
    f.str("kx", &kx_hex, true, 64);
    if (!f.ok()) return reject(frame_error::bad_payload, f.error().message());
    if (echo != util::hex_encode(client_nonce_)) return reject(frame_error::replayed, "hello_ack for another handshake");
    if (!util::hex_decode(sn_hex, kNonceSize, &sn)) return reject(frame_error::bad_payload, "hello_ack: bad server nonce");
    if (!util::hex_decode(kx_hex, kBoxPublicKeySize, &kx)) return reject(frame_error::bad_payload, "hello_ack: bad kx");
    auto cipher = client_cipher_keys(kx_, kx);
    if (!cipher) return reject(frame_error::bad_payload, "hello_ack: " + cipher.error().message());
    sess_ = session(derive_session_keys(secret_, client_nonce_, sn), std::move(*cipher), true);
    kx_ = {};
    binding_ = client_nonce_ + sn;
  }
  state_ = state::established;
  double now = util::now_s();
  for (auto& [t, payload] : pending_) queue_frame(sess_.seal(t, payload), now);
  pending_.clear();
  return true;
}

bool connection::on_readable(double now, std::vector<ctl_message>* out) {
  // Read at most a few frames' worth per round, so one busy peer cannot
  // starve the others.
  const size_t budget = static_cast<size_t>(lim_.max_payload) + 64 * 1024;
  size_t got = 0;
  bool eof = false;
  char buf[64 * 1024];
  while (got < budget) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n > 0) {
      if (in_.empty()) partial_since_ = now;
      in_.append(buf, static_cast<size_t>(n));
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    close_reason_ = std::string("receive error: ") + std::strerror(errno);
    return false;
  }
  size_t off = 0;
  while (off < in_.size()) {
    std::string_view rest(in_.data() + off, in_.size() - off);
    std::string plain;
    decoded_frame d = state_ == state::established ? sess_.open(rest, lim_.max_payload, &plain)
                                                   : decode_frame(rest, secret_, lim_.max_payload);
    if (state_ == state::awaiting_hello && d.what == decoded_frame::kind::error && d.error == frame_error::bad_tag &&
        !service_secret_.empty()) {
      // A service's hello: the session runs under the service secret.
      decoded_frame s = decode_frame(rest, service_secret_, lim_.max_payload);
      if (s.what == decoded_frame::kind::frame) {
        d = s;
        service_ = true;
        secret_ = service_secret_;
      }
    }
    if (d.what == decoded_frame::kind::need_more) break;
    if (d.what == decoded_frame::kind::error) return reject(d.error, d.detail);
    last_frame_ = now;
    if (state_ != state::established) {
      if (!handle_handshake(d)) return false;
    } else {
      ctl_type t = static_cast<ctl_type>(d.header.type);
      if (t == ctl_type::hello || t == ctl_type::hello_ack) {
        return reject(frame_error::unexpected, std::string(type_name(t)) + " after the handshake");
      }
      auto body = util::parse_json_object(plain);
      if (!body) {
        // The frame is authentic and the stream intact: answer, keep the connection.
        log_rejection(peer_, "bad_payload", std::string(type_name(t)) + ": " + body.error().message());
        send(ctl_type::error, error_body(status(errc::invalid_argument,
                                                std::string(type_name(t)) + ": " + body.error().message())));
      } else {
        out->push_back(ctl_message{t, std::move(*body)});
      }
    }
    off += d.consumed;
  }
  in_.erase(0, off);
  if (!in_.empty() && off > 0) partial_since_ = now;
  if (eof) {
    if (!in_.empty()) return reject(frame_error::truncated, "connection closed inside a frame (" +
                                                                std::to_string(in_.size()) + " bytes pending)");
    close_reason_ = state_ == state::established ? "closed by peer" : "closed by peer during the handshake";
    return false;
  }
  return true;
}

bool connection::on_writable(double now) {
  while (out_off_ < out_.size()) {
    ssize_t n = ::send(fd_.get(), out_.data() + out_off_, out_.size() - out_off_, MSG_NOSIGNAL);
    if (n > 0) {
      out_off_ += static_cast<size_t>(n);
      write_progress_ = now;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_reason_ = std::string("send error: ") + (n < 0 ? std::strerror(errno) : "no progress");
    return false;
  }
  if (out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
  } else if (out_off_ > (1u << 20)) {
    out_.erase(0, out_off_);
    out_off_ = 0;
  }
  return true;
}

bool connection::check_timeouts(double now) {
  auto over = [&](const std::string& why) {
    close_reason_ = why;
    rejected_ = true;
    return false;
  };
  if (state_ != state::established && now - created_ > lim_.handshake_timeout_s) {
    return over("handshake not completed within " + std::to_string(lim_.handshake_timeout_s) + " s");
  }
  if (!in_.empty() && now - partial_since_ > lim_.frame_timeout_s) {
    return over("slow peer: a frame begun " + std::to_string(lim_.frame_timeout_s) + " s ago is still incomplete");
  }
  if (wants_write() && now - write_progress_ > lim_.write_timeout_s) {
    return over("peer does not read its replies (no progress for " + std::to_string(lim_.write_timeout_s) + " s)");
  }
  if (out_.size() - out_off_ > lim_.max_output) return over("peer does not read its replies (output over limit)");
  if (state_ == state::established && now - last_frame_ > lim_.idle_timeout_s) {
    close_reason_ = "idle for " + std::to_string(lim_.idle_timeout_s) + " s";
    return false;
  }
  return true;
}

status service_loop::listen(const net_address& a) {
  auto fd = listen_tcp(a);
  if (!fd) return fd.take_status();
  listen_fd_ = std::move(*fd);
  return {};
}

std::string service_loop::listen_address() const { return listen_fd_ ? socket_name(listen_fd_.get(), false) : ""; }

result<uint64_t> service_loop::connect(const net_address& a, const std::string& role, const std::string& id,
                                       int timeout_ms, const std::string& secret) {
  auto fd = connect_tcp(a, timeout_ms);
  if (!fd) return fd.take_status();
  std::string peer = a.to_string();
  auto c = std::make_unique<connection>(std::move(*fd), connection::side::client, secret.empty() ? secret_ : secret,
                                        lim_, peer, util::now_s());
  c->start_client(role, id);
  uint64_t cid = next_id_++;
  conns_[cid] = std::move(c);
  return cid;
}

void service_loop::send(uint64_t conn, ctl_type t, const json& body) {
  auto it = conns_.find(conn);
  if (it != conns_.end()) it->second->send(t, body);
}

void service_loop::close(uint64_t conn, const std::string& why) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  closing_.insert(conn);
  log(log_level::debug, "closing connection from " + it->second->peer() + ": " + why);
}

connection* service_loop::find(uint64_t conn) {
  auto it = conns_.find(conn);
  return it == conns_.end() ? nullptr : it->second.get();
}

void service_loop::drop(uint64_t id, handler& h) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  connection& c = *it->second;
  (void)c.on_writable(util::now_s());  // best effort: a final error reply
  if (c.rejected()) {
    auto colon = c.close_reason().find(':');
    log_rejection(c.peer(), c.close_reason().substr(0, colon),
                  colon == std::string::npos ? c.close_reason() : c.close_reason().substr(colon + 2));
  } else if (!c.close_reason().empty()) {
    log(log_level::debug, "connection from " + c.peer() + " closed: " + c.close_reason());
  }
  conns_.erase(it);
  h.on_closed(id);
}

void service_loop::run_once(int timeout_ms, handler& h) {
  std::vector<struct pollfd> pfds;
  std::vector<uint64_t> ids;
  if (listen_fd_) {
    pfds.push_back({listen_fd_.get(), POLLIN, 0});
    ids.push_back(0);
  }
  for (auto& [id, c] : conns_) {
    pfds.push_back({c->fd(), static_cast<short>(POLLIN | (c->wants_write() ? POLLOUT : 0)), 0});
    ids.push_back(id);
  }
  const size_t own = pfds.size();
  if (extra_ != nullptr) extra_->add_fds(&pfds);
  int n = ::poll(pfds.data(), pfds.size(), timeout_ms);
  if (n < 0 && errno != EINTR) log_error(std::string("poll: ") + std::strerror(errno));
  double now = util::now_s();
  if (extra_ != nullptr) extra_->on_events(pfds.data() + own, pfds.size() - own, now);
  for (size_t i = 0; n > 0 && i < own; ++i) {
    if (pfds[i].revents == 0) continue;
    if (ids[i] == 0) {
      for (;;) {
        struct sockaddr_storage ss {};
        socklen_t len = sizeof ss;
        int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN, or a transient error (EMFILE, ECONNABORTED): next round
        unique_fd cfd(fd);
        std::string peer = socket_name(fd, true);
        if (conns_.size() >= lim_.max_connections) {
          log_rejection(peer, "too_many_connections", std::to_string(conns_.size()) + " open");
          continue;
        }
        set_nodelay(fd);
        uint64_t cid = next_id_++;
        conns_[cid] = std::make_unique<connection>(std::move(cfd), connection::side::server, secret_, lim_, peer, now,
                                                   &nonces_);
        if (!service_secret_.empty()) conns_[cid]->accept_service_secret(service_secret_);
      }
      continue;
    }
    auto it = conns_.find(ids[i]);
    if (it == conns_.end() || closing_.count(ids[i])) continue;
    connection& c = *it->second;
    bool alive = true;
    if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
      std::vector<ctl_message> msgs;
      alive = c.on_readable(now, &msgs);
      for (auto& m : msgs) {
        if (closing_.count(ids[i])) break;
        h.on_message(ids[i], m);
      }
    }
    if (alive && (pfds[i].revents & POLLOUT)) alive = c.on_writable(now);
    if (!alive) closing_.insert(ids[i]);
  }
  // Replies queued above go out now when the socket takes them; limits.
  for (auto& [id, c] : conns_) {
    if (closing_.count(id)) continue;
    bool alive = !c->wants_write() || c->on_writable(now);
    if (alive) alive = c->check_timeouts(now);
    if (!alive) closing_.insert(id);
  }
  std::set<uint64_t> todo;
  todo.swap(closing_);
  for (uint64_t id : todo) drop(id, h);
}

errc errc_from_name(std::string_view name) {
  for (errc c : {errc::ok, errc::invalid_argument, errc::not_found, errc::corruption, errc::io_error, errc::no_space,
                 errc::again, errc::cancelled, errc::not_supported, errc::internal, errc::diverged,
                 errc::unusable, errc::exists, errc::earlier_failed, errc::busy}) {
    if (errc_name(c) == name) return c;
  }
  return errc::internal;
}

json error_body(const status& s) { return {{"code", std::string(errc_name(s.code()))}, {"message", s.message()}}; }

result<json> control_call(const net_address& a, const std::string& secret, const std::string& role, ctl_type t,
                  const json& body, int timeout_ms, net_limits lim) {
  return control_call_bound(a, secret, role, t, body, {}, timeout_ms, lim);
}

result<json> control_call_bound(const net_address& a, const std::string& secret, const std::string& role, ctl_type t,
                                json body, const body_finish& finish, int timeout_ms, net_limits lim) {
  const double deadline = util::now_s() + timeout_ms / 1000.0;
  auto fd = connect_tcp(a, timeout_ms);
  if (!fd) return fd.take_status();
  connection c(std::move(*fd), connection::side::client, secret, lim, a.to_string(), util::now_s());
  c.start_client(role, "");
  bool sent = false;
  // Without a finish the message waits in the connection's queue for the handshake.
  auto send_when_ready = [&] {
    if (sent || (finish && !c.established())) return;
    if (finish) finish(body, c.binding());
    c.send(t, body);
    sent = true;
  };
  send_when_ready();
  for (;;) {
    double now = util::now_s();
    if (now >= deadline) {
      return status(errc::io_error, "no reply from " + a.to_string() + " within " + std::to_string(timeout_ms) + " ms");
    }
    struct pollfd pfd {c.fd(), static_cast<short>(POLLIN | (c.wants_write() ? POLLOUT : 0)), 0};
    int remaining = static_cast<int>(std::ceil((deadline - now) * 1000.0));
    int n = ::poll(&pfd, 1, remaining);
    if (n < 0 && errno != EINTR) return status::from_errno(errno, "poll");
    if (n <= 0) continue;
    now = util::now_s();
    if ((pfd.revents & POLLOUT) && !c.on_writable(now)) {
      return status(errc::io_error, "sending to " + a.to_string() + ": " + c.close_reason());
    }
    if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
      std::vector<ctl_message> msgs;
      bool alive = c.on_readable(now, &msgs);
      if (alive) send_when_ready();
      if (!msgs.empty()) {
        ctl_message& m = msgs.front();
        if (m.type == ctl_type::reply) return std::move(m.body);
        if (m.type == ctl_type::error) {
          std::string code, text;
          fields f(m.body, "error");
          f.str("code", &code, true, 64);
          f.str("message", &text, true, 1u << 16);
          if (!f.ok()) return status(errc::internal, "malformed error reply from " + a.to_string());
          errc ec = errc_from_name(code);
          return status(ec == errc::ok ? errc::internal : ec, text);
        }
        return status(errc::internal, std::string("unexpected ") + type_name(m.type) + " from " + a.to_string());
      }
      if (!alive) {
        std::string hint = c.established() ? "" : " (does it use the same secret file? its log says why)";
        return status(errc::io_error, a.to_string() + " closed the connection: " + c.close_reason() + hint);
      }
    }
  }
}

namespace {
std::atomic<bool> g_stop_requested{false};
void on_stop_signal(int) { g_stop_requested.store(true); }
}  // namespace

const std::atomic<bool>* install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return &g_stop_requested;
}

}  // namespace cairn::agents

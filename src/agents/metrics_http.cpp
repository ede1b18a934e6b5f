#include "agents/metrics_http.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "agents/log.hpp"

namespace cairn::agents {
namespace {

// OpenMetrics label values escape backslash, double quote and newline.
std::string escape(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char ch : v) {
    if (ch == '\\') out += "\\\\";
    else if (ch == '"') out += "\\\"";
    else if (ch == '\n') out += "\\n";
    else out += ch;
  }
  return out;
}

// HELP text escapes backslash and newline.
std::string escape_help(std::string_view v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\') out += "\\\\";
    else if (ch == '\n') out += "\\n";
    else out += ch;
  }
  return out;
}

std::string number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

std::string reply(int code, std::string_view reason, std::string_view type, const std::string& body, bool head,
                  std::string_view extra_headers = {}) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + std::string(reason) + "\r\n";
  r += "Content-Type: " + std::string(type) + "\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += extra_headers;
  r += "Connection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

}  // namespace

void openmetrics_builder::family(std::string_view name, std::string_view type, std::string_view help,
                                 std::string_view unit) {
  out_ += "# TYPE " + std::string(name) + " " + std::string(type) + "\n";
  if (!unit.empty()) out_ += "# UNIT " + std::string(name) + " " + std::string(unit) + "\n";
  out_ += "# HELP " + std::string(name) + " " + escape_help(help) + "\n";
  sample_name_ = std::string(name);
  if (type == "counter") sample_name_ += "_total";
  if (type == "info") sample_name_ += "_info";
}

void openmetrics_builder::put(const labels& l, const std::string& value) {
  out_ += sample_name_;
  if (!l.empty()) {
    out_ += '{';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i > 0) out_ += ',';
      out_ += l[i].first + "=\"" + escape(l[i].second) + "\"";
    }
    out_ += '}';
  }
  out_ += ' ' + value + '\n';
}

void openmetrics_builder::sample(const labels& l, double value) { put(l, number(value)); }
void openmetrics_builder::sample(const labels& l, uint64_t value) { put(l, std::to_string(value)); }

std::string openmetrics_builder::finish() {
  std::string s = std::move(out_);
  s += "# EOF\n";
  out_.clear();
  return s;
}

result<http_request> parse_http_request(std::string_view head) {
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t a = line.find(' ');
  size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
  if (a == std::string_view::npos || b == std::string_view::npos || line.find(' ', b + 1) != std::string_view::npos ||
      a == 0 || b == a + 1) {
    return status(errc::invalid_argument, "malformed HTTP request line");
  }
  http_request r{std::string(line.substr(0, a)), std::string(line.substr(a + 1, b - a - 1)),
                 std::string(line.substr(b + 1))};
  if (r.version != "HTTP/1.1" && r.version != "HTTP/1.0") {
    return status(errc::invalid_argument, "unsupported HTTP version '" + r.version + "'");
  }
  return r;
}

std::string http_response(std::string_view head, const std::function<std::string()>& render) {
  constexpr std::string_view kText = "text/plain; charset=utf-8";
  auto r = parse_http_request(head);
  if (!r) return reply(400, "Bad Request", kText, r.error().message() + "\n", false);
  const bool is_head = r->method == "HEAD";
  if (r->method != "GET" && !is_head) {
    return reply(405, "Method Not Allowed", kText, "only GET and HEAD are served\n", false, "Allow: GET, HEAD\r\n");
  }
  std::string path = r->target.substr(0, r->target.find('?'));
  // An absolute-form target (a proxy's "http://host:port/metrics") names the same path.
  if (size_t scheme = lower(path).find("://"); scheme != std::string::npos) {
    size_t slash = path.find('/', scheme + 3);
    path = slash == std::string::npos ? "/" : path.substr(slash);
  }
  if (path != "/metrics") return reply(404, "Not Found", kText, "not found: the metrics are at /metrics\n", is_head);
  return reply(200, "OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render(), is_head);
}

status metrics_http_server::listen(const net_address& a) {
  auto fd = listen_tcp(a);
  if (!fd) return fd.error().with_context("metrics endpoint");
  listen_fd_ = std::move(*fd);
  return {};
}

std::string metrics_http_server::listen_address() const {
  return listen_fd_ ? socket_name(listen_fd_.get(), false) : std::string();
}

void metrics_http_server::add_fds(std::vector<struct pollfd>* fds) {
  if (listen_fd_) fds->push_back({listen_fd_.get(), POLLIN, 0});
  for (auto& [fd, c] : clients_) {
    fds->push_back({fd, static_cast<short>(c.answered && !c.draining ? POLLOUT : POLLIN), 0});
  }
}

void metrics_http_server::accept_all(double now) {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error: next round
    unique_fd cfd(fd);
    if (clients_.size() >= kMaxConnections) {
      log_rejection(socket_name(fd, true), "too_many_connections", "metrics endpoint");
      continue;
    }
    client c;
    c.fd = std::move(cfd);
    c.since = now;
    clients_.emplace(fd, std::move(c));
  }
}

bool metrics_http_server::on_readable(client& c, double now) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      if (c.in.size() > kMaxRequest) break;
      continue;
    }
    if (n == 0) return false;  // closed before its request was complete
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return false;
  }
  size_t end = c.in.find("\r\n\r\n");
  if (end == std::string::npos && c.in.size() <= kMaxRequest) return true;  // more to come
  ++requests_;
  if (end == std::string::npos || end + 4 > kMaxRequest) {
    c.out = reply(400, "Bad Request", "text/plain; charset=utf-8", "request head larger than 8 KiB\n", false);
  } else {
    c.out = http_response(std::string_view(c.in).substr(0, end + 2), render_);
  }
  c.answered = true;
  c.since = now;
  return on_writable(c, now);
}

bool metrics_http_server::on_writable(client& c, double now) {
  while (c.off < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.off, c.out.size() - c.off, MSG_NOSIGNAL);
    if (n > 0) {
      c.off += static_cast<size_t>(n);
      c.since = now;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
  ::shutdown(c.fd.get(), SHUT_WR);
  c.draining = true;
  c.since = now;
  return drain(c);
}

bool metrics_http_server::drain(client& c) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // the peer closed (0) or failed: done
  }
}

void metrics_http_server::on_events(const struct pollfd* fds, size_t n, double now) {
  for (size_t i = 0; i < n; ++i) {
    if (fds[i].revents == 0) continue;
    if (listen_fd_ && fds[i].fd == listen_fd_.get()) {
      accept_all(now);
      continue;
    }
    auto it = clients_.find(fds[i].fd);
    if (it == clients_.end()) continue;
    client& c = it->second;
    bool alive = c.draining ? drain(c) : c.answered ? on_writable(c, now) : on_readable(c, now);
    if (!alive) clients_.erase(it);
  }
  for (auto it = clients_.begin(); it != clients_.end();) {
    const double limit = it->second.answered && !it->second.draining ? kWriteTimeout : kRequestTimeout;
    if (now - it->second.since > limit) {
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace cairn::agents

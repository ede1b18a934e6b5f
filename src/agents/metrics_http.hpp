// The /metrics endpoint of the agents controller and managers
// (docs/design/metrics.md, "Agents"): an OpenMetrics 1.0 text builder and a
// minimal HTTP/1.1 responder that serves GET /metrics on the service's own
// poll loop (service_loop::attach), so the exposition is rendered on the
// service's thread from its live state at each scrape, without locks.
//
// The responder answers one request per connection (Connection: close):
// GET or HEAD /metrics -> 200 with the exposition; another path -> 404;
// another method -> 405; a request line or header it cannot read, or a
// request larger than 8 KiB -> 400. A connection that has not sent its whole
// request within 5 s, whose reader does not take the answer within 10 s, or
// that does not close within 5 s of the answer, is closed; at most 16 at once
// (more are closed on accept).
// Thread-safety: none; the service's thread owns it.
#ifndef CAIRN_AGENTS_METRICS_HTTP_HPP
#define CAIRN_AGENTS_METRICS_HTTP_HPP

#include <poll.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agents/net.hpp"
#include "cairn/status.hpp"

namespace cairn::agents {

// Builds an OpenMetrics text exposition: families in the order given, each
// with its TYPE and HELP, then its samples; finish() appends "# EOF".
class openmetrics_builder {
 public:
  using labels = std::vector<std::pair<std::string, std::string>>;
  // type: "counter", "gauge" or "info". A counter's samples are named
  // <name>_total, an info's <name>_info.
  void family(std::string_view name, std::string_view type, std::string_view help, std::string_view unit = {});
  // A sample of the current family.
  void sample(const labels& l, double value);
  void sample(const labels& l, uint64_t value);
  std::string finish();

 private:
  void put(const labels& l, const std::string& value);
  std::string out_;
  std::string sample_name_;
};

// Splits the head of an HTTP request ("GET /metrics HTTP/1.1\r\n...\r\n\r\n").
struct http_request {
  std::string method, target, version;
};
// invalid_argument when the request line is malformed.
result<http_request> parse_http_request(std::string_view head);
// The whole response (status line, headers, body) to `head` for an
// endpoint that serves `render()` at /metrics.
std::string http_response(std::string_view head, const std::function<std::string()>& render);

// Something besides the control connections that a service_loop polls.
class poll_source {
 public:
  virtual ~poll_source() = default;
  virtual void add_fds(std::vector<struct pollfd>* fds) = 0;
  // `fds` are those add_fds appended, with their revents.
  virtual void on_events(const struct pollfd* fds, size_t n, double now) = 0;
};

class metrics_http_server : public poll_source {
 public:
  explicit metrics_http_server(std::function<std::string()> render) : render_(std::move(render)) {}
  status listen(const net_address& a);
  std::string listen_address() const;  // actual "host:port" (port 0 resolved)
  void add_fds(std::vector<struct pollfd>* fds) override;
  void on_events(const struct pollfd* fds, size_t n, double now) override;
  uint64_t requests() const { return requests_; }

  static constexpr size_t kMaxRequest = 8192;
  static constexpr size_t kMaxConnections = 16;
  static constexpr double kRequestTimeout = 5;
  static constexpr double kWriteTimeout = 10;

 private:
  struct client {
    unique_fd fd;
    std::string in, out;
    size_t off = 0;
    bool answered = false;
    // Answer sent and our side shut: what the peer still sends is read and
    // dropped until it closes (a lingering close), so that closing with
    // unread input does not reset the connection before the peer read the
    // answer (a request over the limit).
    bool draining = false;
    double since = 0;  // accepted, then last write progress, then shut
  };
  void accept_all(double now);
  // False when the connection is done (answered and written, or failed).
  bool on_readable(client& c, double now);
  bool on_writable(client& c, double now);
  bool drain(client& c);

  std::function<std::string()> render_;
  unique_fd listen_fd_;
  std::map<int, client> clients_;  // by fd
  uint64_t requests_ = 0;
};

}  // namespace cairn::agents

#endif

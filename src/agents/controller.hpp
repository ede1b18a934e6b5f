// The agents controller service (`cairn controller`): one per deployment.
// Serves managers (registration, heartbeats, graceful leave; it pushes each
// node the set of agents it must run), applications (register, progress,
// resize, probe, unregister) and tools (status, migrate) on one TCP address,
// with controller_state for the decisions and a journal for its state.
// Restarted, it replays the journal and waits one heartbeat timeout for the
// managers to come back; agents keep running meanwhile.
// Thread-safety: run() on one thread; request_stop() from any thread or a
// signal handler.
#ifndef CAIRN_AGENTS_CONTROLLER_HPP
#define CAIRN_AGENTS_CONTROLLER_HPP

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "agents/controller_state.hpp"
#include "agents/journal.hpp"
#include "agents/metrics_http.hpp"
#include "agents/net.hpp"

namespace cairn::agents {

struct controller_options {
  net_address listen{"127.0.0.1", 7420};
  std::string secret;        // the deployment secret (bytes, not the path)
  // The service secret (bytes) that managers seal their hello with: only
  // they may then register nodes (and be sent applications' keys). Empty:
  // the deployment secret does (any application could pose as a manager).
  std::string service_secret;
  std::string journal_path;  // its directory is created if missing
  controller_policy policy;
  net_limits limits;
  uint64_t compact_after = 10000;  // records appended before the journal is rewritten
  // Where GET /metrics is served (OpenMetrics text; metrics_http.hpp); none
  // when unset.
  std::optional<net_address> metrics_listen;
};

// The controller's OpenMetrics exposition (families in docs/design/metrics.md,
// "Agents"): its nodes' memory and agents, applications, and the decisions
// it made since it started.
std::string controller_openmetrics(const controller_state& s);

class controller_service : private service_loop::handler {
 public:
  static result<std::unique_ptr<controller_service>> open(controller_options o);
  ~controller_service() override;
  std::string address() const { return loop_.listen_address(); }
  // The metrics endpoint's "host:port" (empty without one).
  std::string metrics_address() const { return metrics_ ? metrics_->listen_address() : std::string(); }
  const controller_state& state() const { return state_; }
  // One round of the service loop (tests drive it step by step).
  void run_once(int timeout_ms);
  // Serves until *stop becomes true.
  status run(const std::atomic<bool>* stop);

 private:
  explicit controller_service(controller_options o);
  void on_message(uint64_t conn, ctl_message& m) override;
  void on_closed(uint64_t conn) override;
  result<nlohmann::json> handle(uint64_t conn, ctl_message& m);
  void push_updates();
  void tick(double now);
  status journal_append(const nlohmann::json& rec);

  controller_options opt_;
  service_loop loop_;
  std::unique_ptr<metrics_http_server> metrics_;
  std::unique_ptr<journal> journal_;
  controller_state state_;
  std::map<uint64_t, std::string> node_of_conn_;
  std::map<std::string, uint64_t> conn_of_node_;
  // Each registered node's manager's public key (the applications' keys are
  // sealed to it in its node_update).
  std::map<std::string, std::string> node_box_key_;
  nlohmann::json update_for(const std::string& node) const;
  // Whether managers and tools must prove a service secret of their own.
  bool separate_service_secret() const;
  // A request about application `app` from c: from the service, or with the
  // application's request proof in body["proof"] (auth.hpp).
  status check_app_caller(const connection* c, uint64_t app, const nlohmann::json& body, const char* what) const;
  double next_fill_ = 0;
};

}  // namespace cairn::agents

#endif

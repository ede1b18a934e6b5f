// The agents manager service (`cairn manager`): one per agent node.
// Registers the node with the controller and heartbeats its metrics
// (metrics.hpp) and its agents; runs exactly the agents the controller's last
// node_update lists: starts each as a process (posix_spawn of the configured
// agent program, pid tracked, restarted with back-off if it exits), stops
// those no longer listed (SIGTERM, then SIGKILL after a grace period). When
// the controller is unreachable it keeps its agents running and reconnects
// with back-off; on stop it leaves gracefully (its agents move elsewhere)
// and then stops its agents. It also answers `status` on its own address.
//
// Agent launch contract: PROGRAM ARGS..., where each ARG may contain
// {agent} {app} {app_name} {node} {controller} {reserve} {run_dir}
// {stats_file} {secret_file} {store}; without --agent-arg the arguments are
//   --agent-id {agent} --app-id {app} --app {app_name} --node {node}
//   --controller {controller} --stats-file {stats_file} [--persistent {store}]
// ({store}: the application's persistent level, from its registration; the
// pair is left out when the application gave none). When the controller sent
// the application's key, `--key-fd 3` follows, and descriptor 3 is a pipe
// holding the key in hex (never argv or the environment, which other users
// of the node can read).
// stdout and stderr go to {run_dir}/agent-{agent}.log. An agent may write
// {stats_file} (JSON: bytes_in, bytes_out, checkpoints, memory_held,
// endpoint; replaced atomically) and the manager reports it.
// Thread-safety: run() on one thread.
#ifndef CAIRN_AGENTS_MANAGER_HPP
#define CAIRN_AGENTS_MANAGER_HPP

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "agents/metrics.hpp"
#include "agents/metrics_http.hpp"
#include "agents/net.hpp"
#include "agents/auth.hpp"
#include "agents/protocol.hpp"

namespace cairn::agents {

struct manager_options {
  net_address controller{"127.0.0.1", 7420};
  net_address listen{"127.0.0.1", 0};
  std::string secret;           // the deployment secret (bytes)
  std::string secret_file;      // its path, for {secret_file}
  std::string service_secret;   // what it seals its hello to the controller with (empty: the deployment secret)
  std::string node_id;
  uint32_t capacity = 0;        // agents this node takes; 0 = the controller's default
  std::string agent_program;    // empty: agents are recorded but not launched ("unlaunched")
  std::vector<std::string> agent_args;  // templates; empty = the default list above
  std::string run_dir;          // stats and log files of the agents
  double nominal_power_w = 200; // for the power estimate without RAPL
  double stop_grace_s = 3;
  std::string proc_root = "/proc";
  std::string sys_root = "/sys";
  net_limits limits;
  // Where GET /metrics is served (OpenMetrics text; metrics_http.hpp); none
  // when unset.
  std::optional<net_address> metrics_listen;
};

// What an agent's stats file says (the launch contract above); fields it
// does not write are 0.
struct agent_stats {
  uint64_t bytes_in = 0, bytes_out = 0, checkpoints = 0, memory_held = 0, memory_budget = 0, cancelled = 0;
  struct transfers {
    uint64_t held = 0, bytes = 0, failures = 0;
    double seconds = 0;
  };
  transfers pulls, pushes;
  std::string endpoint;
};
// invalid_argument when the text is not a stats object.
result<agent_stats> parse_agent_stats(std::string_view text);

class manager_service : private service_loop::handler {
 public:
  static result<std::unique_ptr<manager_service>> open(manager_options o);
  ~manager_service() override;
  std::string address() const { return loop_.listen_address(); }
  // The metrics endpoint's "host:port" (empty without one).
  std::string metrics_address() const { return metrics_ ? metrics_->listen_address() : std::string(); }
  // The OpenMetrics exposition of this node and its agents (families in
  // docs/design/metrics.md, "Agents"); reads the agents' stats files.
  std::string openmetrics();
  void run_once(int timeout_ms);
  // Serves until *stop; then leaves the controller and stops every agent.
  status run(const std::atomic<bool>* stop);

 private:
  struct agent_proc {
    desired_agent want;
    pid_t pid = 0;
    bool stopping = false;       // SIGTERM sent; erased once reaped
    double kill_at = 0;          // SIGKILL after this
    double next_start = 0;
    int restarts = 0;
    std::string state = "starting";
    std::string last_exit;
    // from the stats file
    uint64_t bytes = 0, checkpoints = 0, memory_held = 0;
    uint64_t prev_bytes = 0, prev_checkpoints = 0;
    double prev_t = 0, bw = 0, rate = 0;
    std::string endpoint;
    bool has_stats = false;
    agent_stats last;  // the stats file as last read
    // The application's data-plane key, opened from want.key_box (empty:
    // none was sent; the agent then runs unsealed). The agent reads it from
    // an inherited pipe (--key-fd 3), never from argv or the environment.
    std::string key;
  };

  explicit manager_service(manager_options o);
  void on_message(uint64_t conn, ctl_message& m) override;
  void on_closed(uint64_t conn) override;
  void tick(double now);
  void connect_controller(double now);
  nlohmann::json node_body(double now, bool registering);
  void apply_update(const node_update& u);
  void start_agent(agent_proc& a, double now);
  void stop_agent(agent_proc& a, double now);
  void reap(double now);
  void read_stats(agent_proc& a, double now);
  std::optional<agent_stats> load_stats(const agent_proc& a) const;
  std::vector<std::string> agent_argv(const agent_proc& a) const;
  nlohmann::json local_status(double now);

  manager_options opt_;
  service_loop loop_;
  std::unique_ptr<metrics_http_server> metrics_;
  metrics_sampler sampler_;
  uint64_t ctl_conn_ = 0;       // 0 = not connected
  bool registered_ = false;
  bool left_ = false;
  double next_connect_ = 0, backoff_ = 0.5, next_heartbeat_ = 0, heartbeat_s_ = 1.0;
  std::string last_connect_error_;
  node_metrics last_metrics_;
  std::map<uint64_t, agent_proc> agents_;
  std::vector<agent_proc> stopping_;  // no longer wanted, being stopped
  // Drawn at start; its public half goes with node_register, and the
  // controller seals the applications' keys to it.
  box_keypair box_ = new_box_keypair();
};

}  // namespace cairn::agents

#endif

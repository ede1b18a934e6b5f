// The controller's state and decisions, without sockets or files, so that
// every policy is unit-testable with a fake clock and an in-memory journal.
//
// State = registry of agent nodes (managers), applications (with hints and a
// target agent count) and agents (application, node, memory reserved). Every
// change is a journal record (docs/format/journal.md) committed through
// commit(): first handed to the journal sink (which makes it durable), then
// applied by apply(), the same function that replays the journal at restart;
// so a replayed journal reproduces the registry exactly. Volatile facts
// (metrics, heartbeat times, agent reports, progress) are never journaled:
// managers and applications send them again; the one exception is the
// checkpoint size an application reports, from which reservations derive.
// Thread-safety: none; the controller service calls it from its one thread.
#ifndef CAIRN_AGENTS_CONTROLLER_STATE_HPP
#define CAIRN_AGENTS_CONTROLLER_STATE_HPP

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agents/placement.hpp"
#include "agents/protocol.hpp"
#include "cairn/status.hpp"

namespace cairn::agents {

struct controller_policy {
  strategy strat = strategy::bandwidth;
  distribution dist = distribution::round_robin;
  uint32_t block_size = 2;         // for distribution::block
  uint32_t default_capacity = 4;   // agents per node when its manager gives none
  count_policy count;              // initial agent count
  double probe_cost_s = 2.5;       // t_probe until an application reports its own (iCheck §V-B5 measured ~2.5 s)
  double heartbeat_interval_s = 1.0;
  double heartbeat_timeout_s = 5.0;  // a node silent this long is lost
};

class controller_state {
 public:
  struct node {
    std::string id;
    std::string address;   // the manager's control address
    uint32_t capacity = 0;
    // volatile
    bool reported = false;  // metrics received since this controller started
    bool leaving = false;
    double last_seen = 0;   // monotonic seconds
    node_metrics metrics;
  };
  struct app {
    uint64_t id = 0;
    std::string name;
    app_hints hints;
    uint32_t target = 0;
    strategy strat = strategy::bandwidth;
    distribution dist = distribution::round_robin;
    uint32_t block_size = 2;
    // Its data-plane key (auth.hpp "application keys"), drawn at its first
    // registration and journaled; empty for an application a journal of an
    // older controller registered (its data plane is then unsealed).
    std::string key;
    // volatile
    uint64_t checkpoints_done = 0;
    double transfer_s = 0;       // measured transfer time with transfer_agents agents (0 = none yet)
    uint32_t transfer_agents = 0;
    double probe_s = 0;          // measured reconfiguration time (0 = none yet)
    uint64_t generation = 0;     // changes whenever its agents change
    std::string last_decision;   // last expansion decision, for status and to log changes once
  };
  struct agent {
    uint64_t id = 0;
    uint64_t app = 0;
    std::string node;
    uint64_t reserve = 0;  // bytes reserved on the node
    // volatile, from the node's reports
    std::string state = "assigned";
    int64_t pid = 0;
    uint64_t memory_held = 0;
    double bw = 0;
    double rate = 0;
    std::string endpoint;
  };

  // The outcome of a request to change an application's agent count.
  struct resize_decision {
    bool applied = false;
    std::string reason;
    uint32_t from = 0, to = 0;  // agents before and after
    double t_probe = 0, t_old = 0, t_new = 0;
    std::optional<uint64_t> remaining;  // checkpoints left, if known
    std::optional<double> break_even;   // n of equation (2)
    nlohmann::json to_json() const;
  };

  // Decisions this controller made since it started (volatile: not
  // journaled, not counted when a journal is replayed); the /metrics
  // endpoint's counters.
  struct decision_counts {
    uint64_t agents_placed = 0;   // agent_add records
    uint64_t agents_moved = 0;    // agent_move records (node left or lost, migration)
    uint64_t agents_removed = 0;  // agent_remove records (reduction, no room after a node went, app gone)
    uint64_t nodes_left = 0, nodes_lost = 0;
    uint64_t resize_applied = 0, resize_refused = 0;  // app_resize requests
    uint64_t expansions = 0;      // shortfalls filled where the break-even rule said so
  };

  using journal_fn = std::function<status(const nlohmann::json&)>;

  controller_state(controller_policy policy, journal_fn journal);

  const controller_policy& policy() const { return policy_; }
  const std::map<std::string, node>& nodes() const { return nodes_; }
  const std::map<uint64_t, app>& apps() const { return apps_; }
  const std::map<uint64_t, agent>& agents() const { return agents_; }
  const decision_counts& decisions() const { return decisions_; }

  // Applies one journal record (validated: invalid_argument/corruption for a
  // record that is malformed or refers to what does not exist). Used for
  // replay and by commit().
  status apply(const nlohmann::json& rec);
  // Records that rebuild the current journaled state from nothing (compaction).
  std::vector<nlohmann::json> snapshot() const;
  // After replay: every node counts as seen at `now`, so its manager has one
  // heartbeat timeout to come back before its agents are moved.
  void recovered(double now);

  // A manager registers (a new node joins, or a known one comes back after a
  // restart of either side). capacity 0 = policy default. Then expands
  // applications short of agents where that pays off.
  status node_register(const std::string& id, const std::string& address, uint32_t capacity,
                       const node_metrics& m, const std::vector<agent_report>& reports, double now);
  status node_heartbeat(const std::string& id, const node_metrics& m, const std::vector<agent_report>& reports,
                        double now);
  // Graceful leave: its agents move to other nodes (or are dropped when none
  // has room), then the node is removed. Returns the number of agents moved.
  result<uint32_t> node_leave(const std::string& id);
  // Nodes silent for longer than the heartbeat timeout are lost: handled as a
  // leave. Returns their ids.
  std::vector<std::string> expire(double now);

  // Registers an application: target count from its hints, placement by the
  // (given or default) strategy and distribution. Returns its id. An
  // application may get fewer agents than its target (even none) when the
  // nodes lack room; it gets the rest when room appears.
  result<uint64_t> app_register(const std::string& name, const app_hints& hints, std::optional<strategy> s,
                                std::optional<distribution> d, std::optional<uint32_t> block_size);
  status app_unregister(uint64_t id);
  // Progress an application reports: checkpoints done so far; measured
  // transfer time of one checkpoint (with its current agents) and of its last
  // reconfiguration, 0 when not measured (volatile: resent at every probe).
  // checkpoint_bytes (all ranks together, 0 = not known) replaces the hint
  // the application registered with (it rarely knows its size at init); a
  // new value is journaled (app_hints), since reservations derive from it.
  status app_progress(uint64_t id, uint64_t checkpoints_done, double transfer_s, double probe_s,
                      uint64_t checkpoint_bytes = 0);
  // Changes the target count to `count`. Expansion is applied only when the
  // break-even rule says it pays off for the checkpoints left, unless `force`;
  // reduction is always applied (it frees resources; the rule cannot justify
  // it). invalid_argument for count 0 or an unknown application.
  result<resize_decision> app_resize(uint64_t id, uint32_t count, bool force);
  // Moves an agent to `node` (empty: the best other node by its application's
  // strategy). Returns the node chosen.
  result<std::string> agent_migrate(uint64_t agent, const std::string& node);
  // Brings applications short of their target towards it where the
  // break-even rule says so (or unconditionally for one with no agent).
  status fill_shortfalls();

  // Estimated metrics of every node that can take agents now (reported, up,
  // not leaving). Computed afresh: what the placement index holds must equal it.
  std::vector<node_view> views() const;
  // "" when the placement index holds exactly views() and the applications
  // listed short of agents are exactly those; else what differs (the
  // simulation's and the tests' check of the indexes' upkeep).
  std::string index_mismatch();
  // The decision of growing `a` from `from` to `to` agents.
  resize_decision expansion_decision(const app& a, uint32_t from, uint32_t to) const;

  // The agents node `id` must run (node_update body).
  node_update desired_for(const std::string& id) const;
  // An application's agents (app_register / app_agents reply body).
  nlohmann::json app_agents_json(uint64_t id) const;
  // The whole state (status reply; `cairn agents status --json`).
  nlohmann::json status_json(double now) const;

  // Nodes whose desired agents changed since the last call.
  std::set<std::string> take_dirty_nodes();
  uint64_t generation() const { return generation_; }

 private:
  status commit(const nlohmann::json& rec);
  // An agent's node's or application's agents, by id (from the indexes).
  std::vector<const agent*> agents_on(const std::string& node) const;
  std::vector<const agent*> agents_of(uint64_t app) const;
  // Removes an agent and its index entries.
  void drop_agent(uint64_t id);
  template <typename K>
  static void unindex(std::map<K, std::set<uint64_t>>& index, const K& key, uint64_t id) {
    auto it = index.find(key);
    if (it == index.end()) return;
    it->second.erase(id);
    if (it->second.empty()) index.erase(it);
  }
  // The view of one node, nullopt when it cannot take agents now.
  std::optional<node_view> view_of(const std::string& id) const;
  // The placement index, with every stale node's view recomputed.
  const node_index& placement_index();
  // Recomputes one node's view in the index (removes it if it cannot take agents).
  void put_view(const std::string& id);
  // Keeps short_apps_: in it iff the application has fewer agents than its target.
  void note_short(uint64_t app);
  uint64_t reserve_per_agent(const app& a, uint32_t agents) const;
  double transfer_estimate(const app& a, uint32_t agents) const;
  // Moves every agent off `node` (to other nodes with room, else removes it).
  status evacuate(const std::string& node, uint32_t* moved);
  // Adds up to `count` agents to `a`; returns how many were placed.
  result<uint32_t> add_agents(const app& a, uint32_t count);
  void touch_app(uint64_t app);

  controller_policy policy_;
  journal_fn journal_;
  std::map<std::string, node> nodes_;
  std::map<uint64_t, app> apps_;
  std::map<uint64_t, agent> agents_;
  // Indexes of agents_ (agent ids per node and per application), kept by
  // apply() and drop_agent(): the decisions ask for them per node and per
  // application, which a scan of every agent makes quadratic at scale.
  std::map<std::string, std::set<uint64_t>> by_node_;
  std::map<uint64_t, std::set<uint64_t>> by_app_;
  // The views of the nodes that can take agents, in every strategy's order,
  // so that a placement does not rank every node. Whatever changes a node's
  // view marks it in stale_ (apply() for the journaled state, the heartbeat,
  // leave and expiry for the volatile one), or its application in
  // stale_apps_ when the estimates of all the application's nodes change
  // (its agent count or hints); placement_index() recomputes those before a
  // placement reads the index.
  node_index index_;
  std::set<std::string> stale_;
  std::set<uint64_t> stale_apps_;
  // Applications with fewer agents than their target, kept by apply():
  // fill_shortfalls visits these, not every application.
  std::set<uint64_t> short_apps_;
  uint64_t next_app_ = 1;
  uint64_t next_agent_ = 1;
  uint64_t generation_ = 0;
  std::set<std::string> dirty_;
  decision_counts decisions_;
};

}  // namespace cairn::agents

#endif

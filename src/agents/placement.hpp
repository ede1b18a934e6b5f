// Placement policy of the agents controller (paper 002, iCheck, §IV): how many
// agents an application gets, on which agent nodes (strategy), how they are
// spread over those nodes (distribution), and whether changing the number of
// agents pays off (the break-even rule, equations (1) and (2)).
// Every function is pure and deterministic (ties broken by node id), so the
// tests can state exactly which nodes must be chosen.
#ifndef CAIRN_AGENTS_PLACEMENT_HPP
#define CAIRN_AGENTS_PLACEMENT_HPP

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::agents {

// Which agent nodes are preferred (iCheck §IV-B).
enum class strategy {
  bandwidth,  // least bandwidth in use (most left for checkpoint transfers)
  memory,     // most free memory (large checkpoints)
  activity,   // least checkpoint activity (checkpoints per second on the node)
  power,      // least power draw (power budget)
};
// How the agents are spread over the preferred nodes (iCheck §IV-B).
enum class distribution {
  block,        // `block_size` consecutive agents per node, node after node
  round_robin,  // one agent per node, cycling (block of 1)
  fill,         // as many as a node takes before the next (fewest nodes)
};
const char* strategy_name(strategy s);
const char* distribution_name(distribution d);
std::optional<strategy> parse_strategy(std::string_view s);
std::optional<distribution> parse_distribution(std::string_view s);

// What the placement sees of a node: its free agent slots (capacity minus the
// agents already assigned) and its metrics as the controller estimates them
// now (reported by the manager, adjusted for agents assigned since).
struct node_view {
  std::string id;
  uint32_t free_slots = 0;
  uint64_t mem_free = 0;       // bytes
  double bw_in_use = 0;        // bytes per second, in + out
  double activity = 0;         // checkpoints per second received by its agents
  double power_w = 0;          // watts
};

// How many agents a node can still take: its free slots, and, when
// per_agent_bytes > 0, no more than mem_free / per_agent_bytes.
uint32_t node_room(const node_view& n, uint64_t per_agent_bytes);

// True iff `a` ranks before `b` under the strategy: the better metric first (a
// metric that is not a number ranks last), equal metrics by free slots (more
// first), then by node id. A strict weak order on any views.
bool ranks_before(const node_view& a, const node_view& b, strategy s);

// Indexes of the nodes with room for at least one agent, best first under the
// strategy (ranks_before).
std::vector<size_t> rank_nodes(std::span<const node_view> nodes, strategy s, uint64_t per_agent_bytes);

// Spreads `count` agents over nodes[order[0]], nodes[order[1]], ... in that
// order. Each pass gives every node with room min(block, room, left) agents;
// passes repeat until all are placed or no node has room. round_robin is a
// block of 1 and fill an unlimited block. Returns the node id of agent 0,
// 1, ...; fewer than `count` when the nodes lack room.
std::vector<std::string> distribute(std::span<const node_view> nodes, std::span<const size_t> order,
                                    uint32_t count, distribution d, uint32_t block_size,
                                    uint64_t per_agent_bytes);

// rank_nodes then distribute.
std::vector<std::string> place_agents(std::span<const node_view> nodes, uint32_t count, strategy s,
                                      distribution d, uint32_t block_size, uint64_t per_agent_bytes);

// The nodes' views kept in the order of every strategy, so that a placement
// reads the few best nodes it needs instead of ranking every node (at 10,000
// nodes a ranking costs milliseconds; docs/benchmarks/agents.md). Only nodes
// with a free slot are in the orders. Each put or erase costs O(log nodes)
// per strategy.
class node_index {
 public:
  node_index() = default;
  // The orders point into views_: a copy would point into the original.
  node_index(const node_index&) = delete;
  node_index& operator=(const node_index&) = delete;
  node_index(node_index&&) = default;  // a map's nodes stay where they are
  node_index& operator=(node_index&&) = default;

  // Inserts v, or replaces the view of the node v.id.
  void put(node_view v);
  void erase(const std::string& id);
  const node_view* find(const std::string& id) const;
  size_t size() const { return views_.size(); }
  // The views of every node in id order (for checks).
  std::vector<node_view> all() const;

  // Exactly place_agents(every view but `exclude`, ...), reading only the
  // prefix of the strategy's order that the distribution's first pass uses.
  std::vector<std::string> place(uint32_t count, strategy s, distribution d, uint32_t block_size,
                                 uint64_t per_agent_bytes, const std::string& exclude = {}) const;

 private:
  struct order_by {
    strategy s;
    bool operator()(const node_view* a, const node_view* b) const { return ranks_before(*a, *b, s); }
  };
  using order = std::set<const node_view*, order_by>;
  static constexpr size_t kStrategies = 4;
  void unlink(const node_view& v);
  std::map<std::string, node_view> views_;  // a map: the orders hold pointers into it
  std::array<order, kStrategies> orders_{order(order_by{strategy::bandwidth}), order(order_by{strategy::memory}),
                                         order(order_by{strategy::activity}), order(order_by{strategy::power})};
};

// What an application says about itself when it registers (0 = not known).
struct app_hints {
  uint32_t ranks = 0;
  uint32_t nodes = 0;
  uint64_t checkpoint_bytes = 0;  // bytes per checkpoint, all ranks together
  double interval_s = 0;          // seconds between checkpoints
  uint64_t checkpoints = 0;       // checkpoints the whole run will take
  std::string store;              // persistent level the agents write to (empty: memory only)
};

// Knobs of the initial agent count.
struct count_policy {
  uint32_t nodes_per_agent = 1;       // one agent per this many application nodes
  uint32_t max_agents = 16;           // per application
  double agent_bandwidth = 1e9;       // bytes/s one agent pulls (model)
  double transfer_fraction = 0.1;     // a checkpoint should move within this share of the interval
};

// Initial agent count (iCheck §IV-A), documented in docs/design/agents.md:
//   by_nodes = ceil(nodes / nodes_per_agent)                        (nodes known)
//   by_bw    = ceil(S / (agent_bandwidth * transfer_fraction * I))  (S and I known)
//   count    = max(1, by_nodes, by_bw), at most ranks (when known) and max_agents.
// This is the application's target; the system's state decides how many of
// them are placed now (room on the nodes), the rest follow when room appears.
uint32_t initial_agent_count(const app_hints& h, const count_policy& p);

// Modelled time of one checkpoint transfer with k agents: S / (k * agent_bandwidth).
double modelled_transfer_s(uint64_t checkpoint_bytes, uint32_t agents, double agent_bandwidth);

// The break-even rule of iCheck §IV-C2. With t_probe the time the application
// spends reconfiguring, t_old / t_new one checkpoint transfer with the old /
// new agents:
//   (1) ncops = (t_probe + t_new) / t_old - 1
//   (2) n     = ncops * t_old / t_new + 1
// and the change degrades the application if fewer than n checkpoints remain.
// break_even_checkpoints returns n, or nullopt when the inputs are outside the
// rule's domain (any input not finite, t_probe < 0, t_old <= 0, t_new <= 0).
std::optional<double> break_even_checkpoints(double t_probe, double t_old, double t_new);
// True iff the change makes transfers faster (t_new < t_old) and
// remaining_checkpoints >= n; false outside the domain. A change that does not
// make transfers faster never pays off by this rule (reductions are decided
// for resources, not speed).
bool change_pays_off(double t_probe, double t_old, double t_new, uint64_t remaining_checkpoints);

}  // namespace cairn::agents

#endif

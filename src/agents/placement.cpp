#include "agents/placement.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cairn::agents {

const char* strategy_name(strategy s) {
  switch (s) {
    case strategy::bandwidth: return "bandwidth";
    case strategy::memory: return "memory";
    case strategy::activity: return "activity";
    case strategy::power: return "power";
  }
  return "?";
}

const char* distribution_name(distribution d) {
  switch (d) {
    case distribution::block: return "block";
    case distribution::round_robin: return "round_robin";
    case distribution::fill: return "fill";
  }
  return "?";
}

std::optional<strategy> parse_strategy(std::string_view s) {
  for (strategy x : {strategy::bandwidth, strategy::memory, strategy::activity, strategy::power}) {
    if (s == strategy_name(x)) return x;
  }
  return std::nullopt;
}

std::optional<distribution> parse_distribution(std::string_view s) {
  for (distribution x : {distribution::block, distribution::round_robin, distribution::fill}) {
    if (s == distribution_name(x)) return x;
  }
  if (s == "round-robin") return distribution::round_robin;
  return std::nullopt;
}

uint32_t node_room(const node_view& n, uint64_t per_agent_bytes) {
  uint64_t room = n.free_slots;
  if (per_agent_bytes > 0) room = std::min<uint64_t>(room, n.mem_free / per_agent_bytes);
  return static_cast<uint32_t>(room);
}

namespace {

// 1 when a is better, -1 when b is, 0 when equal; a value that is not a
// number is worse than any number.
int compare_metric(double a, double b, bool lower_is_better) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na == nb ? 0 : (na ? -1 : 1);
  if (a == b) return 0;
  return (a < b) == lower_is_better ? 1 : -1;
}

// Agents a node gets per pass of distribute.
uint32_t block_of(distribution d, uint32_t block_size) {
  switch (d) {
    case distribution::block: return std::max<uint32_t>(1, block_size);
    case distribution::round_robin: return 1;
    case distribution::fill: return std::numeric_limits<uint32_t>::max();
  }
  return 1;
}

}  // namespace

bool ranks_before(const node_view& a, const node_view& b, strategy s) {
  int c = 0;
  switch (s) {
    case strategy::bandwidth: c = compare_metric(a.bw_in_use, b.bw_in_use, true); break;
    case strategy::memory: c = a.mem_free == b.mem_free ? 0 : (a.mem_free > b.mem_free ? 1 : -1); break;
    case strategy::activity: c = compare_metric(a.activity, b.activity, true); break;
    case strategy::power: c = compare_metric(a.power_w, b.power_w, true); break;
  }
  if (c != 0) return c > 0;
  // Equal metrics: the node with more free slots (spreads load), then the id.
  if (a.free_slots != b.free_slots) return a.free_slots > b.free_slots;
  return a.id < b.id;
}

std::vector<size_t> rank_nodes(std::span<const node_view> nodes, strategy s, uint64_t per_agent_bytes) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (node_room(nodes[i], per_agent_bytes) > 0) idx.push_back(i);
  }
  std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return ranks_before(nodes[x], nodes[y], s); });
  return idx;
}

std::vector<std::string> distribute(std::span<const node_view> nodes, std::span<const size_t> order,
                                    uint32_t count, distribution d, uint32_t block_size,
                                    uint64_t per_agent_bytes) {
  const uint32_t block = block_of(d, block_size);
  std::vector<uint32_t> room(order.size());
  for (size_t i = 0; i < order.size(); ++i) room[i] = node_room(nodes[order[i]], per_agent_bytes);
  std::vector<std::string> out;
  uint32_t left = count;
  while (left > 0) {
    bool placed = false;
    for (size_t i = 0; i < order.size() && left > 0; ++i) {
      uint32_t give = std::min({block, room[i], left});
      for (uint32_t k = 0; k < give; ++k) out.push_back(nodes[order[i]].id);
      room[i] -= give;
      left -= give;
      placed = placed || give > 0;
    }
    if (!placed) break;
  }
  return out;
}

std::vector<std::string> place_agents(std::span<const node_view> nodes, uint32_t count, strategy s,
                                      distribution d, uint32_t block_size, uint64_t per_agent_bytes) {
  std::vector<size_t> order = rank_nodes(nodes, s, per_agent_bytes);
  return distribute(nodes, order, count, d, block_size, per_agent_bytes);
}

void node_index::unlink(const node_view& v) {
  if (v.free_slots == 0) return;
  for (order& o : orders_) o.erase(&v);
}

void node_index::put(node_view v) {
  auto [it, fresh] = views_.try_emplace(v.id);
  if (!fresh) unlink(it->second);  // before its keys change
  it->second = std::move(v);
  if (it->second.free_slots == 0) return;
  for (order& o : orders_) o.insert(&it->second);
}

void node_index::erase(const std::string& id) {
  auto it = views_.find(id);
  if (it == views_.end()) return;
  unlink(it->second);
  views_.erase(it);
}

const node_view* node_index::find(const std::string& id) const {
  auto it = views_.find(id);
  return it == views_.end() ? nullptr : &it->second;
}

std::vector<node_view> node_index::all() const {
  std::vector<node_view> out;
  out.reserve(views_.size());
  for (const auto& [id, v] : views_) out.push_back(v);
  return out;
}

std::vector<std::string> node_index::place(uint32_t count, strategy s, distribution d, uint32_t block_size,
                                           uint64_t per_agent_bytes, const std::string& exclude) const {
  // distribute's first pass goes down the order until every agent is placed:
  // the nodes after that point get nothing, in that pass or any other.
  const uint32_t block = block_of(d, block_size);
  std::vector<node_view> prefix;
  uint32_t left = count;
  for (const node_view* v : orders_[static_cast<size_t>(s)]) {
    if (left == 0) break;
    if (v->id == exclude) continue;
    const uint32_t room = node_room(*v, per_agent_bytes);
    if (room == 0) {
      // Every node here has a free slot, so it lacks memory; under the memory
      // strategy so do all after it (they have no more memory free).
      if (s == strategy::memory) break;
      continue;
    }
    prefix.push_back(*v);
    left -= std::min({block, room, left});
  }
  std::vector<size_t> order(prefix.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  return distribute(prefix, order, count, d, block_size, per_agent_bytes);
}

uint32_t initial_agent_count(const app_hints& h, const count_policy& p) {
  uint64_t count = 1;
  if (h.nodes > 0) {
    uint64_t per = std::max<uint32_t>(1, p.nodes_per_agent);
    count = std::max<uint64_t>(count, (h.nodes + per - 1) / per);
  }
  if (h.checkpoint_bytes > 0 && h.interval_s > 0 && p.agent_bandwidth > 0 && p.transfer_fraction > 0) {
    double want = std::ceil(static_cast<double>(h.checkpoint_bytes) /
                            (p.agent_bandwidth * p.transfer_fraction * h.interval_s));
    if (std::isfinite(want) && want > static_cast<double>(count)) {
      count = want >= 1e9 ? uint64_t{1000000000} : static_cast<uint64_t>(want);
    }
  }
  if (h.ranks > 0) count = std::min<uint64_t>(count, h.ranks);
  count = std::min<uint64_t>(count, std::max<uint32_t>(1, p.max_agents));
  return static_cast<uint32_t>(count);
}

double modelled_transfer_s(uint64_t checkpoint_bytes, uint32_t agents, double agent_bandwidth) {
  if (agents == 0 || agent_bandwidth <= 0) return std::numeric_limits<double>::infinity();
  return static_cast<double>(checkpoint_bytes) / (static_cast<double>(agents) * agent_bandwidth);
}

std::optional<double> break_even_checkpoints(double t_probe, double t_old, double t_new) {
  if (!std::isfinite(t_probe) || !std::isfinite(t_old) || !std::isfinite(t_new)) return std::nullopt;
  if (t_probe < 0 || t_old <= 0 || t_new <= 0) return std::nullopt;
  const double ncops = (t_probe + t_new) / t_old - 1;  // equation (1)
  const double n = ncops * t_old / t_new + 1;           // equation (2)
  if (!std::isfinite(n)) return std::nullopt;
  return n;
}

bool change_pays_off(double t_probe, double t_old, double t_new, uint64_t remaining_checkpoints) {
  std::optional<double> n = break_even_checkpoints(t_probe, t_old, t_new);
  if (!n) return false;
  if (!(t_new < t_old)) return false;
  return static_cast<double>(remaining_checkpoints) >= *n;
}

}  // namespace cairn::agents

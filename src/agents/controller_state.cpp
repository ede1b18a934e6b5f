#include "agents/controller_state.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "agents/wire.hpp"
#include "util/clock.hpp"
#include "util/hex.hpp"

namespace cairn::agents {
namespace {

using nlohmann::json;

uint64_t sat_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

json controller_state::resize_decision::to_json() const {
  json j = {{"applied", applied}, {"reason", reason}, {"from", from}, {"to", to},
            {"t_probe", t_probe}, {"t_old", t_old},   {"t_new", t_new}};
  j["remaining"] = remaining ? json(*remaining) : json(nullptr);
  j["break_even"] = break_even ? json(*break_even) : json(nullptr);
  return j;
}

controller_state::controller_state(controller_policy policy, journal_fn journal)
    : policy_(policy), journal_(std::move(journal)) {
  // Generations only grow, across restarts too (clients compare them).
  generation_ = static_cast<uint64_t>(util::wall_s() * 1000.0);
}

void controller_state::touch_app(uint64_t app) {
  ++generation_;
  auto it = apps_.find(app);
  if (it != apps_.end()) it->second.generation = generation_;
}

// Longer than 120 lines for a reason: the dispatch over the journal's
// record kinds, each validated field by field where it is applied.
status controller_state::apply(const json& rec) {
  fields f(rec, "journal record");
  std::string op;
  f.str("op", &op, true, 32);
  if (!f.ok()) return f.error();
  auto bad = [&](const std::string& why) { return status(errc::invalid_argument, "journal record " + op + ": " + why); };

  if (op == "ids") {
    uint64_t na = 0, ng = 0;
    f.u64("next_app", &na);
    f.u64("next_agent", &ng);
    if (!f.ok()) return f.error();
    next_app_ = std::max(next_app_, na);
    next_agent_ = std::max(next_agent_, ng);
    return {};
  }
  if (op == "node_add") {
    std::string id, address;
    uint32_t capacity = 0;
    f.str("node", &id, true, kMaxNameLength);
    f.str("address", &address, true, 256);
    f.u32("capacity", &capacity, true, 1u << 16);
    if (!f.ok()) return f.error();
    if (!valid_name(id)) return bad("invalid node id '" + id + "'");
    node& n = nodes_[id];
    n.id = id;
    n.address = address;
    n.capacity = capacity;
    dirty_.insert(id);
    stale_.insert(id);
    return {};
  }
  if (op == "node_remove") {
    std::string id, reason;
    f.str("node", &id, true, kMaxNameLength);
    f.str("reason", &reason, false, 64);
    if (!f.ok()) return f.error();
    if (!nodes_.count(id)) return bad("unknown node " + id);
    if (auto on = by_node_.find(id); on != by_node_.end()) {
      for (uint64_t a : std::set<uint64_t>(on->second)) {
        const uint64_t app_id = agents_.at(a).app;
        touch_app(app_id);
        drop_agent(a);
        stale_apps_.insert(app_id);
        note_short(app_id);
      }
    }
    nodes_.erase(id);
    dirty_.insert(id);
    stale_.insert(id);
    return {};
  }
  if (op == "app_add") {
    app a;
    std::string s, d;
    f.u64("app", &a.id);
    f.str("name", &a.name, true, kMaxNameLength);
    f.u32("target", &a.target, true, 1u << 16);
    f.str("strategy", &s, true, 32);
    f.str("distribution", &d, true, 32);
    f.u32("block_size", &a.block_size, true, 1u << 16);
    const json* h = f.object("hints");
    std::string key;
    f.str("key", &key, false, 2 * kAppKeySize);
    if (!f.ok()) return f.error();
    auto hints = parse_hints(*h);
    if (!hints) return hints.error();
    a.hints = *hints;
    if (!key.empty() && !util::hex_decode(key, kAppKeySize, &a.key)) return bad("the key is not hex of 32 bytes");
    auto ps = parse_strategy(s);
    auto pd = parse_distribution(d);
    if (!ps || !pd) return bad("unknown strategy or distribution");
    a.strat = *ps;
    a.dist = *pd;
    if (a.id == 0 || apps_.count(a.id)) return bad("application id " + std::to_string(a.id) + " is taken or 0");
    if (!valid_name(a.name)) return bad("invalid application name");
    next_app_ = std::max(next_app_, a.id + 1);
    uint64_t id = a.id;
    apps_[id] = std::move(a);
    touch_app(id);
    note_short(id);
    return {};
  }
  if (op == "app_target") {
    uint64_t id = 0;
    uint32_t target = 0;
    f.u64("app", &id);
    f.u32("target", &target, true, 1u << 16);
    if (!f.ok()) return f.error();
    auto it = apps_.find(id);
    if (it == apps_.end()) return bad("unknown application " + std::to_string(id));
    it->second.target = target;
    touch_app(id);
    note_short(id);
    return {};
  }
  if (op == "app_hints") {
    uint64_t id = 0;
    f.u64("app", &id);
    const json* h = f.object("hints");
    if (!f.ok()) return f.error();
    auto hints = parse_hints(*h);
    if (!hints) return hints.error();
    auto it = apps_.find(id);
    if (it == apps_.end()) return bad("unknown application " + std::to_string(id));
    it->second.hints = *hints;
    stale_apps_.insert(id);
    return {};
  }
  if (op == "app_remove") {
    uint64_t id = 0;
    f.u64("app", &id);
    if (!f.ok()) return f.error();
    if (!apps_.count(id)) return bad("unknown application " + std::to_string(id));
    if (auto of = by_app_.find(id); of != by_app_.end()) {
      for (uint64_t a : std::set<uint64_t>(of->second)) {
        dirty_.insert(agents_.at(a).node);
        stale_.insert(agents_.at(a).node);
        drop_agent(a);
      }
    }
    apps_.erase(id);
    short_apps_.erase(id);
    ++generation_;
    return {};
  }
  if (op == "agent_add") {
    agent g;
    f.u64("agent", &g.id);
    f.u64("app", &g.app);
    f.str("node", &g.node, true, kMaxNameLength);
    f.u64("reserve", &g.reserve, false);
    if (!f.ok()) return f.error();
    if (g.id == 0 || agents_.count(g.id)) return bad("agent id " + std::to_string(g.id) + " is taken or 0");
    if (!apps_.count(g.app)) return bad("unknown application " + std::to_string(g.app));
    if (!nodes_.count(g.node)) return bad("unknown node " + g.node);
    next_agent_ = std::max(next_agent_, g.id + 1);
    dirty_.insert(g.node);
    touch_app(g.app);
    uint64_t id = g.id;
    const uint64_t app_id = g.app;
    by_node_[g.node].insert(id);
    by_app_[g.app].insert(id);
    agents_[id] = std::move(g);
    stale_apps_.insert(app_id);  // its node, and its application's others (their share changed)
    note_short(app_id);
    return {};
  }
  if (op == "agent_move") {
    uint64_t id = 0;
    std::string to;
    f.u64("agent", &id);
    f.str("node", &to, true, kMaxNameLength);
    if (!f.ok()) return f.error();
    auto it = agents_.find(id);
    if (it == agents_.end()) return bad("unknown agent " + std::to_string(id));
    if (!nodes_.count(to)) return bad("unknown node " + to);
    dirty_.insert(it->second.node);
    dirty_.insert(to);
    stale_.insert(it->second.node);
    stale_.insert(to);
    agent moved;
    moved.id = id;
    moved.app = it->second.app;
    moved.reserve = it->second.reserve;
    moved.node = to;
    unindex(by_node_, it->second.node, id);
    by_node_[to].insert(id);
    it->second = moved;  // a new process on the new node: no report yet
    touch_app(moved.app);
    return {};
  }
  if (op == "agent_remove") {
    uint64_t id = 0;
    f.u64("agent", &id);
    if (!f.ok()) return f.error();
    auto it = agents_.find(id);
    if (it == agents_.end()) return bad("unknown agent " + std::to_string(id));
    const uint64_t app_id = it->second.app;
    dirty_.insert(it->second.node);
    stale_.insert(it->second.node);
    touch_app(app_id);
    drop_agent(id);
    stale_apps_.insert(app_id);
    note_short(app_id);
    return {};
  }
  return bad("unknown operation");
}

std::vector<json> controller_state::snapshot() const {
  std::vector<json> out;
  out.push_back({{"op", "ids"}, {"next_app", next_app_}, {"next_agent", next_agent_}});
  for (const auto& [id, n] : nodes_) {
    out.push_back({{"op", "node_add"}, {"node", id}, {"address", n.address}, {"capacity", n.capacity}});
  }
  for (const auto& [id, a] : apps_) {
    out.push_back({{"op", "app_add"},
                   {"app", id},
                   {"name", a.name},
                   {"hints", to_json(a.hints)},
                   {"target", a.target},
                   {"strategy", strategy_name(a.strat)},
                   {"distribution", distribution_name(a.dist)},
                   {"block_size", a.block_size}});
    if (!a.key.empty()) out.back()["key"] = util::hex_encode(a.key);
  }
  for (const auto& [id, g] : agents_) {
    out.push_back({{"op", "agent_add"}, {"agent", id}, {"app", g.app}, {"node", g.node}, {"reserve", g.reserve}});
  }
  return out;
}

void controller_state::recovered(double now) {
  for (auto& [id, n] : nodes_) n.last_seen = now;
}

status controller_state::commit(const json& rec) {
  CAIRN_RETURN_IF_ERROR(journal_(rec));
  status st = apply(rec);
  if (!st) return status(errc::internal, "controller produced an invalid journal record: " + st.message());
  const std::string op = rec.value("op", "");
  if (op == "agent_add") ++decisions_.agents_placed;
  else if (op == "agent_move") ++decisions_.agents_moved;
  else if (op == "agent_remove") ++decisions_.agents_removed;
  else if (op == "node_remove") ++(rec.value("reason", "") == "lost" ? decisions_.nodes_lost : decisions_.nodes_left);
  return {};
}

std::vector<const controller_state::agent*> controller_state::agents_on(const std::string& node) const {
  std::vector<const agent*> out;
  if (auto it = by_node_.find(node); it != by_node_.end())
    for (uint64_t id : it->second) out.push_back(&agents_.at(id));
  return out;
}

std::vector<const controller_state::agent*> controller_state::agents_of(uint64_t app) const {
  std::vector<const agent*> out;
  if (auto it = by_app_.find(app); it != by_app_.end())
    for (uint64_t id : it->second) out.push_back(&agents_.at(id));
  return out;
}

void controller_state::drop_agent(uint64_t id) {
  auto it = agents_.find(id);
  unindex(by_node_, it->second.node, id);
  unindex(by_app_, it->second.app, id);
  agents_.erase(it);
}

uint64_t controller_state::reserve_per_agent(const app& a, uint32_t agents) const {
  if (a.hints.checkpoint_bytes == 0 || agents == 0) return 0;
  return (a.hints.checkpoint_bytes + agents - 1) / agents;
}

double controller_state::transfer_estimate(const app& a, uint32_t agents) const {
  if (agents == 0) return 0;
  if (a.transfer_s > 0 && a.transfer_agents > 0) {
    // Measured with transfer_agents agents; transfers scale with the agent count.
    return a.transfer_s * a.transfer_agents / agents;
  }
  if (a.hints.checkpoint_bytes > 0) {
    return modelled_transfer_s(a.hints.checkpoint_bytes, agents, policy_.count.agent_bandwidth);
  }
  return 0;  // unknown
}

std::optional<node_view> controller_state::view_of(const std::string& id) const {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return std::nullopt;
  const node& n = it->second;
  if (!n.reported || n.leaving) return std::nullopt;
  node_view v;
  v.id = id;
  v.mem_free = n.metrics.mem_free;
  v.bw_in_use = n.metrics.bw_in_use;
  v.activity = n.metrics.activity;
  v.power_w = n.metrics.power_w;
  uint32_t used = 0;
  if (auto on = by_node_.find(id); on != by_node_.end()) {
    for (uint64_t gid : on->second) {
      const agent* g = &agents_.at(gid);
      ++used;
      // What an agent will take but its node has not measured yet.
      v.mem_free = sat_sub(v.mem_free, sat_sub(g->reserve, g->memory_held));
      const app& a = apps_.at(g->app);
      if (a.hints.interval_s > 0) {
        auto of = by_app_.find(a.id);
        uint32_t k = of == by_app_.end() ? 0 : static_cast<uint32_t>(of->second.size());
        double share = k > 0 ? static_cast<double>(a.hints.checkpoint_bytes) / k : 0;
        v.bw_in_use += std::max(0.0, share / a.hints.interval_s - g->bw);
        v.activity += std::max(0.0, 1.0 / a.hints.interval_s - g->rate);
      }
    }
  }
  v.free_slots = n.capacity > used ? n.capacity - used : 0;
  return v;
}

std::vector<node_view> controller_state::views() const {
  std::vector<node_view> out;
  out.reserve(nodes_.size());
  for (const auto& entry : nodes_) {
    if (auto v = view_of(entry.first)) out.push_back(std::move(*v));
  }
  return out;
}

const node_index& controller_state::placement_index() {
  // An application's nodes are looked up only now: a replayed journal marks
  // applications by the thousand and places nothing.
  for (uint64_t app : stale_apps_) {
    if (auto of = by_app_.find(app); of != by_app_.end()) {
      for (uint64_t gid : of->second) stale_.insert(agents_.at(gid).node);
    }
  }
  stale_apps_.clear();
  for (const std::string& id : stale_) put_view(id);
  stale_.clear();
  return index_;
}

void controller_state::note_short(uint64_t app) {
  auto it = apps_.find(app);
  auto of = by_app_.find(app);
  const size_t have = of == by_app_.end() ? 0 : of->second.size();
  if (it != apps_.end() && have < it->second.target) short_apps_.insert(app);
  else short_apps_.erase(app);
}

void controller_state::put_view(const std::string& id) {
  if (auto v = view_of(id)) index_.put(std::move(*v));
  else index_.erase(id);
}

std::string controller_state::index_mismatch() {
  auto same = [](const node_view& a, const node_view& b) {
    auto eq = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
    return a.id == b.id && a.free_slots == b.free_slots && a.mem_free == b.mem_free && eq(a.bw_in_use, b.bw_in_use) &&
           eq(a.activity, b.activity) && eq(a.power_w, b.power_w);
  };
  const std::vector<node_view> want = views();
  const std::vector<node_view> have = placement_index().all();
  for (size_t i = 0; i < std::max(want.size(), have.size()); ++i) {
    if (i >= want.size()) return "the placement index holds node " + have[i].id + ", which cannot take agents";
    if (i >= have.size() || want[i].id != have[i].id) return "the placement index lacks node " + want[i].id;
    if (!same(want[i], have[i])) return "the placement index holds a stale view of node " + want[i].id;
  }
  for (const auto& [id, a] : apps_) {
    auto of = by_app_.find(id);
    const bool is_short = (of == by_app_.end() ? 0 : of->second.size()) < a.target;
    if (is_short != (short_apps_.count(id) > 0))
      return "application " + std::to_string(id) + (is_short ? " is short of agents but not listed so" : " is listed short of agents but is not");
  }
  return "";
}

controller_state::resize_decision controller_state::expansion_decision(const app& a, uint32_t from,
                                                                       uint32_t to) const {
  resize_decision d;
  d.from = from;
  d.to = to;
  d.t_probe = a.probe_s > 0 ? a.probe_s : policy_.probe_cost_s;
  d.t_old = transfer_estimate(a, from);
  d.t_new = transfer_estimate(a, to);
  if (a.hints.checkpoints > 0) d.remaining = a.hints.checkpoints - std::min(a.checkpoints_done, a.hints.checkpoints);
  d.break_even = break_even_checkpoints(d.t_probe, d.t_old, d.t_new);
  if (to <= from) {
    d.applied = false;
    d.reason = "not an expansion";
    return d;
  }
  if (from == 0) {
    d.applied = true;
    d.reason = "the application has no agent";
    return d;
  }
  if (d.t_old <= 0 || d.t_new <= 0) {
    d.applied = true;
    d.reason = "no transfer time known (no checkpoint size hint, no measurement): restoring the target count";
    return d;
  }
  uint64_t remaining = d.remaining.value_or(std::numeric_limits<uint64_t>::max());
  d.applied = change_pays_off(d.t_probe, d.t_old, d.t_new, remaining);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %s checkpoints left, break-even after %.3g (t_probe %.3gs, t_old %.3gs, t_new %.3gs)",
                d.applied ? "pays off" : "does not pay off",
                d.remaining ? std::to_string(*d.remaining).c_str() : "unknown (assumed many)",
                d.break_even ? *d.break_even : std::nan(""), d.t_probe, d.t_old, d.t_new);
  d.reason = buf;
  return d;
}

result<uint32_t> controller_state::add_agents(const app& a, uint32_t count) {
  uint32_t have = static_cast<uint32_t>(agents_of(a.id).size());
  uint64_t per = reserve_per_agent(a, have + count);
  std::vector<std::string> where = placement_index().place(count, a.strat, a.dist, a.block_size, per);
  uint64_t app_id = a.id;  // `a` may move while records are applied
  for (const std::string& node : where) {
    CAIRN_RETURN_IF_ERROR(commit({{"op", "agent_add"}, {"agent", next_agent_}, {"app", app_id}, {"node", node},
                                  {"reserve", per}}));
  }
  return static_cast<uint32_t>(where.size());
}

status controller_state::evacuate(const std::string& node, uint32_t* moved) {
  std::map<uint64_t, std::vector<uint64_t>> by_app;
  std::map<uint64_t, uint64_t> largest_reserve;
  for (const agent* g : agents_on(node)) {
    by_app[g->app].push_back(g->id);
    largest_reserve[g->app] = std::max(largest_reserve[g->app], g->reserve);
  }
  for (const auto& [app_id, ids] : by_app) {
    const app& a = apps_.at(app_id);
    // A moved agent keeps its reservation, which is larger than an agent's
    // share now when the application gained agents since it was placed: the
    // room must fit the reservation it carries.
    uint64_t per = std::max(reserve_per_agent(a, static_cast<uint32_t>(agents_of(app_id).size())),
                            largest_reserve[app_id]);
    std::vector<std::string> where =
        placement_index().place(static_cast<uint32_t>(ids.size()), a.strat, a.dist, a.block_size, per, node);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i < where.size()) {
        CAIRN_RETURN_IF_ERROR(commit({{"op", "agent_move"}, {"agent", ids[i]}, {"node", where[i]}}));
        ++*moved;
      } else {
        CAIRN_RETURN_IF_ERROR(commit({{"op", "agent_remove"}, {"agent", ids[i]}}));
      }
    }
  }
  return {};
}

status controller_state::node_register(const std::string& id, const std::string& address, uint32_t capacity,
                                       const node_metrics& m, const std::vector<agent_report>& reports,
                                       double now) {
  if (!valid_name(id)) return {errc::invalid_argument, "invalid node id '" + id + "' (1-128 of [A-Za-z0-9._:@-])"};
  if (address.empty() || address.size() > 256) return {errc::invalid_argument, "invalid node address"};
  uint32_t cap = capacity > 0 ? capacity : policy_.default_capacity;
  auto it = nodes_.find(id);
  if (it == nodes_.end() || it->second.address != address || it->second.capacity != cap) {
    CAIRN_RETURN_IF_ERROR(commit({{"op", "node_add"}, {"node", id}, {"address", address}, {"capacity", cap}}));
  }
  dirty_.insert(id);  // it gets its desired agents in any case
  CAIRN_RETURN_IF_ERROR(node_heartbeat(id, m, reports, now));
  return fill_shortfalls();
}

status controller_state::node_heartbeat(const std::string& id, const node_metrics& m,
                                        const std::vector<agent_report>& reports, double now) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return {errc::not_found, "node " + id + " is not registered (register again)"};
  node& n = it->second;
  n.reported = true;
  n.leaving = false;
  n.last_seen = now;
  n.metrics = m;
  static const std::set<uint64_t> none;
  auto on = by_node_.find(id);
  for (uint64_t gid : on == by_node_.end() ? none : on->second) {
    agent& g = agents_.at(gid);
    auto it_r = std::find_if(reports.begin(), reports.end(), [&](const agent_report& x) { return x.agent == gid; });
    const agent_report* r = it_r == reports.end() ? nullptr : &*it_r;
    if (r == nullptr) {
      // Its manager does not have it (not launched yet, or the manager
      // restarted): nothing it reported before is true any more, and the
      // memory it held must count as reserved again.
      g.state = "assigned";
      g.pid = 0;
      g.memory_held = 0;
      g.bw = g.rate = 0;
      if (!g.endpoint.empty()) {
        g.endpoint.clear();
        touch_app(g.app);
      }
      continue;
    }
    g.state = r->state;
    g.pid = r->pid;
    g.memory_held = r->memory_held;
    g.bw = r->bw;
    g.rate = r->rate;
    if (g.endpoint != r->endpoint) {
      g.endpoint = r->endpoint;
      touch_app(g.app);
    }
  }
  // Its view now, not at the next placement: a heartbeat pays for itself
  // (every node sends one each interval). view_of reads the whole state, so
  // a stale mark of this node is settled too.
  stale_.erase(id);
  put_view(id);
  return {};
}

result<uint32_t> controller_state::node_leave(const std::string& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return status(errc::not_found, "node " + id + " is not registered");
  it->second.leaving = true;
  stale_.insert(id);
  uint32_t moved = 0;
  CAIRN_RETURN_IF_ERROR(evacuate(id, &moved));
  CAIRN_RETURN_IF_ERROR(commit({{"op", "node_remove"}, {"node", id}, {"reason", "left"}}));
  return moved;
}

std::vector<std::string> controller_state::expire(double now) {
  std::vector<std::string> lost;
  for (auto& [id, n] : nodes_) {
    if (now - n.last_seen > policy_.heartbeat_timeout_s) {
      n.leaving = true;  // no placement onto any lost node while the others are evacuated
      stale_.insert(id);
      lost.push_back(id);
    }
  }
  for (const std::string& id : lost) {
    uint32_t moved = 0;
    // A journal failure leaves the node marked leaving; the next tick retries.
    if (!evacuate(id, &moved)) continue;
    (void)commit({{"op", "node_remove"}, {"node", id}, {"reason", "lost"}});
  }
  return lost;
}

result<uint64_t> controller_state::app_register(const std::string& name, const app_hints& hints,
                                                std::optional<strategy> s, std::optional<distribution> d,
                                                std::optional<uint32_t> block_size) {
  if (!valid_name(name)) {
    return status(errc::invalid_argument, "invalid application name '" + name + "' (1-128 of [A-Za-z0-9._:@-])");
  }
  // The same name again is the same application coming back (a restarted
  // job): it gets its registration, and the agents that hold its checkpoints.
  for (const auto& [id, a] : apps_) {
    if (a.name != name) continue;
    apps_.at(id).last_decision = "re-registered: kept its " + std::to_string(agents_of(id).size()) + " agents";
    return id;
  }
  uint32_t target = initial_agent_count(hints, policy_.count);
  uint64_t id = next_app_;
  CAIRN_RETURN_IF_ERROR(commit({{"op", "app_add"},
                                {"app", id},
                                {"name", name},
                                {"hints", to_json(hints)},
                                {"target", target},
                                {"strategy", strategy_name(s.value_or(policy_.strat))},
                                {"distribution", distribution_name(d.value_or(policy_.dist))},
                                {"block_size", std::max<uint32_t>(1, block_size.value_or(policy_.block_size))},
                                {"key", util::hex_encode(new_app_key())}}));
  auto placed = add_agents(apps_.at(id), target);
  if (!placed) return placed.take_status();
  apps_.at(id).last_decision = "registered: target " + std::to_string(target) + ", placed " +
                               std::to_string(*placed) + (*placed < target ? " (the nodes lack room for the rest)" : "");
  return id;
}

status controller_state::app_unregister(uint64_t id) {
  if (!apps_.count(id)) return {errc::not_found, "application " + std::to_string(id) + " is not registered"};
  CAIRN_RETURN_IF_ERROR(commit({{"op", "app_remove"}, {"app", id}}));
  return fill_shortfalls();  // its room may serve others
}

status controller_state::app_progress(uint64_t id, uint64_t checkpoints_done, double transfer_s, double probe_s,
                                      uint64_t checkpoint_bytes) {
  auto it = apps_.find(id);
  if (it == apps_.end()) return {errc::not_found, "application " + std::to_string(id) + " is not registered"};
  app& a = it->second;
  if (checkpoint_bytes > 0 && checkpoint_bytes != a.hints.checkpoint_bytes) {
    // Reservations derive from it: journaled, so a restarted controller
    // reserves what this one would.
    app_hints h = a.hints;
    h.checkpoint_bytes = checkpoint_bytes;
    CAIRN_RETURN_IF_ERROR(commit({{"op", "app_hints"}, {"app", id}, {"hints", to_json(h)}}));
  }
  a.checkpoints_done = checkpoints_done;
  if (transfer_s > 0) {
    a.transfer_s = transfer_s;
    a.transfer_agents = static_cast<uint32_t>(agents_of(id).size());
  }
  if (probe_s > 0) a.probe_s = probe_s;
  return {};
}

result<controller_state::resize_decision> controller_state::app_resize(uint64_t id, uint32_t count, bool force) {
  auto it = apps_.find(id);
  if (it == apps_.end()) return status(errc::not_found, "application " + std::to_string(id) + " is not registered");
  if (count == 0 || count > (1u << 16)) {
    return status(errc::invalid_argument, "agent count must be 1..65536 (unregister to release every agent)");
  }
  const app& a = it->second;
  // Each rank talks to one agent: agents beyond the rank count would serve nobody.
  if (a.hints.ranks > 0 && count > a.hints.ranks) {
    return status(errc::invalid_argument, "application " + std::to_string(id) + " has " +
                                              std::to_string(a.hints.ranks) + " ranks: at most that many agents");
  }
  std::vector<const agent*> mine = agents_of(id);
  uint32_t have = static_cast<uint32_t>(mine.size());
  resize_decision d;
  if (count > have) {
    uint64_t per = reserve_per_agent(a, count);
    uint32_t room = static_cast<uint32_t>(
        placement_index().place(count - have, a.strat, a.dist, a.block_size, per).size());
    d = expansion_decision(a, have, have + room);
    if (room == 0) {
      d.applied = force;
      d.reason = force ? "no node has room now: target raised, agents follow when room appears"
                       : "no node has room for another agent";
    } else if (force && !d.applied) {
      d.applied = true;
      d.reason = "forced; rule: " + d.reason;
    }
    if (!d.applied) {
      apps_.at(id).last_decision = "resize to " + std::to_string(count) + " refused: " + d.reason;
      ++decisions_.resize_refused;
      return d;
    }
    CAIRN_RETURN_IF_ERROR(commit({{"op", "app_target"}, {"app", id}, {"target", count}}));
    auto placed = add_agents(apps_.at(id), room);
    if (!placed) return placed.take_status();
    d.to = have + *placed;
  } else {
    d.from = have;
    d.to = count;
    d.t_probe = a.probe_s > 0 ? a.probe_s : policy_.probe_cost_s;
    d.t_old = transfer_estimate(a, have);
    d.t_new = transfer_estimate(a, count);
    d.applied = true;
    d.reason = count == have ? "unchanged"
                             : "reduced: frees agents' memory and bandwidth (the break-even rule does not apply "
                               "to reductions)";
    if (a.target != count) CAIRN_RETURN_IF_ERROR(commit({{"op", "app_target"}, {"app", id}, {"target", count}}));
    // The newest agents go first.
    for (uint32_t i = have; i > count; --i) {
      CAIRN_RETURN_IF_ERROR(commit({{"op", "agent_remove"}, {"agent", mine[i - 1]->id}}));
    }
  }
  apps_.at(id).last_decision = "resize to " + std::to_string(count) + ": " + d.reason;
  ++decisions_.resize_applied;
  return d;
}

result<std::string> controller_state::agent_migrate(uint64_t agent_id, const std::string& to) {
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return status(errc::not_found, "agent " + std::to_string(agent_id) + " does not exist");
  const agent& g = it->second;
  const app& a = apps_.at(g.app);
  std::string from = g.node;
  const node_index& index = placement_index();
  std::string chosen;
  if (to.empty()) {
    std::vector<std::string> best = index.place(1, a.strat, distribution::fill, 1, g.reserve, from);
    if (best.empty()) return status(errc::again, "no other node has room for agent " + std::to_string(agent_id));
    chosen = best.front();
  } else {
    if (to == from) return status(errc::invalid_argument, "agent " + std::to_string(agent_id) + " is on " + to + " already");
    if (!nodes_.count(to)) return status(errc::not_found, "node " + to + " is not registered");
    const node_view* nv = index.find(to);
    if (nv == nullptr || node_room(*nv, g.reserve) == 0) {
      return status(errc::again, "node " + to + " has no room for agent " + std::to_string(agent_id) +
                                     " (full, short of memory, leaving, or not reporting yet)");
    }
    chosen = to;
  }
  CAIRN_RETURN_IF_ERROR(commit({{"op", "agent_move"}, {"agent", agent_id}, {"node", chosen}}));
  return chosen;
}

status controller_state::fill_shortfalls() {
  // In id order, as a walk of every application would find them.
  const std::vector<uint64_t> ids(short_apps_.begin(), short_apps_.end());
  for (uint64_t id : ids) {
    const app& a = apps_.at(id);
    auto of = by_app_.find(id);
    uint32_t have = of == by_app_.end() ? 0 : static_cast<uint32_t>(of->second.size());
    if (have >= a.target) continue;
    const node_index& index = placement_index();
    if (index.size() == 0) break;  // no node can take an agent
    uint64_t per = reserve_per_agent(a, a.target);
    uint32_t room = static_cast<uint32_t>(index.place(a.target - have, a.strat, a.dist, a.block_size, per).size());
    if (room == 0) continue;
    resize_decision d = expansion_decision(a, have, have + room);
    std::string note = "expand " + std::to_string(have) + " -> " + std::to_string(have + room) + ": " + d.reason;
    apps_.at(id).last_decision = note;
    if (!d.applied) continue;
    auto placed = add_agents(apps_.at(id), room);
    if (!placed) return placed.take_status();
    ++decisions_.expansions;
  }
  return {};
}

node_update controller_state::desired_for(const std::string& id) const {
  node_update u;
  u.generation = generation_;
  u.heartbeat_ms = static_cast<uint32_t>(std::max(10.0, policy_.heartbeat_interval_s * 1000.0));
  for (const agent* g : agents_on(id)) {
    desired_agent d;
    d.agent = g->id;
    d.app = g->app;
    d.app_name = apps_.at(g->app).name;
    d.reserve = g->reserve;
    d.store = apps_.at(g->app).hints.store;
    u.agents.push_back(std::move(d));
  }
  return u;
}

json controller_state::app_agents_json(uint64_t id) const {
  auto it = apps_.find(id);
  if (it == apps_.end()) return json();
  const app& a = it->second;
  json list = json::array();
  for (const agent* g : agents_of(id)) {
    auto n = nodes_.find(g->node);
    list.push_back({{"agent", g->id},
                    {"node", g->node},
                    {"manager", n != nodes_.end() ? n->second.address : ""},
                    {"endpoint", g->endpoint},
                    {"state", g->state}});
  }
  return {{"app", id}, {"name", a.name}, {"generation", a.generation}, {"target", a.target}, {"agents", list}};
}

json controller_state::status_json(double now) const {
  json j;
  j["policy"] = {{"strategy", strategy_name(policy_.strat)},
                 {"distribution", distribution_name(policy_.dist)},
                 {"block_size", policy_.block_size},
                 {"default_capacity", policy_.default_capacity},
                 {"heartbeat_interval_s", policy_.heartbeat_interval_s},
                 {"heartbeat_timeout_s", policy_.heartbeat_timeout_s},
                 {"probe_cost_s", policy_.probe_cost_s},
                 {"agent_bandwidth", policy_.count.agent_bandwidth},
                 {"nodes_per_agent", policy_.count.nodes_per_agent},
                 {"max_agents_per_app", policy_.count.max_agents},
                 {"transfer_fraction", policy_.count.transfer_fraction}};
  uint64_t total_held = 0, total_reserved = 0;
  double total_bw = 0;
  json nodes = json::array();
  for (const auto& entry : nodes_) {
    const std::string& id = entry.first;  // (clang 14 cannot capture a structured binding)
    const node& n = entry.second;
    uint64_t held = 0, reserved = 0;
    auto mine = agents_on(id);
    for (const agent* g : mine) {
      held += g->memory_held;
      reserved += g->reserve;
    }
    total_held += held;
    total_reserved += reserved;
    json jn = {{"node", id},
               {"address", n.address},
               {"state", n.leaving ? "leaving" : (n.reported ? "up" : "recovering")},
               {"capacity", n.capacity},
               {"agents", mine.size()},
               {"memory_held", held},
               {"memory_reserved", reserved},
               {"last_heartbeat_age_s", std::max(0.0, now - n.last_seen)}};
    if (n.reported) {
      jn["metrics"] = to_json(n.metrics);
      total_bw += n.metrics.bw_in_use;
    } else {
      jn["metrics"] = nullptr;
    }
    if (const auto ev = view_of(id)) {
      jn["estimate"] = {{"free_slots", ev->free_slots}, {"mem_free", ev->mem_free}, {"bw_in_use", ev->bw_in_use},
                        {"activity", ev->activity}, {"power_w", ev->power_w}};
    }
    nodes.push_back(std::move(jn));
  }
  j["nodes"] = std::move(nodes);
  json apps = json::array();
  size_t total_agents = 0;
  for (const auto& [id, a] : apps_) {
    json list = json::array();
    uint64_t held = 0, reserved = 0;
    for (const agent* g : agents_of(id)) {
      held += g->memory_held;
      reserved += g->reserve;
      ++total_agents;
      list.push_back({{"agent", g->id},
                      {"node", g->node},
                      {"state", g->state},
                      {"pid", g->pid},
                      {"memory_held", g->memory_held},
                      {"memory_reserved", g->reserve},
                      {"bw", g->bw},
                      {"endpoint", g->endpoint}});
    }
    apps.push_back({{"app", id},
                    {"name", a.name},
                    {"hints", to_json(a.hints)},
                    {"strategy", strategy_name(a.strat)},
                    {"distribution", distribution_name(a.dist)},
                    {"block_size", a.block_size},
                    {"target", a.target},
                    {"agents", list},
                    {"memory_held", held},
                    {"memory_reserved", reserved},
                    {"checkpoints_done", a.checkpoints_done},
                    {"generation", a.generation},
                    {"last_decision", a.last_decision}});
  }
  j["applications"] = std::move(apps);
  j["totals"] = {{"nodes", nodes_.size()},
                 {"applications", apps_.size()},
                 {"agents", total_agents},
                 {"memory_held", total_held},
                 {"memory_reserved", total_reserved},
                 {"bw_in_use", total_bw}};
  return j;
}

std::set<std::string> controller_state::take_dirty_nodes() {
  std::set<std::string> out;
  out.swap(dirty_);
  return out;
}

}  // namespace cairn::agents

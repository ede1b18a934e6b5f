#include "agents/protocol.hpp"

#include "agents/wire.hpp"

namespace cairn::agents {

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > kMaxNameLength) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-' || c == ':' || c == '@';
    if (!ok) return false;
  }
  return true;
}

nlohmann::json to_json(const node_metrics& m) {
  return {{"mem_total", m.mem_total},       {"mem_free", m.mem_free},
          {"bw_in_use", m.bw_in_use},       {"bw_source", m.bw_source},
          {"activity", m.activity},         {"activity_source", m.activity_source},
          {"power_w", m.power_w},           {"power_estimated", m.power_estimated},
          {"power_source", m.power_source}, {"cpu_util", m.cpu_util}};
}

result<node_metrics> parse_metrics(const nlohmann::json& j) {
  node_metrics m;
  fields f(j, "metrics");
  f.u64("mem_total", &m.mem_total);
  f.u64("mem_free", &m.mem_free);
  f.num("bw_in_use", &m.bw_in_use);
  f.str("bw_source", &m.bw_source, false);
  f.num("activity", &m.activity);
  f.str("activity_source", &m.activity_source, false);
  f.num("power_w", &m.power_w, true, 0, 1e7);
  f.boolean("power_estimated", &m.power_estimated);
  f.str("power_source", &m.power_source, false);
  f.num("cpu_util", &m.cpu_util, false, 0, 1);
  if (!f.ok()) return f.error();
  return m;
}

nlohmann::json to_json(const agent_report& r) {
  return {{"agent", r.agent}, {"app", r.app},   {"state", r.state}, {"pid", r.pid},
          {"memory_held", r.memory_held}, {"bw", r.bw}, {"rate", r.rate}, {"endpoint", r.endpoint}};
}

result<std::vector<agent_report>> parse_reports(const nlohmann::json* array) {
  std::vector<agent_report> out;
  if (array == nullptr) return out;
  if (!array->is_array() || array->size() > kMaxAgentsPerMessage) {
    return status(errc::invalid_argument, "agents: must be an array of at most " +
                                              std::to_string(kMaxAgentsPerMessage) + " reports");
  }
  for (const auto& e : *array) {
    agent_report r;
    fields f(e, "agent report");
    f.u64("agent", &r.agent);
    f.u64("app", &r.app);
    f.str("state", &r.state, true, 32);
    uint64_t pid = 0;
    f.u64("pid", &pid, false, INT32_MAX);
    r.pid = static_cast<int64_t>(pid);
    f.u64("memory_held", &r.memory_held, false);
    f.num("bw", &r.bw, false);
    f.num("rate", &r.rate, false);
    f.str("endpoint", &r.endpoint, false, 1024);
    if (!f.ok()) return f.error();
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::json to_json(const app_hints& h) {
  return {{"ranks", h.ranks},
          {"nodes", h.nodes},
          {"checkpoint_bytes", h.checkpoint_bytes},
          {"interval_s", h.interval_s},
          {"checkpoints", h.checkpoints},
          {"store", h.store}};
}

result<app_hints> parse_hints(const nlohmann::json& j) {
  app_hints h;
  fields f(j, "hints");
  f.u32("ranks", &h.ranks, false, 1u << 24);
  f.u32("nodes", &h.nodes, false, 1u << 20);
  f.u64("checkpoint_bytes", &h.checkpoint_bytes, false, uint64_t{1} << 56);
  f.num("interval_s", &h.interval_s, false, 0, 1e9);
  f.u64("checkpoints", &h.checkpoints, false, uint64_t{1} << 40);
  f.str("store", &h.store, false, kMaxPathLength);
  if (!f.ok()) return f.error();
  if (h.store.find_first_of(std::string("\0\n", 2)) != std::string::npos)
    return status(errc::invalid_argument, "hints: store path contains a NUL or newline");
  return h;
}

nlohmann::json to_json(const node_update& u) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& d : u.agents) {
    a.push_back({{"agent", d.agent}, {"app", d.app}, {"app_name", d.app_name}, {"reserve", d.reserve}, {"store", d.store}});
    if (!d.key_box.empty()) a.back()["key_box"] = d.key_box;
  }
  return {{"generation", u.generation}, {"heartbeat_ms", u.heartbeat_ms}, {"agents", a}};
}

result<node_update> parse_node_update(const nlohmann::json& j) {
  node_update u;
  fields f(j, "node_update");
  f.u64("generation", &u.generation);
  f.u32("heartbeat_ms", &u.heartbeat_ms, true, 3600 * 1000);
  const nlohmann::json* a = f.array("agents", true, kMaxAgentsPerMessage);
  if (!f.ok()) return f.error();
  if (u.heartbeat_ms < 10) return status(errc::invalid_argument, "node_update: heartbeat_ms below 10");
  for (const auto& e : *a) {
    desired_agent d;
    fields g(e, "node_update agent");
    g.u64("agent", &d.agent);
    g.u64("app", &d.app);
    g.str("app_name", &d.app_name, true, kMaxNameLength);
    g.u64("reserve", &d.reserve, false);
    g.str("store", &d.store, false, kMaxPathLength);
    g.str("key_box", &d.key_box, false, 512);
    if (!g.ok()) return g.error();
    u.agents.push_back(std::move(d));
  }
  return u;
}

}  // namespace cairn::agents

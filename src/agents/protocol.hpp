// Bodies of the control messages that more than one service reads or writes
// (node metrics, agent reports, application hints, a node's desired agents),
// with strict parsers: a field of the wrong type or out of range makes the
// whole message invalid_argument (the service answers with an error frame).
// Message list and fields: docs/format/control.md.
#ifndef CAIRN_AGENTS_PROTOCOL_HPP
#define CAIRN_AGENTS_PROTOCOL_HPP

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agents/placement.hpp"
#include "cairn/status.hpp"

namespace cairn::agents {

inline constexpr size_t kMaxNameLength = 128;   // node ids, application names
inline constexpr size_t kMaxAgentsPerMessage = 4096;
inline constexpr size_t kMaxPathLength = 4096;  // store paths

// A node's state as its manager measures it (metrics.hpp says how).
struct node_metrics {
  uint64_t mem_total = 0;       // bytes
  uint64_t mem_free = 0;        // bytes available (MemAvailable)
  double bw_in_use = 0;         // bytes per second, in + out
  std::string bw_source;        // "agents" or "/proc/net/dev"
  double activity = 0;          // checkpoints per second received by the node's agents
  std::string activity_source;
  double power_w = 0;
  bool power_estimated = true;
  std::string power_source;     // "rapl" or how it was estimated
  double cpu_util = 0;          // 0..1
};
nlohmann::json to_json(const node_metrics& m);
result<node_metrics> parse_metrics(const nlohmann::json& j);

// One agent as its manager sees it.
struct agent_report {
  uint64_t agent = 0;
  uint64_t app = 0;
  std::string state;            // starting, running, exited, failed, unlaunched
  int64_t pid = 0;
  uint64_t memory_held = 0;     // bytes of checkpoints the agent holds
  double bw = 0;                // bytes per second it moved lately
  double rate = 0;              // checkpoints per second it received lately
  std::string endpoint;         // its data-plane address (empty until it has one)
};
nlohmann::json to_json(const agent_report& r);
result<std::vector<agent_report>> parse_reports(const nlohmann::json* array);

nlohmann::json to_json(const app_hints& h);
result<app_hints> parse_hints(const nlohmann::json& j);

// One agent a node must run (node_update).
struct desired_agent {
  uint64_t agent = 0;
  uint64_t app = 0;
  std::string app_name;
  uint64_t reserve = 0;  // bytes the controller reserved for it
  std::string store;     // where it writes the application's versions (empty: memory only)
  // The application's data-plane key sealed to the manager's public key
  // (auth.hpp "application keys"), hex; empty: the application has none.
  std::string key_box;
};
struct node_update {
  uint64_t generation = 0;
  uint32_t heartbeat_ms = 1000;
  std::vector<desired_agent> agents;
};
nlohmann::json to_json(const node_update& u);
result<node_update> parse_node_update(const nlohmann::json& j);

// A name for a node or an application: 1..kMaxNameLength bytes of
// [A-Za-z0-9._:@-] (it appears in logs, file names and command lines).
bool valid_name(const std::string& s);

}  // namespace cairn::agents

#endif

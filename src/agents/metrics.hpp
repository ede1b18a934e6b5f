// What a manager measures on its node for the controller (node_metrics):
//   memory     MemTotal / MemAvailable of /proc/meminfo;
//   bandwidth  bytes per second its agents moved (their stats files), or,
//              while no agent reports, the receive + transmit rate of the
//              node's interfaces other than lo in /proc/net/dev;
//   activity   checkpoints per second its agents received (their stats);
//   power      RAPL: the energy counters of the package domains
//              /sys/class/powercap/intel-rapl:N/energy_uj, differenced; where
//              they cannot be read (often root-only) it is ESTIMATED as
//              nominal_w * (0.3 + 0.7 * CPU utilisation from /proc/stat), and
//              flagged power_estimated with the formula in power_source.
// The parsers are pure functions; the sampler reads files under configurable
// roots so tests can give it a fake /proc and /sys.
// Thread-safety: the sampler belongs to one thread.
#ifndef CAIRN_AGENTS_METRICS_HPP
#define CAIRN_AGENTS_METRICS_HPP

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agents/protocol.hpp"
#include "cairn/status.hpp"

namespace cairn::agents {

struct meminfo {
  uint64_t total = 0;      // bytes
  uint64_t available = 0;  // bytes
};
// invalid_argument when MemTotal is missing; MemAvailable falls back to
// MemFree + Buffers + Cached on kernels older than 3.14.
result<meminfo> parse_meminfo(std::string_view text);
// Sum of received + transmitted bytes over the interfaces (lo excluded unless
// include_loopback).
result<uint64_t> parse_net_dev(std::string_view text, bool include_loopback);
struct cpu_times {
  uint64_t busy = 0;   // jiffies not idle or iowait
  uint64_t total = 0;
};
result<cpu_times> parse_proc_stat(std::string_view text);

// Counters of all agents of the node together (cumulative).
struct agent_counters {
  bool any = false;       // at least one agent reported
  uint64_t bytes = 0;     // in + out
  uint64_t checkpoints = 0;
};

class metrics_sampler {
 public:
  metrics_sampler(std::string proc_root = "/proc", std::string sys_root = "/sys", double nominal_power_w = 200);
  // Rates are over the time since the previous call (the constructor takes
  // the first reading).
  node_metrics sample(double now, const agent_counters& agents);

 private:
  struct rapl_reading {
    bool ok = false;
    std::vector<uint64_t> energy_uj;
    std::vector<uint64_t> range_uj;
  };
  rapl_reading read_rapl() const;
  std::optional<cpu_times> read_cpu() const;
  std::optional<uint64_t> read_net() const;

  std::string proc_, sys_;
  double nominal_w_;
  double last_t_;
  std::optional<cpu_times> last_cpu_;
  std::optional<uint64_t> last_net_;
  rapl_reading last_rapl_;
  agent_counters last_agents_;
  bool have_agents_ = false;
};

}  // namespace cairn::agents

#endif

#include "advise/model.hpp"

#include <algorithm>
#include <cmath>

#include "util/config.hpp"

namespace cairn::advise {
namespace {

status check_positive(const char* what, double v, const char* hint) {
  if (!(v > 0) || std::isinf(v))
    return {errc::invalid_argument, std::string(what) + " must be a positive number of seconds, not " +
                                        std::to_string(v) + " (" + hint + ")"};
  return {};
}

}  // namespace

result<double> young_interval(double cost_s, double mtbf_s) {
  CAIRN_RETURN_IF_ERROR(check_positive("checkpoint cost", cost_s, "measure it or give it"));
  CAIRN_RETURN_IF_ERROR(check_positive("MTBF", mtbf_s, "give the mean time between failures"));
  return std::sqrt(2 * cost_s * mtbf_s);
}

result<double> daly_interval(double cost_s, double mtbf_s) {
  CAIRN_RETURN_IF_ERROR(check_positive("checkpoint cost", cost_s, "measure it or give it"));
  CAIRN_RETURN_IF_ERROR(check_positive("MTBF", mtbf_s, "give the mean time between failures"));
  // J. T. Daly, "A higher order estimate of the optimum checkpoint interval
  // for restart dumps", FGCS 22 (2006), eq. (37).
  if (cost_s >= 2 * mtbf_s) return mtbf_s;
  const double x = cost_s / (2 * mtbf_s);
  return std::sqrt(2 * cost_s * mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - cost_s;
}

result<double> job_mtbf(double node_mtbf_s, int64_t nodes) {
  CAIRN_RETURN_IF_ERROR(check_positive("node MTBF", node_mtbf_s, "give --node-mtbf in seconds"));
  if (nodes < 1)
    return status(errc::invalid_argument, "node count must be at least 1, not " + std::to_string(nodes));
  return node_mtbf_s / static_cast<double>(nodes);
}

result<engine_shape> shape_from_config(const std::map<std::string, std::string>& values,
                                       const std::string& persistent_fs) {
  // Parse the keys that decide the passes with the configuration's own parser
  // (same spellings, same errors); the others do not matter here.
  std::map<std::string, std::string> env;
  for (const char* k : {"mode", "hash_trees", "hash_chunk", "hash_abs", "local_enabled", "direct_io", "persistent_interval", "engine_host",
                        "persistent_layout", "aggregate_strategy", "agents"}) {
    auto it = values.find(k);
    if (it == values.end()) continue;
    std::string name = "CAIRN_";
    for (char ch : std::string(k)) name += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    env[name] = it->second;
  }
  CAIRN_ASSIGN_OR_RETURN(config c, config::load("", env));
  engine_shape s;
  s.sync = c.mode == engine_mode::sync;
  s.hash_trees = c.hash_trees;
  s.hash_chunk = c.hash_chunk;
  s.hash_abs = c.hash_abs;
  s.local = c.local_enabled;
  s.direct_io = c.direct_io;
  s.persistent_interval = c.persistent_interval;
  s.recycled_local = c.engine_host != engine_host::daemon &&
                     !(c.resolved_layout(persistent_fs) == persistent_layout::aggregated &&
                       c.aggregate_strategy == aggregate_strategy::leaders);
  return s;
}

std::vector<pass> memory_passes(const engine_shape& s) {
  std::vector<pass> p;
  p.push_back({"capture", 2, true});  // read the region, write the staging slot
  // Checksums and hash trees are one pass: each chunk is read once and hashed
  // for both while in cache (format::checksum_and_tree), so the trees add
  // hashing but no memory traffic.
  p.push_back({"checksum", 1, true});
  if (s.local) p.push_back({"local", 2, true});  // copy into tmpfs / the page cache
  // O_DIRECT: the device reads the slot (DMA); buffered: a copy like local.
  p.push_back({"persistent", s.direct_io ? 1.0 : 2.0, !s.direct_io});
  return p;
}

double passes_m(const std::vector<pass>& passes, bool cpu_only) {
  double m = 0;
  for (const auto& p : passes)
    if (p.cpu || !cpu_only) m += p.traffic;
  return m;
}

result<prediction> predict(const engine_shape& s, const workload& w, const bandwidths& b) {
  if (w.bytes_per_rank == 0) return status(errc::invalid_argument, "checkpoint size is 0: give the bytes per rank");
  if (w.ranks_per_node < 1)
    return status(errc::invalid_argument, "ranks per node must be at least 1, not " + std::to_string(w.ranks_per_node));
  if (!(b.memory > 0)) return status(errc::invalid_argument, "memory bandwidth B_M is missing: measure it");
  if (s.local && !(b.local_io > 0))
    return status(errc::invalid_argument, "the local level's write bandwidth is missing: measure it (or local_enabled = false)");
  if (!(b.persistent_io > 0)) return status(errc::invalid_argument, "the persistent level's write bandwidth is missing");
  const double bm_cpu = b.memory_cpu > 0 ? b.memory_cpu : b.memory;
  // A memory-backed local level is written by the CPU alone: its CPU-accounted
  // bandwidth is its cost without other load on the cores.
  const double local_bw = b.local_in_memory && b.local_io_cpu > 0 ? b.local_io_cpu : b.local_io;
  const double S = static_cast<double>(w.bytes_per_rank);
  const double node = S * w.ranks_per_node;  // S_node
  prediction p;
  const auto passes = memory_passes(s);
  p.m = passes_m(passes);
  p.m_cpu = passes_m(passes, true);
  // A CPU's pass: at its CPU-accounted rate, which other load on the cores
  // does not distort (docs/design/advise.md). The checksum pass at its own
  // measured rate where there is one (hashing, not memory, bounds it).
  auto cpu_pass_s = [&](const pass& ps) {
    if (ps.stage == "checksum" && b.checksum_cpu > 0) return node / b.checksum_cpu;
    return ps.traffic * node / bm_cpu;
  };
  for (const auto& ps : passes) {
    stage_cost c{ps.stage, "memory", 0};
    if (ps.stage == "local") {
      c = {ps.stage, "io", node / local_bw};
    } else if (ps.stage == "persistent") {
      c = {ps.stage, "io", node / b.persistent_io};
    } else {
      c.seconds = cpu_pass_s(ps);
      if (ps.stage == "checksum" && b.checksum_cpu > 0) c.bound = "cpu";
    }
    p.stages.push_back(c);
  }
  if (b.commit_s > 0) p.stages.push_back({"commit", "io", 2 * b.commit_s});  // MANIFEST + catalog
  for (const auto& c : p.stages) {
    // Only every persistent_interval-th checkpoint writes (and commits) the persistent level.
    double k = (c.stage == "persistent" || c.stage == "commit") && s.local ? std::max(1, s.persistent_interval) : 1;
    p.sync_s += c.seconds / k;
  }
  p.sync_io_only_s = node / b.persistent_io;
  for (const auto& ps : passes) {
    if (!ps.cpu) continue;
    p.async_s += ps.stage == "local" && b.local_in_memory ? node / local_bw : cpu_pass_s(ps);
  }
  p.async_paper_s = p.m * node / bm_cpu;
  p.blocked_async_s = p.stages.front().seconds;
  return p;
}

result<interval_advice> advise_interval(double cost_s, double mtbf_s, double local_cost_s, double persistent_cost_s,
                                        double persistent_write_s, double crash_fraction) {
  if (!(crash_fraction >= 0 && crash_fraction < 1))
    return status(errc::invalid_argument, "crash fraction must be in [0, 1), not " + std::to_string(crash_fraction));
  interval_advice a;
  a.mtbf_s = mtbf_s;
  a.cost_s = cost_s;
  a.crash_fraction = crash_fraction;
  a.local_cost_s = local_cost_s;
  a.persistent_cost_s = persistent_cost_s;
  CAIRN_ASSIGN_OR_RETURN(a.young_s, young_interval(cost_s, mtbf_s));
  CAIRN_ASSIGN_OR_RETURN(a.daly_s, daly_interval(cost_s, mtbf_s));
  // First-order expected loss at Daly's interval: the checkpoints themselves
  // (C per tau) and, per failure, half an interval of rework plus a checkpoint.
  a.expected_overhead = cost_s / a.daly_s + (a.daly_s + cost_s) / (2 * mtbf_s);
  if (local_cost_s > 0) {
    CAIRN_ASSIGN_OR_RETURN(a.local_interval_s, daly_interval(local_cost_s, mtbf_s));
    const double persistent_mtbf = mtbf_s / (1 - crash_fraction);
    if (persistent_cost_s > 0) {
      CAIRN_ASSIGN_OR_RETURN(a.persistent_interval_s, daly_interval(persistent_cost_s, persistent_mtbf));
    }
    // The level cannot be written more often than its write takes.
    a.persistent_interval_s = std::max(a.persistent_interval_s, persistent_write_s);
    a.persistent_interval = std::max(1, static_cast<int>(std::lround(a.persistent_interval_s / a.local_interval_s)));
    if (persistent_write_s > 0)
      a.persistent_interval = std::max(a.persistent_interval,
                                       static_cast<int>(std::ceil(persistent_write_s / a.local_interval_s)));
    a.persistent_interval_s = a.persistent_interval * a.local_interval_s;
  } else {
    a.persistent_interval_s = a.daly_s;
    a.persistent_interval = 1;
  }
  return a;
}

}  // namespace cairn::advise

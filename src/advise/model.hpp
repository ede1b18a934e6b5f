// The checkpoint overhead model of paper 001 (Shahzad et al.) and the
// checkpoint intervals of Young and Daly (docs/design/advise.md). Pure
// functions: no I/O, no clocks; safe from any thread.
#ifndef CAIRN_ADVISE_MODEL_HPP
#define CAIRN_ADVISE_MODEL_HPP

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cairn/status.hpp"

namespace cairn::advise {

// Young (1974): sqrt(2 C M). cost_s > 0, mtbf_s > 0 (else invalid_argument).
result<double> young_interval(double cost_s, double mtbf_s);
// Daly (2006), the higher-order estimate:
//   sqrt(2CM) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C   for C < 2M, else M.
result<double> daly_interval(double cost_s, double mtbf_s);
// The job's MTBF from a node's and the node count (node_mtbf / nodes).
result<double> job_mtbf(double node_mtbf_s, int64_t nodes);

// What of the engine's configuration decides its passes over the data.
struct engine_shape {
  bool sync = false;           // mode = sync
  bool hash_trees = true;
  uint64_t hash_chunk = 64 << 10;  // the trees' leaves, as the checksum stage hashes them
  double hash_abs = 0;
  bool local = true;           // local_enabled
  bool direct_io = true;       // persistent level written with O_DIRECT
  int persistent_interval = 1; // every k-th version goes to the persistent level
  // The local level overwrites a retired version's file in place
  // (engine::local_recycler) rather than writing a new one and removing the
  // old: not in daemon mode, nor with the leaders' aggregation.
  bool recycled_local = true;
};
// From the configuration's key = value pairs (config::values(), or the run
// identity's config JSON flattened to strings). Unknown keys are ignored;
// a malformed value of a known key is invalid_argument. persistent_fs (as
// storage::detect_geometry names it) resolves persistent_layout = auto as
// the client does; empty: taken as a file per process.
result<engine_shape> shape_from_config(const std::map<std::string, std::string>& values,
                                       const std::string& persistent_fs = "");

// One pass the engine makes over a checkpoint's bytes in memory.
struct pass {
  std::string stage;  // capture, checksum (with the hash trees), local, persistent
  double traffic;     // bytes of memory traffic per checkpoint byte
  bool cpu;           // made by a CPU (false: by the device, O_DIRECT DMA)
};
std::vector<pass> memory_passes(const engine_shape& s);
// m: the sum of the traffic of the passes; m_cpu: of those a CPU makes.
double passes_m(const std::vector<pass>& passes, bool cpu_only = false);

// Measured bandwidths of one node, bytes per second (0 = not measured).
struct bandwidths {
  double memory = 0;         // B_M, memory traffic of the node (wall clock)
  double memory_cpu = 0;     // B_M over CPU seconds (robust to other load); used when > 0
  double local_io = 0;       // B_IO of the local level, ranks_per_node writers
  double persistent_io = 0;  // B_IO of the persistent level, ranks_per_node writers
  // The local level is memory (tmpfs): its write is all CPU (copy, page
  // allocation), so thread mode's CPU cost counts it at local_io, not as two
  // passes at B_M.
  bool local_in_memory = false;
  double local_io_cpu = 0;   // B_IO,local over CPU seconds; used for a memory-backed level when > 0
  // Seconds of one small durable write in the persistent directory (temporary
  // name, fdatasync, rename, directory fsync); 0 = not measured. A version's
  // commit is two: the MANIFEST and the catalog's transaction.
  double commit_s = 0;
  // The checksum pass (with the trees) over CPU seconds, bytes hashed per
  // second of the node: its cost where measured (> 0), else one read at B_M.
  double checksum_cpu = 0;
};

struct workload {
  uint64_t bytes_per_rank = 0;  // S, one rank's shard
  int ranks_per_node = 1;       // r
};

struct stage_cost {
  std::string stage;
  std::string bound;   // "memory", "cpu" (the checksum pass at its measured rate) or "io"
  double seconds = 0;  // per checkpoint and rank
};

struct prediction {
  std::vector<stage_cost> stages;  // in engine order
  double m = 0;                    // every memory pass
  double m_cpu = 0;                // the passes a CPU makes
  double sync_s = 0;               // t_O,s per checkpoint: every stage in a row (and the commit)
  double sync_io_only_s = 0;       // the paper's pure S/B_IO (the persistent write)
  // t_O,a per checkpoint: m_cpu S_node / B_M(cpu), with the local write at
  // S_node / B_IO,local when the local level is memory (local_in_memory)
  double async_s = 0;
  double async_paper_s = 0;        // m S_node / B_M (the paper's, every pass)
  double blocked_async_s = 0;      // capture alone (what thread mode blocks)
  // The cost the application sees per checkpoint in the shape's mode.
  double cost_s(const engine_shape& s) const { return s.sync ? sync_s : async_s; }
};
// invalid_argument when a bandwidth the shape needs is missing (<= 0) or the
// workload is empty.
result<prediction> predict(const engine_shape& s, const workload& w, const bandwidths& b);

// How often to checkpoint, and every how many checkpoints to go persistent.
struct interval_advice {
  double mtbf_s = 0;
  double cost_s = 0;       // per checkpoint
  double young_s = 0;
  double daly_s = 0;
  // Levels (docs/design/advise.md): local interval from the capture + local
  // cost and the full failure rate, persistent from the persistent cost and
  // the rate of failures the local level does not survive.
  double crash_fraction = 0;
  double local_cost_s = 0, persistent_cost_s = 0;
  double local_interval_s = 0;       // 0 without the local level
  double persistent_interval_s = 0;
  int persistent_interval = 1;       // configuration key: every k-th checkpoint
  // Expected share of the run lost at Daly's interval: checkpoints plus rework.
  double expected_overhead = 0;
};
// cost_s: the cost per checkpoint (prediction or measurement); local_cost_s
// and persistent_cost_s: what a checkpoint of each level costs the
// application (local_cost_s 0 without a local level; persistent_cost_s 0 when
// the persistent write takes nothing from it, as an O_DIRECT write in thread
// mode); persistent_write_s: how long the persistent write takes, the
// shortest interval the level can keep up with. crash_fraction in [0, 1).
result<interval_advice> advise_interval(double cost_s, double mtbf_s, double local_cost_s, double persistent_cost_s,
                                        double persistent_write_s, double crash_fraction);

}  // namespace cairn::advise

#endif

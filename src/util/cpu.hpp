// CPU placement of engine threads (paper 001: a checkpoint thread per core,
// per socket or per node).
#ifndef CAIRN_UTIL_CPU_HPP
#define CAIRN_UTIL_CPU_HPP

#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "util/config.hpp"

namespace cairn::util {

// The CPUs (OS indexes) an engine thread may use under `p`, relative to
// `home_cpu` (the CPU the application thread ran on at init), from the
// machine's topology as hwloc sees it, so any topology works (SMT width,
// packages, groups, offline or cgroup-disallowed CPUs):
//   none:   empty (inherit the application thread's binding; hwloc not loaded);
//   core:   the other hardware threads (PUs) of home_cpu's core, its spare
//           SMT siblings; home_cpu's core itself when it has none;
//   socket: the PUs of home_cpu's package;
//   node:   every PU the process is allowed to use (its cgroup's cpuset).
// Only allowed PUs are returned. `synthetic`: a hwloc synthetic topology
// ("pack:2 core:2 pu:2") instead of this machine's (tests).
// Errors: invalid_argument when home_cpu is not a PU of the topology or the
// synthetic description is malformed; internal when hwloc cannot load the
// machine's topology (the message says to use placement = none).
result<std::vector<int>> placement_cpus(placement p, int home_cpu, const std::string& synthetic = {});

// Whether an engine thread placed on `engine_cpus` (empty: inheriting the
// calling thread's binding) may run on a CPU other than `home_cpu`, where
// the calling (application) thread runs.
bool runs_elsewhere(const std::vector<int>& engine_cpus, int home_cpu);

// This node's load for the aggregation plan (lower is better): the 1-minute
// load average per online CPU plus the fraction of memory in use, from
// /proc (0 where unreadable). Network use is not measured. About 20 us.
double node_load();
// MemAvailable of /proc/meminfo in bytes; 0 when unknown.
uint64_t available_memory();

// Binds the calling thread to `cpus` (no-op when empty).
status bind_this_thread(const std::vector<int>& cpus);

// How an engine thread is scheduled: placement's CPUs, policy and nice
// increment (util/config.hpp).
struct thread_setup {
  std::vector<int> cpus;  // empty: inherit
  thread_priority priority = thread_priority::normal;
  int nice = 0;
};

// Applies `s` to the calling thread only (Linux schedules threads one by
// one). Errors: the first failing call's errno; the thread keeps what was
// applied before it.
status setup_this_thread(const thread_setup& s);

}  // namespace cairn::util

#endif

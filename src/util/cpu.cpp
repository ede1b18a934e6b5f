#include "util/cpu.hpp"

#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace cairn::util {
namespace {

// The topology, freed on every path.
class topology {
 public:
  topology() = default;
  ~topology() {
    if (t_) hwloc_topology_destroy(t_);
  }
  topology(const topology&) = delete;
  topology& operator=(const topology&) = delete;
  hwloc_topology_t get() const { return t_; }

  status load(const std::string& synthetic) {
    if (hwloc_topology_init(&t_) != 0) {
      t_ = nullptr;
      return status::from_errno(errno, "placement: initialising hwloc");
    }
    // Only packages, cores and PUs matter: caches and I/O devices are not
    // read, which keeps the load to a few milliseconds.
    hwloc_topology_set_cache_types_filter(t_, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_icache_types_filter(t_, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_io_types_filter(t_, HWLOC_TYPE_FILTER_KEEP_NONE);
    if (!synthetic.empty() && hwloc_topology_set_synthetic(t_, synthetic.c_str()) != 0)
      return {errc::invalid_argument, "placement: '" + synthetic + "' is not a hwloc synthetic topology"};
    if (hwloc_topology_load(t_) != 0)
      return {errc::internal, "placement: hwloc could not load this machine's topology (" +
                                  std::string(std::strerror(errno)) + "); set placement = none"};
    return {};
  }

 private:
  hwloc_topology_t t_ = nullptr;
};

// A bitmap, freed on every path.
struct bitmap {
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  ~bitmap() { hwloc_bitmap_free(b); }
  bitmap() = default;
  bitmap(const bitmap&) = delete;
  bitmap& operator=(const bitmap&) = delete;
};

std::vector<int> cpus_of(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

}  // namespace

bool runs_elsewhere(const std::vector<int>& engine_cpus, int home_cpu) {
  if (!engine_cpus.empty())
    return std::any_of(engine_cpus.begin(), engine_cpus.end(), [&](int c) { return c != home_cpu; });
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 1;
}

result<std::vector<int>> placement_cpus(placement p, int home_cpu, const std::string& synthetic) {
  if (p == placement::none) return std::vector<int>{};
  topology topo;
  CAIRN_RETURN_IF_ERROR(topo.load(synthetic));
  hwloc_topology_t t = topo.get();
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(t);
  if (p == placement::node) return cpus_of(allowed);
  hwloc_obj_t pu = home_cpu >= 0 ? hwloc_get_pu_obj_by_os_index(t, static_cast<unsigned>(home_cpu)) : nullptr;
  if (pu == nullptr)
    return status(errc::invalid_argument, "placement: CPU " + std::to_string(home_cpu) +
                                              ", where the application thread runs, is not in the machine's topology");
  bitmap set;
  if (p == placement::socket) {
    // A machine whose topology has no package level counts as one package.
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, pu);
    hwloc_bitmap_and(set.b, pkg ? pkg->cpuset : allowed, allowed);
  } else {
    // core: the application's core's other PUs, where an engine thread
    // shares the core's caches but not its thread of execution (paper 001);
    // without SMT the core itself. No core level: the PU is its own core.
    hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_CORE, pu);
    hwloc_bitmap_and(set.b, core ? core->cpuset : pu->cpuset, allowed);
    bitmap spare;
    hwloc_bitmap_andnot(spare.b, set.b, pu->cpuset);
    if (!hwloc_bitmap_iszero(spare.b)) hwloc_bitmap_copy(set.b, spare.b);
  }
  // The application's own CPU is always usable, even if hwloc says otherwise.
  if (hwloc_bitmap_iszero(set.b)) hwloc_bitmap_copy(set.b, pu->cpuset);
  return cpus_of(set.b);
}

status bind_this_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return {};
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0) return status::from_errno(rc, "binding an engine thread to its CPUs (placement)");
  return {};
}

namespace {

// MemTotal and MemAvailable of /proc/meminfo, in bytes (0 when unknown).
void read_meminfo(uint64_t* total, uint64_t* avail) {
  *total = *avail = 0;
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return;
  char key[64];
  unsigned long long kb = 0;
  while ((!*total || !*avail) && std::fscanf(f, "%63s %llu kB", key, &kb) == 2) {
    if (std::strcmp(key, "MemTotal:") == 0) *total = uint64_t{kb} * 1024;
    else if (std::strcmp(key, "MemAvailable:") == 0) *avail = uint64_t{kb} * 1024;
  }
  std::fclose(f);
}

}  // namespace

double node_load() {
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    double one = 0;
    if (std::fscanf(f, "%lf", &one) == 1) {
      const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
      load += one / static_cast<double>(cpus > 0 ? cpus : 1);
    }
    std::fclose(f);
  }
  uint64_t total = 0, avail = 0;
  read_meminfo(&total, &avail);
  if (total) load += 1.0 - static_cast<double>(avail) / static_cast<double>(total);
  return load;
}

uint64_t available_memory() {
  uint64_t total = 0, avail = 0;
  read_meminfo(&total, &avail);
  return avail;
}

status setup_this_thread(const thread_setup& s) {
  CAIRN_RETURN_IF_ERROR(bind_this_thread(s.cpus));
  if (s.priority != thread_priority::normal) {
    sched_param p{};
    p.sched_priority = 0;
    // pid 0: the calling thread.
    if (sched_setscheduler(0, s.priority == thread_priority::idle ? SCHED_IDLE : SCHED_BATCH, &p) != 0)
      return status::from_errno(errno, "setting the scheduling policy of an engine thread (engine_priority)");
  }
  if (s.nice > 0) {
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, tid);
    if (errno == 0 && setpriority(PRIO_PROCESS, tid, now + s.nice) != 0)
      return status::from_errno(errno, "setting the nice value of an engine thread (engine_nice)");
  }
  return {};
}

}  // namespace cairn::util

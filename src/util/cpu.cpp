#include "util/cpu.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace cairn::util {
namespace {

// Parses a sysfs CPU list such as "0-3,8,10-11".
std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty() || part == "\n") continue;
    auto dash = part.find('-');
    try {
      int lo = std::stoi(part.substr(0, dash));
      int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    } catch (...) {
      return {};
    }
  }
  return out;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string cpu_path(int cpu, const char* file) {
  return "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + file;
}

}  // namespace

std::vector<int> placement_cpus(placement p, int home_cpu) {
  std::vector<int> online = parse_cpu_list(read_line("/sys/devices/system/cpu/online"));
  if (online.empty()) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < n; ++c) online.push_back(c);
  }
  switch (p) {
    case placement::none:
      return {};
    case placement::node:
      return online;
    case placement::socket: {
      std::string pkg = read_line(cpu_path(home_cpu, "physical_package_id"));
      std::vector<int> out;
      for (int c : online)
        if (read_line(cpu_path(c, "physical_package_id")) == pkg) out.push_back(c);
      return out.empty() ? online : out;
    }
    case placement::core: {
      std::vector<int> sib = parse_cpu_list(read_line(cpu_path(home_cpu, "thread_siblings_list")));
      std::vector<int> out;
      for (int c : sib)
        if (c != home_cpu) out.push_back(c);
      if (out.empty()) out.push_back(home_cpu);
      return out;
    }
  }
  return {};
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
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    unsigned long long kb = 0, total = 0, avail = 0;
    while (std::fscanf(f, "%63s %llu kB", key, &kb) == 2) {
      if (std::strcmp(key, "MemTotal:") == 0) total = kb;
      else if (std::strcmp(key, "MemAvailable:") == 0) avail = kb;
      if (total && avail) break;
    }
    std::fclose(f);
    if (total) load += 1.0 - static_cast<double>(avail) / static_cast<double>(total);
  }
  return load;
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

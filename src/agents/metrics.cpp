#include "agents/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "storage/storage_env.hpp"
#include "util/clock.hpp"

namespace cairn::agents {
namespace {

std::vector<std::string_view> split_lines(std::string_view t) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < t.size()) {
    size_t nl = t.find('\n', pos);
    if (nl == std::string_view::npos) nl = t.size();
    out.push_back(t.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

std::vector<std::string_view> split_ws(std::string_view t) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < t.size()) {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
    size_t j = i;
    while (j < t.size() && t[j] != ' ' && t[j] != '\t') ++j;
    if (j > i) out.push_back(t.substr(i, j - i));
    i = j;
  }
  return out;
}

bool to_u64(std::string_view s, uint64_t* v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size();
}

// /proc and /sys files report a size of 0, so they are read to EOF (at most 1 MiB).
std::optional<std::string> read_small(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      if (n < 0) return std::nullopt;
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20)) {
      ::close(fd);
      return std::nullopt;
    }
  }
}

}  // namespace

result<meminfo> parse_meminfo(std::string_view text) {
  std::optional<uint64_t> total, avail, free, buffers, cached;
  for (std::string_view line : split_lines(text)) {
    auto w = split_ws(line);
    if (w.size() < 2) continue;
    uint64_t v = 0;
    if (!to_u64(w[1], &v)) continue;
    uint64_t bytes = (w.size() >= 3 && w[2] == "kB") ? v * 1024 : v;
    if (w[0] == "MemTotal:") total = bytes;
    else if (w[0] == "MemAvailable:") avail = bytes;
    else if (w[0] == "MemFree:") free = bytes;
    else if (w[0] == "Buffers:") buffers = bytes;
    else if (w[0] == "Cached:") cached = bytes;
  }
  if (!total) return status(errc::invalid_argument, "meminfo: no MemTotal line");
  meminfo m;
  m.total = *total;
  m.available = avail ? *avail : free.value_or(0) + buffers.value_or(0) + cached.value_or(0);
  return m;
}

result<uint64_t> parse_net_dev(std::string_view text, bool include_loopback) {
  uint64_t sum = 0;
  bool any = false;
  for (std::string_view line : split_lines(text)) {
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // the two header lines
    auto name = split_ws(line.substr(0, colon));
    if (name.size() != 1) continue;
    auto w = split_ws(line.substr(colon + 1));
    // receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes ...
    uint64_t rx = 0, tx = 0;
    if (w.size() < 16 || !to_u64(w[0], &rx) || !to_u64(w[8], &tx)) {
      return status(errc::invalid_argument, "net/dev: malformed line for " + std::string(name[0]));
    }
    if (name[0] == "lo" && !include_loopback) continue;
    sum += rx + tx;
    any = true;
  }
  if (!any) return status(errc::not_found, "net/dev: no interface");
  return sum;
}

result<cpu_times> parse_proc_stat(std::string_view text) {
  for (std::string_view line : split_lines(text)) {
    auto w = split_ws(line);
    if (w.empty() || w[0] != "cpu") continue;
    // cpu user nice system idle iowait irq softirq steal guest guest_nice
    cpu_times t;
    for (size_t i = 1; i < w.size() && i <= 8; ++i) {
      uint64_t v = 0;
      if (!to_u64(w[i], &v)) return status(errc::invalid_argument, "stat: malformed cpu line");
      t.total += v;
      if (i != 4 && i != 5) t.busy += v;
    }
    if (w.size() < 5) return status(errc::invalid_argument, "stat: short cpu line");
    return t;
  }
  return status(errc::invalid_argument, "stat: no cpu line");
}

metrics_sampler::metrics_sampler(std::string proc_root, std::string sys_root, double nominal_power_w)
    : proc_(std::move(proc_root)), sys_(std::move(sys_root)), nominal_w_(nominal_power_w), last_t_(util::now_s()) {
  last_cpu_ = read_cpu();
  last_net_ = read_net();
  last_rapl_ = read_rapl();
}

std::optional<cpu_times> metrics_sampler::read_cpu() const {
  auto t = read_small(proc_ + "/stat");
  if (!t) return std::nullopt;
  auto c = parse_proc_stat(*t);
  if (!c) return std::nullopt;
  return *c;
}

std::optional<uint64_t> metrics_sampler::read_net() const {
  auto t = read_small(proc_ + "/net/dev");
  if (!t) return std::nullopt;
  auto n = parse_net_dev(*t, false);
  if (!n) return std::nullopt;
  return *n;
}

metrics_sampler::rapl_reading metrics_sampler::read_rapl() const {
  rapl_reading r;
  const std::string dir = sys_ + "/class/powercap";
  auto names = storage::storage_env::posix()->list(dir);
  if (!names) return r;
  std::vector<std::string> packages;
  for (const auto& n : *names) {
    // Package domains only ("intel-rapl:0"); subdomains ("intel-rapl:0:0") are inside them.
    if (n.rfind("intel-rapl:", 0) == 0 && std::count(n.begin(), n.end(), ':') == 1) packages.push_back(n);
  }
  std::sort(packages.begin(), packages.end());
  if (packages.empty()) return r;
  for (const auto& p : packages) {
    auto e = read_small(dir + "/" + p + "/energy_uj");
    auto m = read_small(dir + "/" + p + "/max_energy_range_uj");
    uint64_t ev = 0, mv = 0;
    auto trim = [](std::string s) {
      while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
      return s;
    };
    if (!e || !to_u64(trim(*e), &ev)) return r;  // unreadable (root-only since 2020) -> estimate
    if (!m || !to_u64(trim(*m), &mv)) mv = 0;
    r.energy_uj.push_back(ev);
    r.range_uj.push_back(mv);
  }
  r.ok = true;
  return r;
}

node_metrics metrics_sampler::sample(double now, const agent_counters& agents) {
  node_metrics m;
  const double dt = std::max(1e-3, now - last_t_);
  if (auto t = read_small(proc_ + "/meminfo")) {
    if (auto mi = parse_meminfo(*t)) {
      m.mem_total = mi->total;
      m.mem_free = mi->available;
    }
  }
  // CPU utilisation since the last sample.
  auto cpu = read_cpu();
  if (cpu && last_cpu_ && cpu->total > last_cpu_->total) {
    m.cpu_util = std::clamp(static_cast<double>(cpu->busy - std::min(cpu->busy, last_cpu_->busy)) /
                                static_cast<double>(cpu->total - last_cpu_->total),
                            0.0, 1.0);
  }
  if (cpu) last_cpu_ = cpu;
  // Bandwidth and activity.
  auto net = read_net();
  if (agents.any) {
    if (have_agents_) {
      m.bw_in_use = static_cast<double>(agents.bytes - std::min(agents.bytes, last_agents_.bytes)) / dt;
      m.activity = static_cast<double>(agents.checkpoints - std::min(agents.checkpoints, last_agents_.checkpoints)) / dt;
    }
    m.bw_source = "agents";
    m.activity_source = "agents";
    last_agents_ = agents;
    have_agents_ = true;
  } else {
    if (net && last_net_) m.bw_in_use = static_cast<double>(*net - std::min(*net, *last_net_)) / dt;
    m.bw_source = net ? "/proc/net/dev (interfaces other than lo)" : "none (no agent stats, /proc/net/dev unreadable)";
    m.activity_source = "none (no agent reports checkpoint counters)";
    have_agents_ = false;
  }
  if (net) last_net_ = net;
  // Power.
  rapl_reading rapl = read_rapl();
  if (rapl.ok && last_rapl_.ok && rapl.energy_uj.size() == last_rapl_.energy_uj.size()) {
    double uj = 0;
    for (size_t i = 0; i < rapl.energy_uj.size(); ++i) {
      uint64_t a = last_rapl_.energy_uj[i], b = rapl.energy_uj[i];
      uint64_t d = b >= a ? b - a : (rapl.range_uj[i] > a ? rapl.range_uj[i] - a + b : b);  // counter wrapped
      uj += static_cast<double>(d);
    }
    m.power_w = uj / 1e6 / dt;
    m.power_estimated = false;
    m.power_source = "rapl (" + std::to_string(rapl.energy_uj.size()) + " package domains, energy_uj)";
  } else {
    m.power_w = nominal_w_ * (0.3 + 0.7 * m.cpu_util);
    m.power_estimated = true;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "estimated: %.0f W nominal x (0.3 + 0.7 x CPU utilisation %.2f); %s", nominal_w_, m.cpu_util,
                  rapl.ok ? "RAPL first reading pending" : "RAPL energy_uj not readable");
    m.power_source = buf;
  }
  last_rapl_ = rapl;
  last_t_ = now;
  return m;
}

}  // namespace cairn::agents

#include "agents/log.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>

#include "util/clock.hpp"
#include "util/mutex.hpp"

namespace cairn::agents {
namespace {

cairn::mutex mu;
std::string name CAIRN_GUARDED_BY(mu) = "agents";
log_level min_level CAIRN_GUARDED_BY(mu) = log_level::info;
double window_start CAIRN_GUARDED_BY(mu) = 0;  // rejection rate limit
int window_lines CAIRN_GUARDED_BY(mu) = 0;
long suppressed CAIRN_GUARDED_BY(mu) = 0;

const char* level_name(log_level l) {
  switch (l) {
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
  }
  return "?";
}

void write_line(log_level level, const std::string& message) CAIRN_REQUIRES(mu) {
  double now = util::wall_s();
  time_t t = static_cast<time_t>(now);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  int ms = static_cast<int>((now - std::floor(now)) * 1000.0);
  std::fprintf(stderr, "%s.%03dZ cairn-%s[%d] %s: %s\n", ts, ms > 999 ? 999 : ms, name.c_str(),
               static_cast<int>(::getpid()), level_name(level), message.c_str());
  std::fflush(stderr);
}

}  // namespace

void set_log_name(const std::string& n) {
  cairn::lock_guard lock(mu);
  name = n;
}

void set_log_level(log_level l) {
  cairn::lock_guard lock(mu);
  min_level = l;
}

void log(log_level level, const std::string& message) {
  cairn::lock_guard lock(mu);
  if (level < min_level) return;
  write_line(level, message);
}

void log_rejection(const std::string& peer, const std::string& code, const std::string& detail) {
  cairn::lock_guard lock(mu);
  double now = util::now_s();
  if (now - window_start >= 10.0) {
    if (suppressed > 0) {
      write_line(log_level::warn, std::to_string(suppressed) + " more rejected messages were not logged");
    }
    window_start = now;
    window_lines = 0;
    suppressed = 0;
  }
  if (window_lines >= 20) {
    ++suppressed;
    return;
  }
  ++window_lines;
  write_line(log_level::warn, "rejected message from " + peer + ": " + code + ": " + detail);
}

}  // namespace cairn::agents

#include "output.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "util/clock.hpp"

namespace cairn::cli {

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string format_time(double epoch_s, bool millis) {
  if (epoch_s <= 0) return "-";
  double whole = std::floor(epoch_s);
  time_t t = static_cast<time_t>(whole);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out(buf, n);
  if (millis) {
    int ms = std::min(999, static_cast<int>(std::lround((epoch_s - whole) * 1000.0)));
    std::snprintf(buf, sizeof buf, ".%03d", ms);
    out += buf;
  }
  return out + "Z";
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", s);
  return buf;
}

table::table(std::vector<std::string> headers, std::vector<bool> right)
    : headers_(std::move(headers)), right_(std::move(right)) {
  right_.resize(headers_.size(), false);
}

void table::add(std::vector<std::string> row) {
  row.resize(headers_.size());
  rows_.push_back(std::move(row));
}

void table::print(std::FILE* out) const {
  std::vector<size_t> width(headers_.size());
  for (size_t i = 0; i < headers_.size(); ++i) width[i] = headers_[i].size();
  for (auto& r : rows_)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (size_t i = 0; i < cells.size(); ++i) {
      size_t pad = width[i] - cells[i].size();
      bool last = i + 1 == cells.size();
      if (right_[i]) s.append(pad, ' ');
      s += cells[i];
      if (!right_[i] && !last) s.append(pad, ' ');
      if (!last) s += "  ";
    }
    std::fprintf(out, "%s\n", s.c_str());
  };
  line(headers_);
  for (auto& r : rows_) line(r);
}

nlohmann::json redundancy_json(const std::optional<format::redundancy_info>& r) {
  if (!r) return nullptr;
  return {{"scheme", r->scheme},
          {"description", r->description},
          {"k", r->k},
          {"m", r->m},
          {"sets", r->sets},
          {"protected_at", r->protected_at > 0 ? nlohmann::json(r->protected_at) : nlohmann::json(nullptr)}};
}

void print_json(const nlohmann::json& j) {
  std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fprintf(stdout, "%s\n", text.c_str());
}

void print_error(const status& s) { std::fprintf(stderr, "cairn: error: %s\n", s.message().c_str()); }

void print_warning(const std::string& message) { std::fprintf(stderr, "cairn: warning: %s\n", message.c_str()); }

progress::progress(bool enabled, uint64_t total_bytes)
    : enabled_(enabled), tty_(enabled && ::isatty(STDERR_FILENO) == 1), total_(total_bytes), last_(util::now_s()) {}

progress::~progress() { clear(); }

void progress::advance(uint64_t bytes, const std::string& label) {
  done_ += bytes;
  if (!enabled_) return;
  double now = util::now_s();
  if (now - last_ < (tty_ ? 0.1 : 10.0)) return;
  last_ = now;
  int pct = total_ > 0 ? static_cast<int>(100.0 * static_cast<double>(done_) / static_cast<double>(total_)) : 100;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K[%3d%%] %s", std::min(pct, 100), label.c_str());
    shown_ = true;
  } else {
    std::fprintf(stderr, "cairn: %d%% (%s of %s) %s\n", std::min(pct, 100), format_bytes(done_).c_str(),
                 format_bytes(total_).c_str(), label.c_str());
  }
  std::fflush(stderr);
}

void progress::clear() {
  if (shown_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }
}

}  // namespace cairn::cli

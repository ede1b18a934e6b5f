// Output helpers of the CLI: aligned tables, sizes, times, JSON, progress.
#ifndef CAIRN_TOOLS_CAIRN_OUTPUT_HPP
#define CAIRN_TOOLS_CAIRN_OUTPUT_HPP

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/status.hpp"
#include "format/manifest.hpp"

namespace cairn::cli {

// "512 B", "12.0 KiB", "3.5 MiB", ...
std::string format_bytes(uint64_t bytes);
// UTC ISO 8601: "2023-11-14T22:13:20Z" (with millis: "...:20.123Z"); "-" for 0.
std::string format_time(double epoch_s, bool millis = false);
// Seconds with 6 decimals: "0.001000".
std::string format_seconds(double s);

// A table printed with columns padded to their widest cell, two spaces apart.
class table {
 public:
  // right[i]: right-align column i (numbers).
  table(std::vector<std::string> headers, std::vector<bool> right);
  void add(std::vector<std::string> row);
  bool empty() const { return rows_.empty(); }
  void print(std::FILE* out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// A version's recorded node-loss redundancy (manifest `redundancy`) as JSON:
// null when there is none.
nlohmann::json redundancy_json(const std::optional<format::redundancy_info>& r);

// Pretty JSON on stdout (invalid UTF-8 in names is replaced, never thrown on).
void print_json(const nlohmann::json& j);

// "cairn: error: <message>" on stderr.
void print_error(const status& s);
void print_warning(const std::string& message);

// Progress on stderr for long operations: on a terminal, one line rewritten
// in place (at most 10 times a second); otherwise a line every 10 s, so short
// runs print nothing. Disabled progress prints nothing at all.
class progress {
 public:
  progress(bool enabled, uint64_t total_bytes);
  ~progress();
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  void advance(uint64_t bytes, const std::string& label);
  // Clears the terminal line before other output is printed.
  void clear();

 private:
  bool enabled_;
  bool tty_;
  uint64_t total_;
  uint64_t done_ = 0;
  double last_ = 0;
  bool shown_ = false;
};

}  // namespace cairn::cli

#endif

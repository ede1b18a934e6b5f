#include "format/layout.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace cairn::format {

using storage::join;

std::string runs_dir(const std::string& root) { return join(root, "runs"); }

std::string checkpoint_dir(const std::string& root, const std::string& run, const std::string& name) {
  return join(join(runs_dir(root), run), name);
}

std::string version_dir_name(int64_t version) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "v%012" PRId64, version);
  return buf;
}

std::string version_dir(const std::string& root, const std::string& run, const std::string& name, int64_t version) {
  return join(checkpoint_dir(root, run, name), version_dir_name(version));
}

std::string shard_file_name(uint32_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard.%06u", rank);
  return buf;
}

std::string shard_path(const std::string& root, const std::string& run, const std::string& name, int64_t version,
                       uint32_t rank) {
  return join(version_dir(root, run, name, version), shard_file_name(rank));
}

std::string manifest_path(const std::string& root, const std::string& run, const std::string& name, int64_t version) {
  return join(version_dir(root, run, name, version), kManifestName);
}

std::string damaged_path(const std::string& root, const std::string& run, const std::string& name, int64_t version) {
  return join(version_dir(root, run, name, version), kDamagedName);
}

namespace {
// Decimal digits from `from` to the end, zero-padded or not, up to INT64_MAX
// (a nanosecond timestamp used as a version has 19 digits).
bool parse_digits(const std::string& s, size_t from, int64_t* out) {
  if (s.size() <= from) return false;
  int64_t v = 0;
  for (size_t i = from; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    const int d = s[i] - '0';
    if (v > (INT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}
}  // namespace

bool parse_version_dir(const std::string& entry, int64_t* version) {
  return entry.size() >= 2 && entry[0] == 'v' && parse_digits(entry, 1, version);
}

bool parse_shard_name(const std::string& entry, uint32_t* rank) {
  if (entry.rfind("shard.", 0) != 0) return false;
  int64_t r = 0;
  if (!parse_digits(entry, 6, &r) || r > UINT32_MAX) return false;
  *rank = static_cast<uint32_t>(r);
  return true;
}

std::vector<int64_t> list_versions(storage::storage_env* env, const std::string& root, const std::string& run,
                                   const std::string& name) {
  std::vector<int64_t> out;
  auto names = env->list(checkpoint_dir(root, run, name));
  if (!names) return out;
  for (auto& n : *names) {
    int64_t v = 0;
    if (parse_version_dir(n, &v)) out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> list_subdirs(storage::storage_env* env, const std::string& dir) {
  std::vector<std::string> out;
  auto names = env->list(dir);
  if (!names) return out;
  for (auto& n : *names) {
    struct stat st {};
    if (::stat(join(dir, n).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cairn::format

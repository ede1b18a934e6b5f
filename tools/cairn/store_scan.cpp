#include "store_scan.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <set>

#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/shard.hpp"

namespace cairn::cli {

int exit_code_for(const status& s) {
  if (s.is_ok()) return kExitOk;
  if (s.code() == errc::invalid_argument || s.code() == errc::not_found) return kExitUsage;
  return kExitFailure;
}

status check_store(const std::string& root) {
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) return {errc::not_found, "store " + root + " does not exist"};
  if (!S_ISDIR(st.st_mode)) return {errc::invalid_argument, "store " + root + " is not a directory"};
  storage::storage_env* env = storage::storage_env::posix();
  if (!env->exists(format::runs_dir(root)) && !env->exists(storage::join(root, format::kCatalogName))) {
    return {errc::invalid_argument,
            root + " is not a cairn store (it has neither a runs/ directory nor " + format::kCatalogName + ")"};
  }
  return {};
}

status check_directory(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return {errc::not_found, what + " " + path + " does not exist or is not a directory"};
  return {};
}

namespace {
void add_subdirs(const std::string& dir, std::set<std::string>* out) {
  for (auto& n : format::list_subdirs(storage::storage_env::posix(), dir)) out->insert(n);
}
}  // namespace

result<std::vector<std::string>> select_runs(const std::string& root, const std::string& scratch,
                                             const std::string& only) {
  std::set<std::string> runs;
  add_subdirs(format::runs_dir(root), &runs);
  if (!scratch.empty()) add_subdirs(format::runs_dir(scratch), &runs);
  if (only.empty()) return std::vector<std::string>(runs.begin(), runs.end());
  if (runs.count(only) != 0) return std::vector<std::string>{only};
  std::string known;
  for (auto& r : runs) known += (known.empty() ? "" : ", ") + r;
  return status(errc::not_found, "run '" + only + "' not found in " + root +
                                     (known.empty() ? " (the store has no runs)" : " (runs: " + known + ")"));
}

std::vector<std::string> checkpoint_names(const std::string& root, const std::string& scratch, const std::string& run) {
  std::set<std::string> names;
  add_subdirs(storage::join(format::runs_dir(root), run), &names);
  if (!scratch.empty()) add_subdirs(storage::join(format::runs_dir(scratch), run), &names);
  return {names.begin(), names.end()};
}

std::vector<int64_t> version_numbers(const std::string& root, const std::string& scratch, const std::string& run,
                                     const std::string& name) {
  storage::storage_env* env = storage::storage_env::posix();
  std::set<int64_t> versions;
  for (int64_t v : format::list_versions(env, root, run, name)) versions.insert(v);
  if (!scratch.empty())
    for (int64_t v : format::list_versions(env, scratch, run, name)) versions.insert(v);
  return {versions.begin(), versions.end()};
}

const char* state_name(version_state s) {
  switch (s) {
    case version_state::committed: return "committed";
    case version_state::incomplete: return "incomplete";
    case version_state::invalid: return "invalid";
    case version_state::absent: return "absent";
  }
  return "unknown";
}

const char* layout_name(const version_scan& s) { return s.aggregated() ? "aggregated" : "file_per_process"; }

uint64_t file_size_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::optional<std::string> damaged_record(storage::storage_env* env, const std::string& root, const std::string& run,
                                          const std::string& name, int64_t version) {
  const std::string path = format::damaged_path(root, run, name, version);
  if (!env->exists(path)) return std::nullopt;
  auto text = env->read_all(path);
  if (!text) return "(its record " + path + " cannot be read: " + text.error().message() + ")";
  std::string why = text->substr(0, 4096);
  while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
  for (char& ch : why)
    if (static_cast<unsigned char>(ch) < 0x20) ch = ' ';  // one line of a table, whatever the file holds
  return why;
}

version_scan scan_version(storage::storage_env* env, const std::string& root, const std::string& run,
                          const std::string& name, int64_t version) {
  version_scan s;
  s.dir = format::version_dir(root, run, name, version);
  auto names = env->list(s.dir);
  if (!names) return s;  // absent
  bool has_manifest = false;
  for (auto& n : *names) {
    uint32_t rank = 0;
    if (n == format::kManifestName) {
      has_manifest = true;
    } else if (n == format::kDamagedName) {
      s.damaged = damaged_record(env, root, run, name, version);
    } else if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) {
      s.tmp_files.push_back(n);
    } else if (format::parse_shard_name(n, &rank)) {
      s.shard_ranks.push_back(rank);
      s.bytes += file_size_of(storage::join(s.dir, n));
    } else if (uint32_t index = 0; format::parse_data_file_name(n, &index)) {
      s.data_files.push_back(index);
      s.bytes += file_size_of(storage::join(s.dir, n));
    }
  }
  std::sort(s.shard_ranks.begin(), s.shard_ranks.end());
  std::sort(s.data_files.begin(), s.data_files.end());
  std::sort(s.tmp_files.begin(), s.tmp_files.end());
  if (has_manifest) {
    auto m = format::read_manifest(env, storage::join(s.dir, format::kManifestName));
    if (m) {
      s.state = version_state::committed;
      s.nranks = m->nranks;
      s.manifest = std::move(*m);
      return s;
    }
    s.state = version_state::invalid;
    s.manifest_error = m.take_status();
  } else {
    s.state = version_state::incomplete;
  }
  for (uint32_t rank : s.shard_ranks) {
    auto h = format::read_header(env, storage::join(s.dir, format::shard_file_name(rank)));
    if (h) {
      s.nranks = h->nranks;
      break;
    }
  }
  return s;
}

}  // namespace cairn::cli

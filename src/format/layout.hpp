// Paths of the store and of a level directory; see docs/format/store.md.
#ifndef CAIRN_FORMAT_LAYOUT_HPP
#define CAIRN_FORMAT_LAYOUT_HPP

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

inline constexpr const char* kManifestName = "MANIFEST";
inline constexpr const char* kCatalogName = "catalog.sqlite";
// Beside a committed version's MANIFEST: a restart found every copy of it
// damaged (docs/format/store.md).
inline constexpr const char* kDamagedName = "DAMAGED";

// <root>/runs
std::string runs_dir(const std::string& root);
// <root>/runs/<run>/<name>
std::string checkpoint_dir(const std::string& root, const std::string& run, const std::string& name);
// <root>/runs/<run>/<name>/v<version:012>
std::string version_dir(const std::string& root, const std::string& run, const std::string& name, int64_t version);
std::string version_dir_name(int64_t version);  // v<version:012>
std::string shard_file_name(uint32_t rank);  // shard.<rank:06>
std::string shard_path(const std::string& root, const std::string& run, const std::string& name, int64_t version,
                       uint32_t rank);
std::string manifest_path(const std::string& root, const std::string& run, const std::string& name, int64_t version);
std::string damaged_path(const std::string& root, const std::string& run, const std::string& name, int64_t version);

// Parses "v000000000042" -> 42; false for other names.
bool parse_version_dir(const std::string& entry, int64_t* version);
bool parse_shard_name(const std::string& entry, uint32_t* rank);

// Versions present as directories under checkpoint_dir, ascending. Missing dir -> empty.
std::vector<int64_t> list_versions(storage::storage_env* env, const std::string& root, const std::string& run,
                                   const std::string& name);
// Subdirectory names of dir, sorted; empty if dir is missing.
std::vector<std::string> list_subdirs(storage::storage_env* env, const std::string& dir);

}  // namespace cairn::format

#endif

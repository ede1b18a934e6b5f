// Read-only store access from C (cairn_store.h): the reader under Python's
// cairn.open. Everything goes through src/format, the code restart and the
// CLI read with, so that the formats have one implementation.
#include "cairn_store.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "capi/handle.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/run_info.hpp"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "format/torch_state.hpp"
#include "storage/storage_env.hpp"

struct cairn_store {
  std::string root;
};

namespace cairn::capi {
namespace {

using nlohmann::json;

storage::storage_env* env() { return storage::storage_env::posix(); }

// Hands `text` to the caller as malloc'ed memory (cairn_store_free).
status give(const std::string& text, char** out) {
  char* p = static_cast<char*>(std::malloc(text.size() + 1));
  if (p == nullptr) return {errc::no_space, "out of memory for " + std::to_string(text.size()) + " bytes"};
  std::memcpy(p, text.data(), text.size() + 1);
  *out = p;
  return {};
}

status need(const void* p, const char* fn, const char* what) {
  if (p == nullptr) return {errc::invalid_argument, std::string(fn) + ": " + what + " is NULL"};
  return {};
}

// The MANIFEST of a committed version, checked to be that version's.
result<format::manifest> committed_manifest(const cairn_store& s, const std::string& run, const std::string& name,
                                            int64_t version) {
  const std::string path = format::manifest_path(s.root, run, name, version);
  if (!env()->exists(path))
    return status(errc::not_found, "run '" + run + "', checkpoint '" + name + "': version " +
                                       std::to_string(version) + " is not committed (no " + path + ")");
  CAIRN_ASSIGN_OR_RETURN(format::manifest m, format::read_manifest(env(), path));
  if (m.run != run || m.name != name || m.version != version)
    return status(errc::corruption, path + ": manifest is of " + m.run + "/" + m.name + "/v" +
                                        std::to_string(m.version));
  if (m.shards.size() != m.nranks)
    return status(errc::corruption, path + ": " + std::to_string(m.shards.size()) + " shards listed for " +
                                        std::to_string(m.nranks) + " ranks");
  return m;
}

std::vector<int64_t> committed_versions(const cairn_store& s, const std::string& run, const std::string& name,
                                        status* error) {
  std::vector<int64_t> out;
  for (int64_t v : format::list_versions(env(), s.root, run, name)) {
    auto m = committed_manifest(s, run, name, v);
    if (m) {
      out.push_back(v);
    } else if (m.error().code() != errc::not_found && m.error().code() != errc::corruption && *error) {
      *error = m.error();  // a newer format: say so rather than hide the version
    }
  }
  return out;
}

bool skipped(const std::string& entry) { return entry.size() >= 4 && entry.compare(entry.size() - 4, 4, ".tmp") == 0; }

// Checkpoint names of `run` with a committed version.
std::vector<std::string> committed_checkpoints(const cairn_store& s, const std::string& run, status* error) {
  std::vector<std::string> out;
  const std::string dir = storage::join(format::runs_dir(s.root), run);
  for (const auto& name : format::list_subdirs(env(), dir)) {
    if (!skipped(name) && !committed_versions(s, run, name, error).empty()) out.push_back(name);
  }
  return out;
}


json header_json(const format::shard_header& h, const std::string& where) {
  json regions = json::array();
  for (const auto& r : h.regions) {
    regions.push_back({{"name", r.name}, {"type", r.type}, {"type_name", format::type_name(r.type)},
                       {"flags", r.flags}, {"compression", r.compression}, {"dims", r.dims},
                       {"global", r.global}, {"start", r.start}, {"count", r.count}, {"offset", r.offset},
                       {"length", r.length}, {"checksum", r.checksum}, {"stored_offset", r.stored_offset},
                       {"stored_length", r.stored_length}});
  }
  return {{"path", where}, {"format_version", h.format_version}, {"run", h.run}, {"name", h.name},
          {"version", h.version}, {"rank", h.rank}, {"nranks", h.nranks}, {"data_offset", h.data_offset},
          {"file_size", h.file_size}, {"header_checksum", h.header_checksum}, {"stored_size", h.stored_size},
          {"regions", std::move(regions)}};
}

// A reader of rank's shard of a committed version, its header checked
// against the MANIFEST. A file the MANIFEST lists but that is missing is
// corruption (the version is committed), not "not found".
result<std::unique_ptr<format::shard_reader>> open_shard(const cairn_store& s, const std::string& run,
                                                         const std::string& name, int64_t version, uint32_t rank) {
  CAIRN_ASSIGN_OR_RETURN(format::manifest m, committed_manifest(s, run, name, version));
  if (rank >= m.nranks)
    return status(errc::not_found, run + "/" + name + "/v" + std::to_string(version) + ": no rank " +
                                       std::to_string(rank) + " (the version has " + std::to_string(m.nranks) +
                                       " ranks)");
  const format::shard_entry& e = m.shards[rank];
  const std::string where = format::persistent_image_where(s.root, run, name, version, rank, &m);
  if (m.aggregated) {
    const std::string dir = format::version_dir(s.root, run, name, version);
    for (const auto& x : e.extents) {
      const std::string path = storage::join(dir, m.container.files.at(x.file).name);
      if (!env()->exists(path)) return status(errc::corruption, path + ": data file listed in the manifest is missing");
    }
  } else if (!env()->exists(where)) {
    return status(errc::corruption, where + ": shard listed in the manifest is missing");
  }
  CAIRN_ASSIGN_OR_RETURN(auto file, format::open_persistent_image(env(), s.root, run, name, version, rank, &m));
  CAIRN_ASSIGN_OR_RETURN(auto rd, format::shard_reader::open(std::move(file), where));
  const format::shard_header& h = rd->header();
  if (h.file_size != e.size)
    return status(errc::corruption, where + ": size " + std::to_string(h.file_size) + " differs from the manifest's " +
                                        std::to_string(e.size));
  if (h.header_checksum != e.header_checksum)
    return status(errc::corruption, where + ": header checksum differs from the manifest's");
  if (h.run != run || h.name != name || h.version != version || h.rank != rank || h.nranks != m.nranks)
    return status(errc::corruption, where + ": shard is of " + h.run + "/" + h.name + "/v" + std::to_string(h.version) +
                                        " rank " + std::to_string(h.rank) + " of " + std::to_string(h.nranks) +
                                        ", the manifest's is of " + run + "/" + name + "/v" + std::to_string(version));
  return rd;
}

}  // namespace
}  // namespace cairn::capi

using cairn::errc;
using cairn::status;
using cairn::capi::guard;
using cairn::capi::need;

int cairn_store_open(const char* path, cairn_store_t** out) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(path, "cairn_store_open", "path"));
    CAIRN_RETURN_IF_ERROR(need(out, "cairn_store_open", "out"));
    *out = nullptr;
    auto* env = cairn::capi::env();
    // list() fails on what is not a directory.
    if (!env->exists(path) || !env->list(path))
      return {errc::not_found, std::string(path) + ": no such store (not a directory)"};
    if (!env->list(cairn::format::runs_dir(path)))
      return {errc::not_found, std::string(path) + ": not a cairn store (no runs/ directory)"};
    *out = new cairn_store{path};
    return {};
  });
}

void cairn_store_close(cairn_store_t* s) { delete s; }

void cairn_store_free(char* text) { std::free(text); }

int cairn_store_runs(cairn_store_t* s, char** json) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(s, "cairn_store_runs", "store"));
    CAIRN_RETURN_IF_ERROR(need(json, "cairn_store_runs", "json"));
    status error;
    nlohmann::json out = nlohmann::json::array();
    for (const auto& run : cairn::format::list_subdirs(cairn::capi::env(), cairn::format::runs_dir(s->root))) {
      if (!cairn::capi::skipped(run) && !cairn::capi::committed_checkpoints(*s, run, &error).empty())
        out.push_back(run);
    }
    CAIRN_RETURN_IF_ERROR(error);
    return cairn::capi::give(out.dump(), json);
  });
}

int cairn_store_checkpoints(cairn_store_t* s, const char* run, char** json) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(s, "cairn_store_checkpoints", "store"));
    CAIRN_RETURN_IF_ERROR(need(run, "cairn_store_checkpoints", "run"));
    CAIRN_RETURN_IF_ERROR(need(json, "cairn_store_checkpoints", "json"));
    status error;
    nlohmann::json out = cairn::capi::committed_checkpoints(*s, run, &error);
    CAIRN_RETURN_IF_ERROR(error);
    return cairn::capi::give(out.dump(), json);
  });
}

int cairn_store_versions(cairn_store_t* s, const char* run, const char* name, char** json) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(s, "cairn_store_versions", "store"));
    CAIRN_RETURN_IF_ERROR(need(run, "cairn_store_versions", "run"));
    CAIRN_RETURN_IF_ERROR(need(name, "cairn_store_versions", "name"));
    CAIRN_RETURN_IF_ERROR(need(json, "cairn_store_versions", "json"));
    status error;
    nlohmann::json out = cairn::capi::committed_versions(*s, run, name, &error);
    CAIRN_RETURN_IF_ERROR(error);
    return cairn::capi::give(out.dump(), json);
  });
}

int cairn_store_manifest(cairn_store_t* s, const char* run, const char* name, int64_t version, char** json) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(s, "cairn_store_manifest", "store"));
    CAIRN_RETURN_IF_ERROR(need(run, "cairn_store_manifest", "run"));
    CAIRN_RETURN_IF_ERROR(need(name, "cairn_store_manifest", "name"));
    CAIRN_RETURN_IF_ERROR(need(json, "cairn_store_manifest", "json"));
    CAIRN_ASSIGN_OR_RETURN(auto m, cairn::capi::committed_manifest(*s, run, name, version));
    (void)m;  // validated; the caller gets the file's own JSON, every field of it
    const std::string path = cairn::format::manifest_path(s->root, run, name, version);
    CAIRN_ASSIGN_OR_RETURN(std::string text, cairn::capi::env()->read_all(path));
    CAIRN_ASSIGN_OR_RETURN(std::string body, cairn::format::unseal_json(text, path, "manifest"));
    return cairn::capi::give(body, json);
  });
}

int cairn_store_run_info(cairn_store_t* s, const char* run, char** json) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(s, "cairn_store_run_info", "store"));
    CAIRN_RETURN_IF_ERROR(need(run, "cairn_store_run_info", "run"));
    CAIRN_RETURN_IF_ERROR(need(json, "cairn_store_run_info", "json"));
    const std::string path = cairn::format::run_file_path(s->root, run);
    if (!cairn::capi::env()->exists(path)) return {errc::not_found, path + ": the run has no RUN file"};
    CAIRN_ASSIGN_OR_RETURN(std::string text, cairn::capi::env()->read_all(path));
    CAIRN_ASSIGN_OR_RETURN(auto info, cairn::format::decode_run_info(text, path));
    (void)info;  // validated
    CAIRN_ASSIGN_OR_RETURN(std::string body, cairn::format::unseal_json(text, path, "RUN file"));
    return cairn::capi::give(body, json);
  });
}

int cairn_store_shard_header(cairn_store_t* s, const char* run, const char* name, int64_t version, uint32_t rank,
                             char** json) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(s, "cairn_store_shard_header", "store"));
    CAIRN_RETURN_IF_ERROR(need(run, "cairn_store_shard_header", "run"));
    CAIRN_RETURN_IF_ERROR(need(name, "cairn_store_shard_header", "name"));
    CAIRN_RETURN_IF_ERROR(need(json, "cairn_store_shard_header", "json"));
    CAIRN_ASSIGN_OR_RETURN(auto rd, cairn::capi::open_shard(*s, run, name, version, rank));
    return cairn::capi::give(cairn::capi::header_json(rd->header(), rd->path()).dump(), json);
  });
}

int cairn_store_read_region(cairn_store_t* s, const char* run, const char* name, int64_t version, uint32_t rank,
                            const char* region, void* buf, uint64_t bytes) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(s, "cairn_store_read_region", "store"));
    CAIRN_RETURN_IF_ERROR(need(run, "cairn_store_read_region", "run"));
    CAIRN_RETURN_IF_ERROR(need(name, "cairn_store_read_region", "name"));
    CAIRN_RETURN_IF_ERROR(need(region, "cairn_store_read_region", "region"));
    CAIRN_ASSIGN_OR_RETURN(auto rd, cairn::capi::open_shard(*s, run, name, version, rank));
    const auto& regions = rd->header().regions;
    for (size_t i = 0; i < regions.size(); ++i) {
      if (regions[i].name != region) continue;
      if (bytes != regions[i].length)
        return {errc::invalid_argument, rd->path() + ": region '" + region + "' has " +
                                            std::to_string(regions[i].length) + " bytes, the buffer " +
                                            std::to_string(bytes)};
      if (bytes > 0) CAIRN_RETURN_IF_ERROR(need(buf, "cairn_store_read_region", "buf"));
      return rd->read_region(i, std::span<std::byte>(static_cast<std::byte*>(buf), bytes));
    }
    std::string names;
    for (const auto& r : regions) names += (names.empty() ? "" : ", ") + r.name;
    return {errc::not_found, rd->path() + ": no region '" + region + "' (regions: " + (names.empty() ? "none" : names) + ")"};
  });
}

int cairn_store_region_keys(cairn_store_t* s, const char* run, const char* name, int64_t version, uint32_t rank,
                            char** json) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(s, "cairn_store_region_keys", "store"));
    CAIRN_RETURN_IF_ERROR(need(run, "cairn_store_region_keys", "run"));
    CAIRN_RETURN_IF_ERROR(need(name, "cairn_store_region_keys", "name"));
    CAIRN_RETURN_IF_ERROR(need(json, "cairn_store_region_keys", "json"));
    CAIRN_ASSIGN_OR_RETURN(auto rd, cairn::capi::open_shard(*s, run, name, version, rank));
    CAIRN_ASSIGN_OR_RETURN(auto keys, cairn::format::torch_state_keys(*rd));
    return cairn::capi::give(nlohmann::json(keys).dump(), json);
  });
}

int cairn_shard_file_header(const char* path, char** json) {
  return guard(__func__, [&]() -> status {
    CAIRN_RETURN_IF_ERROR(need(path, "cairn_shard_file_header", "path"));
    CAIRN_RETURN_IF_ERROR(need(json, "cairn_shard_file_header", "json"));
    CAIRN_ASSIGN_OR_RETURN(auto rd, cairn::format::shard_reader::open(cairn::capi::env(), path));
    return cairn::capi::give(cairn::capi::header_json(rd->header(), rd->path()).dump(), json);
  });
}

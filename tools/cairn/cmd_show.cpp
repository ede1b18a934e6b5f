// cairn show: the regions and timings of one version, from its MANIFEST and
// shard headers; for an aggregated version (docs/format/container.md) also its
// data files, writers and bytes moved, and each rank's extents.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "commands.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "format/torch_state.hpp"
#include "output.hpp"
#include "store_scan.hpp"
#include "util/hash.hpp"

namespace cairn::cli {
namespace {

std::string join_list(const std::vector<std::string>& items) {
  std::string s;
  for (auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

// The run holding checkpoint `name`: `run` if given (and it has it), else the
// only run that has it.
result<std::string> resolve_run(const std::string& store, const std::string& name, const std::string& run) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> runs, select_runs(store, "", run));
  std::vector<std::string> holders;
  for (auto& r : runs) {
    if (storage::storage_env::posix()->exists(format::checkpoint_dir(store, r, name))) holders.push_back(r);
  }
  if (!run.empty() && holders.empty()) {
    std::vector<std::string> names = checkpoint_names(store, "", run);
    return status(errc::not_found, "run '" + run + "' has no checkpoint '" + name + "'" +
                                       (names.empty() ? "" : " (checkpoints: " + join_list(names) + ")"));
  }
  if (holders.empty()) return status(errc::not_found, "no checkpoint named '" + name + "' in " + store);
  if (holders.size() > 1) {
    return status(errc::invalid_argument, "checkpoint '" + name + "' exists in several runs (" + join_list(holders) +
                                              "): choose one with --run");
  }
  return holders.front();
}

std::string shape_text(const format::region_desc& r) {
  std::string s;
  if (r.dims.empty()) {
    s = std::to_string(r.count);
  } else {
    for (size_t i = 0; i < r.dims.size(); ++i) s += (i ? "x" : "") + std::to_string(r.dims[i]);
  }
  if (r.flags & format::kColumnMajor) s += " (col-major)";
  return s;
}

std::string numbers_text(const std::vector<uint32_t>& v) {
  std::string s;
  for (uint32_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "-" : s;
}

// The container section of an aggregated version's MANIFEST.
nlohmann::json container_json(const format::container_info& c, const std::string& dir) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : c.files) {
    files.push_back({{"name", f.name},
                     {"path", storage::join(dir, f.name)},
                     {"size", f.size},
                     {"size_on_disk", file_size_of(storage::join(dir, f.name))},
                     {"writers", f.writers}});
  }
  return {{"strategy", c.strategy},
          {"stripe", c.stripe},
          {"stripe_count", c.stripe_count},
          {"files", files},
          {"leaders", c.leaders},
          {"bytes_between_nodes", c.bytes_between_nodes},
          {"bytes_within_nodes", c.bytes_within_nodes},
          {"padding", c.padding}};
}

void print_container(const format::container_info& c) {
  std::printf("layout:      aggregated\n");
  std::printf("strategy:    %s\n", c.strategy.c_str());
  std::printf("stripe:      %s\n",
              c.stripe == 0 ? "none"
                            : (std::to_string(c.stripe) + " (" + format_bytes(c.stripe) + "), count " +
                               (c.stripe_count == 0 ? std::string("unknown") : std::to_string(c.stripe_count)))
                                  .c_str());
  std::printf("leaders:     %s\n", numbers_text(c.leaders).c_str());
  std::printf("moved:       %llu bytes between nodes, %llu within nodes\n",
              static_cast<unsigned long long>(c.bytes_between_nodes),
              static_cast<unsigned long long>(c.bytes_within_nodes));
  std::printf("padding:     %llu bytes (%s)\n", static_cast<unsigned long long>(c.padding),
              format_bytes(c.padding).c_str());
  std::printf("\ndata files:\n");
  table files({"FILE", "SIZE", "WRITERS"}, {false, true, false});
  for (const auto& f : c.files) files.add({f.name, std::to_string(f.size), numbers_text(f.writers)});
  files.print(stdout);
}

// The keys of a cairn.pytorch state's tensor regions in one rank's image.
result<std::map<std::string, std::string>> torch_keys(storage::storage_env* env, const std::string& store,
                                                      const std::string& run, const std::string& name,
                                                      int64_t version, uint32_t rank, const format::manifest* container,
                                                      const std::string& where) {
  CAIRN_ASSIGN_OR_RETURN(auto file, format::open_persistent_image(env, store, run, name, version, rank, container));
  CAIRN_ASSIGN_OR_RETURN(auto rd, format::shard_reader::open(std::move(file), where));
  return format::torch_state_keys(*rd);
}

// The rows, JSON and errors of every rank that `cairn show` prints.
struct show_tables {
  explicit show_tables(bool aggregated)
      : shards(aggregated ? std::vector<std::string>{"RANK", "EXTENTS", "FILES", "SIZE", "HEADER_CHECKSUM", "HOST"}
                          : std::vector<std::string>{"RANK", "FILE", "SIZE", "HEADER_CHECKSUM", "HOST"},
               aggregated ? std::vector<bool>{true, true, false, true, false, false}
                          : std::vector<bool>{true, false, true, false, false}) {}
  int rc = kExitOk;
  nlohmann::json jshards = nlohmann::json::array();
  table regions{{"RANK", "REGION", "TYPE", "COUNT", "SHAPE", "OFFSET", "LENGTH", "CHECKSUM"},
                {true, false, false, true, false, true, true, false}};
  table shards;
  table timings{{"RANK", "CAPTURED_AT", "CAPTURE_S", "CHECKSUM_S", "LOCAL_S", "PERSISTENT_S", "PERSISTENT_AT"},
                {true, false, true, true, true, true, false}};
  std::vector<std::string> errors;
  uint64_t compressed_shards = 0, stored_bytes = 0, image_bytes = 0;
};

// One rank of the version `cairn show` prints: its shard (or its extents in
// an aggregated version's data files), timings and regions, into *t.
// `container`: the MANIFEST of an aggregated version, else null.
void show_rank(const show_options& o, const std::string& run, const version_scan& s,
               const format::manifest* container, uint32_t rank, show_tables* t) {
  storage::storage_env* env = storage::storage_env::posix();
  const std::string path = format::persistent_image_where(o.store, run, o.name, o.version, rank, container);
  nlohmann::json js = {{"rank", rank}};
  const format::shard_entry* e = s.manifest ? &s.manifest->shards[rank] : nullptr;
  // The FILE column (file per process), or EXTENTS and FILES (aggregated).
  std::vector<std::string> where_cells = {format::shard_file_name(rank)};
  if (container) {
    nlohmann::json jextents = nlohmann::json::array();
    std::set<uint32_t> in_files;
    uint64_t extent_bytes = 0;
    for (const auto& x : e->extents) {
      jextents.push_back({{"src", x.src},
                          {"length", x.length},
                          {"file", container->container.files[x.file].name},
                          {"offset", x.offset},
                          {"checksum", util::hex64(x.checksum)}});
      in_files.insert(x.file);
      extent_bytes += x.length;
    }
    std::string names;
    for (uint32_t f : in_files) names += (names.empty() ? "" : ",") + container->container.files[f].name;
    js["file"] = nullptr;
    js["extent_count"] = e->extents.size();
    js["extent_bytes"] = extent_bytes;
    js["extents"] = std::move(jextents);
    where_cells = {std::to_string(e->extents.size()), names.empty() ? "-" : names};
  } else {
    js["file"] = format::shard_file_name(rank);
  }
  auto row = [&](std::vector<std::string> tail) {
    std::vector<std::string> cells = {std::to_string(rank)};
    cells.insert(cells.end(), where_cells.begin(), where_cells.end());
    cells.insert(cells.end(), tail.begin(), tail.end());
    return cells;
  };
  if (e != nullptr) {
    js["size"] = e->size;
    js["header_checksum"] = util::hex64(e->header_checksum);
    js["host"] = e->host;
    js["timings"] = {{"captured_at", e->captured_at}, {"capture_s", e->capture_s},
                     {"checksum_s", e->checksum_s},   {"local_s", e->local_s},
                     {"persistent_s", e->persistent_s}, {"persistent_at", e->persistent_at}};
    t->timings.add({std::to_string(rank), format_time(e->captured_at, true), format_seconds(e->capture_s),
                 format_seconds(e->checksum_s), format_seconds(e->local_s), format_seconds(e->persistent_s),
                 format_time(e->persistent_at, true)});
  }
  auto file = format::open_persistent_image(env, o.store, run, o.name, o.version, rank, container);
  auto h = file ? format::read_header(**file, path) : result<format::shard_header>(file.take_status());
  if (!h) {
    std::string message = h.error().message();
    if (container && h.error().code() == errc::not_found)
      message += " (the MANIFEST lists it: this version cannot be restored; `cairn verify` checks the store)";
    js["error"] = message;
    // Ranks whose extents share a missing data file report it once.
    if (std::find(t->errors.begin(), t->errors.end(), message) == t->errors.end()) t->errors.push_back(message);
    t->rc = kExitFailure;
    t->shards.add(
        row({e ? std::to_string(e->size) : "-", e ? util::hex64(e->header_checksum) : "-", e ? e->host : "-"}));
    t->jshards.push_back(std::move(js));
    return;
  }
  if (e == nullptr) {
    js["size"] = h->file_size;
    js["header_checksum"] = util::hex64(h->header_checksum);
  }
  // SIZE is the image's; a compressed shard (format 3) stores fewer bytes.
  js["format_version"] = h->format_version;
  js["stored_size"] = h->stored_size;
  if (h->compressed()) {
    ++t->compressed_shards;
    t->stored_bytes += h->stored_size;
    t->image_bytes += h->file_size;
  }
  t->shards.add(row({std::to_string(h->file_size), util::hex64(h->header_checksum), e ? e->host : "-"}));
  // A cairn.pytorch state names its tensor regions by their keys.
  std::map<std::string, std::string> keys;
  if (std::any_of(h->regions.begin(), h->regions.end(),
                  [](const format::region_desc& r) { return r.name == format::kTorchStateRegion; })) {
    auto k = torch_keys(env, o.store, run, o.name, o.version, rank, container, path);
    if (k) {
      keys = std::move(*k);
    } else {
      js["keys_error"] = k.error().message();
      if (std::find(t->errors.begin(), t->errors.end(), k.error().message()) == t->errors.end())
        t->errors.push_back(k.error().message());
      t->rc = kExitFailure;
    }
  }
  nlohmann::json jregions = nlohmann::json::array();
  for (const auto& r : h->regions) {
    std::vector<uint64_t> shape = r.dims.empty() ? std::vector<uint64_t>{r.count} : r.dims;
    auto key = keys.find(r.name);
    jregions.push_back({{"name", r.name},
                        {"key", key == keys.end() ? nlohmann::json(nullptr) : nlohmann::json(key->second)},
                        {"type", format::type_name(r.type)},
                        {"count", r.count},
                        {"shape", shape},
                        {"column_major", (r.flags & format::kColumnMajor) != 0},
                        {"offset", r.offset},
                        {"length", r.length},
                        {"checksum", util::hex64(r.checksum)},
                        {"compression", r.compression == format::kCompressZstd ? "zstd" : "none"},
                        {"stored_length", r.stored_length}});
    t->regions.add({std::to_string(rank), key == keys.end() ? r.name : key->second + " (" + r.name + ")",
                 format::type_name(r.type), std::to_string(r.count), shape_text(r),
                 std::to_string(r.offset), std::to_string(r.length), util::hex64(r.checksum)});
  }
  js["regions"] = std::move(jregions);
  t->jshards.push_back(std::move(js));
}

}  // namespace

int cmd_show(const show_options& o) {
  if (status st = check_store(o.store); !st) {
    print_error(st);
    return exit_code_for(st);
  }
  auto run_or = resolve_run(o.store, o.name, o.run);
  if (!run_or) {
    print_error(run_or.error());
    return exit_code_for(run_or.error());
  }
  const std::string run = *run_or;
  storage::storage_env* env = storage::storage_env::posix();
  version_scan s = scan_version(env, o.store, run, o.name, o.version);
  if (s.state == version_state::absent) {
    std::vector<std::string> known;
    for (int64_t v : version_numbers(o.store, "", run, o.name)) known.push_back(std::to_string(v));
    status st(errc::not_found, "version " + std::to_string(o.version) + " of " + run + "/" + o.name +
                                   " not found in " + o.store +
                                   (known.empty() ? "" : " (versions: " + join_list(known) + ")"));
    print_error(st);
    return exit_code_for(st);
  }

  // Ranks to show: all the manifest lists, or the shard files present.
  std::vector<uint32_t> ranks;
  if (s.manifest) {
    for (auto& e : s.manifest->shards) ranks.push_back(e.rank);
  } else {
    ranks = s.shard_ranks;
  }

  // An aggregated version's ranks have extents in data files, not a shard file.
  const format::manifest* container = s.manifest && s.manifest->aggregated ? &*s.manifest : nullptr;
  show_tables t(container != nullptr);
  for (uint32_t rank : ranks) show_rank(o, run, s, container, rank, &t);

  uint64_t bytes = s.bytes;
  std::string state_text = state_name(s.state);
  if (s.state == version_state::incomplete && s.aggregated()) {
    state_text += " (aggregated: " + std::to_string(s.data_files.size()) + " data file" +
                  (s.data_files.size() == 1 ? "" : "s") + ", no MANIFEST)";
  } else if (s.state == version_state::incomplete) {
    state_text += " (" + std::to_string(s.shard_ranks.size()) + " of " +
                  (s.nranks ? std::to_string(*s.nranks) : std::string("?")) + " shards, no MANIFEST)";
  } else if (s.state == version_state::invalid) {
    state_text += " (" + s.manifest_error.message() + ")";
    t.rc = kExitFailure;
  }
  if (s.damaged) state_text += ", damaged: restarts skip it (" + *s.damaged + ")";

  if (o.json) {
    nlohmann::json j = {{"store", o.store},   {"run", run},        {"name", o.name},
                        {"version", o.version}, {"state", state_name(s.state)},
                        {"nranks", s.nranks ? nlohmann::json(*s.nranks) : nlohmann::json(nullptr)},
                        {"bytes", bytes},       {"layout", layout_name(s)},
                        {"shards", t.jshards}};
    if (s.manifest) {
      j["committed_at"] = s.manifest->committed_at;
      j["executable"] = s.manifest->executable;
      j["mode"] = s.manifest->mode;
      j["redundancy"] = redundancy_json(s.manifest->redundancy);
    }
    if (container) j["container"] = container_json(container->container, s.dir);
    if (s.state == version_state::invalid) j["problem"] = s.manifest_error.message();
    j["damaged"] = s.damaged ? nlohmann::json(*s.damaged) : nlohmann::json(nullptr);
    print_json(j);
  } else {
    std::printf("run:         %s\n", run.c_str());
    std::printf("checkpoint:  %s\n", o.name.c_str());
    std::printf("version:     %lld\n", static_cast<long long>(o.version));
    std::printf("state:       %s\n", state_text.c_str());
    std::printf("ranks:       %s\n", s.nranks ? std::to_string(*s.nranks).c_str() : "?");
    std::printf("bytes:       %llu (%s)\n", static_cast<unsigned long long>(bytes), format_bytes(bytes).c_str());
    if (s.manifest) {
      std::printf("committed:   %s\n", format_time(s.manifest->committed_at, true).c_str());
      std::printf("executable:  %s\n", s.manifest->executable.c_str());
      std::printf("mode:        %s\n", s.manifest->mode.c_str());
      if (const auto& r = s.manifest->redundancy) {
        // The time is known only when every set was complete before the commit.
        std::printf("redundancy:  %s, %s\n", r->description.c_str(),
                    r->protected_at > 0 ? ("sets complete " + format_time(r->protected_at, true)).c_str()
                                        : "sets not yet complete when committed");
      }
    }
    if (container) {
      print_container(container->container);
    } else if (s.aggregated()) {
      std::printf("layout:      aggregated\n");
    }
    std::printf("\nregions:\n");
    t.regions.print(stdout);
    std::printf("\nshards:\n");
    t.shards.print(stdout);
    if (t.compressed_shards > 0) {
      std::printf("compressed:  %llu of %zu shards (zstd), %s stored for %s of images\n",
                  static_cast<unsigned long long>(t.compressed_shards), ranks.size(), format_bytes(t.stored_bytes).c_str(),
                  format_bytes(t.image_bytes).c_str());
    }
    if (!t.timings.empty()) {
      std::printf("\ntimings (seconds; times UTC):\n");
      t.timings.print(stdout);
    }
  }
  for (auto& e : t.errors) print_error(status(errc::corruption, e));
  return t.rc;
}

}  // namespace cairn::cli

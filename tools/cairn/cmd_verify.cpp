// cairn verify: re-reads every shard of every version (committed or not) at
// the persistent level, and at the local level when --scratch is given, and
// checks it against its own header and against the version's MANIFEST. A
// rank's image in an aggregated version (docs/format/container.md) is checked
// twice: every extent against its checksum in the MANIFEST, then every region
// read through the image reader, as a shard file.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "output.hpp"
#include "store_scan.hpp"
#include "util/hash.hpp"

namespace cairn::cli {
namespace {

// Shard data is hashed through one reusable buffer of this size, so memory
// stays bounded whatever the shard size.
constexpr size_t kChunkBytes = size_t{4} << 20;

struct problem {
  std::string file;
  std::string level;
  std::string run;
  std::string name;
  int64_t version = 0;
  std::string message;
  std::optional<format::extent_problem> extent;  // a damaged extent of an aggregated version
};

struct shard_job {
  std::string level;  // "persistent" or "local"
  std::string run;
  std::string name;
  int64_t version = 0;
  uint32_t rank = 0;
  std::string path;                           // the shard file, or "<dir>/data.* (rank r)"
  std::optional<format::shard_entry> expect;  // from a valid MANIFEST
  std::optional<uint32_t> nranks;             // from a valid MANIFEST
  uint64_t size = 0;                          // bytes to read (progress)
  std::shared_ptr<const format::manifest> container;  // an aggregated version's MANIFEST
};

// Strips "<file>: " from messages of the format module, which name the file
// themselves, since every problem line starts with the file.
std::string without_prefix(const std::string& message, const std::string& file) {
  const std::string prefix = file + ": ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

class verifier {
 public:
  verifier(const verify_options& o) : o_(o) {}

  int run() {
    status st = check_store(o_.store);
    if (st && !o_.scratch.empty()) st = check_directory(o_.scratch, "scratch directory");
    if (!st) {
      print_error(st);
      return exit_code_for(st);
    }
    auto runs = select_runs(o_.store, o_.scratch, o_.run);
    if (!runs) {
      print_error(runs.error());
      return exit_code_for(runs.error());
    }
    for (const auto& run : *runs)
      for (const auto& name : checkpoint_names(o_.store, o_.scratch, run))
        for (int64_t v : version_numbers(o_.store, o_.scratch, run, name)) plan_version(run, name, v);

    uint64_t total = 0;
    for (auto& j : jobs_) total += j.size;
    progress_ = std::make_unique<progress>(!o_.json, total);
    for (auto& j : jobs_) check_shard(j);
    progress_->clear();
    report();
    return problems_.empty() ? kExitOk : kExitFailure;
  }

 private:
  void add_problem(const std::string& file, const std::string& level, const std::string& run,
                   const std::string& name, int64_t version, const std::string& message,
                   std::optional<format::extent_problem> extent = std::nullopt) {
    problem p{file, level, run, name, version, without_prefix(message, file), std::move(extent)};
    if (!o_.json) {
      if (progress_) progress_->clear();
      std::printf("%s: %s\n", p.file.c_str(), p.message.c_str());
      std::fflush(stdout);
    }
    problems_.push_back(std::move(p));
  }

  void plan_version(const std::string& run, const std::string& name, int64_t version) {
    storage::storage_env* env = storage::storage_env::posix();
    version_scan s = scan_version(env, o_.store, run, name, version);
    ++versions_;
    switch (s.state) {
      case version_state::committed: ++committed_; break;
      case version_state::incomplete: ++incomplete_; break;
      case version_state::invalid: ++invalid_; break;
      case version_state::absent: ++local_only_; break;
    }
    if (s.state == version_state::invalid) {
      const std::string mpath = storage::join(s.dir, format::kManifestName);
      add_problem(mpath, "persistent", run, name, version, s.manifest_error.message());
    }
    if (s.manifest && s.manifest->aggregated) {
      plan_container(s, run, name, version);
    }
    auto job = [&](const std::string& level, const std::string& root, uint32_t rank) {
      shard_job j;
      j.level = level;
      j.run = run;
      j.name = name;
      j.version = version;
      j.rank = rank;
      j.path = format::shard_path(root, run, name, version, rank);
      if (s.manifest && rank < s.manifest->shards.size()) {
        j.expect = s.manifest->shards[rank];
        j.nranks = s.manifest->nranks;
      }
      j.size = file_size_of(j.path);
      return j;
    };
    if (s.manifest && s.manifest->aggregated) {
      // Planned above.
    } else if (s.manifest) {
      // Committed: every shard the manifest lists must be there.
      for (const auto& e : s.manifest->shards) {
        const std::string path = format::shard_path(o_.store, run, name, version, e.rank);
        if (std::find(s.shard_ranks.begin(), s.shard_ranks.end(), e.rank) == s.shard_ranks.end()) {
          add_problem(path, "persistent", run, name, version, "missing (the MANIFEST lists it)");
          continue;
        }
        jobs_.push_back(job("persistent", o_.store, e.rank));
      }
    } else {
      // Not committed: check the shards that are there (others may be coming).
      for (uint32_t rank : s.shard_ranks) jobs_.push_back(job("persistent", o_.store, rank));
    }
    if (!o_.scratch.empty()) {
      // The local level keeps what retention left: missing shards are normal.
      // A present one must be the same image as the committed one.
      version_scan l = scan_version(env, o_.scratch, run, name, version);
      for (uint32_t rank : l.shard_ranks) jobs_.push_back(job("local", o_.scratch, rank));
    }
  }

  // An aggregated version: every data file the MANIFEST lists must be there,
  // as long as it says; then a job per rank whose extents lie in intact files.
  void plan_container(const version_scan& s, const std::string& run, const std::string& name, int64_t version) {
    auto m = std::make_shared<const format::manifest>(*s.manifest);
    std::vector<bool> file_ok(m->container.files.size(), true);
    for (size_t f = 0; f < m->container.files.size(); ++f) {
      const format::data_file& d = m->container.files[f];
      const std::string path = storage::join(s.dir, d.name);
      if (!storage::storage_env::posix()->exists(path)) {
        add_problem(path, "persistent", run, name, version,
                    "missing (the MANIFEST lists it, with the extents of ranks " + ranks_in_file(*m, f) + ")");
        file_ok[f] = false;
      } else if (const uint64_t size = file_size_of(path); size < d.size) {
        add_problem(path, "persistent", run, name, version,
                    "has " + std::to_string(size) + " bytes, the MANIFEST says " + std::to_string(d.size) +
                        " (truncated; it holds the extents of ranks " + ranks_in_file(*m, f) + ")");
        file_ok[f] = false;
      }
    }
    for (const auto& e : m->shards) {
      if (!std::all_of(e.extents.begin(), e.extents.end(), [&](auto& x) { return file_ok[x.file]; })) continue;
      shard_job j;
      j.level = "persistent";
      j.run = run;
      j.name = name;
      j.version = version;
      j.rank = e.rank;
      j.path = format::persistent_image_where(o_.store, run, name, version, e.rank, m.get());
      j.expect = e;
      j.nranks = m->nranks;
      j.size = 2 * e.size;  // the extents, then the regions
      j.container = m;
      jobs_.push_back(std::move(j));
    }
  }

  static std::string ranks_in_file(const format::manifest& m, size_t file) {
    std::string s;
    for (const auto& e : m.shards) {
      if (std::any_of(e.extents.begin(), e.extents.end(), [&](auto& x) { return x.file == file; }))
        s += (s.empty() ? "" : ", ") + std::to_string(e.rank);
    }
    return s.empty() ? "none" : s;
  }

  // "; at data.000000 offset N": where image offset `at` of j's rank lies.
  static std::string in_data_files(const shard_job& j, uint64_t at) {
    for (const auto& x : j.container->shards[j.rank].extents) {
      if (at >= x.src && at - x.src < x.length)
        return "; at " + j.container->container.files[x.file].name + " offset " + std::to_string(x.offset + at - x.src);
    }
    return "";
  }

  // Every extent of j's rank against its checksum; the first that does not
  // match (or cannot be read) is a problem naming its data file and offset.
  void check_extents(const shard_job& j) {
    uint64_t read = 0;
    format::extent_problem where;
    const std::string dir = format::version_dir(o_.store, j.run, j.name, j.version);
    status st = format::verify_container_extents(storage::storage_env::posix(), dir, *j.container, j.rank, &read,
                                                 &where);
    extents_ += static_cast<int64_t>(j.container->shards[j.rank].extents.size());
    bytes_ += read;
    progress_->advance(j.size / 2, j.path);
    if (!st) {
      const format::image_extent& x = where.extent;
      std::string message = st.message();
      if (st.code() != errc::corruption || message.find("do not match their checksum") == std::string::npos) {
        message = "extent [" + std::to_string(x.offset) + ", " + std::to_string(x.offset + x.length) + ") of rank " +
                  std::to_string(j.rank) + "'s image: " + message;
      }
      add_problem(where.path, j.level, j.run, j.name, j.version, message, where);
    }
  }

  // The shard file, or the rank's image read through its extents.
  result<std::unique_ptr<format::shard_reader>> open_reader(const shard_job& j) {
    storage::storage_env* env = storage::storage_env::posix();
    if (!j.container) return format::shard_reader::open(env, j.path);
    CAIRN_ASSIGN_OR_RETURN(auto file, format::open_container_image(
                                          env, format::version_dir(o_.store, j.run, j.name, j.version),
                                          *j.container, j.rank));
    return format::shard_reader::open(std::move(file), j.path);
  }

  void check_shard(const shard_job& j) {
    auto problem_here = [&](const std::string& message) {
      add_problem(j.path, j.level, j.run, j.name, j.version, message);
    };
    ++(j.level == "local" ? local_shards_ : persistent_shards_);
    // Bytes of this pass (progress): the file's, or an aggregated image's second half.
    uint64_t size = j.size;
    if (j.container) {
      check_extents(j);
      size = j.size - j.size / 2;
    }
    // Magic, format, header checksum, table, file size; compressed or not.
    auto rd = open_reader(j);
    if (!rd) {
      problem_here(rd.error().message());
      progress_->advance(size, j.path);
      return;
    }
    const format::shard_header& h = (*rd)->header();
    if (h.run != j.run || h.name != j.name || h.version != j.version || h.rank != j.rank) {
      problem_here("header says " + h.run + "/" + h.name + " version " + std::to_string(h.version) + " rank " +
                   std::to_string(h.rank) + ", which does not match its place");
    }
    if (j.expect) {
      // The MANIFEST records the image's size and header checksum, which a
      // compressed shard's header also carries.
      if (h.file_size != j.expect->size) {
        problem_here("size " + std::to_string(h.file_size) + " does not match the MANIFEST (" +
                     std::to_string(j.expect->size) + ")");
      }
      if (h.header_checksum != j.expect->header_checksum) {
        problem_here("header checksum " + util::hex64(h.header_checksum) + " does not match the MANIFEST (" +
                     util::hex64(j.expect->header_checksum) + ")");
      }
      if (j.nranks && h.nranks != *j.nranks) {
        problem_here("header says " + std::to_string(h.nranks) + " ranks, the MANIFEST " +
                     std::to_string(*j.nranks));
      }
    }
    if (buffer_.empty()) buffer_.resize(kChunkBytes);
    // Progress counts the file's bytes (size) as they are read: a
    // compressed region advances by its stored bytes.
    uint64_t advanced = 0;
    auto advance = [&] {
      const uint64_t now = std::min<uint64_t>((*rd)->bytes_read(), size);
      if (now > advanced) progress_->advance(now - advanced, j.path);
      advanced = std::max(advanced, now);
    };
    advance();
    for (const auto& r : h.regions) {
      ++regions_;
      util::xxh3_stream hash;
      status st;
      for (uint64_t done = 0; done < r.length && st;) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, r.length - done));
        st = (*rd)->read(r.offset + done, buffer_.data(), n);
        if (st) hash.update(buffer_.data(), n);
        done += n;
        bytes_ += n;
        advance();
      }
      if (!st) {
        problem_here("reading region '" + r.name + "': " + without_prefix(st.message(), j.path));
      } else if (hash.digest() != r.checksum) {
        problem_here("checksum mismatch in region '" + r.name + "' (offset " + std::to_string(r.offset) +
                     ", length " + std::to_string(r.length) + (j.container ? in_data_files(j, r.offset) : "") +
                     ")");
      }
    }
    if (advanced < size) progress_->advance(size - advanced, j.path);
  }

  void report() {
    if (o_.json) {
      nlohmann::json jp = nlohmann::json::array();
      for (auto& p : problems_) {
        jp.push_back({{"file", p.file},
                      {"level", p.level},
                      {"run", p.run},
                      {"name", p.name},
                      {"version", p.version},
                      {"message", p.message}});
        if (p.extent) {
          // The damaged extent of an aggregated version: where it is, and whose.
          jp.back()["extent"] = {{"rank", p.extent->rank},
                                 {"data_file", p.extent->path},
                                 {"offset", p.extent->extent.offset},
                                 {"length", p.extent->extent.length},
                                 {"image_offset", p.extent->extent.src}};
        }
      }
      print_json({{"store", o_.store},
                  {"ok", problems_.empty()},
                  {"versions",
                   {{"total", versions_},
                    {"committed", committed_},
                    {"incomplete", incomplete_},
                    {"invalid", invalid_},
                    {"local_only", local_only_}}},
                  {"shards", {{"persistent", persistent_shards_}, {"local", local_shards_}}},
                  {"regions", regions_},
                  {"extents", extents_},
                  {"bytes", bytes_},
                  {"problems", jp}});
      return;
    }
    std::string versions = std::to_string(versions_) + " versions (" + std::to_string(committed_) + " committed, " +
                           std::to_string(incomplete_) + " incomplete, " + std::to_string(invalid_) + " invalid";
    if (!o_.scratch.empty()) versions += ", " + std::to_string(local_only_) + " local only";
    versions += ")";
    std::string shards = std::to_string(persistent_shards_ + local_shards_) + " shards (" +
                         std::to_string(persistent_shards_) + " persistent, " + std::to_string(local_shards_) +
                         " local)";
    std::string outcome = problems_.empty() ? "no problems"
                          : problems_.size() == 1 ? "1 problem"
                                                  : std::to_string(problems_.size()) + " problems";
    // Extents are counted only where aggregated versions have some.
    const std::string extents = extents_ > 0 ? ", " + std::to_string(extents_) + " extents" : std::string();
    std::printf("verified %s, %s, %lld regions%s, %s: %s\n", versions.c_str(), shards.c_str(),
                static_cast<long long>(regions_), extents.c_str(), format_bytes(bytes_).c_str(), outcome.c_str());
  }

  const verify_options& o_;
  std::vector<shard_job> jobs_;
  std::vector<problem> problems_;
  std::vector<std::byte> buffer_;
  std::unique_ptr<progress> progress_;
  int64_t versions_ = 0, committed_ = 0, incomplete_ = 0, invalid_ = 0, local_only_ = 0;
  int64_t persistent_shards_ = 0, local_shards_ = 0, regions_ = 0, extents_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace

int cmd_verify(const verify_options& o) { return verifier(o).run(); }

}  // namespace cairn::cli

// cairn verify: re-reads every shard of every version (committed or not) at
// the persistent level, and at the local level when --scratch is given, and
// checks it against its own header and against the version's MANIFEST.
#include <algorithm>
#include <cstdio>

#include "commands.hpp"
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
};

struct shard_job {
  std::string level;  // "persistent" or "local"
  std::string run;
  std::string name;
  int64_t version = 0;
  uint32_t rank = 0;
  std::string path;
  std::optional<format::shard_entry> expect;  // from a valid MANIFEST
  std::optional<uint32_t> nranks;             // from a valid MANIFEST
  uint64_t size = 0;
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
                   const std::string& name, int64_t version, const std::string& message) {
    problem p{file, level, run, name, version, without_prefix(message, file)};
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
    if (s.manifest) {
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

  void check_shard(const shard_job& j) {
    auto problem_here = [&](const std::string& message) {
      add_problem(j.path, j.level, j.run, j.name, j.version, message);
    };
    ++(j.level == "local" ? local_shards_ : persistent_shards_);
    storage::storage_env* env = storage::storage_env::posix();
    // Magic, format, header checksum, table, file size; compressed or not.
    auto rd = format::shard_reader::open(env, j.path);
    if (!rd) {
      problem_here(rd.error().message());
      progress_->advance(j.size, j.path);
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
    // Progress counts the file's bytes (j.size) as they are read: a
    // compressed region advances by its stored bytes.
    uint64_t advanced = 0;
    auto advance = [&] {
      const uint64_t now = std::min<uint64_t>((*rd)->bytes_read(), j.size);
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
                     ", length " + std::to_string(r.length) + ")");
      }
    }
    if (advanced < j.size) progress_->advance(j.size - advanced, j.path);
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
    std::printf("verified %s, %s, %lld regions, %s: %s\n", versions.c_str(), shards.c_str(),
                static_cast<long long>(regions_), format_bytes(bytes_).c_str(), outcome.c_str());
  }

  const verify_options& o_;
  std::vector<shard_job> jobs_;
  std::vector<problem> problems_;
  std::vector<std::byte> buffer_;
  std::unique_ptr<progress> progress_;
  int64_t versions_ = 0, committed_ = 0, incomplete_ = 0, invalid_ = 0, local_only_ = 0;
  int64_t persistent_shards_ = 0, local_shards_ = 0, regions_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace

int cmd_verify(const verify_options& o) { return verifier(o).run(); }

}  // namespace cairn::cli

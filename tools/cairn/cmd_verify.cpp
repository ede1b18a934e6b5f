// cairn verify: re-reads every shard of every version (committed or not) at
// the persistent level, and at the local level when --scratch is given, and
// checks it against its own header and against the version's MANIFEST. A
// rank's image in an aggregated version (docs/format/container.md) is checked
// twice: every extent against its checksum in the MANIFEST, then every region
// read through the image reader, as a shard file. With --scratch, the parity
// files of node-loss redundancy (docs/format/redundancy.md) found there are
// checked too: every block against its checksum, and re-encoded with the
// redundancy codec from the members' node-local shards where they are all
// present and intact.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "commands.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "output.hpp"
#include "redundancy/codec.hpp"
#include "redundancy/parity_file.hpp"
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
  std::optional<redundancy::block> parity;        // a damaged block of a parity file
};

// A parity file (redundancy.<rank>) in a node-local version directory.
struct parity_job {
  std::string path;
  std::string run;
  std::string name;
  int64_t version = 0;
  uint32_t rank = 0;
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
    for (const auto& dir : o_.scratch)
      if (st) st = check_directory(dir, "scratch directory");
    if (!st) {
      print_error(st);
      return exit_code_for(st);
    }
    auto runs = select_all_runs();
    if (!runs) {
      print_error(runs.error());
      return exit_code_for(runs.error());
    }
    for (const auto& run : *runs) {
      std::set<std::string> names;
      for (const auto& dir : scratch_dirs())
        for (const auto& n : checkpoint_names(o_.store, dir, run)) names.insert(n);
      for (const auto& name : names) {
        std::set<int64_t> versions;
        for (const auto& dir : scratch_dirs())
          for (int64_t v : version_numbers(o_.store, dir, run, name)) versions.insert(v);
        for (int64_t v : versions) plan_version(run, name, v);
      }
    }

    uint64_t total = 0;
    for (auto& j : jobs_) total += j.size;
    for (auto& p : parity_jobs_) total += file_size_of(p.path);
    progress_ = std::make_unique<progress>(!o_.json, total);
    for (auto& j : jobs_) check_shard(j);
    // After the shards: a parity block is re-encoded only from shards found intact.
    for (const auto& p : problems_)
      if (p.level == "local") damaged_.insert(p.file);
    for (auto& p : parity_jobs_) check_parity(p);
    progress_->clear();
    report();
    return problems_.empty() ? kExitOk : kExitFailure;
  }

 private:
  // The scratch directories, or one empty name (the persistent level only)
  // for the helpers of store_scan.hpp that take one.
  std::vector<std::string> scratch_dirs() const {
    return o_.scratch.empty() ? std::vector<std::string>{""} : o_.scratch;
  }

  // The runs of the store and of every scratch directory; with --run, that
  // run, or the error naming where it was looked for.
  result<std::vector<std::string>> select_all_runs() const {
    std::set<std::string> all;
    status first;
    for (const auto& dir : scratch_dirs()) {
      auto r = select_runs(o_.store, dir, o_.run);
      if (r) all.insert(r->begin(), r->end());
      else if (first) first = r.error();
    }
    if (all.empty() && !first) return first;
    return std::vector<std::string>(all.begin(), all.end());
  }

  void add_problem(const std::string& file, const std::string& level, const std::string& run,
                   const std::string& name, int64_t version, const std::string& message,
                   std::optional<format::extent_problem> extent = std::nullopt,
                   std::optional<redundancy::block> parity = std::nullopt) {
    problem p{file, level, run, name, version, without_prefix(message, file), std::move(extent), parity};
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
    if (s.damaged)
      add_problem(format::damaged_path(o_.store, run, name, version), "persistent", run, name, version,
                  "a restart found every copy damaged (" + *s.damaged + "); restarts skip this version until it is "
                  "checkpointed again, or until this record is removed after a repair");
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
    for (const auto& dir : o_.scratch) {
      // The local level keeps what retention left: missing shards are normal.
      // A present one must be the same image as the committed one.
      version_scan l = scan_version(env, dir, run, name, version);
      for (uint32_t rank : l.shard_ranks) jobs_.push_back(job("local", dir, rank));
      // Parity files beside them (redundancy.<rank:06>; not the .tmp of one being written).
      auto names = env->list(l.dir);
      if (!names) continue;
      std::sort(names->begin(), names->end());
      for (const auto& n : *names) {
        unsigned rank = 0;
        char tail = 0;
        if (std::sscanf(n.c_str(), "redundancy.%6u%c", &rank, &tail) != 1 || redundancy::parity_file_name(rank) != n)
          continue;
        parity_jobs_.push_back({storage::join(l.dir, n), run, name, version, rank});
      }
    }
  }

  // The node-local shard of `rank` that the parity covers: present in one of
  // the scratch directories, intact (no problem found above), uncompressed
  // and with the header checksum and size the parity file recorded. Else
  // null, with why in *why.
  std::unique_ptr<storage::readable_file> member_shard(const parity_job& p, const redundancy::member& m,
                                                       std::string* why) {
    storage::storage_env* env = storage::storage_env::posix();
    *why = "its shard is in none of the scratch directories";
    for (const auto& dir : o_.scratch) {
      const std::string path = format::shard_path(dir, p.run, p.name, p.version, m.rank);
      if (!env->exists(path)) continue;
      if (damaged_.count(path)) {
        *why = "its shard " + path + " is damaged";
        continue;
      }
      auto f = env->open_read(path);
      auto h = f ? format::read_header(**f, path) : result<format::shard_header>(f.take_status());
      if (!h) {
        *why = h.error().message();
        continue;
      }
      if (h->header_checksum != m.header_checksum || h->file_size != m.size || h->compressed()) {
        *why = "its shard " + path + " is not the image the parity covers (header checksum " +
               util::hex64(h->header_checksum) + ", the parity file says " + util::hex64(m.header_checksum) + ")";
        continue;
      }
      return std::move(f).value();
    }
    return nullptr;
  }

  // A parity file: its header, then every block against its checksum and,
  // where every contributing member's shard is at hand, against the block
  // re-encoded from them (the codec the redundancy stage encodes with).
  void check_parity(const parity_job& p) {
    storage::storage_env* env = storage::storage_env::posix();
    ++parity_files_;
    const uint64_t file_bytes = file_size_of(p.path);
    auto problem_here = [&](const std::string& message, std::optional<redundancy::block> b = std::nullopt) {
      add_problem(p.path, "protected", p.run, p.name, p.version, message, std::nullopt, b);
    };
    auto f = env->open_read(p.path);
    auto h = f ? redundancy::read_parity_header(**f, p.path) : result<redundancy::parity_header>(f.take_status());
    if (!h) {
      problem_here(h.error().message());
      progress_->advance(file_bytes, p.path);
      return;
    }
    if (h->run != p.run || h->name != p.name || h->version != p.version || h->set[h->position].rank != p.rank) {
      problem_here("header says " + h->run + "/" + h->name + " version " + std::to_string(h->version) + " rank " +
                   std::to_string(h->set[h->position].rank) + ", which does not match its place");
      progress_->advance(file_bytes, p.path);
      return;
    }
    const redundancy::geometry& g = h->geo;
    const redundancy::codec codec(g);
    std::vector<std::unique_ptr<storage::readable_file>> shards(g.k);
    std::vector<std::string> why(g.k);
    for (uint32_t q = 0; q < g.k; ++q) shards[q] = member_shard(p, h->set[q], &why[q]);
    if (buffer_.empty()) buffer_.resize(kChunkBytes);
    std::vector<std::vector<unsigned char>> in(g.d());
    std::vector<unsigned char> out;
    uint64_t advanced = 0;  // progress: bytes of this file counted
    for (const auto& b : h->blocks) {
      ++parity_blocks_;
      const std::string which = "parity block of stripe " + std::to_string(b.stripe) + " (row " +
                                std::to_string(b.row) + ", offset " + std::to_string(b.offset) + ", length " +
                                std::to_string(b.length) + ")";
      if (b.stripe >= g.k || b.row >= g.m || g.holders(b.stripe)[b.row] != h->position) {
        problem_here(which + ": position " + std::to_string(h->position) + " of " + g.describe() +
                         " holds no such block (damaged header)",
                     b);
        continue;
      }
      if (b.offset + b.length > (*f)->size()) {
        problem_here(which + ": beyond the end of the file (" + std::to_string((*f)->size()) + " bytes; truncated)",
                     b);
        continue;
      }
      // Re-encoded only when every contributor's shard is at hand.
      const auto contrib = g.contributors(b.stripe);
      uint64_t len = 0;
      std::string missing;
      for (uint32_t c : contrib) {
        len = std::max(len, g.chunk_bytes(h->set[c].size));
        if (!shards[c]) missing += std::string(missing.empty() ? "" : "; ") + "rank " +
                                   std::to_string(h->set[c].rank) + ": " + why[c];
      }
      const bool encode = missing.empty() && len == b.length;
      util::xxh3_stream hash;
      std::optional<uint64_t> differs;  // first block offset where the re-encoded parity differs
      status st;
      for (uint64_t at = 0; at < b.length && st; at += kChunkBytes) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, b.length - at));
        st = (*f)->read_at(b.offset + at, buffer_.data(), n);
        if (!st) break;
        hash.update(buffer_.data(), n);
        if (!encode || differs) continue;
        std::vector<const unsigned char*> src(g.d());
        for (uint32_t t = 0; t < g.d() && st; ++t) {
          // The bytes of contributor c's chunk in this window, zero padded (parity_file.md, "Coding").
          const uint32_t c = contrib[t];
          const uint64_t cb = g.chunk_bytes(h->set[c].size);
          const uint64_t start = static_cast<uint64_t>(g.chunk_of(c, b.stripe)) * cb;
          const uint64_t from = start + at;
          const uint64_t end = std::min<uint64_t>(h->set[c].size, std::min<uint64_t>(from + n, start + cb));
          const uint64_t got = end > from ? end - from : 0;
          in[t].assign(n, 0);
          if (got) st = shards[c]->read_at(from, in[t].data(), got);
          src[t] = in[t].data();
        }
        if (!st) break;
        out.resize(n);
        codec.encode(b.row, src.data(), out.data(), n);
        if (std::memcmp(out.data(), buffer_.data(), n) != 0) {
          size_t i = 0;
          while (out[i] == static_cast<unsigned char>(buffer_[i])) ++i;
          differs = at + i;
        }
      }
      progress_->advance(b.length, p.path);
      advanced += b.length;
      parity_bytes_ += b.length;
      if (!st) {
        problem_here(which + ": " + without_prefix(st.message(), p.path), b);
        continue;
      }
      const bool sum_ok = hash.digest() == b.checksum;
      if (encode) ++parity_reencoded_;
      std::string ranks;
      for (uint32_t c : contrib) ranks += (ranks.empty() ? "" : ", ") + std::to_string(h->set[c].rank);
      if (!sum_ok && differs) {
        problem_here(which + ": checksum mismatch, and it differs from the parity re-encoded from the shards of "
                             "ranks " + ranks + " at block offset " + std::to_string(*differs) + " (damaged)",
                     b);
      } else if (!sum_ok) {
        problem_here(which + ": checksum mismatch (damaged)" +
                         (encode ? std::string(", although it equals the parity re-encoded from the shards of ranks " +
                                               ranks + ": the recorded checksum is wrong")
                                 : "; not re-encoded: " + (missing.empty() ? std::string("chunk sizes do not match "
                                                                                          "the block's length")
                                                                            : missing)),
                     b);
      } else if (differs) {
        problem_here(which + ": differs from the parity re-encoded from the intact shards of ranks " + ranks +
                         " at block offset " + std::to_string(*differs) +
                         " (its checksum matches: the block was encoded from other data, or a shard changed "
                         "outside its checksummed regions)",
                     b);
      }
    }
    if (file_bytes > advanced) progress_->advance(file_bytes - advanced, p.path);
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
        if (p.parity) {
          // The damaged block of a parity file.
          jp.back()["parity_block"] = {{"stripe", p.parity->stripe},
                                       {"row", p.parity->row},
                                       {"offset", p.parity->offset},
                                       {"length", p.parity->length}};
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
                  {"parity",
                   {{"files", parity_files_},
                    {"blocks", parity_blocks_},
                    {"reencoded", parity_reencoded_},
                    {"bytes", parity_bytes_}}},
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
    // Parity only where the scratch directories hold some.
    const std::string parity =
        parity_files_ > 0 ? ", " + std::to_string(parity_files_) + " parity files (" +
                                std::to_string(parity_blocks_) + " blocks, " + std::to_string(parity_reencoded_) +
                                " re-encoded)"
                          : std::string();
    std::printf("verified %s, %s, %lld regions%s%s, %s: %s\n", versions.c_str(), shards.c_str(),
                static_cast<long long>(regions_), extents.c_str(), parity.c_str(),
                format_bytes(bytes_ + parity_bytes_).c_str(), outcome.c_str());
  }

  const verify_options& o_;
  std::vector<shard_job> jobs_;
  std::vector<parity_job> parity_jobs_;
  std::set<std::string> damaged_;  // local shard files with a problem: not used to re-encode parity
  std::vector<problem> problems_;
  std::vector<std::byte> buffer_;
  std::unique_ptr<progress> progress_;
  int64_t versions_ = 0, committed_ = 0, incomplete_ = 0, invalid_ = 0, local_only_ = 0;
  int64_t persistent_shards_ = 0, local_shards_ = 0, regions_ = 0, extents_ = 0;
  uint64_t bytes_ = 0;
  int64_t parity_files_ = 0, parity_blocks_ = 0, parity_reencoded_ = 0;
  uint64_t parity_bytes_ = 0;
};

}  // namespace

int cmd_verify(const verify_options& o) { return verifier(o).run(); }

}  // namespace cairn::cli

// Shard access for the differ of history_diff (history_diff_internal.hpp):
// opening a rank's shard from the run's scratch directory when its copy there
// has the header checksum and size the MANIFEST records, else from the store
// (a shard file or an aggregated version's data files); loading its tree when
// one is usable (missing, damaged or foreign trees are noted, never trusted);
// and every read of shard data. At most kMaxOpenFiles data files are open at
// once. Reads checked against tree leaves fall back once from a damaged local
// copy to the persistent shard; failures are recorded as version problems
// (and divergence candidates), not returned as errors.
#include "analytics/history_diff_internal.hpp"

#include <algorithm>
#include <span>

#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/shard_io.hpp"
#include "format/tree.hpp"
#include "util/hash.hpp"

namespace cairn::analytics::history_diff_internal {
namespace {

// Open data files kept per version; past this, idle ones are closed (a store
// of thousands of ranks must not run out of descriptors).
constexpr size_t kMaxOpenFiles = 256;

}  // namespace

// ---- shards ------------------------------------------------------------------------
// Opens and validates a shard (its header, and that the file has the size
// the header says), compressed or not: s's local copy (a shard file) or its
// persistent shard (a shard file, or the rank's image in the data files of
// an aggregated version).
result<std::unique_ptr<format::shard_reader>> differ::open_reader(const shard_src& s, bool local) {
  std::unique_ptr<format::shard_reader> rd;
  if (local || !s.container) {
    CAIRN_ASSIGN_OR_RETURN(rd, format::shard_reader::open(env_, local ? s.local_path : s.persistent_path));
  } else {
    CAIRN_ASSIGN_OR_RETURN(auto file, format::open_container_image(env_, s.persistent_dir, *s.container, s.rank));
    CAIRN_ASSIGN_OR_RETURN(rd, format::shard_reader::open(std::move(file), s.persistent_path));
  }
  res_.io.metadata_bytes += rd->bytes_read();
  return rd;
}

// Opens s's local copy or persistent shard as the shard of `s` if it is the
// image the MANIFEST records. Sets s.header unless it is already known (a
// header with the same checksum is the same header: references into it stay
// valid).
status differ::open_shard(shard_src& s, bool local, bool keep_header) {
  const std::string& path = local ? s.local_path : s.persistent_path;
  CAIRN_ASSIGN_OR_RETURN(auto f, open_reader(s, local));
  const format::shard_header& h = f->header();
  if (h.header_checksum != s.expect_checksum || h.file_size != s.expect_size) {
    return status(errc::corruption, path + ": header checksum " + util::hex64(h.header_checksum) + " / size " +
                                        std::to_string(h.file_size) + " do not match the MANIFEST (" +
                                        util::hex64(s.expect_checksum) + " / " + std::to_string(s.expect_size) +
                                        ")");
  }
  if (!keep_header) s.header = h;
  if (open_files_ < kMaxOpenFiles) {  // else reopened when its data are needed
    s.file = std::move(f);
    ++open_files_;
  }
  return {};
}

void differ::load_tree(shard_src& s) {
  if (!o_.use_trees) return;
  const std::string name = format::tree_file_name(s.rank);
  std::vector<std::string> paths;
  if (s.local) paths.push_back(storage::join(storage::dirname_of(s.local_path), name));
  // An aggregated version has no trees (container.md): its data are read.
  if (!s.container) paths.push_back(storage::join(s.persistent_dir, name));
  std::string why;
  for (auto& p : paths) {
    if (!env_->exists(p)) continue;
    auto data = env_->read_all(p);
    if (!data) {
      why = data.error().message();
      continue;
    }
    res_.io.tree_bytes += data->size();
    auto t = format::decode_tree(std::as_bytes(std::span<const char>(data->data(), data->size())), p);
    if (!t) {
      why = t.error().message();
      continue;
    }
    if (t->shard_header_checksum != s.header.header_checksum) {
      why = p + ": describes another shard (its shard_header_checksum " + util::hex64(t->shard_header_checksum) +
            " is not the shard's " + util::hex64(s.header.header_checksum) + "); the data are read";
      continue;
    }
    s.tree = std::move(*t);
    ++res_.io.trees_used;
    return;
  }
  if (why.empty() && (!s.tree_written || paths.empty())) {
    ++res_.io.trees_absent;
    return;
  }
  ++res_.io.trees_unusable;
  if (why.empty()) why = paths.back() + ": missing although the MANIFEST says it was written; the data are read";
  res_.io.tree_notes.push_back(why);
}

void differ::load_side(run_side& side, const std::string& name, const format::manifest& m, version_diff& vd) {
  side.shards.clear();
  side.shards.resize(m.nranks);
  for (uint32_t r = 0; r < m.nranks; ++r) {
    shard_src& s = side.shards[r];
    s.rank = r;
    s.expect_checksum = m.shards[r].header_checksum;
    s.expect_size = m.shards[r].size;
    s.tree_written = m.shards[r].tree;
    s.container = m.aggregated ? &m : nullptr;  // m outlives side.shards (compare_version)
    s.persistent_dir = format::version_dir(o_.store, side.run, name, m.version);
    s.persistent_path = format::persistent_image_where(o_.store, side.run, name, m.version, r, s.container);
    res_.io.checkpoint_bytes += s.expect_size;
    ++res_.io.shards;
    if (!side.scratch.empty()) {
      s.local_path = format::shard_path(side.scratch, side.run, name, m.version, r);
      if (env_->exists(s.local_path)) {
        status st = open_shard(s, /*local=*/true);
        if (st) {
          s.local = true;
          ++res_.io.shards_local;
        } else {
          vd.notes.push_back("local copy not used: " + st.message());
        }
      }
    }
    if (!s.local) {
      status st = open_shard(s, /*local=*/false);
      if (!st) {
        s.error = st.message();
        version_problem(r, "run " + std::string(side.label) + " (" + side.run + ") rank " + std::to_string(r) +
                               ": " + st.message(),
                        "unreadable");
        continue;
      }
    }
    s.ok = true;
    load_tree(s);
  }
}

// ---- reading -----------------------------------------------------------------------
// Reads len bytes at offset of s's data into buf. On failure records a
// problem and returns false.
bool differ::read(shard_src& s, const char* label, uint64_t offset, void* buf, size_t len) {
  if (!s.file) {
    if (open_files_ >= kMaxOpenFiles) close_idle(&s);
    auto f = open_reader(s, s.local);
    if (!f) return fail_read(s, label, f.error().message());
    s.file = std::move(*f);
    ++open_files_;
  }
  // Offsets are the image's: a compressed shard decompresses what is read.
  status st = s.file->read(offset, buf, len);
  if (!st) return fail_read(s, label, st.message());
  res_.io.data_bytes += len;
  if (s.local) res_.io.data_bytes_local += len;
  return true;
}

void differ::close_idle(const shard_src* keep) {
  for (run_side* side : {&side_a_, &side_b_})
    for (auto& s : side->shards)
      if (&s != keep && s.file) {
        s.file.reset();
        --open_files_;
      }
}

bool differ::fail_read(shard_src& s, const char* label, const std::string& message) {
  version_problem(s.rank, std::string("run ") + label + " rank " + std::to_string(s.rank) + ": " + message,
                  "unreadable");
  return false;
}

// The local copy of s proved damaged: read the persistent shard from now on.
bool differ::abandon_local(shard_src& s, const char* label) {
  if (s.file) {
    s.file.reset();
    --open_files_;
  }
  s.local = false;
  --res_.io.shards_local;
  status st = open_shard(s, /*local=*/false, /*keep_header=*/true);
  if (!st) return fail_read(s, label, st.message());
  return true;
}

// Reads cnt elements from element e of region d of s into buf; with per > 0
// (e a multiple of per), checks each chunk against the exact leaves of t,
// falling back from a damaged local copy to the persistent shard.
bool differ::read_side(shard_src& s, const char* label, const format::region_desc& d, uint64_t e, uint64_t cnt,
                       const format::region_tree* t, uint64_t per, std::byte* buf) {
  const uint64_t es = format::type_size(d.type);
  for (int attempt = 0;; ++attempt) {
    // After abandoning the local copy, d still describes the persistent
    // shard: its header has the same checksum, hence the same table.
    if (!read(s, label, d.offset + e * es, buf, static_cast<size_t>(cnt * es))) return false;
    if (per == 0) return true;
    bool good = true;
    uint64_t bad_chunk = 0;
    for (uint64_t i = 0; i < cnt && good; i += per) {
      const uint64_t m = std::min(per, cnt - i);
      const uint64_t c = (e + i) / per;
      if (format::exact_leaf(buf + i * es, m, d.type) != t->exact[c]) {
        good = false;
        bad_chunk = c;
      }
    }
    if (good) return true;
    const std::string what = "region '" + d.name + "' chunk " + std::to_string(bad_chunk) + " of " +
                             s.data_path() + " does not match its tree leaf";
    if (s.local && attempt == 0) {
      cur_vd_->notes.push_back(std::string("run ") + label + " rank " + std::to_string(s.rank) + ": " + what +
                               " (damaged local copy: the persistent shard is read instead)");
      if (!abandon_local(s, label)) return false;
      continue;
    }
    version_problem(s.rank, std::string("run ") + label + " rank " + std::to_string(s.rank) + ": " + what +
                                " (damaged data or tree: compared as read)",
                    "damaged");
    return true;
  }
}

}  // namespace cairn::analytics::history_diff_internal

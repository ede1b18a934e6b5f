// A power loss at every step of the store protocol (docs/format/store.md,
// "Commit"): storage::crash_env journals what a POSIX file system may still
// lose (unsynced file data, unsynced directory entries) and drops it; after
// each crash point the store must hold every version reported committed and
// nothing corrupt.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cairn.h"
#include "engine/recycler.hpp"
#include "engine/stages.hpp"
#include "format/commit.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard_io.hpp"
#include "storage/storage_env.hpp"
#include "util/hash.hpp"
#include "test_store.hpp"

namespace cairn {
namespace {

storage::storage_env* posix() { return storage::storage_env::posix(); }

// A directory on tmpfs (the crash is simulated: real syncs need not be slow).
class shm_dir {
 public:
  shm_dir() {
    char tmpl[] = "/dev/shm/cairn-crash-XXXXXX";
    if (mkdtemp(tmpl)) path_ = tmpl;
  }
  ~shm_dir() { (void)posix()->remove_tree(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read(const std::string& path) {
  auto s = posix()->read_all(path);
  return s ? *s : std::string("<missing>");
}

TEST(crash_env, drops_unsynced_data_and_entries_and_keeps_what_was_synced) {
  shm_dir d;
  ASSERT_FALSE(d.path().empty());
  const std::string root = d.path() + "/root", backup = d.path() + "/backup";
  ASSERT_TRUE(posix()->make_dirs(root));
  ASSERT_TRUE(posix()->make_dirs(backup));
  auto env = storage::make_crash_env(posix(), backup);
  // Durable: written, synced, its entry synced (write_atomic, make_dirs).
  ASSERT_TRUE(env->write_atomic(root + "/durable", "kept", true));
  ASSERT_TRUE(env->write_atomic(root + "/removed", "back", true));
  ASSERT_TRUE(env->make_dirs(root + "/a/b"));
  // Entry durable, data not: garbage of the synced size (0 here: empty).
  {
    auto f = env->create(root + "/unsynced_data", false);
    ASSERT_TRUE(f);
    ASSERT_TRUE((*f)->write_at(0, "lost", 4));
    ASSERT_TRUE((*f)->close());
  }
  ASSERT_TRUE(env->sync_dir(root));
  // From here on nothing syncs root. Data synced, entry not: the file vanishes.
  {
    auto f = env->create(root + "/unsynced_entry", false);
    ASSERT_TRUE(f);
    ASSERT_TRUE((*f)->write_at(0, "gone", 4));
    ASSERT_TRUE((*f)->sync());
  }
  // A rename over the durable file, not synced: the old file returns.
  ASSERT_TRUE(env->write_atomic(root + "/durable", "replaced", false));
  EXPECT_EQ(read(root + "/durable"), "replaced");
  // A removal not synced: the file returns.
  ASSERT_TRUE(env->remove_file(root + "/removed"));
  EXPECT_FALSE(posix()->exists(root + "/removed"));
  ASSERT_TRUE(env->crash());
  EXPECT_EQ(read(root + "/durable"), "kept");
  EXPECT_EQ(read(root + "/unsynced_data"), "");
  EXPECT_FALSE(posix()->exists(root + "/unsynced_entry"));
  EXPECT_TRUE(posix()->exists(root + "/a/b"));
  EXPECT_EQ(read(root + "/removed"), "back");
  EXPECT_FALSE(posix()->exists(root + "/durable.tmp"));
}

TEST(crash_env, a_frozen_env_does_nothing_more) {
  shm_dir d;
  auto env = storage::make_crash_env(posix(), d.path());
  env->freeze_after(1);
  EXPECT_FALSE(env->make_dirs(d.path() + "/x"));  // the mkdir; the machine is down before the parent's sync
  EXPECT_TRUE(env->frozen());
  auto f = env->create(d.path() + "/x/f", false);
  EXPECT_FALSE(f);
  EXPECT_NE(f.error().message().find("the machine is down"), std::string::npos) << f.error().message();
  ASSERT_TRUE(env->crash());
  EXPECT_FALSE(posix()->exists(d.path() + "/x"));  // its entry was never made durable
}

const std::vector<test::region_spec> kRegions = {{"field", CAIRN_FLOAT64, 700, {}, false},
                                                 {"step", CAIRN_INT64, 1, {}, false}};
constexpr uint32_t kRanks = 3;
constexpr uint32_t kAttempt = 0x5eed;

struct outcome {
  std::set<int64_t> committed;  // a commit call returned true or ok
  std::set<int64_t> retiring;   // retention started to remove it
};

// How the versions are written and committed.
enum class layout {
  file_per_process,  // shard files; each writer records its part, the last one commits (a rank, cairnd)
  leftovers,         // shard files; each writer calls commit_if_complete (agents, cairnd's leftovers)
  aggregated,        // the ranks' images in two shared data files; parts with extents
};
const char* layout_name(layout l) {
  switch (l) {
    case layout::file_per_process: return "file_per_process";
    case layout::leftovers: return "commit_if_complete";
    case layout::aggregated: return "aggregated";
  }
  return "unknown";
}

constexpr uint64_t kStride = 64 << 10;  // rank 1's offset in the first aggregated data file

format::manifest template_of(int64_t v, layout l) {
  format::manifest m;
  m.run = "r";
  m.name = "ck";
  m.version = v;
  m.nranks = kRanks;
  m.executable = "app";
  m.mode = "thread";
  if (l == layout::aggregated) {
    m.aggregated = true;
    m.container.strategy = "posix_shared";
    // Ranks 0 and 1 in data.000000, rank 2 in data.000001 (created last).
    const uint64_t image = test::make_shard_image("r", "ck", v, 0, kRanks, kRegions)->bytes.size();
    m.container.files = {{format::data_file_name(0), kStride + image, {0, 1}}, {format::data_file_name(1), image, {2}}};
  }
  return m;
}

// Writes rank r's image of version v; its part record (or a commit attempt)
// follows. False once the machine is down.
bool write_part(storage::storage_env* env, const std::string& store, int64_t v, uint32_t r, layout l,
                format::part_record* p) {
  auto img = test::make_shard_image("r", "ck", v, r, kRanks, kRegions);
  if (!img) return false;
  p->entry.rank = r;
  p->entry.size = img->bytes.size();
  p->entry.header_checksum = img->header.header_checksum;
  if (l != layout::aggregated) {
    const std::string path = format::shard_path(store, "r", "ck", v, r);
    return engine::write_shard_file(env, path, img->bytes.data(), img->bytes.size(), false, true, "").is_ok();
  }
  // As the aggregated stage writes its own extent: the shared data file
  // opened without truncation, written at this rank's offset, synced.
  const std::string dir = format::version_dir(store, "r", "ck", v);
  if (!env->make_dirs(dir)) return false;
  const uint32_t file = r / 2;
  auto f = env->create(storage::join(dir, format::data_file_name(file)), false, /*truncate=*/false);
  if (!f) return false;
  const uint64_t off = kStride * (r % 2);
  if (!(*f)->write_at(off, img->bytes.data(), img->bytes.size()) || !(*f)->sync() || !(*f)->close()) return false;
  p->aggregated = true;
  p->entry.extents = {{0, img->bytes.size(), file, off, util::xxh3(img->bytes.data(), img->bytes.size())}};
  return true;
}

// The life of versions 1..5 of a run as the engine writes them: every rank's
// image and its part record, the last of which commits (or, for leftovers, a
// commit attempt after each shard); rank 0's agreed commit after every rank's
// part (a no-op when the last writer committed); keep = 2 retention from
// version 3 on; and version 6 left half written, then removed as `cairn gc`
// would. Stops at the first failure (the machine is down).
void life(storage::storage_env* env, const std::string& store, layout l, outcome* out) {
  ASSERT_LT(test::make_shard_image("r", "ck", 1, 0, kRanks, kRegions)->bytes.size(), kStride);
  for (int64_t v = 1; v <= 6; ++v) {
    format::manifest agreed = template_of(v, l);
    const uint32_t writers = v == 6 ? 2 : kRanks;
    for (uint32_t r = 0; r < writers; ++r) {
      format::part_record p;
      if (!write_part(env, store, v, r, l, &p)) return;
      agreed.shards.push_back(p.entry);
      if (l == layout::leftovers) {
        auto h = format::read_header(env, format::shard_path(store, "r", "ck", v, r));
        if (!h) return;
        auto done = format::commit_if_complete(env, store, *h, "app", "thread");
        if (!done) return;
        if (*done) out->committed.insert(v);
        continue;
      }
      auto done = format::record_part(env, store, template_of(v, l), kAttempt, p);
      if (!done) return;
      if (*done) out->committed.insert(v);
    }
    if (v == 6) {
      out->retiring.insert(6);
      if (!format::remove_version(env, format::version_dir(store, "r", "ck", 6))) return;
      continue;
    }
    if (!format::write_commit(env, store, agreed)) return;
    out->committed.insert(v);
    if (v >= 3) {
      out->retiring.insert(v - 2);
      if (!format::remove_version(env, format::version_dir(store, "r", "ck", v - 2))) return;
    }
  }
}

// What a restart may use after the crash: every MANIFEST intact with every
// shard it lists (through the one reader of both layouts); every version
// reported committed (and not being retired) still committed.
void check_store(const std::string& store, const outcome& out, const std::string& what) {
  std::set<int64_t> intact;
  for (int64_t v : format::list_versions(posix(), store, "r", "ck")) {
    const std::string mpath = format::manifest_path(store, "r", "ck", v);
    if (!posix()->exists(mpath)) continue;
    auto m = format::read_manifest(posix(), mpath);
    ASSERT_TRUE(m) << what << ": version " << v << ": " << m.error().to_string();
    ASSERT_EQ(m->nranks, kRanks) << what;
    for (uint32_t r = 0; r < kRanks; ++r) {
      auto file = format::open_persistent_image(posix(), store, "r", "ck", v, r, &*m);
      ASSERT_TRUE(file) << what << ": version " << v << " is committed but its shard " << r
                        << " cannot be opened: " << file.error().to_string();
      auto img = format::read_shard_image(std::move(file).value(), "shard " + std::to_string(r));
      ASSERT_TRUE(img) << what << ": version " << v << " is committed but its shard " << r
                       << " is not intact: " << img.error().to_string();
      EXPECT_EQ(img->header.header_checksum, m->shards[r].header_checksum) << what;
      EXPECT_EQ(img->header.version, v) << what;
      EXPECT_EQ(img->header.rank, r) << what;
    }
    intact.insert(v);
  }
  for (int64_t v : out.committed) {
    if (!out.retiring.count(v)) {
      EXPECT_TRUE(intact.count(v)) << what << ": version " << v << " was reported committed";
    }
  }
}

class crash_points : public ::testing::TestWithParam<layout> {};

TEST_P(crash_points, every_step_of_commit_retention_and_gc) {
  const layout l = GetParam();
  // The operations of an uninterrupted life, then a crash after each one.
  int64_t total = 0;
  {
    shm_dir d;
    const std::string backup = d.path() + "/backup";
    ASSERT_TRUE(posix()->make_dirs(backup));
    auto env = storage::make_crash_env(posix(), backup);
    outcome out;
    life(env.get(), d.path() + "/store", l, &out);
    total = env->operations();
    EXPECT_EQ(out.committed, (std::set<int64_t>{1, 2, 3, 4, 5}));
    check_store(d.path() + "/store", out, "no crash");
    EXPECT_EQ(format::list_versions(posix(), d.path() + "/store", "r", "ck"), (std::vector<int64_t>{4, 5}));
  }
  ASSERT_GT(total, 100);
  // Each crash point with every unsynced change lost, then with random
  // subsets of them written back.
  constexpr uint64_t kSeeds = 4;
  int trials = 0, committed_somewhere = 0;
  for (int64_t k = 0; k <= total && !HasFailure(); ++k) {
    for (uint64_t seed = 0; seed < kSeeds && !HasFailure(); ++seed) {
      shm_dir d;
      const std::string backup = d.path() + "/backup";
      ASSERT_TRUE(posix()->make_dirs(backup));
      auto env = storage::make_crash_env(posix(), backup);
      env->freeze_after(k);
      outcome out;
      life(env.get(), d.path() + "/store", l, &out);
      const std::string what = std::string(layout_name(l)) + ": crash after operation " + std::to_string(k) +
                               " of " + std::to_string(total) + ", seed " + std::to_string(seed);
      // Seed 0: every unsynced change lost; else a random subset kept, drawn
      // afresh at every crash point.
      const status crashed = env->crash(seed == 0 ? 0 : static_cast<uint64_t>(k) * kSeeds + seed);
      ASSERT_TRUE(crashed) << what << ": " << crashed.to_string();
      check_store(d.path() + "/store", out, what);
      ++trials;
      if (!out.committed.empty()) ++committed_somewhere;
    }
  }
  std::printf("%s: crash points: %lld, trials: %d, of which after a version was reported committed: %d\n",
              layout_name(l), static_cast<long long>(total + 1), trials, committed_somewhere);
}

INSTANTIATE_TEST_SUITE_P(layouts, crash_points,
                         ::testing::Values(layout::file_per_process, layout::leftovers, layout::aggregated),
                         [](const auto& info) { return std::string(layout_name(info.param)); });

// The node-local level: shards written without sync (write_shard_file,
// durable = false), keep = 2, each retired shard recycled as a later
// version's temporary file (engine::local_recycler), overwritten in place and
// renamed. After a power loss a file may hold anything, including the intact
// image of the version it held before it was recycled: the restart's header
// check (format::shard_identity_check) must refuse every file that is not
// exactly the image of the version and rank it is named for.
TEST(crash_points, recycled_node_local_files_never_restore_another_version) {
  auto life = [](storage::storage_env* env, const std::string& scratch) {
    std::vector<std::unique_ptr<engine::local_recycler>> bins;
    for (uint32_t r = 0; r < kRanks; ++r)
      bins.push_back(std::make_unique<engine::local_recycler>(env, scratch, "r", r));
    for (int64_t v = 1; v <= 6; ++v) {
      for (uint32_t r = 0; r < kRanks; ++r) {
        auto img = test::make_shard_image("r", "ck", v, r, kRanks, kRegions);
        const std::string path = format::shard_path(scratch, "r", "ck", v, r);
        if (!env->make_dirs(storage::dirname_of(path))) return;
        const bool recycled = bins[r]->take(img->bytes.size(), path + ".tmp");
        if (!engine::write_shard_file(env, path, img->bytes.data(), img->bytes.size(), false, false, "", recycled))
          return;
        bins[r]->wrote(path, img->bytes.size());
        if (v >= 3) {
          if (!bins[r]->retire(format::shard_path(scratch, "r", "ck", v - 2, r))) return;
          (void)env->remove_dir(format::version_dir(scratch, "r", "ck", v - 2));
        }
      }
    }
  };
  int64_t total = 0;
  {
    shm_dir d;
    ASSERT_TRUE(posix()->make_dirs(d.path() + "/backup"));
    auto env = storage::make_crash_env(posix(), d.path() + "/backup");
    life(env.get(), d.path() + "/scratch");
    total = env->operations();
    EXPECT_EQ(format::list_versions(posix(), d.path() + "/scratch", "r", "ck"), (std::vector<int64_t>{5, 6}));
  }
  constexpr uint64_t kSeeds = 8;
  int trials = 0, usable = 0, refused_older = 0;
  for (int64_t k = 0; k <= total && !HasFailure(); ++k) {
    for (uint64_t seed = 0; seed < kSeeds && !HasFailure(); ++seed) {
      shm_dir d;
      ASSERT_TRUE(posix()->make_dirs(d.path() + "/backup"));
      auto env = storage::make_crash_env(posix(), d.path() + "/backup");
      env->freeze_after(k);
      const std::string scratch = d.path() + "/scratch";
      life(env.get(), scratch);
      const status crashed = env->crash(seed == 0 ? 0 : static_cast<uint64_t>(k) * kSeeds + seed);
      ASSERT_TRUE(crashed) << "crash after operation " << k << ", seed " << seed << ": " << crashed.to_string();
      ++trials;
      for (int64_t v : format::list_versions(posix(), scratch, "r", "ck")) {
        for (uint32_t r = 0; r < kRanks; ++r) {
          const std::string path = format::shard_path(scratch, "r", "ck", v, r);
          if (!posix()->exists(path)) continue;
          auto got = format::read_shard_image(posix(), path, format::shard_identity_check(path, r, kRanks, "ck", v, nullptr));
          if (!got) {
            if (got.error().message().find("header names another shard") != std::string::npos) ++refused_older;
            continue;
          }
          auto want = test::make_shard_image("r", "ck", v, r, kRanks, kRegions);
          ASSERT_EQ(got->header.header_checksum, want->header.header_checksum)
              << "crash after operation " << k << ", seed " << seed << ": " << path;
          ASSERT_TRUE(std::equal(got->bytes().begin(), got->bytes().end(), want->bytes.data()))
              << "crash after operation " << k << ", seed " << seed << ": " << path << " restores other bytes";
          ++usable;
        }
      }
    }
  }
  std::printf("recycled node-local files: crash points: %lld, trials: %d, shards usable: %d, older images "
              "refused by the header check: %d\n",
              static_cast<long long>(total + 1), trials, usable, refused_older);
  EXPECT_GT(refused_older, 0) << "the crash model never left a recycled file with its former image";
}

}  // namespace
}  // namespace cairn

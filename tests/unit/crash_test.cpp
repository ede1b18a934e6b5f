// A power loss at every step of the store protocol (docs/format/store.md,
// "Commit"): storage::crash_env journals what a POSIX file system may still
// lose (unsynced file data, unsynced directory entries) and drops it; after
// each crash point the store must hold every version reported committed and
// nothing corrupt.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "cairn.h"
#include "engine/stages.hpp"
#include "format/commit.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard_io.hpp"
#include "storage/storage_env.hpp"
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

format::manifest template_of(int64_t v) {
  format::manifest m;
  m.run = "r";
  m.name = "ck";
  m.version = v;
  m.nranks = kRanks;
  m.executable = "app";
  m.mode = "thread";
  return m;
}

// The life of versions 1..5 of a run as the engine writes them: every rank's
// shard (write, sync, rename, directory sync) and its part record, the last
// of which commits; rank 0's agreed commit after every rank's part (a no-op
// when the last writer committed); keep = 2 retention from version 3 on; and
// version 6 left half written, then removed as `cairn gc` would. Stops at the
// first failure (the machine is down).
void life(storage::storage_env* env, const std::string& store, outcome* out) {
  for (int64_t v = 1; v <= 6; ++v) {
    format::manifest agreed = template_of(v);
    const uint32_t writers = v == 6 ? 2 : kRanks;
    for (uint32_t r = 0; r < writers; ++r) {
      auto img = test::make_shard_image("r", "ck", v, r, kRanks, kRegions);
      ASSERT_TRUE(img);
      const std::string path = format::shard_path(store, "r", "ck", v, r);
      if (!engine::write_shard_file(env, path, img->bytes.data(), img->bytes.size(), false, true, "")) return;
      format::part_record p;
      p.entry.rank = r;
      p.entry.size = img->bytes.size();
      p.entry.header_checksum = img->header.header_checksum;
      agreed.shards.push_back(p.entry);
      auto done = format::record_part(env, store, template_of(v), kAttempt, p);
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
// shard it lists; every version reported committed (and not being retired)
// still committed.
void check_store(const std::string& store, const outcome& out, const std::string& what) {
  std::set<int64_t> intact;
  for (int64_t v : format::list_versions(posix(), store, "r", "ck")) {
    const std::string mpath = format::manifest_path(store, "r", "ck", v);
    if (!posix()->exists(mpath)) continue;
    auto m = format::read_manifest(posix(), mpath);
    ASSERT_TRUE(m) << what << ": version " << v << ": " << m.error().to_string();
    ASSERT_EQ(m->nranks, kRanks) << what;
    for (uint32_t r = 0; r < kRanks; ++r) {
      auto img = format::read_shard_image(posix(), format::shard_path(store, "r", "ck", v, r));
      ASSERT_TRUE(img) << what << ": version " << v << " is committed but its shard " << r
                       << " is not intact: " << img.error().to_string();
      EXPECT_EQ(img->header.header_checksum, m->shards[r].header_checksum) << what;
    }
    intact.insert(v);
  }
  for (int64_t v : out.committed)
    if (!out.retiring.count(v)) EXPECT_TRUE(intact.count(v)) << what << ": version " << v << " was reported committed";
}

TEST(crash_points, every_step_of_commit_retention_and_gc) {
  // The operations of an uninterrupted life, then a crash after each one.
  int64_t total = 0;
  {
    shm_dir d;
    const std::string backup = d.path() + "/backup";
    ASSERT_TRUE(posix()->make_dirs(backup));
    auto env = storage::make_crash_env(posix(), backup);
    outcome out;
    life(env.get(), d.path() + "/store", &out);
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
      life(env.get(), d.path() + "/store", &out);
      const std::string what = "crash after operation " + std::to_string(k) + " of " + std::to_string(total) +
                               ", seed " + std::to_string(seed);
      const status crashed = env->crash(seed);
      ASSERT_TRUE(crashed) << what << ": " << crashed.to_string();
      check_store(d.path() + "/store", out, what);
      ++trials;
      if (!out.committed.empty()) ++committed_somewhere;
    }
  }
  std::printf("crash points: %lld, trials: %d, of which after a version was reported committed: %d\n",
              static_cast<long long>(total + 1), trials, committed_somewhere);
}

}  // namespace
}  // namespace cairn

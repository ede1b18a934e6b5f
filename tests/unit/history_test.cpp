// Unit tests of src/history: the SQLite catalog, indexed from stores written
// with the format module.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cairn.h"
#include "format/layout.hpp"
#include "format/run_info.hpp"
#include "history/catalog.hpp"
#include "storage/storage_env.hpp"
#include "test_store.hpp"
#include "util/hash.hpp"

namespace cairn {
namespace {

using history::catalog;

const std::vector<test::region_spec> kRegions = {{"temperature", CAIRN_FLOAT64, 32, {4, 8}, false},
                                                 {"step", CAIRN_INT64, 1, {}, false}};

// Runs SQL on the catalog file directly and returns the rows, one string per
// row with columns separated by '|' (NULL as "NULL").
std::vector<std::string> sql_rows(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::vector<std::string> rows;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << "cannot open " << db_path;
    sqlite3_close(db);
    return rows;
  }
  sqlite3_busy_timeout(db, 10000);
  auto cb = [](void* out, int n, char** values, char**) {
    std::string row;
    for (int i = 0; i < n; ++i) row += std::string(i ? "|" : "") + (values[i] ? values[i] : "NULL");
    static_cast<std::vector<std::string>*>(out)->push_back(row);
    return 0;
  };
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), cb, &rows, &err) != SQLITE_OK) {
    ADD_FAILURE() << sql << ": " << (err ? err : "?");
    sqlite3_free(err);
  }
  sqlite3_close(db);
  return rows;
}

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(root().empty()); }

  const std::string& root() const { return dir_.path(); }
  std::string db_path() const { return storage::join(root(), format::kCatalogName); }

  test::version_spec spec(const std::string& run, const std::string& name, int64_t version, uint32_t nranks = 2) {
    test::version_spec s;
    s.run = run;
    s.name = name;
    s.version = version;
    s.nranks = nranks;
    s.regions = kRegions;
    s.executable = "/bin/" + run;
    s.committed_at = 1700000000.0 + 10.0 * static_cast<double>(version);
    return s;
  }

  format::manifest write(const test::version_spec& s) {
    format::manifest m;
    status st = test::write_version(root(), s, &m);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return m;
  }

  std::unique_ptr<catalog> open() {
    auto c = catalog::open(root());
    EXPECT_TRUE(c.is_ok()) << c.error().to_string();
    return c ? std::move(c).value() : nullptr;
  }

  // Every table, rows sorted, for comparing two catalogs.
  std::vector<std::string> dump() {
    std::vector<std::string> out;
    for (const char* table : {"runs", "checkpoints", "shards", "regions", "events"}) {
      out.push_back(std::string("-- ") + table);
      auto rows = sql_rows(db_path(), std::string("SELECT * FROM ") + table);
      std::sort(rows.begin(), rows.end());
      out.insert(out.end(), rows.begin(), rows.end());
    }
    return out;
  }

  void flip_byte(const std::string& path, uint64_t offset) {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr) << path;
    std::fseek(f, static_cast<long>(offset), SEEK_SET);
    int c = std::fgetc(f);
    std::fseek(f, static_cast<long>(offset), SEEK_SET);
    std::fputc(c ^ 0xff, f);
    std::fclose(f);
  }

  test::temp_dir dir_;
  storage::storage_env* env_ = storage::storage_env::posix();
};

TEST_F(CatalogTest, OpenCreatesAVersionedWalSchema) {
  auto c = open();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->store_root(), root());
  EXPECT_TRUE(env_->exists(db_path()));
  EXPECT_EQ(sql_rows(db_path(), "PRAGMA user_version"), std::vector<std::string>{std::to_string(history::kCatalogSchemaVersion)});
  EXPECT_EQ(sql_rows(db_path(), "PRAGMA journal_mode"), std::vector<std::string>{"wal"});
  auto tables = sql_rows(db_path(), "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
  EXPECT_EQ(tables, (std::vector<std::string>{"checkpoints", "events", "regions", "run_info", "runs", "shards"}));
  // Opening again finds the schema in place.
  c.reset();
  c = open();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->list_runs()->empty());
}

TEST_F(CatalogTest, OpenNeedsAnExistingStore) {
  auto c = catalog::open(root() + "/missing");
  EXPECT_EQ(c.error().code(), errc::not_found);
  EXPECT_NE(c.error().message().find(root() + "/missing"), std::string::npos) << c.error().message();
}

TEST_F(CatalogTest, NewerSchemaIsNotSupported) {
  ASSERT_NE(open(), nullptr);
  sql_rows(db_path(), "PRAGMA user_version = 99");
  auto c = catalog::open(root());
  EXPECT_EQ(c.error().code(), errc::not_supported);
  EXPECT_NE(c.error().message().find("schema version 99"), std::string::npos) << c.error().message();
}

TEST_F(CatalogTest, ForeignOrOldSchemaIsReplacedAndRebuilt) {
  write(spec("a", "ck", 1));
  // A catalog file from before versioning: a table of unknown shape, user_version 0.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path().c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE checkpoints(x); INSERT INTO checkpoints VALUES(1);", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto c = open();
  ASSERT_NE(c, nullptr);
  auto versions = c->list_versions();
  ASSERT_TRUE(versions.is_ok()) << versions.error().to_string();
  ASSERT_EQ(versions->size(), 1u);
  EXPECT_EQ((*versions)[0].run, "a");
  EXPECT_EQ(sql_rows(db_path(), "PRAGMA user_version"), std::vector<std::string>{std::to_string(history::kCatalogSchemaVersion)});
}

TEST_F(CatalogTest, GarbageFileIsCorruptionWithAHint) {
  const std::string junk(8192, 'j');
  ASSERT_TRUE(test::write_file(db_path(), junk.data(), junk.size()).is_ok());
  auto c = catalog::open(root());
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.error().code(), errc::corruption);
  EXPECT_NE(c.error().message().find("cairn reindex"), std::string::npos) << c.error().message();
}

TEST_F(CatalogTest, IndexVersionRecordsEverything) {
  format::manifest m = write(spec("run1", "heat", 5));
  auto c = open();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->index_version(env_, "run1", "heat", 5).is_ok());

  auto runs = c->list_runs();
  ASSERT_TRUE(runs.is_ok());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].run, "run1");
  EXPECT_EQ((*runs)[0].executable, "/bin/run1");
  EXPECT_EQ((*runs)[0].nranks, 2u);
  EXPECT_EQ((*runs)[0].first_seen, m.committed_at);
  EXPECT_EQ((*runs)[0].last_seen, m.committed_at);

  auto versions = c->list_versions("run1", "heat");
  ASSERT_TRUE(versions.is_ok());
  ASSERT_EQ(versions->size(), 1u);
  const history::version_row& v = (*versions)[0];
  EXPECT_EQ(v.version, 5);
  EXPECT_EQ(v.nranks, 2u);
  EXPECT_EQ(v.bytes, m.shards[0].size + m.shards[1].size);
  EXPECT_EQ(v.committed_at, m.committed_at);
  EXPECT_EQ(v.mode, "thread");

  auto shards = c->list_shards("run1", "heat", 5);
  ASSERT_TRUE(shards.is_ok());
  ASSERT_EQ(shards->size(), 2u);
  for (uint32_t r = 0; r < 2; ++r) {
    const history::shard_row& s = (*shards)[r];
    EXPECT_EQ(s.rank, r);
    EXPECT_EQ(s.file, format::shard_file_name(r));
    EXPECT_EQ(s.size, m.shards[r].size);
    EXPECT_EQ(s.header_checksum, util::hex64(m.shards[r].header_checksum));
    EXPECT_EQ(s.host, m.shards[r].host);
    EXPECT_EQ(s.capture_s, m.shards[r].capture_s);
    EXPECT_EQ(s.checksum_s, m.shards[r].checksum_s);
    EXPECT_EQ(s.local_s, m.shards[r].local_s);
    EXPECT_EQ(s.persistent_s, m.shards[r].persistent_s);
    EXPECT_EQ(s.persistent_at, m.shards[r].persistent_at);
  }

  auto regions = c->list_regions("run1", "heat", 5);
  ASSERT_TRUE(regions.is_ok());
  ASSERT_EQ(regions->size(), 4u);  // 2 ranks x 2 regions, ordered by rank, region
  auto h1 = format::read_header(env_, format::shard_path(root(), "run1", "heat", 5, 1));
  ASSERT_TRUE(h1.is_ok());
  const history::region_row& step1 = (*regions)[2];
  EXPECT_EQ(step1.rank, 1u);
  EXPECT_EQ(step1.region, "step");
  EXPECT_EQ(step1.type, "int64");
  EXPECT_EQ(step1.count, 1u);
  EXPECT_TRUE(step1.dims.empty());
  EXPECT_EQ(step1.offset, h1->regions[1].offset);
  EXPECT_EQ(step1.length, 8u);
  EXPECT_EQ(step1.checksum, util::hex64(h1->regions[1].checksum));
  const history::region_row& temp1 = (*regions)[3];
  EXPECT_EQ(temp1.region, "temperature");
  EXPECT_EQ(temp1.type, "float64");
  EXPECT_EQ(temp1.dims, (std::vector<uint64_t>{4, 8}));
  EXPECT_FALSE(temp1.column_major);
  EXPECT_EQ(temp1.checksum, util::hex64(h1->regions[0].checksum));

  auto events = c->list_events("run1", "heat", 5);
  ASSERT_TRUE(events.is_ok());
  // Captured per rank; persistent for the whole version and per rank.
  ASSERT_EQ(events->size(), 5u);
  EXPECT_EQ((*events)[0].level, CAIRN_LEVEL_CAPTURED);
  EXPECT_EQ((*events)[0].rank, 0u);
  EXPECT_EQ((*events)[0].at, m.shards[0].captured_at);
  EXPECT_EQ((*events)[2].level, CAIRN_LEVEL_PERSISTENT);
  EXPECT_FALSE((*events)[2].rank.has_value());
  EXPECT_EQ((*events)[2].at, m.committed_at);
  EXPECT_EQ((*events)[2].duration_s, std::max(m.shards[0].persistent_s, m.shards[1].persistent_s));
  EXPECT_EQ((*events)[2].source, "manifest");
  EXPECT_EQ((*events)[4].rank, 1u);
  EXPECT_EQ((*events)[4].at, m.shards[1].persistent_at);
}

// A protected version: the scheme from its manifest, and the protected
// event when the manifest knew it; the same again after a rebuild.
TEST_F(CatalogTest, RedundancyOfAVersionIsIndexedAndRebuilt) {
  write(spec("run1", "heat", 4));
  format::manifest m = write(spec("run1", "heat", 6));
  const std::string mpath = format::manifest_path(root(), "run1", "heat", 6);
  format::redundancy_info r;
  r.scheme = "xor";
  r.description = "xor(k=2, m=1)";
  r.k = 2;
  r.m = 1;
  r.sets = {{0, 1}};
  r.protected_at = m.committed_at - 1.0;
  m.redundancy = r;
  ASSERT_TRUE(env_->write_atomic(mpath, format::encode_manifest(m), false).is_ok());
  auto c = open();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->index_version(env_, "run1", "heat", 4).is_ok());
  ASSERT_TRUE(c->index_version(env_, "run1", "heat", 6).is_ok());
  auto check = [&] {
    auto versions = c->list_versions("run1", "heat");
    ASSERT_TRUE(versions.is_ok()) << versions.error().to_string();
    ASSERT_EQ(versions->size(), 2u);
    EXPECT_EQ((*versions)[0].redundancy, "");  // version 4: none recorded
    EXPECT_EQ((*versions)[0].redundancy_k, 0u);
    EXPECT_EQ((*versions)[1].redundancy, "xor(k=2, m=1)");
    EXPECT_EQ((*versions)[1].redundancy_scheme, "xor");
    EXPECT_EQ((*versions)[1].redundancy_k, 2u);
    EXPECT_EQ((*versions)[1].redundancy_m, 1u);
    EXPECT_EQ(sql_rows(db_path(), "SELECT redundancy_sets FROM checkpoints WHERE version = 6"),
              std::vector<std::string>{"[[0,1]]"});
    EXPECT_EQ(sql_rows(db_path(), "SELECT version, at FROM events WHERE level = 4"),
              std::vector<std::string>{"6|" + sql_rows(db_path(), "SELECT " + std::to_string(r.protected_at))[0]});
  };
  check();
  auto before = dump();
  // `cairn reindex`: from the manifests alone.
  c.reset();
  for (const char* suffix : {"", "-wal", "-shm"}) ASSERT_TRUE(env_->remove_file(db_path() + suffix).is_ok());
  c = open();
  ASSERT_NE(c, nullptr);
  auto n = c->rebuild(env_);
  ASSERT_TRUE(n.is_ok()) << n.error().to_string();
  EXPECT_EQ(*n, 2);
  check();
  EXPECT_EQ(dump(), before);
}

TEST_F(CatalogTest, IndexingTwiceReplaces) {
  write(spec("r", "n", 1));
  auto c = open();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->index_version(env_, "r", "n", 1).is_ok());
  auto before = dump();
  ASSERT_TRUE(c->index_version(env_, "r", "n", 1).is_ok());
  EXPECT_EQ(dump(), before);
  EXPECT_EQ(sql_rows(db_path(), "SELECT count(*) FROM regions"), std::vector<std::string>{"4"});
}

TEST_F(CatalogTest, IndexingAnUncommittedVersionIsNotFound) {
  test::version_spec s = spec("r", "n", 1);
  s.commit = false;
  write(s);
  auto c = open();
  ASSERT_NE(c, nullptr);
  status st = c->index_version(env_, "r", "n", 1);
  EXPECT_EQ(st.code(), errc::not_found);
  EXPECT_NE(st.message().find("not committed"), std::string::npos) << st.message();
  EXPECT_TRUE(c->list_versions()->empty());
}

TEST_F(CatalogTest, DamagedShardLeavesTheCatalogUnchanged) {
  write(spec("r", "n", 1));
  auto c = open();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->index_version(env_, "r", "n", 1).is_ok());
  auto before = dump();
  const std::string shard = format::shard_path(root(), "r", "n", 1, 1);
  flip_byte(shard, 70);
  status st = c->index_version(env_, "r", "n", 1);
  EXPECT_EQ(st.code(), errc::corruption);
  EXPECT_NE(st.message().find(shard), std::string::npos) << st.message();
  EXPECT_EQ(dump(), before);
}

TEST_F(CatalogTest, ShardNotMatchingTheManifest) {
  write(spec("r", "n", 1));
  // Rewrite rank 0's shard as another (valid) image: header checksum differs.
  test::version_spec other = spec("r", "n", 1);
  other.regions.push_back({"extra", CAIRN_INT32, 4, {}, false});
  other.ranks = {0};
  other.commit = false;
  write(other);
  auto c = open();
  ASSERT_NE(c, nullptr);
  status st = c->index_version(env_, "r", "n", 1);
  EXPECT_EQ(st.code(), errc::corruption);
  EXPECT_NE(st.message().find("does not match the manifest"), std::string::npos) << st.message();
}

TEST_F(CatalogTest, MissingShardIsCorruption) {
  write(spec("r", "n", 1));
  ASSERT_TRUE(env_->remove_file(format::shard_path(root(), "r", "n", 1, 1)).is_ok());
  auto c = open();
  ASSERT_NE(c, nullptr);
  status st = c->index_version(env_, "r", "n", 1);
  EXPECT_EQ(st.code(), errc::corruption);
  EXPECT_NE(st.message().find("missing"), std::string::npos) << st.message();
}

TEST_F(CatalogTest, RecordLevelKeepsOneRuntimeRowPerLevel) {
  write(spec("r", "n", 1));
  auto c = open();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->record_level("r", "n", 1, CAIRN_LEVEL_LOCAL, 100.0, 0.5).is_ok());
  ASSERT_TRUE(c->record_level("r", "n", 1, CAIRN_LEVEL_LOCAL, 200.0, 0.25).is_ok());
  auto events = c->list_events("r", "n", 1);
  ASSERT_TRUE(events.is_ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].level, CAIRN_LEVEL_LOCAL);
  EXPECT_FALSE((*events)[0].rank.has_value());
  EXPECT_EQ((*events)[0].at, 200.0);
  EXPECT_EQ((*events)[0].duration_s, 0.25);
  EXPECT_EQ((*events)[0].source, "runtime");

  // Indexing the committed version keeps the runtime record.
  ASSERT_TRUE(c->index_version(env_, "r", "n", 1).is_ok());
  events = c->list_events("r", "n", 1);
  ASSERT_TRUE(events.is_ok());
  EXPECT_EQ(std::count_if(events->begin(), events->end(), [](auto& e) { return e.source == "runtime"; }), 1);

  EXPECT_EQ(c->record_level("r", "n", 1, 3, 1.0, 1.0).code(), errc::invalid_argument);
  EXPECT_EQ(c->record_level("r", "n", 1, 0, 1.0, 1.0).code(), errc::invalid_argument);
  EXPECT_EQ(c->record_level("r", "n", 1, 16, 1.0, 1.0).code(), errc::invalid_argument);
}

TEST_F(CatalogTest, RunIdentityIsIndexedAndSurvivesRebuild) {
  write(spec("r", "n", 1));
  format::run_info info;
  info.run = "r";
  info.application = "md";
  info.code_version = "abc123";
  info.tags = {{"compiler", "gcc"}};
  format::execution e1, e2;
  e1.started_at = 100;
  e1.ended_at = 0;  // died
  e1.nranks = 4;
  e2.started_at = 200;
  e2.ended_at = 300;
  e2.nranks = 2;
  e2.hosts = {"n1", "n2"};
  e2.config = {{"mode", "thread"}};
  info.executions = {e1, e2};
  auto env = storage::storage_env::posix();
  ASSERT_TRUE(env->write_atomic(format::run_file_path(root(), "r"), format::encode_run_info(info), false).is_ok());
  auto c = open();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->index_run(env, "r").is_ok());
  auto check = [&] {
    auto rows = c->list_run_info();
    ASSERT_TRUE(rows.is_ok());
    ASSERT_EQ(rows->size(), 1u);
    const auto& row = (*rows)[0];
    EXPECT_EQ(row.application, "md");
    EXPECT_EQ(row.code_version, "abc123");
    EXPECT_EQ(row.executions, 2);
    EXPECT_EQ(row.started_at, 100.0);
    EXPECT_EQ(row.ended_at, 300.0);
    EXPECT_EQ(row.nranks, 2u);
    EXPECT_EQ(row.hosts, R"(["n1","n2"])");
    EXPECT_EQ(row.tags, R"({"compiler":"gcc"})");
  };
  check();
  ASSERT_TRUE(c->rebuild(env).is_ok());
  check();
  // A damaged RUN file is refused (the row is kept until it is fixed or removed).
  ASSERT_TRUE(env->write_atomic(format::run_file_path(root(), "r"), "garbage", false).is_ok());
  EXPECT_EQ(c->index_run(env, "r").code(), errc::corruption);
  ASSERT_TRUE(env->remove_file(format::run_file_path(root(), "r")).is_ok());
  ASSERT_TRUE(c->index_run(env, "r").is_ok());
  EXPECT_TRUE(c->list_run_info()->empty());
}

TEST_F(CatalogTest, RemoveVersionForgetsItAndUpdatesTheRun) {
  write(spec("r", "n", 1));
  write(spec("r", "n", 2));
  auto c = open();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->index_version(env_, "r", "n", 1).is_ok());
  ASSERT_TRUE(c->index_version(env_, "r", "n", 2).is_ok());
  ASSERT_TRUE(c->record_level("r", "n", 1, CAIRN_LEVEL_LOCAL, 1.0, 1.0).is_ok());
  ASSERT_EQ(c->list_runs()->at(0).first_seen, 1700000010.0);

  ASSERT_TRUE(c->remove_version("r", "n", 1).is_ok());
  EXPECT_EQ(c->list_versions()->size(), 1u);
  EXPECT_TRUE(c->list_shards("r", "n", 1)->empty());
  EXPECT_TRUE(c->list_regions("r", "n", 1)->empty());
  EXPECT_TRUE(c->list_events("r", "n", 1)->empty());
  EXPECT_EQ(c->list_runs()->at(0).first_seen, 1700000020.0);

  ASSERT_TRUE(c->remove_version("r", "n", 2).is_ok());
  EXPECT_TRUE(c->list_runs()->empty());
  EXPECT_TRUE(c->remove_version("r", "n", 99).is_ok());  // unknown: fine
}

TEST_F(CatalogTest, RebuildEqualsIncrementalIndexing) {
  std::vector<format::manifest> committed;
  committed.push_back(write(spec("alpha", "heat", 1)));
  committed.push_back(write(spec("alpha", "heat", 3)));
  committed.push_back(write(spec("alpha", "part", 10, 1)));
  committed.push_back(write(spec("beta", "heat", 1, 3)));
  committed.push_back(write(spec("beta", "heat", 2, 3)));
  test::version_spec partial = spec("alpha", "heat", 4);
  partial.ranks = {0};
  partial.commit = false;
  write(partial);
  write(spec("beta", "heat", 7, 1));
  flip_byte(format::manifest_path(root(), "beta", "heat", 7), 20);  // invalid MANIFEST
  write(spec("beta", "other", 1, 1));
  flip_byte(format::shard_path(root(), "beta", "other", 1, 0), 4096);  // data damage: still indexable

  auto c = open();
  ASSERT_NE(c, nullptr);
  // Incremental, in an order unlike the scan's.
  for (auto it = committed.rbegin(); it != committed.rend(); ++it)
    ASSERT_TRUE(c->index_version(env_, it->run, it->name, it->version).is_ok());
  ASSERT_TRUE(c->index_version(env_, "beta", "other", 1).is_ok());
  auto incremental = dump();

  // Rebuild drops rows of versions that are gone and runtime records.
  write(spec("gone", "x", 1, 1));
  ASSERT_TRUE(c->index_version(env_, "gone", "x", 1).is_ok());
  ASSERT_TRUE(env_->remove_tree(format::runs_dir(root()) + "/gone").is_ok());
  ASSERT_TRUE(c->record_level("alpha", "heat", 3, CAIRN_LEVEL_LOCAL, 5.0, 1.0).is_ok());
  ASSERT_NE(dump(), incremental);

  history::rebuild_stats stats;
  auto n = c->rebuild(env_, &stats);
  ASSERT_TRUE(n.is_ok()) << n.error().to_string();
  EXPECT_EQ(*n, 6);
  EXPECT_EQ(stats.indexed, 6);
  EXPECT_EQ(stats.uncommitted, 1);
  EXPECT_EQ(stats.invalid, 1);
  ASSERT_EQ(stats.problems.size(), 1u);
  EXPECT_NE(stats.problems[0].find(format::manifest_path(root(), "beta", "heat", 7)), std::string::npos)
      << stats.problems[0];
  EXPECT_EQ(dump(), incremental);

  // A second catalog object sees the same, and rebuild(env) works without stats.
  auto again = catalog::open(root());
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*(*again)->rebuild(env_), 6);
  EXPECT_EQ(dump(), incremental);
}

TEST_F(CatalogTest, ConcurrentWritersWaitForTheLock) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 20;
  for (int t = 0; t < kThreads; ++t) write(spec("r", "n", t, 1));
  std::vector<std::thread> threads;
  std::vector<status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = catalog::open(root());  // one object per thread
      if (!c) {
        results[t] = c.error();
        return;
      }
      for (int i = 0; i < kRounds && results[t].is_ok(); ++i) {
        results[t] = (*c)->index_version(env_, "r", "n", t);
        if (results[t]) results[t] = (*c)->record_level("r", "n", t, CAIRN_LEVEL_LOCAL, i, 0.0);
        if (results[t]) {
          auto v = (*c)->list_versions("r");
          if (!v) results[t] = v.error();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(results[t].is_ok()) << results[t].to_string();
  auto c = open();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->list_versions()->size(), static_cast<size_t>(kThreads));
}

}  // namespace
}  // namespace cairn

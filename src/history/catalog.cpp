// SQLite catalog; schema and column meanings in docs/format/catalog.md.
//
// Every table is a function of the files under <root>/runs (except events with
// source = 'runtime'): a version's rows are replaced as a whole, and the runs
// table is recomputed from the checkpoints table after every change, so the
// order in which versions are indexed never shows in the result. That is what
// makes rebuild() equal to incremental indexing.
//
// This file opens the catalog, creates or replaces its schema and writes it
// (index_version, record_level, index_run, remove_version, rebuild); the
// queries are catalog_query.cpp, and what both share is catalog_internal.hpp.
#include "history/catalog.hpp"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn.h"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/run_info.hpp"
#include "format/tree.hpp"
#include "history/catalog_internal.hpp"
#include "util/hash.hpp"

namespace cairn::history {
namespace {

constexpr int kBusyTimeoutMs = 10000;

// The schema of kCatalogSchemaVersion. "offset" is quoted: it is an SQL keyword.
constexpr const char* kSchema = R"sql(
CREATE TABLE runs(
  run         TEXT PRIMARY KEY,
  executable  TEXT NOT NULL,
  nranks      INTEGER NOT NULL,
  first_seen  REAL NOT NULL,
  last_seen   REAL NOT NULL
);
CREATE TABLE checkpoints(
  run           TEXT NOT NULL,
  name          TEXT NOT NULL,
  version       INTEGER NOT NULL,
  nranks        INTEGER NOT NULL,
  bytes         INTEGER NOT NULL,
  committed_at  REAL NOT NULL,
  mode          TEXT NOT NULL,
  executable    TEXT NOT NULL,
  redundancy         TEXT,
  redundancy_scheme  TEXT,
  redundancy_k       INTEGER,
  redundancy_m       INTEGER,
  redundancy_sets    TEXT,
  PRIMARY KEY(run, name, version)
);
CREATE TABLE shards(
  run              TEXT NOT NULL,
  name             TEXT NOT NULL,
  version          INTEGER NOT NULL,
  rank             INTEGER NOT NULL,
  file             TEXT NOT NULL,
  size             INTEGER NOT NULL,
  header_checksum  TEXT NOT NULL,
  host             TEXT NOT NULL,
  captured_at      REAL NOT NULL,
  capture_s        REAL NOT NULL,
  checksum_s       REAL NOT NULL,
  hash_s           REAL NOT NULL,
  local_s          REAL NOT NULL,
  persistent_s     REAL NOT NULL,
  persistent_at    REAL NOT NULL,
  PRIMARY KEY(run, name, version, rank)
);
CREATE TABLE regions(
  run           TEXT NOT NULL,
  name          TEXT NOT NULL,
  version       INTEGER NOT NULL,
  rank          INTEGER NOT NULL,
  region        TEXT NOT NULL,
  type          TEXT NOT NULL,
  type_code     INTEGER NOT NULL,
  count         INTEGER NOT NULL,
  dims          TEXT NOT NULL,
  column_major  INTEGER NOT NULL,
  "offset"      INTEGER NOT NULL,
  length        INTEGER NOT NULL,
  checksum      TEXT NOT NULL,
  global        TEXT NOT NULL,
  start         TEXT NOT NULL,
  exact_root    TEXT,
  tolerant_root TEXT,
  PRIMARY KEY(run, name, version, rank, region)
);
CREATE TABLE run_info(
  run           TEXT PRIMARY KEY,
  application   TEXT NOT NULL,
  code_version  TEXT NOT NULL,
  tags          TEXT NOT NULL,
  executions    INTEGER NOT NULL,
  started_at    REAL NOT NULL,
  ended_at      REAL NOT NULL,
  nranks        INTEGER NOT NULL,
  hosts         TEXT NOT NULL,
  config        TEXT NOT NULL
);
CREATE TABLE events(
  run         TEXT NOT NULL,
  name        TEXT NOT NULL,
  version     INTEGER NOT NULL,
  level       INTEGER NOT NULL,
  rank        INTEGER,
  at          REAL NOT NULL,
  duration_s  REAL NOT NULL,
  source      TEXT NOT NULL CHECK(source IN ('manifest', 'runtime'))
);
CREATE UNIQUE INDEX events_key ON events(run, name, version, level, ifnull(rank, -1), source);
CREATE INDEX checkpoints_by_time ON checkpoints(committed_at);
)sql";

std::string hex(uint64_t v) { return util::hex64(v); }

}  // namespace

namespace catalog_internal {

status catalog_impl::init_schema() {
  // WAL lets readers (cairn ls, a second job) run while the engine writes.
  // File systems without shared memory support refuse it; the default rollback
  // journal still works there, so the result is not checked.
  (void)exec("PRAGMA journal_mode=WAL");
  CAIRN_RETURN_IF_ERROR(exec("PRAGMA synchronous=NORMAL"));  // derived data: losing the last commit is harmless

  auto user_version = [&]() -> result<int64_t> {
    CAIRN_ASSIGN_OR_RETURN(statement * st, query("PRAGMA user_version"));
    CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
    int64_t v = row ? st->i64(0) : 0;
    sqlite3_reset(st->get());
    return v;
  };
  CAIRN_ASSIGN_OR_RETURN(int64_t found, user_version());
  if (found == kCatalogSchemaVersion) return {};

  bool rebuild_needed = false;
  {
    transaction tx(this);
    CAIRN_RETURN_IF_ERROR(tx.begin());
    // Another process may have created the schema while we waited for the lock.
    CAIRN_ASSIGN_OR_RETURN(found, user_version());
    if (found == kCatalogSchemaVersion) return tx.commit();
    if (found > kCatalogSchemaVersion) {
      return {errc::not_supported, "catalog " + path_ + " has schema version " + std::to_string(found) +
                                       ", newer than this cairn reads (" + std::to_string(kCatalogSchemaVersion) +
                                       "): use a newer cairn, or delete the file and run `cairn reindex " + root_ +
                                       "`"};
    }
    // Older schema (or tables of unknown origin): the catalog is derived, so it
    // is dropped and rebuilt rather than migrated.
    std::vector<std::pair<std::string, std::string>> objects;
    {
      CAIRN_ASSIGN_OR_RETURN(statement * st,
                             query("SELECT type, name FROM sqlite_master WHERE type IN ('table','index') AND "
                                   "name NOT LIKE 'sqlite_%'"));
      reset_on_exit guard(st);
      while (true) {
        CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
        if (!row) break;
        objects.emplace_back(st->text(0), st->text(1));
      }
    }
    for (auto& [type, obj] : objects) {
      if (type != "table") continue;  // indexes go with their tables
      std::string sql = "DROP TABLE IF EXISTS \"" + obj + "\"";
      CAIRN_RETURN_IF_ERROR(exec(sql.c_str()));
    }
    rebuild_needed = found != 0 || !objects.empty();
    CAIRN_RETURN_IF_ERROR(exec(kSchema));
    CAIRN_RETURN_IF_ERROR(exec(("PRAGMA user_version = " + std::to_string(kCatalogSchemaVersion)).c_str()));
    CAIRN_RETURN_IF_ERROR(tx.commit());
  }
  if (rebuild_needed) {
    auto n = rebuild(storage::storage_env::posix(), nullptr);
    if (!n) return n.error().with_context("rebuilding catalog " + path_ + " after a schema change");
  }
  return {};
}

result<catalog_impl::version_data> catalog_impl::load_version(storage::storage_env* env, const std::string& run,
                                                              const std::string& name, int64_t version) {
  const std::string mpath = format::manifest_path(root_, run, name, version);
  if (!env->exists(mpath)) {
    return status(errc::not_found, "version " + std::to_string(version) + " of " + run + "/" + name +
                                       " is not committed (no " + mpath + ")");
  }
  version_data v;
  CAIRN_ASSIGN_OR_RETURN(v.manifest, format::read_manifest(env, mpath));
  const format::manifest& m = v.manifest;
  if (m.run != run || m.name != name || m.version != version) {
    return status(errc::corruption, mpath + ": manifest is for " + m.run + "/" + m.name + " version " +
                                        std::to_string(m.version) + ", not the directory it is in");
  }
  for (const auto& e : m.shards) {
    const std::string spath = format::persistent_image_where(root_, run, name, version, e.rank, &m);
    auto file = format::open_persistent_image(env, root_, run, name, version, e.rank, &m);
    auto h = file ? format::read_header(**file, spath) : result<format::shard_header>(file.take_status());
    if (!h) {
      if (h.error().code() == errc::not_found)
        return status(errc::corruption, spath + ": missing, but the manifest lists it");
      return h.take_status();
    }
    if (h->run != run || h->name != name || h->version != version || h->rank != e.rank ||
        h->nranks != m.nranks) {
      return status(errc::corruption, spath + ": header names " + h->run + "/" + h->name + " version " +
                                          std::to_string(h->version) + " rank " + std::to_string(h->rank) + " of " +
                                          std::to_string(h->nranks) + ", which does not match its place");
    }
    if (h->file_size != e.size || h->header_checksum != e.header_checksum) {
      return status(errc::corruption, spath + ": does not match the manifest (size " + std::to_string(h->file_size) +
                                          " vs " + std::to_string(e.size) + ", header checksum " +
                                          hex(h->header_checksum) + " vs " + hex(e.header_checksum) + ")");
    }
    // The tree is an optional accelerator: index its roots when it is intact and
    // belongs to this shard, otherwise leave them NULL.
    auto t = format::read_tree(env, storage::join(format::version_dir(root_, run, name, version),
                                                  format::tree_file_name(e.rank)));
    if (t && t->shard_header_checksum == h->header_checksum) v.trees.emplace_back(std::move(t).value());
    else v.trees.emplace_back(std::nullopt);
    v.headers.push_back(std::move(*h));
  }
  return v;
}

status catalog_impl::delete_version_rows(const std::string& run, const std::string& name, int64_t version,
                                         bool runtime_too) {
  for (const char* table : {"checkpoints", "shards", "regions"}) {
    CAIRN_RETURN_IF_ERROR(run_sql(
        std::string("DELETE FROM ") + table + " WHERE run = ?1 AND name = ?2 AND version = ?3", run, name, version));
  }
  if (runtime_too)
    return run_sql("DELETE FROM events WHERE run = ?1 AND name = ?2 AND version = ?3", run, name, version);
  return run_sql("DELETE FROM events WHERE run = ?1 AND name = ?2 AND version = ?3 AND source = 'manifest'", run,
                 name, version);
}

status catalog_impl::write_version(const version_data& v) {
  const format::manifest& m = v.manifest;
  uint64_t bytes = 0;
  double max_persistent_s = 0;
  for (const auto& e : m.shards) {
    bytes += e.size;
    max_persistent_s = std::max(max_persistent_s, e.persistent_s);
  }
  std::optional<std::string> red, red_scheme, red_sets;
  std::optional<uint32_t> red_k, red_m;
  if (m.redundancy) {
    red = m.redundancy->description;
    red_scheme = m.redundancy->scheme;
    red_k = m.redundancy->k;
    red_m = m.redundancy->m;
    red_sets = nlohmann::json(m.redundancy->sets).dump();
  }
  CAIRN_RETURN_IF_ERROR(
      run_sql("INSERT INTO checkpoints(run, name, version, nranks, bytes, committed_at, mode, executable,"
              " redundancy, redundancy_scheme, redundancy_k, redundancy_m, redundancy_sets)"
              " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
              m.run, m.name, m.version, m.nranks, bytes, m.committed_at, m.mode, m.executable, red, red_scheme,
              red_k, red_m, red_sets));
  const std::string insert_event =
      "INSERT INTO events(run, name, version, level, rank, at, duration_s, source)"
      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, 'manifest')";
  // Every set complete before the commit: the manifest knows when.
  if (m.redundancy && m.redundancy->protected_at > 0) {
    double first = m.redundancy->protected_at;
    for (const auto& e : m.shards) first = std::min(first, e.captured_at);
    CAIRN_RETURN_IF_ERROR(run_sql(insert_event, m.run, m.name, m.version, CAIRN_LEVEL_PROTECTED, nullptr,
                                  m.redundancy->protected_at, m.redundancy->protected_at - first));
  }
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const format::shard_entry& e = m.shards[i];
    CAIRN_RETURN_IF_ERROR(
        run_sql("INSERT INTO shards(run, name, version, rank, file, size, header_checksum, host,"
                " captured_at, capture_s, checksum_s, hash_s, local_s, persistent_s, persistent_at)"
                " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                m.run, m.name, m.version, e.rank, m.aggregated ? std::string() : format::shard_file_name(e.rank),
                e.size, hex(e.header_checksum),
                e.host, e.captured_at, e.capture_s, e.checksum_s, e.hash_s, e.local_s, e.persistent_s, e.persistent_at));
    for (const auto& r : v.headers[i].regions) {
      const format::region_tree* rt = v.trees[i] ? v.trees[i]->find(r.name) : nullptr;
      std::optional<std::string> exact_root, tolerant_root;
      if (rt) exact_root = hex(rt->exact_root);
      if (rt && rt->has_tolerant) tolerant_root = hex(rt->tolerant_root);
      CAIRN_RETURN_IF_ERROR(
          run_sql("INSERT INTO regions(run, name, version, rank, region, type, type_code, count, dims,"
                  " column_major, \"offset\", length, checksum, global, start, exact_root, tolerant_root)"
                  " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
                  m.run, m.name, m.version, e.rank, r.name, std::string(format::type_name(r.type)), r.type, r.count,
                  nlohmann::json(r.dims).dump(), (r.flags & format::kColumnMajor) != 0, r.offset, r.length,
                  hex(r.checksum), nlohmann::json(r.global).dump(), nlohmann::json(r.start).dump(), exact_root,
                  tolerant_root));
    }
    std::optional<uint32_t> rank = e.rank;
    CAIRN_RETURN_IF_ERROR(
        run_sql(insert_event, m.run, m.name, m.version, CAIRN_LEVEL_CAPTURED, rank, e.captured_at, e.capture_s));
    CAIRN_RETURN_IF_ERROR(
        run_sql(insert_event, m.run, m.name, m.version, CAIRN_LEVEL_PERSISTENT, rank, e.persistent_at, e.persistent_s));
  }
  // The version as a whole reached the persistent level when it was committed.
  return run_sql(insert_event, m.run, m.name, m.version, CAIRN_LEVEL_PERSISTENT, nullptr, m.committed_at,
                 max_persistent_s);
}

status catalog_impl::recompute_run(const std::string& run) {
  CAIRN_RETURN_IF_ERROR(run_sql("DELETE FROM runs WHERE run = ?1", run));
  // Newest = latest commit; ties broken by name and version so the row does not
  // depend on the order versions were indexed in.
  return run_sql(
      "INSERT INTO runs(run, executable, nranks, first_seen, last_seen)"
      " SELECT run, executable, nranks,"
      "  (SELECT min(committed_at) FROM checkpoints WHERE run = ?1),"
      "  (SELECT max(committed_at) FROM checkpoints WHERE run = ?1)"
      " FROM checkpoints WHERE run = ?1 ORDER BY committed_at DESC, name DESC, version DESC LIMIT 1",
      run);
}

status catalog_impl::index_version(storage::storage_env* env, const std::string& run, const std::string& name,
                                   int64_t version) {
  CAIRN_ASSIGN_OR_RETURN(version_data v, load_version(env, run, name, version));
  transaction tx(this);
  CAIRN_RETURN_IF_ERROR(tx.begin());
  CAIRN_RETURN_IF_ERROR(delete_version_rows(run, name, version, /*runtime_too=*/false));
  CAIRN_RETURN_IF_ERROR(write_version(v));
  CAIRN_RETURN_IF_ERROR(recompute_run(run));
  return tx.commit();
}

status catalog_impl::record_level(const std::string& run, const std::string& name, int64_t version, unsigned level,
                                  double at, double duration_s) {
  if (level == 0 || level > CAIRN_LEVEL_PERSISTENT || (level & (level - 1)) != 0) {
    return {errc::invalid_argument, "record_level: level " + std::to_string(level) +
                                        " is not a single CAIRN_LEVEL_* bit"};
  }
  return run_sql(
      "INSERT INTO events(run, name, version, level, rank, at, duration_s, source)"
      " VALUES(?1, ?2, ?3, ?4, NULL, ?5, ?6, 'runtime')"
      " ON CONFLICT(run, name, version, level, ifnull(rank, -1), source)"
      " DO UPDATE SET at = excluded.at, duration_s = excluded.duration_s",
      run, name, version, level, at, duration_s);
}

status catalog_impl::index_run(storage::storage_env* env, const std::string& run) {
  auto info = format::read_run_info(env, root_, run);
  if (!info) {
    if (info.error().code() == errc::not_found) return run_sql("DELETE FROM run_info WHERE run = ?1", run);
    return info.take_status();
  }
  return write_run_info(*info);
}

status catalog_impl::write_run_info(const format::run_info& r) {
  CAIRN_RETURN_IF_ERROR(run_sql("DELETE FROM run_info WHERE run = ?1", r.run));
  format::execution first, last;
  if (!r.executions.empty()) {
    first = r.executions.front();
    last = r.executions.back();
  }
  return run_sql(
      "INSERT INTO run_info(run, application, code_version, tags, executions, started_at, ended_at, nranks, hosts,"
      " config) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
      r.run, r.application, r.code_version, nlohmann::json(r.tags).dump(), static_cast<int64_t>(r.executions.size()),
      first.started_at, last.ended_at, last.nranks, nlohmann::json(last.hosts).dump(), nlohmann::json(last.config).dump());
}

status catalog_impl::remove_version(const std::string& run, const std::string& name, int64_t version) {
  transaction tx(this);
  CAIRN_RETURN_IF_ERROR(tx.begin());
  CAIRN_RETURN_IF_ERROR(delete_version_rows(run, name, version, /*runtime_too=*/true));
  CAIRN_RETURN_IF_ERROR(recompute_run(run));
  return tx.commit();
}

result<int64_t> catalog_impl::rebuild(storage::storage_env* env, rebuild_stats* stats) {
  rebuild_stats local;
  rebuild_stats& st = stats != nullptr ? *stats : local;
  st = rebuild_stats{};
  std::vector<version_data> found;
  std::set<std::string> runs;
  const std::string runs_dir = format::runs_dir(root_);
  for (const std::string& run : format::list_subdirs(env, runs_dir)) {
    for (const std::string& name : format::list_subdirs(env, storage::join(runs_dir, run))) {
      for (int64_t version : format::list_versions(env, root_, run, name)) {
        if (!env->exists(format::manifest_path(root_, run, name, version))) {
          ++st.uncommitted;
          continue;
        }
        auto v = load_version(env, run, name, version);
        if (!v) {
          ++st.invalid;
          st.problems.push_back(v.error().message());
          continue;
        }
        runs.insert(run);
        found.push_back(std::move(*v));
      }
    }
  }
  transaction tx(this);
  CAIRN_RETURN_IF_ERROR(tx.begin());
  std::vector<format::run_info> infos;
  for (const std::string& run : format::list_subdirs(env, runs_dir)) {
    auto info = format::read_run_info(env, root_, run);
    if (info) infos.push_back(std::move(info).value());
    else if (info.error().code() != errc::not_found) st.problems.push_back(info.error().message());
  }
  for (const char* table : {"runs", "checkpoints", "shards", "regions", "events", "run_info"})
    CAIRN_RETURN_IF_ERROR(run_sql(std::string("DELETE FROM ") + table));
  for (const auto& v : found) CAIRN_RETURN_IF_ERROR(write_version(v));
  for (const auto& i : infos) CAIRN_RETURN_IF_ERROR(write_run_info(i));
  for (const auto& r : runs) CAIRN_RETURN_IF_ERROR(recompute_run(r));
  CAIRN_RETURN_IF_ERROR(tx.commit());
  st.indexed = static_cast<int64_t>(found.size());
  return st.indexed;
}

}  // namespace catalog_internal

result<std::unique_ptr<catalog>> catalog::open(const std::string& store_root) {
  struct stat sb {};
  if (::stat(store_root.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    return status(errc::not_found, "store " + store_root + " does not exist or is not a directory");
  }
  const std::string path = storage::join(store_root, format::kCatalogName);
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  catalog_internal::connection db(raw);  // sqlite3_open_v2 allocates a handle even on failure
  if (rc != SQLITE_OK) return catalog_internal::sqlite_status(raw, rc, "opening", path);
  sqlite3_extended_result_codes(db.get(), 1);
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);
  auto c = std::make_unique<catalog_internal::catalog_impl>(store_root, path, std::move(db));
  CAIRN_RETURN_IF_ERROR(c->init_schema());
  return std::unique_ptr<catalog>(std::move(c));
}

}  // namespace cairn::history

// SQLite catalog; schema and column meanings in docs/format/catalog.md.
//
// Every table is a function of the files under <root>/runs (except events with
// source = 'runtime'): a version's rows are replaced as a whole, and the runs
// table is recomputed from the checkpoints table after every change, so the
// order in which versions are indexed never shows in the result. That is what
// makes rebuild() equal to incremental indexing.
#include "history/catalog.hpp"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <set>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "cairn.h"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/run_info.hpp"
#include "format/tree.hpp"
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

// Maps an SQLite result code to a status naming the catalog file.
status sqlite_status(sqlite3* db, int rc, std::string_view what, const std::string& path) {
  std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string msg = "catalog " + path + ": " + std::string(what) + ": " + detail;
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return {errc::again, msg + " (another process holds the catalog locked; retry later)"};
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return {errc::corruption, msg + " (the catalog is only an index: delete it and run `cairn reindex " +
                                    storage::dirname_of(path) + "`)"};
    case SQLITE_FULL:
      return {errc::no_space, msg + " (free space on the store's file system)"};
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
    case SQLITE_PROTOCOL:
      return {errc::io_error, msg};
    default:
      return {errc::internal, msg + " (sqlite code " + std::to_string(rc) + ")"};
  }
}

// Move-only owner of a prepared statement.
class statement {
 public:
  statement() = default;
  explicit statement(sqlite3_stmt* s) : s_(s) {}
  ~statement() {
    if (s_ != nullptr) sqlite3_finalize(s_);
  }
  statement(statement&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  statement& operator=(statement&& o) noexcept {
    if (this != &o) {
      if (s_ != nullptr) sqlite3_finalize(s_);
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;

  sqlite3_stmt* get() const { return s_; }

  // Column accessors for the current row.
  int64_t i64(int col) const { return sqlite3_column_int64(s_, col); }
  double f64(int col) const { return sqlite3_column_double(s_, col); }
  bool is_null(int col) const { return sqlite3_column_type(s_, col) == SQLITE_NULL; }
  std::string text(int col) const {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, col));
    return p != nullptr ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_, col))) : std::string();
  }

 private:
  sqlite3_stmt* s_ = nullptr;
};

// Resets a statement when a query loop is left early, so that it does not keep
// a read transaction open until its next use.
class reset_on_exit {
 public:
  explicit reset_on_exit(statement* st) : st_(st) {}
  ~reset_on_exit() { sqlite3_reset(st_->get()); }
  reset_on_exit(const reset_on_exit&) = delete;
  reset_on_exit& operator=(const reset_on_exit&) = delete;

 private:
  statement* st_;
};

// Move-only owner of a connection.
class connection {
 public:
  connection() = default;
  explicit connection(sqlite3* db) : db_(db) {}
  ~connection() {
    if (db_ != nullptr) sqlite3_close_v2(db_);
  }
  connection(connection&& o) noexcept : db_(std::exchange(o.db_, nullptr)) {}
  connection& operator=(connection&& o) noexcept {
    if (this != &o) {
      if (db_ != nullptr) sqlite3_close_v2(db_);
      db_ = std::exchange(o.db_, nullptr);
    }
    return *this;
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  sqlite3* get() const { return db_; }

 private:
  sqlite3* db_ = nullptr;
};

class catalog_impl final : public catalog {
 public:
  catalog_impl(std::string root, std::string path, connection db)
      : root_(std::move(root)), path_(std::move(path)), db_(std::move(db)) {}

  // Brings the schema to kCatalogSchemaVersion (see catalog::open).
  status init_schema();

  const std::string& store_root() const override { return root_; }
  status index_version(storage::storage_env* env, const std::string& run, const std::string& name,
                       int64_t version) override;
  status record_level(const std::string& run, const std::string& name, int64_t version, unsigned level, double at,
                      double duration_s) override;
  status index_run(storage::storage_env* env, const std::string& run) override;
  result<std::vector<run_info_row>> list_run_info() override;
  status remove_version(const std::string& run, const std::string& name, int64_t version) override;
  result<int64_t> rebuild(storage::storage_env* env, rebuild_stats* stats) override;

  result<std::vector<run_row>> list_runs() override;
  result<std::vector<version_row>> list_versions(const std::string& run, const std::string& name) override;
  result<std::vector<shard_row>> list_shards(const std::string& run, const std::string& name,
                                             int64_t version) override;
  result<std::vector<region_row>> list_regions(const std::string& run, const std::string& name,
                                               int64_t version) override;
  result<std::vector<event_row>> list_events(const std::string& run, const std::string& name,
                                             int64_t version) override;

 private:
  // A committed version as read from the store, before any SQL runs (so that
  // file I/O never happens while the write lock is held).
  struct version_data {
    format::manifest manifest;
    std::vector<format::shard_header> headers;  // index = rank
    std::vector<std::optional<format::tree_file>> trees;  // index = rank; empty when absent or unusable
  };

  // Rolls back unless commit() succeeded.
  class transaction {
   public:
    explicit transaction(catalog_impl* c) : c_(c) {}
    ~transaction() {
      if (open_) (void)c_->exec("ROLLBACK");
    }
    transaction(const transaction&) = delete;
    transaction& operator=(const transaction&) = delete;
    status begin() {
      // IMMEDIATE takes the write lock now, so the busy timeout applies here
      // and not to a lock upgrade later (which could deadlock in WAL mode).
      CAIRN_RETURN_IF_ERROR(c_->exec("BEGIN IMMEDIATE"));
      open_ = true;
      return {};
    }
    status commit() {
      CAIRN_RETURN_IF_ERROR(c_->exec("COMMIT"));
      open_ = false;
      return {};
    }

   private:
    catalog_impl* c_;
    bool open_ = false;
  };

  status error(int rc, std::string_view what) const { return sqlite_status(db_.get(), rc, what, path_); }

  status exec(const char* sql) {
    int rc = sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return error(rc, std::string("executing ") + std::string(sql).substr(0, 40));
    return {};
  }

  // A prepared statement for sql, reset and with bindings cleared; cached
  // because rebuild runs the same few statements for every row.
  result<statement*> prepare(const std::string& sql) {
    auto it = cache_.find(sql);
    if (it == cache_.end()) {
      sqlite3_stmt* raw = nullptr;
      int rc = sqlite3_prepare_v2(db_.get(), sql.c_str(), static_cast<int>(sql.size()), &raw, nullptr);
      if (rc != SQLITE_OK) {
        sqlite3_finalize(raw);
        return error(rc, "preparing a statement");
      }
      it = cache_.emplace(sql, statement(raw)).first;
    }
    sqlite3_reset(it->second.get());
    sqlite3_clear_bindings(it->second.get());
    return &it->second;
  }

  template <typename T>
  int bind_one(sqlite3_stmt* s, int i, const T& v) {
    using U = std::decay_t<T>;
    if constexpr (std::is_same_v<U, std::nullptr_t>) {
      return sqlite3_bind_null(s, i);
    } else if constexpr (std::is_same_v<U, std::optional<uint32_t>>) {
      return v ? sqlite3_bind_int64(s, i, *v) : sqlite3_bind_null(s, i);
    } else if constexpr (std::is_same_v<U, std::optional<std::string>>) {
      return v ? sqlite3_bind_text(s, i, v->data(), static_cast<int>(v->size()), SQLITE_TRANSIENT)
               : sqlite3_bind_null(s, i);
    } else if constexpr (std::is_same_v<U, bool>) {
      return sqlite3_bind_int64(s, i, v ? 1 : 0);
    } else if constexpr (std::is_integral_v<U>) {
      // uint64 sizes and counts stay below 2^63 in practice; stored as int64.
      return sqlite3_bind_int64(s, i, static_cast<sqlite3_int64>(v));
    } else if constexpr (std::is_floating_point_v<U>) {
      return sqlite3_bind_double(s, i, static_cast<double>(v));
    } else {
      std::string_view sv(v);
      return sqlite3_bind_text(s, i, sv.data(), static_cast<int>(sv.size()), SQLITE_TRANSIENT);
    }
  }

  // Prepares sql and binds args to ?1, ?2, ...
  template <typename... Args>
  result<statement*> query(const std::string& sql, const Args&... args) {
    CAIRN_ASSIGN_OR_RETURN(statement * st, prepare(sql));
    int i = 0;
    int rc = SQLITE_OK;
    ((rc = rc == SQLITE_OK ? bind_one(st->get(), ++i, args) : rc), ...);
    if (rc != SQLITE_OK) return error(rc, "binding a parameter");
    return st;
  }

  // Advances to the next row: true if there is one, false when done.
  result<bool> step(statement* st) {
    int rc = sqlite3_step(st->get());
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    status s = error(rc, "running a statement");
    sqlite3_reset(st->get());
    return s;
  }

  // Runs a statement that returns no rows.
  template <typename... Args>
  status run_sql(const std::string& sql, const Args&... args) {
    CAIRN_ASSIGN_OR_RETURN(statement * st, query(sql, args...));
    CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
    (void)row;
    sqlite3_reset(st->get());
    return {};
  }

  result<version_data> load_version(storage::storage_env* env, const std::string& run, const std::string& name,
                                    int64_t version);
  status delete_version_rows(const std::string& run, const std::string& name, int64_t version, bool runtime_too);
  status write_version(const version_data& v);
  status write_run_info(const format::run_info& r);
  status recompute_run(const std::string& run);

  std::string root_;
  std::string path_;
  connection db_;
  std::map<std::string, statement> cache_;  // destroyed before db_ (declared after it)
};

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

result<std::vector<run_info_row>> catalog_impl::list_run_info() {
  CAIRN_ASSIGN_OR_RETURN(statement * st,
                         query("SELECT run, application, code_version, tags, executions, started_at, ended_at, nranks,"
                               " hosts, config FROM run_info ORDER BY run"));
  reset_on_exit guard(st);
  std::vector<run_info_row> out;
  while (true) {
    CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
    if (!row) break;
    out.push_back({st->text(0), st->text(1), st->text(2), st->text(3), st->i64(4), st->f64(5), st->f64(6),
                   static_cast<uint32_t>(st->i64(7)), st->text(8), st->text(9)});
  }
  return out;
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

result<std::vector<run_row>> catalog_impl::list_runs() {
  CAIRN_ASSIGN_OR_RETURN(statement * st,
                         query("SELECT run, executable, nranks, first_seen, last_seen FROM runs ORDER BY run"));
  reset_on_exit guard(st);
  std::vector<run_row> out;
  while (true) {
    CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
    if (!row) break;
    out.push_back({st->text(0), st->text(1), static_cast<uint32_t>(st->i64(2)), st->f64(3), st->f64(4)});
  }
  return out;
}

result<std::vector<version_row>> catalog_impl::list_versions(const std::string& run, const std::string& name) {
  CAIRN_ASSIGN_OR_RETURN(statement * st,
                         query("SELECT run, name, version, nranks, bytes, committed_at, mode, executable,"
                               " ifnull(redundancy, ''), ifnull(redundancy_scheme, ''), ifnull(redundancy_k, 0),"
                               " ifnull(redundancy_m, 0) FROM checkpoints WHERE (?1 = '' OR run = ?1) AND (?2 = '' OR name = ?2)"
                               " ORDER BY run, name, version",
                               run, name));
  reset_on_exit guard(st);
  std::vector<version_row> out;
  while (true) {
    CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
    if (!row) break;
    out.push_back({st->text(0), st->text(1), st->i64(2), static_cast<uint32_t>(st->i64(3)),
                   static_cast<uint64_t>(st->i64(4)), st->f64(5), st->text(6), st->text(7), st->text(8),
                   st->text(9), static_cast<uint32_t>(st->i64(10)), static_cast<uint32_t>(st->i64(11))});
  }
  return out;
}

result<std::vector<shard_row>> catalog_impl::list_shards(const std::string& run, const std::string& name,
                                                         int64_t version) {
  CAIRN_ASSIGN_OR_RETURN(statement * st,
                         query("SELECT rank, file, size, header_checksum, host, captured_at, capture_s, checksum_s,"
                               " hash_s, local_s, persistent_s, persistent_at FROM shards"
                               " WHERE run = ?1 AND name = ?2 AND version = ?3 ORDER BY rank",
                               run, name, version));
  reset_on_exit guard(st);
  std::vector<shard_row> out;
  while (true) {
    CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
    if (!row) break;
    out.push_back({static_cast<uint32_t>(st->i64(0)), st->text(1), static_cast<uint64_t>(st->i64(2)), st->text(3),
                   st->text(4), st->f64(5), st->f64(6), st->f64(7), st->f64(8), st->f64(9), st->f64(10),
                   st->f64(11)});
  }
  return out;
}

result<std::vector<region_row>> catalog_impl::list_regions(const std::string& run, const std::string& name,
                                                           int64_t version) {
  CAIRN_ASSIGN_OR_RETURN(statement * st,
                         query("SELECT rank, region, type, count, dims, column_major, \"offset\", length, checksum,"
                               " global, start, ifnull(exact_root, ''), ifnull(tolerant_root, '')"
                               " FROM regions WHERE run = ?1 AND name = ?2 AND version = ?3 ORDER BY rank, region",
                               run, name, version));
  reset_on_exit guard(st);
  std::vector<region_row> out;
  while (true) {
    CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
    if (!row) break;
    region_row r;
    r.rank = static_cast<uint32_t>(st->i64(0));
    r.region = st->text(1);
    r.type = st->text(2);
    r.count = static_cast<uint64_t>(st->i64(3));
    auto dims = nlohmann::json::parse(st->text(4), nullptr, /*allow_exceptions=*/false);
    if (!dims.is_array()) return status(errc::corruption, "catalog " + path_ + ": bad dims of region " + r.region);
    for (const auto& d : dims) {
      if (!d.is_number_unsigned())
        return status(errc::corruption, "catalog " + path_ + ": bad dims of region " + r.region);
      r.dims.push_back(d.get<uint64_t>());
    }
    r.column_major = st->i64(5) != 0;
    r.offset = static_cast<uint64_t>(st->i64(6));
    r.length = static_cast<uint64_t>(st->i64(7));
    r.checksum = st->text(8);
    for (auto [col, vec] : {std::pair{9, &r.global}, std::pair{10, &r.start}}) {
      auto a = nlohmann::json::parse(st->text(col), nullptr, /*allow_exceptions=*/false);
      if (!a.is_array()) return status(errc::corruption, "catalog " + path_ + ": bad layout of region " + r.region);
      for (const auto& d : a) {
        if (!d.is_number_unsigned())
          return status(errc::corruption, "catalog " + path_ + ": bad layout of region " + r.region);
        vec->push_back(d.get<uint64_t>());
      }
    }
    r.exact_root = st->text(11);
    r.tolerant_root = st->text(12);
    out.push_back(std::move(r));
  }
  return out;
}

result<std::vector<event_row>> catalog_impl::list_events(const std::string& run, const std::string& name,
                                                         int64_t version) {
  CAIRN_ASSIGN_OR_RETURN(statement * st,
                         query("SELECT level, rank, at, duration_s, source FROM events"
                               " WHERE run = ?1 AND name = ?2 AND version = ?3 ORDER BY level, rank, source",
                               run, name, version));
  reset_on_exit guard(st);
  std::vector<event_row> out;
  while (true) {
    CAIRN_ASSIGN_OR_RETURN(bool row, step(st));
    if (!row) break;
    event_row e;
    e.level = static_cast<unsigned>(st->i64(0));
    if (!st->is_null(1)) e.rank = static_cast<uint32_t>(st->i64(1));
    e.at = st->f64(2);
    e.duration_s = st->f64(3);
    e.source = st->text(4);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

result<std::unique_ptr<catalog>> catalog::open(const std::string& store_root) {
  struct stat sb {};
  if (::stat(store_root.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    return status(errc::not_found, "store " + store_root + " does not exist or is not a directory");
  }
  const std::string path = storage::join(store_root, format::kCatalogName);
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  connection db(raw);  // sqlite3_open_v2 allocates a handle even on failure
  if (rc != SQLITE_OK) return sqlite_status(raw, rc, "opening", path);
  sqlite3_extended_result_codes(db.get(), 1);
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);
  auto c = std::make_unique<catalog_impl>(store_root, path, std::move(db));
  CAIRN_RETURN_IF_ERROR(c->init_schema());
  return std::unique_ptr<catalog>(std::move(c));
}

}  // namespace cairn::history

// Internal to the catalog unit (catalog.cpp, catalog_query.cpp); nothing
// outside src/history/catalog* includes it. Declares catalog_impl, the SQLite
// implementation of history::catalog (catalog.hpp states the contract), with
// the statement cache and helpers both parts use (prepare, query, step,
// run_sql, transaction), the move-only owners of SQLite handles and the
// mapping of SQLite result codes to statuses:
//  - catalog.cpp: opening the file, creating or replacing the schema, and
//    every write (index_version, record_level, index_run, remove_version,
//    rebuild);
//  - catalog_query.cpp: the list_* queries.
// A catalog_impl, its connection and its cached statements are used by one
// thread at a time.
#ifndef CAIRN_HISTORY_CATALOG_INTERNAL_HPP
#define CAIRN_HISTORY_CATALOG_INTERNAL_HPP

#include <sqlite3.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "format/run_info.hpp"
#include "format/shard.hpp"
#include "format/tree.hpp"
#include "history/catalog.hpp"
#include "storage/storage_env.hpp"

namespace cairn::history::catalog_internal {

// Maps an SQLite result code to a status naming the catalog file.
inline status sqlite_status(sqlite3* db, int rc, std::string_view what, const std::string& path) {
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

}  // namespace cairn::history::catalog_internal

#endif

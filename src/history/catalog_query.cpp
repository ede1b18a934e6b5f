// The catalog's queries (list_run_info, list_runs, list_versions,
// list_shards, list_regions, list_events; contracts in history/catalog.hpp):
// each runs one cached SELECT and converts its rows, resetting the statement
// when it leaves early so that no read transaction stays open. Opening and
// writing the catalog is catalog.cpp; what both share is catalog_internal.hpp.
#include "history/catalog.hpp"

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "history/catalog_internal.hpp"

namespace cairn::history::catalog_internal {

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

}  // namespace cairn::history::catalog_internal

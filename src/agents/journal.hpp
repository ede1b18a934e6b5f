// The controller's append-only journal (format: docs/format/journal.md): a
// 16-byte file header, then records of [u32 length][u64 xxh3][JSON], each
// appended with one write and made durable with fdatasync before the change
// it records takes effect. At open the journal is replayed, stopping at a torn
// last record (a crash in the middle of an append), and rewritten compacted
// (temporary file, fsync, rename, fsync of the directory); appends continue
// on the compacted file. All I/O goes through storage_env.
// Thread-safety: none (one owner thread).
#ifndef CAIRN_AGENTS_JOURNAL_HPP
#define CAIRN_AGENTS_JOURNAL_HPP

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/status.hpp"
#include "storage/storage_env.hpp"

namespace cairn::agents {

inline constexpr char kJournalMagic[8] = {'C', 'A', 'I', 'R', 'N', 'J', 'N', 'L'};
inline constexpr uint32_t kJournalVersion = 1;
inline constexpr size_t kJournalHeaderSize = 16;
inline constexpr size_t kJournalRecordHeader = 12;  // u32 length + u64 xxh3
inline constexpr uint32_t kMaxJournalRecord = 1u << 20;

struct journal_replay {
  uint64_t records = 0;        // records applied
  uint64_t torn_bytes = 0;     // bytes of an incomplete last record, dropped
  bool created = false;        // there was no journal
};

// Parses a whole journal file image: calls apply on each record in order.
// A damaged or incomplete record is tolerated only as the last thing in the
// file (torn_bytes); anywhere else it is corruption, as is a bad file header,
// a record apply() refuses, or a JSON error.
status replay_journal(const std::string& image, const std::function<status(const nlohmann::json&)>& apply,
                      journal_replay* stats);

// One record as it is written (header + JSON).
std::string encode_journal_record(const nlohmann::json& rec);

class journal {
 public:
  // Opens (or creates) the journal at path: replays it through `apply`, then
  // rewrites it from `snapshot()` (called after the replay). The directory
  // must exist.
  static result<std::unique_ptr<journal>> open(storage::storage_env* env, const std::string& path,
                                                const std::function<status(const nlohmann::json&)>& apply,
                                                const std::function<std::vector<nlohmann::json>()>& snapshot,
                                                journal_replay* stats);
  // Appends one record and fdatasyncs it. After a failure the journal refuses
  // further appends (the file may end in a partial record; the next open
  // drops it).
  status append(const nlohmann::json& rec);
  // Replaces the file by these records (compaction).
  status rewrite(const std::vector<nlohmann::json>& records);
  uint64_t appended_since_rewrite() const { return since_rewrite_; }
  // True after a failed append, until a successful rewrite.
  bool failed() const { return !failed_.is_ok(); }
  const std::string& path() const { return path_; }

 private:
  journal(storage::storage_env* env, std::string path) : env_(env), path_(std::move(path)) {}
  storage::storage_env* env_;
  std::string path_;
  std::unique_ptr<storage::writable_file> file_;
  uint64_t offset_ = 0;
  uint64_t since_rewrite_ = 0;
  status failed_;
};

}  // namespace cairn::agents

#endif

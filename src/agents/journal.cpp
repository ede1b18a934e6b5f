#include "agents/journal.hpp"

#include <sys/stat.h>

#include <cstring>

#include "agents/wire.hpp"
#include "util/hash.hpp"

namespace cairn::agents {
namespace {

uint64_t get_le(const std::string& b, size_t off, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(b[off + i])) << (8 * i);
  return v;
}
void put_le(std::string* s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string file_header() {
  std::string h(kJournalMagic, sizeof kJournalMagic);
  put_le(&h, kJournalVersion, 4);
  put_le(&h, 0, 4);
  return h;
}

}  // namespace

std::string encode_journal_record(const nlohmann::json& rec) {
  std::string body = util::dump_json(rec);
  std::string out;
  put_le(&out, body.size(), 4);
  put_le(&out, util::xxh3(body.data(), body.size()), 8);
  out += body;
  return out;
}

status replay_journal(const std::string& image, const std::function<status(const nlohmann::json&)>& apply,
                      journal_replay* stats) {
  if (image.size() < kJournalHeaderSize || std::memcmp(image.data(), kJournalMagic, sizeof kJournalMagic) != 0) {
    return {errc::corruption, "not a cairn agents journal (bad header)"};
  }
  uint32_t version = static_cast<uint32_t>(get_le(image, 8, 4));
  if (version != kJournalVersion) {
    return {errc::not_supported, "journal format version " + std::to_string(version) + ", this build reads " +
                                     std::to_string(kJournalVersion)};
  }
  size_t off = kJournalHeaderSize;
  while (off < image.size()) {
    const size_t left = image.size() - off;
    auto torn = [&](const std::string& why) -> status {
      // Tolerated only when nothing valid could follow: the record reaches the end.
      stats->torn_bytes = left;
      (void)why;
      return {};
    };
    if (left < kJournalRecordHeader) return torn("short record header");
    uint64_t len = get_le(image, off, 4);
    uint64_t sum = get_le(image, off + 4, 8);
    if (len > kMaxJournalRecord) {
      return {errc::corruption, "journal record at offset " + std::to_string(off) + " claims " +
                                    std::to_string(len) + " bytes"};
    }
    if (kJournalRecordHeader + len > left) return torn("record runs past the end");
    const char* body = image.data() + off + kJournalRecordHeader;
    const size_t end = off + kJournalRecordHeader + len;
    if (util::xxh3(body, len) != sum) {
      if (end == image.size()) return torn("bad checksum on the last record");
      return {errc::corruption, "journal record at offset " + std::to_string(off) +
                                    " has a bad checksum and is followed by " +
                                    std::to_string(image.size() - end) + " more bytes"};
    }
    auto j = util::parse_json_object(std::string_view(body, len));
    if (!j) return {errc::corruption, "journal record at offset " + std::to_string(off) + ": " + j.error().message()};
    status st = apply(*j);
    if (!st) return {errc::corruption, "journal record at offset " + std::to_string(off) + ": " + st.message()};
    ++stats->records;
    off = end;
  }
  return {};
}

result<std::unique_ptr<journal>> journal::open(storage::storage_env* env, const std::string& path,
                                               const std::function<status(const nlohmann::json&)>& apply,
                                               const std::function<std::vector<nlohmann::json>()>& snapshot,
                                               journal_replay* stats) {
  *stats = journal_replay{};
  if (env->exists(path)) {
    auto image = env->read_all(path);
    if (!image) return image.error().with_context("reading the journal " + path);
    status st = replay_journal(*image, apply, stats);
    if (!st) {
      return st.with_context("replaying the journal " + path +
                             " (move it aside to start empty: managers re-register, applications must register "
                             "again)");
    }
  } else {
    stats->created = true;
  }
  std::unique_ptr<journal> j(new journal(env, path));
  CAIRN_RETURN_IF_ERROR(j->rewrite(snapshot()));
  return j;
}

status journal::rewrite(const std::vector<nlohmann::json>& records) {
  std::string image = file_header();
  for (const auto& r : records) image += encode_journal_record(r);
  const std::string tmp = path_ + ".tmp";
  auto f = env_->create(tmp, false);
  if (!f) return f.error().with_context("rewriting the journal");
  // It holds the applications' keys: the controller's user alone reads it.
  (void)::chmod(tmp.c_str(), 0600);
  status st = (*f)->write_at(0, image.data(), image.size());
  if (st) st = (*f)->sync();
  if (st) st = env_->rename(tmp, path_);
  if (st) st = env_->sync_dir(storage::dirname_of(path_));
  if (!st) {
    (void)(*f)->close();
    (void)env_->remove_file(tmp);
    return st.with_context("rewriting the journal " + path_);
  }
  // The open file is the renamed one: appends continue on it.
  file_ = std::move(*f);
  offset_ = image.size();
  since_rewrite_ = 0;
  failed_ = status{};
  return {};
}

status journal::append(const nlohmann::json& rec) {
  if (!failed_.is_ok()) return failed_;
  if (!file_) return {errc::internal, "journal " + path_ + " is not open"};
  std::string r = encode_journal_record(rec);
  if (r.size() - kJournalRecordHeader > kMaxJournalRecord) {
    return {errc::invalid_argument, "journal record larger than " + std::to_string(kMaxJournalRecord) + " bytes"};
  }
  status st = file_->write_at(offset_, r.data(), r.size());
  if (st) st = file_->sync();
  if (!st) {
    failed_ = st.with_context("appending to the journal " + path_);
    return failed_;
  }
  offset_ += r.size();
  ++since_rewrite_;
  return {};
}

}  // namespace cairn::agents

#include "format/container.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include "format/layout.hpp"
#include "util/aligned_buffer.hpp"
#include "util/hash.hpp"

namespace cairn::format {

std::string data_file_name(uint32_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "data.%06u", index);
  return buf;
}

bool parse_data_file_name(const std::string& entry, uint32_t* index) {
  if (entry.size() != 11 || entry.compare(0, 5, "data.") != 0) return false;
  uint32_t v = 0;
  for (size_t i = 5; i < entry.size(); ++i) {
    if (entry[i] < '0' || entry[i] > '9') return false;
    v = v * 10 + static_cast<uint32_t>(entry[i] - '0');
  }
  *index = v;
  return true;
}

namespace {

// A rank's image, read through its extents from the data files.
class container_image final : public storage::readable_file {
 public:
  container_image(std::string where, uint64_t size, std::vector<image_extent> extents,
                  std::map<uint32_t, std::unique_ptr<storage::readable_file>> files)
      : where_(std::move(where)), size_(size), extents_(std::move(extents)), files_(std::move(files)) {}

  status read_at(uint64_t offset, void* data, size_t len) const override {
    if (offset > size_ || len > size_ - offset)
      return {errc::corruption, where_ + ": read past the end of the image (" + std::to_string(size_) + " bytes)"};
    auto* out = static_cast<std::byte*>(data);
    // The first extent that ends after `offset` (extents tile [0, size) in order).
    auto it = std::upper_bound(extents_.begin(), extents_.end(), offset,
                               [](uint64_t o, const image_extent& e) { return o < e.src + e.length; });
    while (len > 0) {
      if (it == extents_.end()) return {errc::corruption, where_ + ": no extent holds image offset " + std::to_string(offset)};
      const uint64_t rel = offset - it->src;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(len, it->length - rel));
      CAIRN_RETURN_IF_ERROR(files_.at(it->file)->read_at(it->offset + rel, out, n));
      out += n;
      offset += n;
      len -= n;
      ++it;
    }
    return {};
  }
  uint64_t size() const override { return size_; }

 private:
  std::string where_;
  uint64_t size_;
  std::vector<image_extent> extents_;
  std::map<uint32_t, std::unique_ptr<storage::readable_file>> files_;
};

}  // namespace

result<std::unique_ptr<storage::readable_file>> open_container_image(storage::storage_env* env,
                                                                     const std::string& version_dir,
                                                                     const manifest& m, uint32_t rank) {
  if (!m.aggregated) return status(errc::invalid_argument, version_dir + ": not an aggregated version");
  if (rank >= m.shards.size())
    return status(errc::invalid_argument, version_dir + ": no rank " + std::to_string(rank) + " (the version has " +
                                              std::to_string(m.shards.size()) + ")");
  const shard_entry& s = m.shards[rank];
  std::map<uint32_t, std::unique_ptr<storage::readable_file>> files;
  for (const auto& e : s.extents) {
    if (files.count(e.file)) continue;
    const data_file& d = m.container.files.at(e.file);
    const std::string path = storage::join(version_dir, d.name);
    CAIRN_ASSIGN_OR_RETURN(auto f, env->open_read(path));
    if (f->size() < d.size)
      return status(errc::corruption, path + ": has " + std::to_string(f->size()) + " bytes, the manifest says " +
                                          std::to_string(d.size) + " (truncated); restart uses an older version");
    files.emplace(e.file, std::move(f));
  }
  return std::unique_ptr<storage::readable_file>(new container_image(
      storage::join(version_dir, "data.* (rank " + std::to_string(rank) + ")"), s.size, s.extents, std::move(files)));
}

result<std::unique_ptr<storage::readable_file>> open_persistent_image(storage::storage_env* env,
                                                                      const std::string& store,
                                                                      const std::string& run,
                                                                      const std::string& name, int64_t version,
                                                                      uint32_t rank, const manifest* m) {
  if (m && m->aggregated) return open_container_image(env, version_dir(store, run, name, version), *m, rank);
  return env->open_read(shard_path(store, run, name, version, rank));
}

std::string persistent_image_where(const std::string& store, const std::string& run, const std::string& name,
                                   int64_t version, uint32_t rank, const manifest* m) {
  if (m && m->aggregated)
    return storage::join(version_dir(store, run, name, version), "data.* (rank " + std::to_string(rank) + ")");
  return shard_path(store, run, name, version, rank);
}

status verify_container_extents(storage::storage_env* env, const std::string& version_dir, const manifest& m,
                                int64_t rank, uint64_t* bytes) {
  return verify_container_extents(env, version_dir, m, rank, bytes, nullptr);
}

status verify_container_extents(storage::storage_env* env, const std::string& version_dir, const manifest& m,
                                int64_t rank, uint64_t* bytes, extent_problem* where) {
  if (!m.aggregated) return {errc::invalid_argument, version_dir + ": not an aggregated version"};
  constexpr uint64_t kChunk = 8 << 20;
  std::vector<std::byte> buf;
  std::map<uint32_t, std::unique_ptr<storage::readable_file>> files;
  for (const auto& s : m.shards) {
    if (rank >= 0 && s.rank != static_cast<uint64_t>(rank)) continue;
    for (const auto& e : s.extents) {
      auto blame = [&](status st) {
        if (where) *where = {s.rank, e, storage::join(version_dir, m.container.files.at(e.file).name)};
        return st;
      };
      auto it = files.find(e.file);
      if (it == files.end()) {
        auto f = env->open_read(storage::join(version_dir, m.container.files.at(e.file).name));
        if (!f) return blame(f.take_status());
        it = files.emplace(e.file, std::move(f).value()).first;
      }
      util::xxh3_stream h;
      for (uint64_t done = 0; done < e.length;) {
        const size_t n = static_cast<size_t>(std::min(kChunk, e.length - done));
        buf.resize(std::max<size_t>(buf.size(), n));
        if (status st = it->second->read_at(e.offset + done, buf.data(), n); !st) return blame(st);
        h.update(buf.data(), n);
        done += n;
      }
      if (bytes) *bytes += e.length;
      if (h.digest() != e.checksum) {
        return blame({errc::corruption, storage::join(version_dir, m.container.files[e.file].name) + ": bytes [" +
                                      std::to_string(e.offset) + ", " + std::to_string(e.offset + e.length) +
                                      ") of rank " + std::to_string(s.rank) + "'s image (from image offset " +
                                      std::to_string(e.src) + ") do not match their checksum"});
      }
    }
  }
  return {};
}

}  // namespace cairn::format

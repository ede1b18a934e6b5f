#include "redundancy/parity_file.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "util/hash.hpp"
#include "util/json.hpp"
#include "util/names.hpp"

namespace cairn::redundancy {

std::string parity_file_name(uint32_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "redundancy.%06u", rank);
  return buf;
}

namespace {
uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }
}  // namespace

std::string encode_parity_header(parity_header* h) {
  nlohmann::json j;
  j["run"] = h->run;
  j["name"] = h->name;
  j["version"] = h->version;
  j["nranks"] = h->nranks;
  j["scheme"] = scheme_name(h->geo.kind);
  j["k"] = h->geo.k;
  j["m"] = h->geo.m;
  j["position"] = h->position;
  j["written_at"] = h->written_at;
  j["set"] = nlohmann::json::array();
  for (const auto& m : h->set)
    j["set"].push_back({{"rank", m.rank}, {"node", m.node}, {"size", m.size},
                        {"header_checksum", util::hex64(m.header_checksum)}});
  // Offsets depend on the header's length, which depends on the offsets'
  // digits: lay out with a generous bound, then fix.
  auto dump = [&](uint64_t start) {
    j["blocks"] = nlohmann::json::array();
    uint64_t at = start;
    for (auto& b : h->blocks) {
      b.offset = at;
      at = align4k(at + b.length);
      j["blocks"].push_back({{"stripe", b.stripe}, {"row", b.row}, {"offset", b.offset}, {"length", b.length},
                             {"checksum", util::hex64(b.checksum)}});
    }
    return j.dump();
  };
  uint64_t start = 4096;
  std::string text = dump(start);
  while (align4k(kParityPrefix + text.size()) != start) {
    start = align4k(kParityPrefix + text.size());
    text = dump(start);
  }
  std::string out(start, '\0');
  std::memcpy(out.data(), kParityMagic, 8);
  const uint32_t format = kParityFormat, len = static_cast<uint32_t>(text.size());
  const uint64_t sum = util::xxh3(text.data(), text.size());
  std::memcpy(out.data() + 8, &format, 4);
  std::memcpy(out.data() + 12, &len, 4);
  std::memcpy(out.data() + 16, &sum, 8);
  std::memcpy(out.data() + kParityPrefix, text.data(), text.size());
  return out;
}

result<parity_header> decode_parity_header(std::span<const std::byte> bytes, const std::string& where) {
  auto bad = [&](const std::string& why) { return status(errc::corruption, where + ": " + why); };
  if (bytes.size() < kParityPrefix || std::memcmp(bytes.data(), kParityMagic, 8) != 0)
    return bad("not a cairn parity file (bad magic)");
  uint32_t format, len;
  uint64_t sum;
  std::memcpy(&format, bytes.data() + 8, 4);
  std::memcpy(&len, bytes.data() + 12, 4);
  std::memcpy(&sum, bytes.data() + 16, 8);
  if (format != kParityFormat)
    return status(errc::not_supported, where + ": parity file format " + std::to_string(format) +
                                           " (this cairn reads " + std::to_string(kParityFormat) + ")");
  if (bytes.size() < kParityPrefix + len) return bad("truncated header");
  const char* text = reinterpret_cast<const char*>(bytes.data() + kParityPrefix);
  if (util::xxh3(text, len) != sum) return bad("header checksum mismatch");
  parity_header h;
  try {
    auto j = nlohmann::json::parse(text, text + len);
    h.run = j.at("run").get<std::string>();
    h.name = j.at("name").get<std::string>();
    h.version = util::int_at<int64_t>(j, "version");
    h.nranks = util::int_at<uint32_t>(j, "nranks");
    auto kind = parse_scheme(j.at("scheme").get<std::string>());
    if (!kind) return bad(kind.error().message());
    h.geo.kind = *kind;
    h.geo.k = util::int_at<uint32_t>(j, "k");
    h.geo.m = util::int_at<uint32_t>(j, "m");
    h.position = util::int_at<uint32_t>(j, "position");
    h.written_at = j.value("written_at", 0.0);
    for (const auto& m : j.at("set")) {
      member x;
      x.rank = util::int_at<uint32_t>(m, "rank");
      x.node = m.at("node").get<std::string>();
      x.size = util::int_at<uint64_t>(m, "size");
      if (!util::parse_hex64(m.at("header_checksum").get<std::string>(), &x.header_checksum))
        return bad("bad header_checksum");
      h.set.push_back(std::move(x));
    }
    for (const auto& b : j.at("blocks")) {
      block x;
      x.stripe = util::int_at<uint32_t>(b, "stripe");
      x.row = util::int_at<uint32_t>(b, "row");
      x.offset = util::int_at<uint64_t>(b, "offset");
      x.length = util::int_at<uint64_t>(b, "length");
      if (!util::parse_hex64(b.at("checksum").get<std::string>(), &x.checksum)) return bad("bad block checksum");
      h.blocks.push_back(x);
    }
  } catch (const std::exception& e) {
    return bad(std::string("bad header: ") + e.what());
  }
  if (h.geo.k != h.set.size() || h.position >= h.geo.k || h.geo.k < 2 || h.geo.m < 1 ||
      (h.geo.kind == scheme::rs && h.geo.m >= h.geo.k))
    return bad("inconsistent set description");
  // Members are distinct ranks of the job that wrote the file (a rebuild
  // indexes the job's ranks with them).
  std::vector<bool> seen(std::min<uint64_t>(h.nranks, uint64_t{1} << 24));
  for (const member& m : h.set) {
    if (m.rank >= seen.size() || seen[m.rank])
      return bad("set member rank " + std::to_string(m.rank) + " is not a distinct rank of the " +
                 std::to_string(h.nranks) + " the file names");
    seen[m.rank] = true;
  }
  for (auto [what, s] : {std::pair<const char*, const std::string*>{"run", &h.run}, {"checkpoint", &h.name}})
    if (status st = util::check_name(what, *s); !st) return bad(st.message());
  return h;
}

result<parity_header> read_parity_header(storage::readable_file& f, const std::string& where) {
  std::byte prefix[kParityPrefix];
  if (f.size() < kParityPrefix) return status(errc::corruption, where + ": truncated parity file");
  CAIRN_RETURN_IF_ERROR(f.read_at(0, prefix, sizeof prefix));
  uint32_t len;
  std::memcpy(&len, prefix + 12, 4);
  if (f.size() < kParityPrefix + len) return status(errc::corruption, where + ": truncated parity file");
  std::vector<std::byte> all(kParityPrefix + len);
  CAIRN_RETURN_IF_ERROR(f.read_at(0, all.data(), all.size()));
  return decode_parity_header(all, where);
}

status write_parity_file(storage::storage_env* env, const std::string& dir, uint32_t rank, parity_header* h,
                         const std::vector<util::aligned_buffer>& data) {
  const std::string head = encode_parity_header(h);
  const std::string path = storage::join(dir, parity_file_name(rank));
  CAIRN_RETURN_IF_ERROR(env->make_dirs(dir));
  auto f = env->create(path + ".tmp", false);
  if (!f) return f.take_status().with_context("writing " + path);
  status st = (*f)->write_at(0, head.data(), head.size());
  for (size_t i = 0; st && i < h->blocks.size(); ++i)
    st = (*f)->write_at(h->blocks[i].offset, data[i].data(), h->blocks[i].length);
  if (st) st = (*f)->close();
  if (st) st = env->rename(path + ".tmp", path);
  if (!st) (void)env->remove_file(path + ".tmp");
  return st.with_context("writing " + path);
}

}  // namespace cairn::redundancy

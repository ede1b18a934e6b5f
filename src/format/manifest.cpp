#include "format/manifest.hpp"

#include <nlohmann/json.hpp>

#include "format/layout.hpp"
#include "format/run_info.hpp"
#include "util/hash.hpp"
#include "util/json.hpp"

namespace cairn::format {

using nlohmann::json;

namespace {

json entry_json(const shard_entry& s, bool aggregated) {
  json j = {{"rank", s.rank},
            {"file", aggregated ? std::string() : shard_file_name(s.rank)},
            {"size", s.size},
            {"header_checksum", util::hex64(s.header_checksum)},
            {"captured_at", s.captured_at},
            {"capture_s", s.capture_s},
            {"checksum_s", s.checksum_s},
            {"hash_s", s.hash_s},
            {"tree", s.tree},
            {"local_s", s.local_s},
            {"persistent_s", s.persistent_s},
            {"persistent_at", s.persistent_at},
            {"host", s.host}};
  if (aggregated) {
    json extents = json::array();
    for (auto& e : s.extents) extents.push_back({e.src, e.length, e.file, e.offset, util::hex64(e.checksum)});
    j["extents"] = extents;
  }
  return j;
}

// `extents`: the entry has them (an aggregated version's); `container`, when
// not null, the data files they must lie in. Throws json::exception on a
// missing field; the callers turn it into a corruption error.
result<shard_entry> entry_from_json(const json& s, bool extents, const container_info* container,
                                    const std::string& where) {
  auto corrupt = [&](const std::string& what) { return status(errc::corruption, where + ": " + what); };
  shard_entry e;
  e.rank = util::int_at<uint32_t>(s, "rank");
  e.size = util::int_at<uint64_t>(s, "size");
  if (!util::parse_hex64(s.at("header_checksum"), &e.header_checksum)) return corrupt("bad shard checksum");
  e.captured_at = s.value("captured_at", 0.0);
  e.capture_s = s.value("capture_s", 0.0);
  e.checksum_s = s.value("checksum_s", 0.0);
  e.hash_s = s.value("hash_s", 0.0);
  e.tree = s.value("tree", false);
  e.local_s = s.value("local_s", 0.0);
  e.persistent_s = s.value("persistent_s", 0.0);
  e.persistent_at = s.value("persistent_at", 0.0);
  e.host = s.value("host", "");
  if (!extents) return e;
  uint64_t next = 0;
  for (auto& x : s.at("extents")) {
    image_extent ie;
    ie.src = util::int_of<uint64_t>(x.at(0), "extent source offset");
    ie.length = util::int_of<uint64_t>(x.at(1), "extent length");
    ie.file = util::int_of<uint32_t>(x.at(2), "extent file");
    ie.offset = util::int_of<uint64_t>(x.at(3), "extent offset");
    if (!util::parse_hex64(x.at(4), &ie.checksum)) return corrupt("bad extent checksum");
    if (ie.src != next || ie.length == 0 ||
        (container && (ie.file >= container->files.size() || ie.offset + ie.length > container->files[ie.file].size)))
      return corrupt("rank " + std::to_string(e.rank) + ": extents do not tile the image inside the data files");
    next += ie.length;
    e.extents.push_back(ie);
  }
  if (next != e.size)
    return corrupt("rank " + std::to_string(e.rank) + ": extents cover " + std::to_string(next) + " of " +
                   std::to_string(e.size) + " bytes");
  return e;
}

}  // namespace

// The body is JSON; the file ends with a line "xxh3 <16 hex>" checksumming the body.
std::string encode_manifest(const manifest& m) {
  json j;
  j["format"] = "cairn-manifest";
  j["format_version"] = m.aggregated ? kManifestAggregatedVersion : kManifestFormatVersion;
  j["run"] = m.run;
  j["name"] = m.name;
  j["version"] = m.version;
  j["nranks"] = m.nranks;
  j["committed_at"] = m.committed_at;
  j["executable"] = m.executable;
  j["mode"] = m.mode;
  if (m.aggregated) {
    const container_info& c = m.container;
    json files = json::array();
    for (auto& f : c.files) files.push_back({{"name", f.name}, {"size", f.size}, {"writers", f.writers}});
    j["layout"] = "aggregated";
    j["container"] = {{"format_version", kContainerFormatVersion},
                      {"strategy", c.strategy},
                      {"stripe", c.stripe},
                      {"stripe_count", c.stripe_count},
                      {"files", files},
                      {"leaders", c.leaders},
                      {"bytes_between_nodes", c.bytes_between_nodes},
                      {"bytes_within_nodes", c.bytes_within_nodes},
                      {"padding", c.padding}};
  }
  json shards = json::array();
  for (auto& s : m.shards) shards.push_back(entry_json(s, m.aggregated));
  j["shards"] = shards;
  if (m.redundancy) {
    const redundancy_info& r = *m.redundancy;
    j["redundancy"] = {{"scheme", r.scheme},
                       {"description", r.description},
                       {"k", r.k},
                       {"m", r.m},
                       {"sets", r.sets},
                       {"protected_at", r.protected_at > 0 ? json(r.protected_at) : json(nullptr)}};
  }
  return seal_json(j.dump(1) + "\n");
}

result<manifest> decode_manifest(const std::string& text, const std::string& where) {
  auto corrupt = [&](const std::string& what) { return status(errc::corruption, where + ": " + what); };
  auto body = unseal_json(text, where, "manifest");
  if (!body) return body.take_status();
  manifest m;
  try {
    json j = json::parse(*body);
    if (j.at("format") != "cairn-manifest") return corrupt("not a cairn manifest");
    const int fv = util::int_at<int>(j, "format_version");
    if (fv != kManifestFormatVersion && fv != kManifestAggregatedVersion)
      return status(errc::not_supported, where + ": manifest format version " + std::to_string(fv) +
                                             " not readable by this cairn (it reads 1 and 2); upgrade cairn");
    if (j.value("layout", "file_per_process") == "aggregated") {
      const json& c = j.at("container");
      const int cv = util::int_at<int>(c, "format_version");
      if (cv != kContainerFormatVersion)
        return status(errc::not_supported, where + ": container format version " + std::to_string(cv) +
                                               " not readable by this cairn (it reads " +
                                               std::to_string(kContainerFormatVersion) + "); upgrade cairn");
      m.aggregated = true;
      m.container.strategy = c.at("strategy");
      m.container.stripe = util::int_at<uint64_t>(c, "stripe");
      m.container.stripe_count = util::int_or<uint32_t>(c, "stripe_count", 0);
      for (auto& f : c.at("files")) {
        data_file d;
        d.name = f.at("name");
        d.size = util::int_at<uint64_t>(f, "size");
        if (f.contains("writers")) d.writers = util::ints_of<uint32_t>(f["writers"], "writers");
        if (d.name.empty() || d.name.find('/') != std::string::npos) return corrupt("bad data file name");
        m.container.files.push_back(std::move(d));
      }
      if (c.contains("leaders")) m.container.leaders = util::ints_of<uint32_t>(c["leaders"], "leaders");
      m.container.bytes_between_nodes = util::int_or<uint64_t>(c, "bytes_between_nodes", 0);
      m.container.bytes_within_nodes = util::int_or<uint64_t>(c, "bytes_within_nodes", 0);
      m.container.padding = util::int_or<uint64_t>(c, "padding", 0);
    }
    m.run = j.at("run");
    m.name = j.at("name");
    m.version = util::int_at<int64_t>(j, "version");
    m.nranks = util::int_at<uint32_t>(j, "nranks");
    m.committed_at = j.at("committed_at");
    m.executable = j.value("executable", "");
    m.mode = j.value("mode", "");
    // Optional (absent before it was recorded, and in unprotected versions).
    if (j.contains("redundancy") && !j["redundancy"].is_null()) {
      const json& r = j["redundancy"];
      redundancy_info ri;
      ri.scheme = r.at("scheme");
      ri.description = r.value("description", "");
      ri.k = util::int_at<uint32_t>(r, "k");
      ri.m = util::int_at<uint32_t>(r, "m");
      if (r.contains("sets"))
        for (const json& set : r["sets"]) ri.sets.push_back(util::ints_of<uint32_t>(set, "redundancy set"));
      if (r.contains("protected_at") && !r["protected_at"].is_null()) ri.protected_at = r["protected_at"];
      m.redundancy = std::move(ri);
    }
    for (auto& s : j.at("shards")) {
      CAIRN_ASSIGN_OR_RETURN(shard_entry e, entry_from_json(s, m.aggregated, &m.container, where));
      m.shards.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    return corrupt(std::string("malformed manifest: ") + e.what());
  }
  if (m.shards.size() != m.nranks) return corrupt("manifest lists " + std::to_string(m.shards.size()) +
                                                  " shards for " + std::to_string(m.nranks) + " ranks");
  for (uint32_t i = 0; i < m.nranks; ++i)
    if (m.shards[i].rank != i) return corrupt("manifest shards out of rank order");
  return m;
}

result<manifest> read_manifest(storage::storage_env* env, const std::string& path) {
  CAIRN_ASSIGN_OR_RETURN(std::string text, env->read_all(path));
  return decode_manifest(text, path);
}

}  // namespace cairn::format

namespace cairn::format {

std::string encode_part(const part_record& p) {
  json j = {{"format", "cairn-part"},
            {"format_version", kPartFormatVersion},
            {"aggregated", p.aggregated},
            {"shard", entry_json(p.entry, p.aggregated)}};
  if (p.protected_at > 0) j["protected_at"] = p.protected_at;
  return seal_json(j.dump() + "\n");
}

result<part_record> decode_part(const std::string& text, const std::string& where) {
  auto body = unseal_json(text, where, "part record");
  if (!body) return body.take_status();
  part_record p;
  try {
    json j = json::parse(*body);
    if (j.at("format") != "cairn-part" || j.at("format_version") != kPartFormatVersion)
      return status(errc::corruption, where + ": not a cairn part record of format " + std::to_string(kPartFormatVersion));
    p.aggregated = j.at("aggregated");
    CAIRN_ASSIGN_OR_RETURN(p.entry, entry_from_json(j.at("shard"), p.aggregated, nullptr, where));
    p.protected_at = j.value("protected_at", 0.0);
  } catch (const json::exception& e) {
    return status(errc::corruption, where + ": malformed part record: " + e.what());
  }
  return p;
}

}  // namespace cairn::format

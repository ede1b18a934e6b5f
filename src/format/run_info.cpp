#include "format/run_info.hpp"

#include <nlohmann/json.hpp>

#include "format/layout.hpp"
#include "util/hash.hpp"
#include "util/json.hpp"

namespace cairn::format {

using nlohmann::json;

std::string seal_json(const std::string& body) {
  return body + "xxh3 " + util::hex64(util::xxh3(body.data(), body.size())) + "\n";
}

result<std::string> unseal_json(const std::string& text, const std::string& where, const std::string& kind) {
  auto pos = text.rfind("xxh3 ");
  if (pos == std::string::npos || text.size() != pos + 5 + 16 + 1 || text.back() != '\n')
    return status(errc::corruption, where + ": missing checksum trailer (truncated " + kind + ")");
  uint64_t want = 0;
  if (!util::parse_hex64(text.substr(pos + 5, 16), &want)) return status(errc::corruption, where + ": bad checksum trailer");
  if (util::xxh3(text.data(), pos) != want) return status(errc::corruption, where + ": " + kind + " checksum mismatch");
  return text.substr(0, pos);
}

std::string run_file_path(const std::string& root, const std::string& run) {
  return storage::join(storage::join(runs_dir(root), run), kRunFileName);
}

std::string encode_run_info(const run_info& r) {
  json j;
  j["format"] = "cairn-run";
  j["format_version"] = kRunFormatVersion;
  j["run"] = r.run;
  j["application"] = r.application;
  j["code_version"] = r.code_version;
  j["tags"] = r.tags;
  json ex = json::array();
  for (auto& e : r.executions) {
    ex.push_back({{"started_at", e.started_at},
                  {"ended_at", e.ended_at},
                  {"nranks", e.nranks},
                  {"hosts", e.hosts},
                  {"nodes", e.nodes},
                  {"job", e.job},
                  {"executable", e.executable},
                  {"code_version", e.code_version},
                  {"config", e.config}});
    if (e.attempt != 0) ex.back()["attempt"] = e.attempt;
  }
  j["executions"] = ex;
  return seal_json(j.dump(1) + "\n");
}

result<run_info> decode_run_info(const std::string& text, const std::string& where) {
  CAIRN_ASSIGN_OR_RETURN(std::string body, unseal_json(text, where, "RUN file"));
  run_info r;
  try {
    json j = json::parse(body);
    if (j.at("format") != "cairn-run") return status(errc::corruption, where + ": not a cairn RUN file");
    const int fv = util::int_at<int>(j, "format_version");
    if (fv != kRunFormatVersion)
      return status(errc::not_supported, where + ": RUN format version " + std::to_string(fv) + " not readable");
    r.run = j.at("run");
    r.application = j.value("application", "");
    r.code_version = j.value("code_version", "");
    r.tags = j.value("tags", std::map<std::string, std::string>{});
    for (auto& e : j.at("executions")) {
      execution x;
      x.started_at = e.value("started_at", 0.0);
      x.ended_at = e.value("ended_at", 0.0);
      x.nranks = util::int_or<uint32_t>(e, "nranks", 0);
      x.hosts = e.value("hosts", std::vector<std::string>{});
      x.nodes = e.value("nodes", std::vector<std::string>{});
      x.job = e.value("job", "");
      x.executable = e.value("executable", "");
      x.code_version = e.value("code_version", "");
      x.config = e.value("config", std::map<std::string, std::string>{});
      x.attempt = util::int_or<uint32_t>(e, "attempt", 0);
      r.executions.push_back(std::move(x));
    }
  } catch (const json::exception& e) {
    return status(errc::corruption, where + ": malformed RUN file: " + e.what());
  }
  return r;
}

result<run_info> read_run_info(storage::storage_env* env, const std::string& root, const std::string& run) {
  std::string path = run_file_path(root, run);
  CAIRN_ASSIGN_OR_RETURN(std::string text, env->read_all(path));
  return decode_run_info(text, path);
}

}  // namespace cairn::format

#include "format/torch_state.hpp"

#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::format {
namespace {

using nlohmann::json;

// Python's json writes NaN, Infinity and -Infinity for non-finite floats;
// JSON has no such tokens. They are replaced by null outside strings (the
// structure is all that is read here).
std::string without_non_finite(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  bool in_string = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < in.size()) {
        out += in[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    std::string_view rest = in.substr(i);
    size_t token = rest.starts_with("NaN") ? 3 : rest.starts_with("Infinity") ? 8 : rest.starts_with("-Infinity") ? 9 : 0;
    if (token > 0) {
      out += "null";
      i += token - 1;
      continue;
    }
    out += c;
  }
  return out;
}

constexpr int kMaxDepth = 512;
// A state's JSON takes about 100 bytes per tensor.
constexpr uint64_t kMaxStateBytes = uint64_t{1} << 30;

struct walker {
  const std::string& where;
  std::map<std::string, std::string> keys;

  status bad(const std::string& path, const std::string& what) const {
    return {errc::corruption, where + ": cairn.pytorch state" + (path.empty() ? "" : " at '" + path + "'") + ": " +
                                  what};
  }

  static std::string child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  status tensor(const json& v, const std::string& path) {
    const json& index = v["tensor"];
    if (!index.is_number_unsigned()) return bad(path, "tensor index is not a non-negative integer");
    auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array()) return bad(path, "tensor without a shape");
    bool empty = false;
    for (const json& d : *shape) {
      if (!d.is_number_unsigned()) return bad(path, "tensor shape holds a value that is not a non-negative integer");
      empty = empty || d.get<uint64_t>() == 0;
    }
    if (empty) return {};  // no region: a tensor without elements
    char region[32];
    std::snprintf(region, sizeof region, "t%06llu", static_cast<unsigned long long>(index.get<uint64_t>()));
    if (!keys.emplace(region, path.empty() ? "(state)" : path).second)
      return bad(path, std::string("region ") + region + " is referenced twice");
    return {};
  }

  status walk(const json& v, const std::string& path, int depth) {
    if (depth > kMaxDepth) return bad(path, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
    if (!v.is_object()) return {};  // null, bool, number, string
    if (v.contains("tensor")) return tensor(v, path);
    if (v.contains("np_scalar")) return {};
    if (auto d = v.find("dict"); d != v.end()) {
      if (!d->is_array()) return bad(path, "'dict' is not a list");
      for (const json& item : *d) {
        if (!item.is_array() || item.size() != 2 || !(item[0].is_string() || item[0].is_number_integer()))
          return bad(path, "a dict entry is not a [key, value] pair with a string or integer key");
        const std::string key = item[0].is_string() ? item[0].get<std::string>() : item[0].dump();
        CAIRN_RETURN_IF_ERROR(walk(item[1], child(path, key), depth + 1));
      }
      return {};
    }
    for (const char* kind : {"list", "tuple"}) {
      auto l = v.find(kind);
      if (l == v.end()) continue;
      if (!l->is_array()) return bad(path, std::string("'") + kind + "' is not a list");
      for (size_t i = 0; i < l->size(); ++i) CAIRN_RETURN_IF_ERROR(walk((*l)[i], child(path, std::to_string(i)), depth + 1));
      return {};
    }
    return bad(path, "an entry that is none of tensor, np_scalar, dict, list, tuple");
  }
};

}  // namespace

result<std::map<std::string, std::string>> torch_state_keys(std::string_view json_text, const std::string& where) {
  json doc = json::parse(without_non_finite(json_text), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    return status(errc::corruption, where + ": cairn.pytorch state is not a JSON object");
  auto format = doc.find("format");
  auto version = doc.find("format_version");
  if (format == doc.end() || !format->is_string() || *format != "cairn-torch-state")
    return status(errc::not_supported, where + ": state region of another format (not cairn-torch-state)");
  if (version == doc.end() || !version->is_number_integer())
    return status(errc::corruption, where + ": cairn.pytorch state without a format_version");
  if (version->get<int64_t>() != kTorchStateFormatVersion)
    return status(errc::not_supported, where + ": cairn.pytorch state format_version " + version->dump() +
                                           " (this cairn reads " + std::to_string(kTorchStateFormatVersion) +
                                           "): upgrade cairn");
  auto state = doc.find("state");
  if (state == doc.end()) return status(errc::corruption, where + ": cairn.pytorch state without 'state'");
  walker w{where, {}};
  CAIRN_RETURN_IF_ERROR(w.walk(*state, "", 0));
  return std::move(w.keys);
}

result<std::map<std::string, std::string>> torch_state_keys(shard_reader& shard) {
  const auto& regions = shard.header().regions;
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].name != kTorchStateRegion) continue;
    if (regions[i].length > kMaxStateBytes)
      return status(errc::corruption, shard.path() + ": region " + kTorchStateRegion + " of " +
                                          std::to_string(regions[i].length) + " bytes is larger than a state's " +
                                          std::to_string(kMaxStateBytes));
    std::string text(regions[i].length, '\0');
    CAIRN_RETURN_IF_ERROR(shard.read_region(i, std::as_writable_bytes(std::span<char>(text.data(), text.size()))));
    return torch_state_keys(text, shard.path() + ": region " + kTorchStateRegion);
  }
  return std::map<std::string, std::string>{};
}

}  // namespace cairn::format
